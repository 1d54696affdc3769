"""The probe pod's forms of the protocol's messages and summary, without pydantic.

Every probe Job runs ``taskhandler-operator probe`` in a fresh interpreter, and pydantic (its
import and the building of the models' validators) was the largest part of a probe's own cost
(docs/operations.md). The models in :mod:`.messages` and :mod:`.summary` stay the definition:
the operator validates what a probe pod reports with them, and this module only takes the
common case on the pod without them:

* :func:`read_runtime_message` accepts a runtime's message when it already has exactly the
  types the models declare (plain JSON values, nothing to coerce, no rule broken) and returns
  what ``model_dump(mode="json")`` would; anything else (an error, a value pydantic would
  coerce) is left to the models themselves (``session`` imports them then), so that every
  verdict and message is theirs;
* :class:`PlainSummary` writes the summary JSON that :class:`.summary.ProbeSummary` reads back
  to the same value (the same shortening and caps);
* :func:`error_response` and :func:`parse_request_body` are the two bodies the driver sends.

tests/unit/protocol/test_plain.py checks each against the models; tests/unit/test_cli_imports.py
checks that a probe's run imports no pydantic.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, Literal

from taskhandler_operator.limits import (
    ID_LENGTH,
    MAX_SUMMARY_ARTIFACT_BYTES,
    MAX_SUMMARY_ERROR_BYTES,
    MAX_SUMMARY_PIDS,
    MAX_SUMMARY_WARNING_BYTES,
    MAX_SUMMARY_WARNINGS,
)

__all__ = [
    "RESULT_MARKER",
    "RESULT_TYPES",
    "RUNTIME_REQUEST_TYPES",
    "ExitCode",
    "InvalidMessage",
    "LogStats",
    "PlainResult",
    "PlainSummary",
    "ProbeErrorKind",
    "ProbeWarningKind",
    "RuntimeRequestType",
    "SummaryWarning",
    "Timings",
    "dag_id_problem",
    "error_response",
    "parse_request_body",
    "read_runtime_message",
    "sha256_text",
    "shorten",
]

RESULT_MARKER = "----- taskhandler-operator probe result -----"


class ExitCode(IntEnum):
    """Exit status of ``taskhandler-operator probe``."""

    OK = 0
    PROBE_FAILED = 1  # the runtime misbehaved or did not answer
    ARTIFACT_REFUSED = 3  # verification failed; nothing was run
    DRIVER_ERROR = 4  # the runtime could not be launched, or the driver itself failed


class ProbeErrorKind(StrEnum):
    ARTIFACT_REFUSED = "artifact_refused"
    LAUNCH_FAILED = "launch_failed"
    EXITED_BEFORE_CONNECT = "exited_before_connect"
    CONNECT_TIMEOUT = "connect_timeout"
    ANSWER_TIMEOUT = "answer_timeout"
    EXITED_WITHOUT_RESULT = "exited_without_result"
    INVALID_FRAME = "invalid_frame"
    FRAME_TOO_LARGE = "frame_too_large"
    INVALID_MESSAGE = "invalid_message"
    DUPLICATE_RESULT = "duplicate_result"
    EXIT_TIMEOUT = "exit_timeout"
    EXIT_STATUS = "exit_status"
    PROCESSES_LEFT = "processes_left"
    DRIVER_ERROR = "driver_error"

    @property
    def exit_code(self) -> ExitCode:
        if self is ProbeErrorKind.ARTIFACT_REFUSED:
            return ExitCode.ARTIFACT_REFUSED
        if self in (ProbeErrorKind.LAUNCH_FAILED, ProbeErrorKind.DRIVER_ERROR):
            return ExitCode.DRIVER_ERROR
        return ExitCode.PROBE_FAILED


class ProbeWarningKind(StrEnum):
    """Something wrong that does not cost a valid, acknowledged answer (docs/protocol.md)."""

    EXIT_TIMEOUT = "exit_timeout"  # did not exit within the grace; killed, answer kept
    EMPTY_ANSWER = "empty_answer"  # registered no task handler at all


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _encoded_size(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def shorten(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` cut, with an ellipsis, so that its JSON string takes at most ``limit`` bytes."""
    if _encoded_size(text) <= limit:
        return text
    low, high = 0, len(text)  # binary search for the longest piece that fits
    while low < high:
        middle = (low + high + 1) // 2
        piece = text[-middle:] if keep_end else text[:middle]
        if _encoded_size(piece + "…") <= limit:
            low = middle
        else:
            high = middle - 1
    if keep_end:
        return "…" + text[len(text) - low :]
    return text[:low] + "…"


# -- messages ---------------------------------------------------------------------------------

# Requests a runtime may send to its supervisor (Airflow's ToManager union, minus the results).
RUNTIME_REQUEST_TYPES: frozenset[str] = frozenset(
    {
        "GetConnection",
        "GetVariable",
        "GetVariableKeys",
        "PutVariable",
        "DeleteVariable",
        "GetTaskStates",
        "GetTICount",
        "GetPrevSuccessfulDagRun",
        "GetPreviousDagRun",
        "GetPreviousTI",
        "GetXCom",
        "GetXComCount",
        "GetXComSequenceItem",
        "GetXComSequenceSlice",
        "MaskSecret",
    }
)
RESULT_TYPES: frozenset[str] = frozenset(
    {"TaskHandlerParsingResult", "SDKTaskHandlerParsingResult"}
)


