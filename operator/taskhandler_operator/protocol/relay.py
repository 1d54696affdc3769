"""Relaying the runtime's output (logs channel, stdout, stderr) into the driver's log, bounded.

A runtime is untrusted: it can write endless lines or endless volume. Memory stays bounded by
one line (:class:`LineSplitter` cuts long lines) and output by a shared budget
(:class:`RelayBudget`): past it, lines are still read — so the runtime never blocks on a full
socket — but dropped and counted.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from taskhandler_operator.limits import MAX_RELAYED_EVENT_CHARS
from taskhandler_operator.protocol.eventlog import EventLog, Level

__all__ = [
    "LineSplitter",
    "RelayBudget",
    "RelayLimits",
    "describe_line",
    "relay_stream",
]

READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class RelayLimits:
    max_line_bytes: int = 16 * 1024
    max_total_bytes: int = 1024 * 1024
    max_lines: int = 10_000


@dataclass(slots=True)
class RelayBudget:
    """What has been relayed and dropped so far, across every source of one probe."""

    limits: RelayLimits = field(default_factory=RelayLimits)
    relayed_lines: int = 0
    relayed_bytes: int = 0
    dropped_lines: int = 0
    truncated_lines: int = 0

    def admit(self, size: int) -> bool:
        if (
            self.relayed_lines >= self.limits.max_lines
            or self.relayed_bytes + size > self.limits.max_total_bytes
        ):
            self.dropped_lines += 1
            return False
        self.relayed_lines += 1
        self.relayed_bytes += size
        return True


class LineSplitter:
    """Splits a byte stream into newline-terminated lines of at most ``max_line_bytes``.

    A longer line is emitted cut (flagged ``truncated``) as soon as it reaches the limit, and
    the rest of it, up to the next newline, is discarded.
    """

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        lines: list[tuple[bytes, bool]] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            if not self._discarding:
                room = self._max - len(self._buffer)
                if end - start > room:
                    self._buffer += data[start : start + room]
                    lines.append((self._take(), True))
                    self._discarding = True
                else:
                    self._buffer += data[start:end]
            if newline < 0:
                break
            if self._discarding:
                self._discarding = False
            else:
                lines.append((self._take(), False))
            start = newline + 1
        return lines

    def finish(self) -> list[tuple[bytes, bool]]:
        """The unterminated last line, if any."""
        if self._discarding or not self._buffer:
            self._discarding = False
            self._buffer.clear()
            return []
        return [(self._take(), False)]

    def _take(self) -> bytes:
        line = bytes(self._buffer).removesuffix(b"\r")
        self._buffer.clear()
        return line


_LEVELS: dict[str, Level] = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "notice": "info",
    "warn": "warning",
    "warning": "warning",
    "error": "error",
    "exception": "error",
    "critical": "error",
    "fatal": "error",
}


def _level_of(value: object) -> Level:
    if isinstance(value, str):
        return _LEVELS.get(value.strip().lower(), "info")
    if isinstance(value, int) and not isinstance(value, bool):
        # Python logging numbers: 10 debug, 20 info, 30 warning, 40+ error.
        if value >= 40:
            return "error"
        if value >= 30:
            return "warning"
        if value >= 20:
            return "info"
        return "debug"
    return "info"


def describe_line(source: str, line: bytes, truncated: bool) -> tuple[Level, str, dict[str, Any]]:
    """The driver log entry (level, event, fields) for one line of runtime output.

    On the logs channel a line is a JSON object with at least ``event`` and usually ``level``;
    anything else (and all of stdout/stderr) is relayed as text.
    """
    text = line.decode("utf-8", errors="replace")
    fields: dict[str, Any] = {"source": f"runtime.{source}"}
    if truncated:
        fields["truncated"] = True
    if source == "logs" and not truncated:
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            record = None
        if isinstance(record, dict):
            event = record.get("event")
            event_text = (
                str(event)[:MAX_RELAYED_EVENT_CHARS] if event is not None else "runtime log"
            )
            fields["record"] = record
            return _level_of(record.get("level")), event_text, fields
    fields["line"] = text
    return "info", f"runtime {source}", fields


def relay_line(log: EventLog, budget: RelayBudget, source: str, line: bytes, cut: bool) -> None:
    if cut:
        budget.truncated_lines += 1
    if not budget.admit(len(line)):
        if budget.dropped_lines == 1:
            log.warning(
                "runtime output exceeds the relay budget; further lines are dropped",
                max_total_bytes=budget.limits.max_total_bytes,
                max_lines=budget.limits.max_lines,
            )
        return
    level, event, fields = describe_line(source, line, cut)
    log.emit(level, event, **fields)


async def relay_stream(
    reader: asyncio.StreamReader, source: str, log: EventLog, budget: RelayBudget
) -> None:
    """Relay ``reader`` until end of stream (or a reset); cancel it to stop earlier."""
    splitter = LineSplitter(budget.limits.max_line_bytes)
    while True:
        try:
            data = await reader.read(READ_CHUNK)
        except (ConnectionError, OSError):
            break
        if not data:
            break
        for line, cut in splitter.feed(data):
            relay_line(log, budget, source, line, cut)
    for line, cut in splitter.finish():
        relay_line(log, budget, source, line, cut)
