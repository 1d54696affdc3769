"""The scale-out benchmark's pure parts (``benchmarks/_scaleout.py``): passes per bundle read from
the operator's own metrics exposition, which operator reconciled which bundle, and the verdicts
of the phase's targets."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from benchmarks._scaleout import (
    coverage,
    passes_by_bundle,
    rows,
    single_cpu_per_second,
    summarize,
    window_seconds,
)
from prometheus_client import generate_latest

from taskhandler_operator.controller.metrics import Metrics


def test_passes_by_bundle_sums_outcomes_of_one_namespace() -> None:
    # The exposition of the operator's real metric families, not a hand-written text.
    metrics = Metrics()
    metrics.observe_reconcile("bench", "a", "ok", 0.01)
    metrics.observe_reconcile("bench", "a", "ok", 0.02)
    metrics.observe_reconcile("bench", "a", "error", 0.5)
    metrics.observe_reconcile("bench", "b", "ok", 0.01)
    metrics.observe_reconcile("other", "a", "ok", 0.01)
    text = generate_latest(metrics.registry).decode()
    assert passes_by_bundle(text, "bench") == {"a": 3.0, "b": 1.0}
    assert passes_by_bundle(text, "missing") == {}


def test_coverage_counts_bundles_by_both_none_and_the_other_shard() -> None:
    window = {
        "": {"a": 2.0, "b": 1.0, "d": 1.0},
        "b": {"b": 1.0, "c": 1.0, "e": 1.0},
    }
    expected = {"a": "", "b": "", "c": "b", "d": "b", "e": "b", "f": "b"}
    got = coverage(list(expected), window, expected)
    assert got["bundles"] == 6
    assert got["by_more_than_one"] == 1 and got["examples"]["more_than_one"] == ["b"]
    assert got["by_none"] == 1 and got["examples"]["none"] == ["f"]
    assert got["by_the_other_shard"] == 1 and got["examples"]["other_shard"] == ["d"]
    # a, c, e (d was reconciled by exactly one operator, the wrong one: counted apart too).
    assert got["by_exactly_one"] == 4


def test_coverage_of_one_shard_that_saw_everything() -> None:
    names = ["a", "b"]
    got = coverage(names, {"": {"a": 1.0, "b": 3.0}}, dict.fromkeys(names, ""))
    assert (got["by_exactly_one"], got["by_more_than_one"], got["by_none"]) == (2, 0, 0)


def _result(one_mib: float, default_mib: float, b_mib: float, base_mib: float) -> dict[str, Any]:
    def config(shards: dict[str, float], cpu: float, passes: float) -> dict[str, Any]:
        return {
            "first_passes_seconds": 60.0,
            "passes": passes,
            "apiserver_requests_per_pass": 0.002,
            "coverage": {
                "bundles": 2000,
                "by_exactly_one": 2000,
                "by_more_than_one": 0,
                "by_none": 0,
                "by_the_other_shard": 0,
            },
            "shards": {
                shard: {"cpu_per_second": cpu, "peak_rss_mib": mib} for shard, mib in shards.items()
            },
        }

    return {
        "bundles": 2000,
        "artifacts_per_bundle": 5,
        "interval": "60s",
        "base": {"peak_rss_mib": base_mib},
        "one_shard": config({"default": one_mib}, 0.5, 3000),
        "two_shards": config({"default": default_mib, "b": b_mib}, 0.24, 3000),
    }


def test_rss_is_judged_above_the_base_and_the_whole_process_ratio_is_only_printed() -> None:
    # The figures of the 2026-12-03 08:49 run with a base of 120 MiB: each shard's whole-process
    # ratio is above 0.55 (207/350, 237/350), the part above the base is not (87/230, 117/230).
    got = summarize(_result(350.0, 207.0, 237.0, 120.0))
    assert got["ratios"]["default"]["rss"] == 0.591
    assert got["ratios"]["default"]["rss_above_base"] == 0.378
    assert got["ratios"]["b"]["rss_above_base"] == 0.509
    assert got["ok"]["rss"] is True and got["ok"]["cpu"] is True
    table = {row["measure"].split(": ", 1)[1]: row for row in rows(got)}
    judged = table["peak RSS per shard above the base, 2 shards vs 1"]
    assert judged["result"] == "PASS"
    assert "default 87 MiB = 0.38x" in judged["measured"] and "base 120 MiB" in judged["measured"]
    whole = table["peak RSS per shard, whole process, 2 shards vs 1"]
    assert whole["result"] == "-" and "default 207 MiB = 0.59x" in whole["measured"]


def test_rss_above_the_base_fails_when_a_shard_keeps_most_of_the_share() -> None:
    got = summarize(_result(350.0, 207.0, 300.0, 120.0))
    assert got["ratios"]["b"]["rss_above_base"] == 0.783
    assert got["ok"]["rss"] is False
    # A single shard no bigger than the base has no share to divide: no ratio, no PASS.
    flat = summarize(_result(120.0, 110.0, 110.0, 120.0))
    assert flat["ratios"]["default"]["rss_above_base"] is None and flat["ok"]["rss"] is False


def test_cpu_is_read_against_the_mean_of_the_single_shard_before_and_after() -> None:
    # A B A: the single shard at 0.5 CPU-s per second before the two shards and 0.6 after
    # (a machine slowing down); the shards' 0.3 is 0.55x of the mean 0.55, not 0.6x of 0.5.
    result = _result(350.0, 207.0, 237.0, 120.0)
    for shard in result["two_shards"]["shards"].values():
        shard["cpu_per_second"] = 0.3025
    result["one_shard_again"] = copy.deepcopy(result["one_shard"])
    result["one_shard_again"]["shards"]["default"]["cpu_per_second"] = 0.6
    assert single_cpu_per_second(result) == 0.55
    got = summarize(result)
    assert got["ratios"]["default"]["cpu"] == 0.55 and got["ok"]["cpu"] is True
    table = {row["measure"].split(": ", 1)[1]: row for row in rows(got)}
    cpu = table["CPU per second per shard, 2 shards vs 1"]
    assert cpu["result"] == "PASS"
    assert "(one shard 0.500 before, 0.600 after: mean 0.550)" in cpu["measured"]
    # Against the first window alone it would fail: the mean is what the target reads.
    del result["one_shard_again"]
    alone = summarize(result)
    assert alone["ratios"]["default"]["cpu"] == 0.605 and alone["ok"]["cpu"] is False
    assert "(one shard 0.500)" in rows(alone)[0]["measured"]


def test_the_default_window_is_a_whole_number_of_intervals() -> None:
    # 1.5 intervals let a bundle's phase decide whether it passes once or twice in the window.
    args = argparse.Namespace(scaleout_window=None, scaleout_interval="60s")
    assert window_seconds(args) == 120.0
    assert window_seconds(argparse.Namespace(scaleout_window=15.0, scaleout_interval="60s")) == 15
