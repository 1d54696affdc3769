"""Edge cases of the message models as the probe driver meets them on the wire."""

from __future__ import annotations

from typing import Any

import pytest

from taskhandler_operator.protocol.messages import (
    ErrorResponse,
    InvalidMessage,
    RuntimeRequest,
    TaskHandlerParseRequest,
    TaskHandlerParsingResult,
    parse_runtime_message,
)
from taskhandler_operator.records import contains_nul


def test_parse_request_body_has_no_design_a_fields() -> None:
    body = TaskHandlerParseRequest(file="/b/etl", bundle_path="/b", bundle_name="B").to_body()
    assert body == {
        "type": "TaskHandlerParseRequest",
        "file": "/b/etl",
        "bundle_path": "/b",
        "bundle_name": "B",
    }


def test_design_a_result_type_and_unknown_keys_are_accepted() -> None:
    message = parse_runtime_message(
        {
            "type": "SDKTaskHandlerParsingResult",
            "fileloc": "f",
            "task_handlers": {"d": [{"task_id": "t", "params": [{"name": "x", "required": True}]}]},
            "something_new": 1,
        }
    )
    assert isinstance(message, TaskHandlerParsingResult)
    declaration = message.task_handlers["d"][0]
    assert declaration.mode == "positional"  # Design A had no binding field
    assert declaration.params is not None and declaration.params[0].required is True


@pytest.mark.parametrize(
    ("binding", "mode"),
    [
        ("positional", "positional"),
        ("named", "named"),
        ("named_or_whole", "named"),
        ("named_open", "named"),
        ("by_magic", None),
    ],
)
def test_binding_modes(binding: str, mode: str | None) -> None:
    message = parse_runtime_message(
        {
            "type": "TaskHandlerParsingResult",
            "task_handlers": {"d": [{"task_id": "t", "binding": binding}]},
        }
    )
    assert isinstance(message, TaskHandlerParsingResult)
    assert message.task_handlers["d"][0].mode == mode


def test_get_requests_are_kept_as_sent() -> None:
    message = parse_runtime_message({"type": "GetVariable", "key": "k", "extra": [1]})
    assert isinstance(message, RuntimeRequest)
    assert message.model_dump() == {"type": "GetVariable", "key": "k", "extra": [1]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (None, "message body is NoneType, expected a map"),
        ([1], "message body is list, expected a map"),
        ({"no": "type"}, "message body has no string 'type'"),
        ({"type": 5}, "message body has no string 'type'"),
        ({"type": "StartupDetails"}, "unexpected message type 'StartupDetails'"),
        (
            {"type": "TaskHandlerParsingResult", "task_handlers": None},
            "TaskHandlerParsingResult does not validate: task_handlers: Input should be a "
            "valid dictionary",
        ),
        (
            {"type": "TaskHandlerParsingResult"},
            "TaskHandlerParsingResult does not validate: task_handlers: Field required",
        ),
        (
            {
                "type": "TaskHandlerParsingResult",
                "task_handlers": {"d": [{"task_id": "t"}, {"task_id": "t"}]},
            },
            "Dag 'd' declares task handler 't' twice",
        ),
        (
            {"type": "TaskHandlerParsingResult", "task_handlers": {"d": [{"binding": "named"}]}},
            "task_handlers.d.0.task_id: Field required",
        ),
    ],
)
def test_invalid_messages(body: object, message: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        parse_runtime_message(body)
    assert message in str(info.value)


def test_error_response_dump_is_what_go_recognises() -> None:
    dumped = ErrorResponse(detail={"message": "no client"}).model_dump(mode="json")
    assert dumped == {
        "type": "ErrorResponse",
        "error": "generic_error",
        "detail": {"message": "no client"},
    }


@pytest.mark.parametrize(
    "handlers",
    [
        {"d": [{"task_id": "t\x00", "binding": "positional"}]},
        {"d\x00": []},
        {"d": [{"task_id": "t", "params": [{"name": "x", "value_schema": {"enum": ["a\x00"]}}]}]},
    ],
)
def test_a_result_with_a_nul_character_is_an_invalid_message(handlers: dict[str, Any]) -> None:
    body = {"type": "TaskHandlerParsingResult", "task_handlers": handlers}
    with pytest.raises(InvalidMessage) as caught:
        parse_runtime_message(body)
    assert "task handler declarations contain a NUL character" in str(caught.value)


def test_nul_search_survives_deep_nesting() -> None:
    deep: Any = "fine"
    for _ in range(100_000):
        deep = [deep]
    assert contains_nul(deep) is False
    assert contains_nul([deep, {"k": "v\x00"}]) is True
