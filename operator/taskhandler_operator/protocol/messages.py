"""Message models of the task-handler probe protocol (the wire side).

Design B (the shape Airflow's code implements) is primary; Design-A variants are accepted on
input so that older runtimes and older supervisors still interoperate:

* ``TaskHandlerParseRequest`` may carry ``dag_ids`` (Design A); a runtime ignores it.
* ``TaskHandlerParam`` may carry ``required`` (Design A); it is accepted and kept.
* ``TaskHandlerDeclaration.binding`` may be a mode newer or older SDKs emit
  (``named_or_whole``, ``named_open``); :attr:`TaskHandlerDeclaration.mode` folds those into
  ``named`` and reports anything else as unknown, so validation can name it.
* Results typed ``SDKTaskHandlerParsingResult`` (Design A) are read as
  ``TaskHandlerParsingResult``.

The declarations are records the database stores too, so they live in
:mod:`taskhandler_operator.records`; this module holds the messages that carry them.

Bodies are plain JSON types: they travel as msgpack maps with a ``type`` discriminator.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from taskhandler_operator.protocol.plain import RESULT_TYPES, RUNTIME_REQUEST_TYPES, InvalidMessage
from taskhandler_operator.records import TaskHandlers, contains_nul

__all__ = [
    "RESULT_TYPES",
    "RUNTIME_REQUEST_TYPES",
    "ErrorResponse",
    "InvalidMessage",
    "RuntimeRequest",
    "TaskHandlerParseRequest",
    "TaskHandlerParsingResult",
    "parse_runtime_message",
]


class _Wire(BaseModel):
    """Base for wire models: unknown keys are ignored, as the protocol requires."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class TaskHandlerParseRequest(_Wire):
    """Sent by the supervisor as the id-0 first frame of a probe."""

    type: Literal["TaskHandlerParseRequest"] = "TaskHandlerParseRequest"
    file: str
    bundle_path: str
    bundle_name: str
    # Design A: the Dags the supervisor wanted. Design-B supervisors never send it.
    dag_ids: list[str] | None = None

    def to_body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class TaskHandlerParsingResult(_Wire):
    """The runtime's answer: every registered handler, keyed by dag_id."""

    type: Literal["TaskHandlerParsingResult", "SDKTaskHandlerParsingResult"] = (
        "TaskHandlerParsingResult"
    )
    fileloc: str = ""
    # Never null: a runtime with no handlers answers {}.
    task_handlers: TaskHandlers
    import_errors: dict[str, str] | None = None
    warnings: list[Any] | None = None

    @field_validator("task_handlers", mode="before")
    @classmethod
    def _storable(cls, value: object) -> object:
        # PostgreSQL's jsonb cannot hold NUL; refusing it here makes such an answer an invalid
        # probe result of this one artifact instead of a write failure for its whole bundle.
        if contains_nul(value):
            raise ValueError("task handler declarations contain a NUL character")
        return value

    @field_validator("task_handlers")
    @classmethod
    def _unique_task_ids(cls, value: TaskHandlers) -> TaskHandlers:
        for dag_id, declarations in value.items():
            seen: set[str] = set()
            for declaration in declarations:
                if declaration.task_id in seen:
                    raise ValueError(
                        f"Dag {dag_id!r} declares task handler {declaration.task_id!r} twice"
                    )
                seen.add(declaration.task_id)
        return value

    @property
    def handler_count(self) -> int:
        return sum(len(declarations) for declarations in self.task_handlers.values())


class ErrorResponse(_Wire):
    type: Literal["ErrorResponse"] = "ErrorResponse"
    error: str = "generic_error"
    detail: dict[str, Any] | None = None


class RuntimeRequest(BaseModel):
    """One of the ``Get*``/``Put*`` requests; fields vary per type and are kept as sent."""

    model_config = ConfigDict(extra="allow")

    type: str

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in RUNTIME_REQUEST_TYPES:
            raise ValueError(f"unknown request type {value!r}")
        return value


def parse_runtime_message(body: object) -> TaskHandlerParsingResult | RuntimeRequest:
    """Validate a body received from a runtime (Airflow's ``ToManager`` for a probe)."""
    if not isinstance(body, dict):
        raise InvalidMessage(f"message body is {type(body).__name__}, expected a map")
    kind = body.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("message body has no string 'type'")
    try:
        if kind in RESULT_TYPES:
            return TaskHandlerParsingResult.model_validate(body)
        if kind in RUNTIME_REQUEST_TYPES:
            return RuntimeRequest.model_validate(body)
    except ValidationError as exc:
        raise InvalidMessage(f"{kind} does not validate: {_first_error(exc)}") from exc
    raise InvalidMessage(f"unexpected message type {kind!r}")


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first.get('msg', '')}{more}"
