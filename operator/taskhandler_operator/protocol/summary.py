"""What a probe reports: the compact summary, the result marker, and how a reader checks both.

A probe pod reports twice (DESIGN §3.5):

* the **summary** (:class:`ProbeSummary`) as the container's termination message — small
  (the kubelet keeps at most 4096 bytes), always written, success or not;
* the **result** in the container log: the line :data:`RESULT_MARKER`, then exactly one line of
  compact JSON (the validated ``TaskHandlerParsingResult``).

The reader accepts the result only when the SHA-256 of that JSON line (UTF-8, without its
newline) equals ``summary.result_sha256`` (:func:`accept_result`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from taskhandler_operator.limits import (
    MAX_SUMMARY_ARTIFACT_BYTES,
    MAX_SUMMARY_ERROR_BYTES,
    MAX_SUMMARY_PIDS,
    MAX_SUMMARY_WARNING_BYTES,
    MAX_SUMMARY_WARNINGS,
)
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult

# Shared with the probe pod's pydantic-free side (plain.py), so both name the same values.
from taskhandler_operator.protocol.plain import (
    RESULT_MARKER,
    ExitCode,
    ProbeErrorKind,
    ProbeWarningKind,
    sha256_text,
)
from taskhandler_operator.protocol.plain import shorten as _shorten

__all__ = [
    "RESULT_MARKER",
    "ExitCode",
    "LogStats",
    "ProbeErrorKind",
    "ProbeSummary",
    "ProbeWarningKind",
    "ResultRejected",
    "ResultScanner",
    "SummaryWarning",
    "Timings",
    "accept_result",
    "accept_result_line",
    "find_result_line",
    "result_line",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


Millis = Annotated[float, Field(ge=0)]


class Timings(_Model):
    """Milliseconds spent in each step; ``None`` for a step that was not reached."""

    verify_ms: Millis | None = None
    spawn_ms: Millis | None = None
    connect_ms: Millis | None = None
    answer_ms: Millis | None = None
    exit_ms: Millis | None = None
    cleanup_ms: Millis | None = None
    total_ms: Millis = 0.0


class LogStats(_Model):
    relayed_lines: int = 0
    dropped_lines: int = 0
    truncated_lines: int = 0


class SummaryWarning(_Model):
    kind: ProbeWarningKind
    message: str

    @field_validator("message")
    @classmethod
    def _short_message(cls, value: str) -> str:
        return _shorten(value, MAX_SUMMARY_WARNING_BYTES)


class ProbeSummary(_Model):
    """The termination message of a probe; kept under ``limits.MAX_SUMMARY_BYTES``."""

    summary_version: Literal[1] = 1
    status: Literal["ok", "error"]
    error_kind: ProbeErrorKind | None = None
    error: str | None = None
    artifact: str
    language: str
    schema_version: str | None = None
    result_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    result_bytes: int | None = None
    dag_count: int | None = None
    handler_count: int | None = None
    runtime_exit_code: int | None = None
    runtime_pids: list[int] = Field(default_factory=list)
    # How many Dags the request named in ``dag_ids``; None when it named none (docs/protocol.md).
    dag_ids_requested: int | None = None
    warnings: list[SummaryWarning] = Field(default_factory=list)
    logs: LogStats = Field(default_factory=LogStats)
    timings: Timings = Field(default_factory=Timings)

    @field_validator("error")
    @classmethod
    def _short_error(cls, value: str | None) -> str | None:
        return _shorten(value, MAX_SUMMARY_ERROR_BYTES) if value is not None else None

    @field_validator("artifact")
    @classmethod
    def _short_artifact(cls, value: str) -> str:
        # Keep the end of a long path: the file name is the informative part.
        return _shorten(value, MAX_SUMMARY_ARTIFACT_BYTES, keep_end=True)

    @field_validator("runtime_pids")
    @classmethod
    def _few_pids(cls, value: list[int]) -> list[int]:
        return value[:MAX_SUMMARY_PIDS]

    @field_validator("warnings")
    @classmethod
    def _few_warnings(cls, value: list[SummaryWarning]) -> list[SummaryWarning]:
        return value[:MAX_SUMMARY_WARNINGS]

    @model_validator(mode="after")
    def _warnings_only_when_ok(self) -> ProbeSummary:
        # A failed probe's error text already takes the size budget warnings would use.
        if self.status != "ok" and self.warnings:
            raise ValueError("only an ok summary carries warnings")
        return self

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def exit_code(self) -> ExitCode:
        if self.status == "ok":
            return ExitCode.OK
        return (self.error_kind or ProbeErrorKind.DRIVER_ERROR).exit_code

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


def result_line(result: TaskHandlerParsingResult) -> str:
    """The one-line JSON form of a result that follows :data:`RESULT_MARKER` in the log.

    ASCII only: a runtime's strings may hold U+2028, U+0085 and the like, which JSON leaves
    unescaped and which some line splitters (Python's ``str.splitlines``) treat as line ends.
    """
    return json.dumps(result.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"))


class ResultRejected(ValueError):
    """The log and the summary of a probe do not agree on a valid result."""


def find_result_line(lines: Iterable[str]) -> str | None:
    """The line after the last :data:`RESULT_MARKER` line, if there is one."""
    found: str | None = None
    take_next = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        if take_next:
            found = line
            take_next = False
        if line == RESULT_MARKER:
            take_next = True
    return found


_CR_ROOM = 16


class ResultScanner:
    """Finds the line after the last :data:`RESULT_MARKER` in a log fed in chunks, keeping at most
    ``max_line_bytes`` of it and nothing else: a probe's log can be far larger than its result
    (a runtime's output, or anything a probe image prints), and the reader must not hold it.

    Lines end at ``"\\n"`` only, as in :func:`accept_result`; trailing ``"\\r"`` are dropped.
    """

    _MARKER = RESULT_MARKER.encode()

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._max = max_line_bytes
        self._line = bytearray()  # the current line, only as much of it as can matter
        self._over = False  # the current line is longer than what is kept of it
        self._take_next = False  # the line before was the marker
        self._capture = False  # the current line follows a marker
        self.found: bytes | None = None
        self.found_too_long = False
        self.bytes_read = 0
        self.peak = 0  # the most bytes of a line held at once

    def feed(self, data: bytes) -> None:
        self.bytes_read += len(data)
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            self._keep(data[start:end])
            if newline < 0:
                return
            self._end_line()
            start = newline + 1

    def _keep(self, piece: bytes) -> None:
        if self._over or not piece:
            return
        # A line that follows a marker is kept up to the cap; any other line only as far as it
        # could still be the marker (either with room for trailing "\r"s).
        room = (self._max if self._capture else len(self._MARKER)) + _CR_ROOM - len(self._line)
        if len(piece) > room:
            self._line += piece[:room]
            self._over = True
        else:
            self._line += piece
        self.peak = max(self.peak, len(self._line))

    def _end_line(self) -> None:
        line = bytes(self._line).rstrip(b"\r")
        if self._capture:
            if self._over or len(line) > self._max:
                self.found, self.found_too_long = None, True
            else:
                self.found, self.found_too_long = line, False
        self._take_next = not self._over and line == self._MARKER
        self._capture = self._take_next
        self._line.clear()
        self._over = False

    def finish(self) -> bytes | None:
        """End of the log: the last line counts even without its newline (``split("\\n")``)."""
        if self._capture or self._line:
            self._end_line()
        return self.found


def accept_result_line(line: str | None, summary: ProbeSummary) -> TaskHandlerParsingResult:
    """:func:`accept_result` for a result line already found (:class:`ResultScanner`)."""
    if not summary.ok or summary.result_sha256 is None:
        raise ResultRejected(f"the probe did not succeed: {summary.error or 'no result hash'}")
    if line is None:
        raise ResultRejected("the probe log has no result marker followed by a line")
    digest = sha256_text(line)
    if digest != summary.result_sha256:
        raise ResultRejected(
            f"the logged result hashes to {digest}, the summary says {summary.result_sha256}"
        )
    try:
        return TaskHandlerParsingResult.model_validate_json(line)
    except ValidationError as exc:
        # The hashes agree, so the driver logged this line; a reader still answers a line that is
        # not a result with a rejection, never with another exception (found by tests/fuzz).
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the result"
        raise ResultRejected(
            f"the logged result is not a valid TaskHandlerParsingResult ({where}: "
            f"{' '.join(str(first.get('msg', '')).split())})"
        ) from None


def accept_result(log_text: str, summary: ProbeSummary) -> TaskHandlerParsingResult:
    """The probe's result, only if the summary says ok and the logged line matches its hash."""
    if not summary.ok or summary.result_sha256 is None:
        raise ResultRejected(f"the probe did not succeed: {summary.error or 'no result hash'}")
    # Split on "\n" only, as the kubelet does: splitlines() also breaks at U+2028 and friends.
    return accept_result_line(find_result_line(log_text.split("\n")), summary)
