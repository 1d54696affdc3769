"""Shared output for benchmarks: an aligned table on stdout and a JSON file of results.

Every benchmark compares against a baseline measured in the same run, so results
are ratios that survive a noisy, shared machine better than absolute times.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

# THOP_BENCH_RESULTS lets the smoke test write elsewhere than the real results.
RESULTS_DIR = Path(
    os.environ.get("THOP_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"
)

T = TypeVar("T")


def timed(action: Callable[[], T], repeat: int = 1) -> tuple[float, T]:
    """Median wall time of ``repeat`` runs of ``action`` (seconds) and the last result."""
    times: list[float] = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def ratio(baseline: float, ours: float) -> float:
    """How many times faster ``ours`` is than ``baseline`` (inf when ours rounds to zero)."""
    return baseline / ours if ours > 0 else float("inf")


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value == float("inf"):
            return "inf"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.4f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Print ``rows`` as an aligned table; numbers right-aligned."""
    if not rows:
        return
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [
        all(
            isinstance(row.get(c), int | float) and not isinstance(row.get(c), bool) for row in rows
        )
        for c in columns
    ]
    if title:
        print(title)
    print(
        "  ".join(
            c.rjust(w) if n else c.ljust(w)
            for c, w, n in zip(columns, widths, numeric, strict=True)
        )
    )
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print(
            "  ".join(
                v.rjust(w) if n else v.ljust(w)
                for v, w, n in zip(row, widths, numeric, strict=True)
            )
        )


def write_json(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` plus run metadata to ``<RESULTS_DIR>/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        **payload,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path
