"""The sizing table's arithmetic (``benchmarks/sizing.py``): slopes solved from a benchmark
result's shape, and the rules that turn them into shards and resource settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import sizing


def _scaleout(cpu_one: float, cpu_halves: tuple[float, float]) -> dict[str, Any]:
    return {
        "bundles": 2000,
        "interval": "60s",
        "one_shard": {"shards": {"default": {"cpu_per_second": cpu_one, "cpu_ms_per_pass": 12.5}}},
        "two_shards": {
            "shards": {
                "default": {"cpu_per_second": cpu_halves[0]},
                "b": {"cpu_per_second": cpu_halves[1]},
            }
        },
    }


def test_cpu_model_solves_pass_cost_and_base_from_one_shard_and_two() -> None:
    # p = 10 ms, c0 = 0.05 cores: 2,000 bundles at 60 s are 33.3 passes/s.
    p, c0 = 0.010, 0.05
    one = c0 + 2000 / 60 * p
    half = c0 + 1000 / 60 * p
    got_p, got_c0, how = sizing.cpu_model(_scaleout(one, (half - 0.01, half + 0.01)))
    assert got_p == pytest.approx(p)
    assert got_c0 == pytest.approx(c0)
    assert how.startswith("solved")


def test_cpu_model_reads_the_single_shard_as_the_target_does() -> None:
    # With a second single-shard window (A B A) the phase records the mean of both, and the
    # model solves from that mean, not from the first window alone.
    p, c0 = 0.010, 0.05
    one = c0 + 2000 / 60 * p
    half = c0 + 1000 / 60 * p
    scaleout = _scaleout(one - 0.04, (half, half))
    scaleout["one_shard_cpu_per_second"] = one
    got_p, got_c0, _ = sizing.cpu_model(scaleout)
    assert got_p == pytest.approx(p)
    assert got_c0 == pytest.approx(c0)


def test_cpu_model_falls_back_when_the_halves_cost_more_than_the_whole() -> None:
    got_p, got_c0, how = sizing.cpu_model(_scaleout(0.30, (0.31, 0.33)))
    assert (got_p, got_c0) == (0.0125, 0.0)
    assert "single shard" in how


def test_memory_model_is_the_line_through_two_sets() -> None:
    m0, m = sizing.memory_model(
        {"bundles": 1000, "artifacts_per_bundle": 20, "peak_rss_mib": 250.0},
        {"bundles": 100, "artifacts_per_bundle": 20, "peak_rss_mib": 142.0},
    )
    assert m == pytest.approx(0.12)
    assert m0 == pytest.approx(130.0)
    with pytest.raises(ValueError):
        sizing.memory_model(
            {"bundles": 1000, "artifacts_per_bundle": 20, "peak_rss_mib": 250.0},
            {"bundles": 100, "artifacts_per_bundle": 40, "peak_rss_mib": 142.0},
        )


def test_shards_keep_each_under_the_bundle_and_core_limits() -> None:
    model = sizing.Model(0.010, 0.05, 130.0, 0.12, "test")
    # 10,000 at 5 min: 0.05 + 2,000/300 * 0.01 = 0.117 cores; the bundle limit decides.
    assert sizing.shards_for(model, 10000, 300) == 5
    # 2,000 at 1 min: one shard would need 0.38 cores, under the limit.
    assert sizing.shards_for(model, 2000, 60) == 1
    # 10,000 at 1 min: 0.05 + n/60 * 0.01 <= 0.5 needs n <= 2,700; the 2,000 limit is tighter.
    assert sizing.shards_for(model, 10000, 60) == 5
    slow = sizing.Model(0.030, 0.05, 130.0, 0.12, "test")
    # 0.05 + n/60 * 0.03 <= 0.5 needs n <= 900: 2,000 bundles need 3 shards of 667.
    assert sizing.shards_for(slow, 2000, 60) == 3


def test_rows_round_requests_up_and_keep_the_charts_floors() -> None:
    model = sizing.Model(0.010, 0.05, 130.0, 0.12, "test")
    small, big = sizing.rows(model, [(500, 300), (2000, 300)])
    # 130 + 60 = 190 MiB: under the chart's 256Mi request, which stays; 0.067 cores -> 100m.
    assert small["memory request / limit"] == "256Mi / 1024Mi"
    assert small["CPU request"] == "100m"
    # 130 + 240 = 370 MiB -> 384Mi; 0.05 + 0.0667 = 0.117 cores -> 150m.
    assert big["peak RSS per shard"] == "370 MiB"
    assert big["memory request / limit"] == "384Mi / 1024Mi"
    assert big["CPU request"] == "150m"
    assert sizing.markdown([small]).splitlines()[2].startswith("| 500 | 5 min | 1 | 500 |")


def test_main_prints_the_table_of_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = 0.05 + 1000 / 60 * 0.010
    run = {
        "steady": {"bundles": 1000, "artifacts_per_bundle": 20, "peak_rss_mib": 250.0},
        "steady_base": {"bundles": 100, "artifacts_per_bundle": 20, "peak_rss_mib": 142.0},
        "scaleout": _scaleout(0.05 + 2000 / 60 * 0.010, (half, half)),
    }
    path = tmp_path / "operator.json"
    path.write_text(json.dumps(run))
    assert sizing.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "p = 10.00 ms per pass, c0 = 0.050 cores" in out
    assert "| 10,000 | 1 min | 5 | 2,000 |" in out
    path.write_text(json.dumps({"steady": run["steady"]}))
    assert sizing.main([str(path)]) == 2