class InvalidMessage(ValueError):
    """A frame body that does not validate as any message a runtime may send."""


@dataclass(frozen=True, slots=True)
class RuntimeRequestType:
    """A ``Get*``/``Put*`` request of a runtime: only its type matters to a probe."""

    type: str


@dataclass(frozen=True, slots=True)
class PlainResult:
    """A validated ``TaskHandlerParsingResult`` as ``model_dump(mode="json")`` gives it."""

    body: dict[str, Any]

    @property
    def task_handlers(self) -> dict[str, list[dict[str, Any]]]:
        handlers: dict[str, list[dict[str, Any]]] = self.body["task_handlers"]
        return handlers

    @property
    def handler_count(self) -> int:
        return sum(len(declarations) for declarations in self.task_handlers.values())

    def line(self) -> str:
        """The one-line JSON after :data:`RESULT_MARKER` (``summary.result_line``)."""
        return json.dumps(self.body, ensure_ascii=True, separators=(",", ":"))


class _Defer(Exception):
    """Not plainly valid: the pydantic models decide."""


def _plain_json(value: object) -> Any:
    """``value`` when it is JSON as pydantic would dump an ``Any`` unchanged, else defer.

    Iterative, because the nesting depth of a runtime's answer is the runtime's choice.
    """
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str:
            if "\x00" in item:
                raise _Defer
        elif kind is dict:
            for key in item:
                if type(key) is not str or "\x00" in key:
                    raise _Defer
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                raise _Defer
        elif item is not None and kind is not int and kind is not bool:
            raise _Defer
    return value


def _str(value: Any) -> str:
    if type(value) is not str or "\x00" in value:
        raise _Defer
    return value


def _optional(value: object, check: Any) -> Any:
    return None if value is None else check(value)


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _Defer
    return value


