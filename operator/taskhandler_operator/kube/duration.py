"""Go-style durations (``30s``, ``5m``, ``1h30m``, ``1.5h``), as Flux and ``kubectl`` write them.

The CRD checks the same grammar with a CEL rule (``duration()`` is Go's ``time.ParseDuration``),
so the apiserver and the operator agree on what a duration is.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

from taskhandler_operator.kube.markers import Cel, cel_string

__all__ = ["DURATION_MESSAGE", "DURATION_PATTERN", "Duration", "parse_duration"]

# A subset of Go's grammar: no sign, no ns/us units (nothing here needs them).
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DURATION_MESSAGE = "must be a positive duration such as 30s, 5m or 1h30m (units h, m, s, ms)"
MAX_DURATION_CHARS = 32

_WHOLE = re.compile(DURATION_PATTERN)
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> timedelta:
    """``"1h30m"`` → 90 minutes; ``ValueError`` (with :data:`DURATION_MESSAGE`) otherwise."""
    if not _WHOLE.fullmatch(text):
        raise ValueError(DURATION_MESSAGE)
    seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
    if seconds <= 0:
        raise ValueError(DURATION_MESSAGE)
    return timedelta(seconds=seconds)


def _check(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[
    str,
    StringConstraints(max_length=MAX_DURATION_CHARS),
    AfterValidator(_check),
    Cel(
        f"self.matches({cel_string(DURATION_PATTERN)}) && duration(self) > duration('0s')",
        DURATION_MESSAGE,
    ),
]
"""A positive Go duration string; :func:`parse_duration` turns it into a ``timedelta``."""
