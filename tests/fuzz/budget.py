"""The fuzzing budget and the memory bound every target is held to.

``THOP_FUZZ_EXAMPLES`` sets the examples per target (default 2,000: 7 to 20 times the unit
tests' property budgets); there is no per-example deadline, since a slow example is reported by
the run time, not failed on a noisy machine. Each example runs under :func:`bounded_memory`.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("THOP_FUZZ_EXAMPLES", "2000"))
# Far above what any target needs for inputs of these sizes (a few MiB), far below what an
# unbounded expansion (an alias chain, a claimed 4 GiB allocation) would take.
MAX_PEAK_BYTES = 64 * 1024 * 1024

settings.register_profile(
    "fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
FUZZ = settings.get_profile("fuzz")


@contextmanager
def bounded_memory(limit: int = MAX_PEAK_BYTES) -> Iterator[None]:
    """Fail when the Python allocations inside the block peak above ``limit`` bytes."""
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak {peak} bytes, bound {limit}"