def _param(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Defer
    schema = value.get("value_schema")
    if schema is not None and type(schema) is not dict:
        raise _Defer
    return {
        "name": _optional(value.get("name"), _str),
        "value_schema": _optional(schema, _plain_json),
        "exact_name": _bool(value.get("exact_name", False)),
        "required": _optional(value.get("required"), _bool),
    }


def _declaration(value: Any, seen: set[str]) -> dict[str, Any]:
    if type(value) is not dict or "task_id" not in value:
        raise _Defer
    task_id = _str(value["task_id"])
    if task_id in seen:  # the model names the duplicate
        raise _Defer
    seen.add(task_id)
    params = value.get("params")
    if params is not None and type(params) is not list:
        raise _Defer
    return {
        "task_id": task_id,
        "binding": _str(value.get("binding", "positional")),
        "params": None if params is None else [_param(p) for p in params],
    }


def _has_nul(value: object) -> bool:
    """``records.contains_nul``: a NUL in any key or string, extra keys included."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list | tuple):
            pending += item
    return False


def _result(body: dict[str, Any]) -> dict[str, Any]:
    handlers = body.get("task_handlers")
    # The model refuses a NUL anywhere in the declarations, even under keys it ignores.
    if type(handlers) is not dict or _has_nul(handlers):
        raise _Defer
    task_handlers: dict[str, list[dict[str, Any]]] = {}
    for dag_id, declarations in handlers.items():
        if type(declarations) is not list:
            raise _Defer
        seen: set[str] = set()
        task_handlers[_str(dag_id)] = [_declaration(d, seen) for d in declarations]
    import_errors = body.get("import_errors")
    if import_errors is not None:
        if type(import_errors) is not dict:
            raise _Defer
        import_errors = {_str(k): _str(v) for k, v in import_errors.items()}
    warnings = body.get("warnings")
    if warnings is not None and type(warnings) is not list:
        raise _Defer
    return {
        "type": body["type"],
        "fileloc": _str(body.get("fileloc", "")),
        "task_handlers": task_handlers,
        "import_errors": import_errors,
        "warnings": _optional(warnings, _plain_json),
    }


def read_runtime_message(body: object) -> PlainResult | RuntimeRequestType | None:
    """Validate a body received from a runtime, as ``messages.parse_runtime_message`` does.

    Raises :class:`InvalidMessage` (the models' message) for what no message can be; returns
    None for a result that is not plainly valid: ``messages.parse_runtime_message`` decides
    then (it coerces, or names what is wrong), as ``session`` does.
    """
    if not isinstance(body, dict):
        raise InvalidMessage(f"message body is {type(body).__name__}, expected a map")
    kind = body.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("message body has no string 'type'")
    if kind in RUNTIME_REQUEST_TYPES:
        # The model keeps any payload; only the type is read.
        return RuntimeRequestType(kind)
    if kind not in RESULT_TYPES:
        raise InvalidMessage(f"unexpected message type {kind!r}")
    if type(body) is not dict or type(kind) is not str:
        return None
    try:
        return PlainResult(_result(body))
    except _Defer:
        return None


def dag_id_problem(dag_id: object) -> str | None:
    """Why a ``--dag-id`` cannot be sent in a parse request, or None."""
    if not isinstance(dag_id, str) or not dag_id or len(dag_id) > ID_LENGTH or "\x00" in dag_id:
        return f"a dag_id must be 1 to {ID_LENGTH} characters without NUL"
    return None


def error_response(detail: dict[str, str]) -> dict[str, object]:
    """``ErrorResponse(detail=detail).model_dump(mode="json")``."""
    return {"type": "ErrorResponse", "error": "generic_error", "detail": dict(detail)}


def parse_request_body(
    file: str, bundle_path: str, bundle_name: str, dag_ids: list[str] | None
) -> dict[str, Any]:
    """``TaskHandlerParseRequest(...).to_body()``: the id-0 frame's body."""
    body: dict[str, Any] = {
        "type": "TaskHandlerParseRequest",
        "file": file,
        "bundle_path": bundle_path,
        "bundle_name": bundle_name,
    }
    if dag_ids is not None:
        body["dag_ids"] = list(dag_ids)
    return body


# -- the summary ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timings:
    """Milliseconds spent in each step; ``None`` for a step that was not reached."""

    verify_ms: float | None = None
    spawn_ms: float | None = None
    connect_ms: float | None = None
    answer_ms: float | None = None
    exit_ms: float | None = None
    cleanup_ms: float | None = None
    total_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class LogStats:
    relayed_lines: int = 0
    dropped_lines: int = 0
    truncated_lines: int = 0


@dataclass(frozen=True, slots=True)
class SummaryWarning:
    kind: ProbeWarningKind
    message: str


def _fields(value: Timings | LogStats) -> dict[str, Any]:
    return {
        name: getattr(value, name) for name in value.__slots__ if getattr(value, name) is not None
    }


@dataclass(frozen=True, slots=True)
class PlainSummary:
    """The probe's termination message, as :class:`.summary.ProbeSummary` reads it.

    Applies the model's rules on creation: the error, artifact and warning texts shortened,
    at most ``MAX_SUMMARY_PIDS`` pids and ``MAX_SUMMARY_WARNINGS`` warnings, warnings only on
    an ok summary.
    """

    status: Literal["ok", "error"]
    artifact: str
    language: str
    error_kind: ProbeErrorKind | None = None
    error: str | None = None
    schema_version: str | None = None
    result_sha256: str | None = None
    result_bytes: int | None = None
    dag_count: int | None = None
    handler_count: int | None = None
    runtime_exit_code: int | None = None
    runtime_pids: list[int] = field(default_factory=list)
    dag_ids_requested: int | None = None
    warnings: list[SummaryWarning] = field(default_factory=list)
    logs: LogStats = field(default_factory=LogStats)
    timings: Timings = field(default_factory=Timings)

    def __post_init__(self) -> None:
        if self.status != "ok" and self.warnings:
            raise ValueError("only an ok summary carries warnings")
        cut = object.__setattr__
        if self.error is not None:
            cut(self, "error", shorten(self.error, MAX_SUMMARY_ERROR_BYTES))
        cut(self, "artifact", shorten(self.artifact, MAX_SUMMARY_ARTIFACT_BYTES, keep_end=True))
        cut(self, "runtime_pids", list(self.runtime_pids[:MAX_SUMMARY_PIDS]))
        warnings = [
            SummaryWarning(w.kind, shorten(w.message, MAX_SUMMARY_WARNING_BYTES))
            for w in self.warnings[:MAX_SUMMARY_WARNINGS]
        ]
        cut(self, "warnings", warnings)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def exit_code(self) -> ExitCode:
        if self.status == "ok":
            return ExitCode.OK
        return (self.error_kind or ProbeErrorKind.DRIVER_ERROR).exit_code

    def to_dict(self) -> dict[str, Any]:
        """``ProbeSummary.model_dump(mode="json", exclude_none=True)``, field for field."""
        values: dict[str, Any] = {
            "summary_version": 1,
            "status": self.status,
            "error_kind": None if self.error_kind is None else self.error_kind.value,
            "error": self.error,
            "artifact": self.artifact,
            "language": self.language,
            "schema_version": self.schema_version,
            "result_sha256": self.result_sha256,
            "result_bytes": self.result_bytes,
            "dag_count": self.dag_count,
            "handler_count": self.handler_count,
            "runtime_exit_code": self.runtime_exit_code,
            "runtime_pids": list(self.runtime_pids),
            "dag_ids_requested": self.dag_ids_requested,
            "warnings": [{"kind": w.kind.value, "message": w.message} for w in self.warnings],
            "logs": _fields(self.logs),
            "timings": _fields(self.timings),
        }
        return {name: value for name, value in values.items() if value is not None}

    def to_json(self) -> str:
        """Compact JSON, UTF-8 kept as is (``ProbeSummary.to_json``)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))
