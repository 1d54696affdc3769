"""Metric families, read back from a private registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from taskhandler_operator.controller.metrics import PREFIX, Metrics


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry(), clock=lambda: 1_700_000_000.0)


def value(metrics: Metrics, metric: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"{PREFIX}_{metric}", labels)


def test_reconcile_histogram_by_bundle_and_outcome(metrics: Metrics) -> None:
    metrics.observe_reconcile("ns", "java", "success", 0.3)
    metrics.observe_reconcile("ns", "java", "success", 12.0)
    metrics.observe_reconcile("ns", "java", "error", 1.0)
    bundle = {"namespace": "ns", "name": "java"}
    assert value(metrics, "reconcile_duration_seconds_count", **bundle, outcome="success") == 2
    assert value(metrics, "reconcile_duration_seconds_sum", **bundle, outcome="success") == 12.3
    assert (
        value(metrics, "reconcile_duration_seconds_bucket", **bundle, outcome="success", le="0.5")
        == 1
    )
    assert value(metrics, "reconcile_duration_seconds_count", **bundle, outcome="error") == 1


def test_counters_and_gauges(metrics: Metrics) -> None:
    metrics.count_probe("ns", "go", "accepted")
    metrics.count_probe("ns", "go", "accepted")
    metrics.count_probe("ns", "go", "timed_out")
    metrics.set_jobs_running("ns", "go", 3)
    metrics.set_bindings("ns", "go", 42)
    metrics.set_ready("ns", "go", True)
    metrics.set_ready("ns", "java", False)
    metrics.mark_synced("ns", "go")
    metrics.count_source_error("ns", "go", "git", "unreachable")
    metrics.count_artifact_request("ok")
    metrics.count_artifact_request("bad_signature")
    metrics.set_leader(True)
    b = {"namespace": "ns", "name": "go"}
    assert value(metrics, "probes_total", **b, outcome="accepted") == 2
    assert value(metrics, "probes_total", **b, outcome="timed_out") == 1
    assert value(metrics, "probe_jobs_running", **b) == 3
    assert value(metrics, "bindings", **b) == 42
    assert value(metrics, "bundle_ready", **b) == 1
    assert value(metrics, "bundle_ready", namespace="ns", name="java") == 0
    assert value(metrics, "last_successful_sync_timestamp_seconds", **b) == 1_700_000_000.0
    assert value(metrics, "source_errors_total", **b, source="git", kind="unreachable") == 1
    assert value(metrics, "artifact_server_requests_total", outcome="ok") == 1
    assert value(metrics, "artifact_server_requests_total", outcome="bad_signature") == 1
    assert value(metrics, "leader", shard="default") == 1
    metrics.set_leader(False)
    assert value(metrics, "leader", shard="default") == 0


def test_leader_gauge_names_its_shard_before_the_first_election() -> None:
    # A standby that never led still reports 0 for its shard, so an alert grouping
    # by (namespace, shard) sees every shard.
    metrics = Metrics(CollectorRegistry(), shard="team-a")
    assert 'taskhandler_operator_leader{shard="team-a"} 0.0' in (
        generate_latest(metrics.registry).decode()
    )
    metrics.set_leader(True)
    assert value(metrics, "leader", shard="team-a") == 1


def test_remove_bundle_drops_only_that_bundles_series(metrics: Metrics) -> None:
    for name in ("gone", "kept"):
        metrics.observe_reconcile("ns", name, "success", 1)
        metrics.observe_reconcile("ns", name, "error", 1)
        metrics.count_probe("ns", name, "failed")
        metrics.set_jobs_running("ns", name, 1)
        metrics.set_bindings("ns", name, 5)
        metrics.mark_synced("ns", name)
        metrics.count_source_error("ns", name, "s3", "auth")
    metrics.observe_reconcile("other", "gone", "success", 1)  # same name, other namespace
    metrics.remove_bundle("ns", "gone")
    text = generate_latest(metrics.registry).decode()
    assert 'name="gone",namespace="ns"' not in text
    assert text.count('name="kept",namespace="ns"') > 7
    assert 'name="gone",namespace="other"' in text


def test_two_instances_do_not_collide() -> None:
    # Each operator in a test process has its own registry, so creating two is fine.
    Metrics()
    Metrics()


@pytest.mark.parametrize("outcome", ["", "Error", "connection refused by 10.0.0.1", "x" * 33])
def test_free_text_label_values_are_refused(metrics: Metrics, outcome: str) -> None:
    with pytest.raises(ValueError, match="short snake_case word"):
        metrics.count_probe("ns", "go", outcome)
    with pytest.raises(ValueError, match="short snake_case word"):
        metrics.count_source_error("ns", "go", "git", outcome)


def test_exposition_names(metrics: Metrics) -> None:
    metrics.observe_reconcile("ns", "x", "success", 1)
    metrics.count_probe("ns", "x", "accepted")
    metrics.count_artifact_request("ok")
    text = generate_latest(metrics.registry).decode()
    for name in (
        "taskhandler_operator_reconcile_duration_seconds_bucket",
        "taskhandler_operator_probes_total",
        "taskhandler_operator_artifact_server_requests_total",
        "# TYPE taskhandler_operator_probe_jobs_running gauge",
        "# TYPE taskhandler_operator_bindings gauge",
        "# TYPE taskhandler_operator_last_successful_sync_timestamp_seconds gauge",
        "# TYPE taskhandler_operator_source_errors_total counter",
        "# TYPE taskhandler_operator_leader gauge",
    ):
        assert name in text


def test_tracked_entries_are_read_at_each_scrape(metrics: Metrics) -> None:
    sizes = {"wakeups": 3}
    metrics.track("wakeups", lambda: sizes["wakeups"])
    metrics.set_ready("ns", "a", True)
    metrics.set_bindings("ns", "a", 1)
    metrics.set_ready("ns", "b", True)
    assert metrics.bundle_series() == 3
    assert 'taskhandler_operator_tracked_entries{structure="wakeups"} 3.0' in (
        generate_latest(metrics.registry).decode()
    )
    sizes["wakeups"] = 0
    metrics.remove_bundle("ns", "a")
    metrics.remove_bundle("ns", "b")
    assert metrics.bundle_series() == 0
    assert 'taskhandler_operator_tracked_entries{structure="wakeups"} 0.0' in (
        generate_latest(metrics.registry).decode()
    )
