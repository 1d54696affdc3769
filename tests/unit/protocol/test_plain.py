"""The probe pod's pydantic-free forms (protocol/plain.py) agree with the models they stand for.

The models stay the definition: a body the plain reader takes must give exactly the models'
dump, and a body it leaves to them must be one they coerce or refuse; a plain summary must read
back through ``ProbeSummary`` as the same value the model would have built.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhandler_operator.limits import MAX_SUMMARY_PIDS, MAX_SUMMARY_WARNINGS
from taskhandler_operator.protocol import plain
from taskhandler_operator.protocol.messages import (
    ErrorResponse,
    InvalidMessage,
    TaskHandlerParseRequest,
    TaskHandlerParsingResult,
    parse_runtime_message,
)
from taskhandler_operator.protocol.summary import (
    LogStats,
    ProbeErrorKind,
    ProbeSummary,
    ProbeWarningKind,
    SummaryWarning,
    Timings,
    result_line,
)

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4), st.binary(max_size=2)
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
maybe = st.one_of(st.none(), json_leaf, json_any)
param = st.fixed_dictionaries(
    {},
    optional={
        "name": maybe,
        "value_schema": st.one_of(st.none(), st.dictionaries(st.text(max_size=3), json_any)),
        "exact_name": st.one_of(st.booleans(), maybe),
        "required": st.one_of(st.booleans(), st.none(), maybe),
        "extra": json_any,
    },
)
declaration = st.fixed_dictionaries(
    {},
    optional={
        "task_id": st.one_of(st.sampled_from(["t", "u", "t\x00"]), maybe),
        "binding": st.one_of(st.sampled_from(["positional", "named", "x"]), maybe),
        "params": st.one_of(st.none(), st.lists(param, max_size=2), maybe),
        "other": json_any,
    },
)
body = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(plain.RESULT_TYPES))},
    optional={
        "fileloc": st.one_of(st.text(max_size=3), maybe),
        "task_handlers": st.one_of(
            st.dictionaries(
                st.sampled_from(["d", "e", "d\x00"]), st.lists(declaration, max_size=3)
            ),
            maybe,
        ),
        "import_errors": st.one_of(st.none(), st.dictionaries(st.text(max_size=2), maybe)),
        "warnings": st.one_of(st.none(), st.lists(json_any, max_size=2), maybe),
        "unknown": json_any,
    },
)


def by_models(value: object) -> dict[str, Any] | str:
    try:
        model = parse_runtime_message(value)
    except InvalidMessage as exc:
        return f"refused: {exc}"
    assert isinstance(model, TaskHandlerParsingResult)
    return model.model_dump(mode="json")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body)
def test_a_result_the_plain_reader_takes_is_the_models_dump(value: dict[str, Any]) -> None:
    read = plain.read_runtime_message(value)
    expected = by_models(value)
    if read is None:
        return  # left to the models (the session asks them)
    assert isinstance(read, plain.PlainResult)
    assert read.body == expected
    model = TaskHandlerParsingResult.model_validate(value)
    assert read.line() == result_line(model)
    assert read.handler_count == model.handler_count


def test_a_well_formed_result_is_read_without_the_models() -> None:
    value = {
        "type": "TaskHandlerParsingResult",
        "fileloc": "/b/etl",
        "task_handlers": {
            "d": [
                {"task_id": "t", "binding": "named", "params": [{"name": "x", "extra": 1}]},
                {"task_id": "u"},
            ]
        },
        "warnings": [{"w": 1.5}],
        "something_new": 1,
    }
    read = plain.read_runtime_message(value)
    assert isinstance(read, plain.PlainResult)
    assert read.body == by_models(value)
    assert read.handler_count == 2


@pytest.mark.parametrize(
    "value",
    [
        {"type": "TaskHandlerParsingResult", "task_handlers": None},
        {"type": "TaskHandlerParsingResult"},
        {"type": "TaskHandlerParsingResult", "task_handlers": {"d": [{"task_id": "t"}] * 2}},
        {
            "type": "TaskHandlerParsingResult",
            "task_handlers": {"d": [{"x\x00": 1, "task_id": "t"}]},
        },
        # Coerced by the model (lax mode): the plain reader leaves it to it.
        {
            "type": "TaskHandlerParsingResult",
            "task_handlers": {"d": [{"task_id": "t", "params": [{"exact_name": "yes"}]}]},
        },
    ],
)
def test_what_is_not_plainly_valid_is_left_to_the_models(value: dict[str, Any]) -> None:
    assert plain.read_runtime_message(value) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "message body is NoneType, expected a map"),
        ({"type": 5}, "message body has no string 'type'"),
        ({"type": "StartupDetails"}, "unexpected message type 'StartupDetails'"),
    ],
)
def test_what_no_message_can_be_is_refused_with_the_models_words(
    value: object, message: str
) -> None:
    with pytest.raises(InvalidMessage, match=message):
        plain.read_runtime_message(value)
    with pytest.raises(InvalidMessage, match=message):
        parse_runtime_message(value)


def test_requests_and_the_bodies_the_driver_sends_match_the_models() -> None:
    assert plain.read_runtime_message({"type": "GetVariable", "key": "k"}) == (
        plain.RuntimeRequestType("GetVariable")
    )
    detail = {"message": "no client"}
    assert plain.error_response(detail) == ErrorResponse(detail=detail).model_dump(mode="json")
    for dag_ids in (None, ["a", "b"]):
        model = TaskHandlerParseRequest(
            file="/f", bundle_path="/b", bundle_name="B", dag_ids=dag_ids
        )
        assert plain.parse_request_body("/f", "/b", "B", dag_ids) == model.to_body()


@pytest.mark.parametrize(
    "fields",
    [
        {"status": "ok", "result_sha256": "a" * 64, "dag_count": 1, "handler_count": 5},
        {"status": "error", "error_kind": ProbeErrorKind.ANSWER_TIMEOUT, "error": "é\u2028" * 9000},
        {
            "status": "ok",
            "runtime_pids": list(range(MAX_SUMMARY_PIDS + 5)),
            "warnings": [(ProbeWarningKind.EMPTY_ANSWER, "w" * 9000)] * (MAX_SUMMARY_WARNINGS + 2),
            "dag_ids_requested": 3,
        },
    ],
)
def test_a_plain_summary_reads_back_as_the_models(fields: dict[str, Any]) -> None:
    artifact = "/bundles/" + "x" * 5000 + "/etl"
    warnings = fields.pop("warnings", [])
    ours = plain.PlainSummary(
        artifact=artifact,
        language="go",
        warnings=[plain.SummaryWarning(kind, message) for kind, message in warnings],
        logs=plain.LogStats(relayed_lines=3, dropped_lines=1),
        timings=plain.Timings(verify_ms=1.5, total_ms=20.25),
        **fields,
    )
    model = ProbeSummary(
        artifact=artifact,
        language="go",
        warnings=[SummaryWarning(kind=kind, message=message) for kind, message in warnings],
        logs=LogStats(relayed_lines=3, dropped_lines=1),
        timings=Timings(verify_ms=1.5, total_ms=20.25),
        **fields,
    )
    assert ProbeSummary.model_validate_json(ours.to_json()) == model
    assert ours.to_dict() == model.model_dump(mode="json", exclude_none=True)
    assert (ours.exit_code, ours.error, ours.ok) == (model.exit_code, model.error, model.ok)


def test_an_error_summary_carries_no_warning() -> None:
    with pytest.raises(ValueError, match="only an ok summary carries warnings"):
        plain.PlainSummary(
            status="error",
            artifact="a",
            language="go",
            warnings=[plain.SummaryWarning(ProbeWarningKind.EMPTY_ANSWER, "m")],
        )
