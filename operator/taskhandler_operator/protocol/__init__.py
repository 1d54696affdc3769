"""Frames, message models and the probe driver (supervisor side of the Lang-SDK protocol).

The public API other programs import is :data:`__all__`; each name is loaded from its module on
first use, so importing the package (the CLI does, to list its commands) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskhandler_operator.protocol.driver import ProbeConfig, ProbeOutcome, run_probe
    from taskhandler_operator.protocol.frames import (
        FrameError,
        FrameTooLarge,
        RequestFrame,
        ResponseFrame,
        read_frame,
    )
    from taskhandler_operator.protocol.messages import (
        ErrorResponse,
        InvalidMessage,
        RuntimeRequest,
        TaskHandlerParseRequest,
        TaskHandlerParsingResult,
        parse_runtime_message,
    )
    from taskhandler_operator.protocol.summary import (
        RESULT_MARKER,
        ExitCode,
        ProbeErrorKind,
        ProbeSummary,
        ResultRejected,
        accept_result,
        result_line,
    )

__all__ = [
    "RESULT_MARKER",
    "ErrorResponse",
    "ExitCode",
    "FrameError",
    "FrameTooLarge",
    "InvalidMessage",
    "ProbeConfig",
    "ProbeErrorKind",
    "ProbeOutcome",
    "ProbeSummary",
    "RequestFrame",
    "ResponseFrame",
    "ResultRejected",
    "RuntimeRequest",
    "TaskHandlerParseRequest",
    "TaskHandlerParsingResult",
    "accept_result",
    "parse_runtime_message",
    "read_frame",
    "result_line",
    "run_probe",
]

_HOMES = {
    "driver": ("ProbeConfig", "ProbeOutcome", "run_probe"),
    "frames": ("FrameError", "FrameTooLarge", "RequestFrame", "ResponseFrame", "read_frame"),
    "messages": (
        "ErrorResponse",
        "InvalidMessage",
        "RuntimeRequest",
        "TaskHandlerParseRequest",
        "TaskHandlerParsingResult",
        "parse_runtime_message",
    ),
    "summary": (
        "RESULT_MARKER",
        "ExitCode",
        "ProbeErrorKind",
        "ProbeSummary",
        "ResultRejected",
        "accept_result",
        "result_line",
    ),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
