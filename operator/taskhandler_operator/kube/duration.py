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

__all__ = [
    "DURATION_MESSAGE",
    "DURATION_PATTERN",
    "DURATION_TOO_LONG_MESSAGE",
    "Duration",
    "parse_duration",
]

# A subset of Go's grammar: no sign, no ns/us units (nothing here needs them).
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DURATION_MESSAGE = "must be a positive duration such as 30s, 5m or 1h30m (units h, m, s, ms)"
MAX_DURATION_CHARS = 32
# Go's largest time.Duration, 2^63-1 nanoseconds (about 292 years).
MAX_DURATION_SECONDS = (2**63 - 1) / 1e9
DURATION_TOO_LONG_MESSAGE = "must be a duration of at most 2562047h (Go's largest, about 292 years)"

_WHOLE = re.compile(DURATION_PATTERN)
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> timedelta:
    """``"1h30m"`` → 90 minutes; ``ValueError`` (with :data:`DURATION_MESSAGE`) otherwise."""
    if not _WHOLE.fullmatch(text):
        raise ValueError(DURATION_MESSAGE)
    seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
    if seconds > MAX_DURATION_SECONDS:
        # Go's time.Duration (the CRD's CEL duration()) cannot hold it; neither can timedelta
        # from some length on, which raised OverflowError here (found by tests/fuzz).
        raise ValueError(DURATION_TOO_LONG_MESSAGE)
    delta = timedelta(seconds=seconds)
    # timedelta counts whole microseconds: "0.000000001m" is positive but would become 0, an
    # interval that requeues at once (found by tests/fuzz).
    if delta <= timedelta(0):
        raise ValueError(DURATION_MESSAGE)
    return delta


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
