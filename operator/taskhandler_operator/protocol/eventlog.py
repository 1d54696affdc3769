"""Structured log of the probe driver: one JSON object per line.

Every line carries ``timestamp`` (UTC, RFC 3339), ``level`` and ``event``; other fields follow.
The driver writes from one thread only, so lines never interleave; the result marker and the
result line are written through the same stream for that reason (see ``driver.RESULT_MARKER``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

__all__ = ["EventLog", "Level"]

Level = Literal["debug", "info", "warning", "error"]


class EventLog:
    def __init__(self, stream: TextIO, *, min_level: Level = "debug") -> None:
        self._stream = stream
        self._min_rank = _RANK[min_level]

    def emit(self, level: Level, event: str, **fields: Any) -> None:
        if _RANK[level] < self._min_rank:
            return
        record: dict[str, Any] = {
            "timestamp": datetime.now(UTC).isoformat(timespec="microseconds"),
            "level": level,
            "event": event,
        }
        record.update(fields)
        self.write_lines(json.dumps(record, ensure_ascii=False, default=str))

    def debug(self, event: str, **fields: Any) -> None:
        self.emit("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self.emit("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.emit("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.emit("error", event, **fields)

    def write_lines(self, *lines: str) -> None:
        """Write raw lines in one call (kept adjacent in the stream) and flush."""
        self._stream.write("".join(f"{line}\n" for line in lines))
        self._stream.flush()


_RANK: dict[str, int] = {"debug": 10, "info": 20, "warning": 30, "error": 40}
