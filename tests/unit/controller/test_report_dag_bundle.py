"""The informational DagBundleInSync condition: its Warning Event on drift transitions only,
and it never takes part in Ready."""

from __future__ import annotations

from datetime import UTC, datetime

from taskhandler_operator.controller.report import transition_events
from taskhandler_operator.kube.conditions import set_condition, summarize
from taskhandler_operator.kube.status import (
    Condition,
    ConditionStatus,
    ConditionType,
    TaskHandlerBundleStatus,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
T, S = ConditionType, ConditionStatus


def status(
    reason: str | None, message: str = "m", *, healthy: bool = True
) -> TaskHandlerBundleStatus:
    conditions: list[Condition] = []
    for type_ in (T.SOURCE_READY, T.ARTIFACTS_PROBED, T.BINDINGS_PUBLISHED):
        conditions = set_condition(
            conditions, type_, S.TRUE if healthy else S.FALSE, "Ok", "ok", generation=1, now=NOW
        )
    if reason is not None:
        flag = S.TRUE if reason == "InSync" else S.FALSE
        conditions = set_condition(
            conditions, T.DAG_BUNDLE_IN_SYNC, flag, reason, message, generation=1, now=NOW
        )
    conditions = summarize(conditions, generation=1, now=NOW)
    return TaskHandlerBundleStatus(conditions=conditions)


def drift_events(old: TaskHandlerBundleStatus, new: TaskHandlerBundleStatus) -> list[str]:
    return [e.type for e in transition_events(old, new) if e.reason == "DagBundleDrift"]


def test_drift_warns_when_it_starts_or_its_versions_change_only() -> None:
    assert drift_events(status("InSync"), status("Drift", "a vs b")) == ["Warning"]
    assert drift_events(status(None), status("Drift", "a vs b")) == ["Warning"]
    assert drift_events(status("Drift", "a vs b"), status("Drift", "a vs b")) == []
    assert drift_events(status("Drift", "a vs b"), status("Drift", "a vs c")) == ["Warning"]
    assert drift_events(status("Drift", "a vs b"), status("InSync")) == []
    assert drift_events(status("InSync"), status("UnknownDagBundle")) == []


def test_dag_bundle_condition_never_changes_ready() -> None:
    for reason in ("Drift", "UnknownDagBundle", "InSync"):
        ready = next(c for c in status(reason).conditions if c.type == T.READY)
        assert ready.status == S.TRUE, reason
