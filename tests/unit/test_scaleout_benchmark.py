"""The scale-out benchmark's pure parts (``benchmarks/_scaleout.py``): passes per bundle read from
the operator's own metrics exposition, and which operator reconciled which bundle."""

from __future__ import annotations

from benchmarks._scaleout import coverage, passes_by_bundle
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
