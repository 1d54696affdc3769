"""The operator benchmark's verdicts for issue 24's targets (pure row builders, no cluster)."""

from __future__ import annotations

from typing import Any

from benchmarks import operator as bench


def steady(cpu_ms: float, passes: float = 100.0) -> dict[str, Any]:
    return {"cpu_ms_per_pass": cpu_ms, "passes": passes}


def test_the_cpu_verdict_is_on_the_ratio_to_the_reference() -> None:
    reference = bench.cpu_reference([bench.REFERENCE_CALIBRATION_MS * 2] * 3)
    # Twice as slow a machine: twice the milliseconds per pass still passes...
    limit_here = 2 * bench.TARGET_CPU_MS
    assert reference["target_ms_here"] == limit_here
    assert bench._cpu_row(steady(limit_here - 1), "1 x 1", reference)["result"] == "PASS"
    # ...where the milliseconds alone would have failed it, and past it the ratio fails.
    assert bench._cpu_row(steady(limit_here - 1), "1 x 1", None)["result"] == "FAIL"
    assert bench._cpu_row(steady(limit_here + 1), "1 x 1", reference)["result"] == "FAIL"
    assert bench._cpu_row(steady(1.0, passes=0), "1 x 1", reference)["result"] == "FAIL"


def test_the_calibration_keeps_20_ms_on_the_calibration_machine() -> None:
    reference = bench.cpu_reference([bench.REFERENCE_CALIBRATION_MS])
    assert reference["target_ms_here"] == bench.TARGET_CPU_MS


def cold(parallelism: int, wall: float, job_s: float = 1.0) -> dict[str, Any]:
    return bench.cold_ratios(
        {"artifacts": 8, "parallelism": parallelism, "wall_seconds": wall, "job_seconds": [2.0]},
        job_s,
    )


def test_the_cold_start_target_applies_where_the_ideal_is_reachable() -> None:
    probe: dict[str, Any] = {
        "cold_start": cold(8, 5.0),
        "cold_start_free_cores": cold(2, 4.5),
        "free_cores": 2,
    }
    # ceil(8/8) x 1 s = 1 s ideal: 5x, no verdict (8 Jobs on 2 cores cannot reach it).
    assert probe["cold_start"]["ratio"] == 5.0
    assert probe["cold_start"]["ratio_to_loaded_job_time"] == 2.5
    over, at_cores = bench._cold_rows(probe)
    assert over["result"] == "-"
    # ceil(8/2) x 1 s = 4 s ideal: 1.125x, within 1.3x.
    assert probe["cold_start_free_cores"]["ratio"] == 1.125
    assert at_cores["result"] == "PASS"
    probe["cold_start_free_cores"] = cold(2, 6.0)
    assert bench._cold_rows(probe)[1]["result"] == "FAIL"
