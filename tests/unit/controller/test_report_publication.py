"""controller/report.py with publication under control: the history in status, a held change,
a rollback, and their Events (pure; real pass outcomes, the publication part set by hand as
the write path reports it)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from taskhandler_operator.controller.bundle import (
    BundleInputs,
    annotation_managers,
    slim_managed_fields,
)
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.controller.report import Observation, bundle_status, transition_events
from taskhandler_operator.kube.conditions import STALLS
from taskhandler_operator.kube.status import TaskHandlerBundleStatus
from taskhandler_operator.publication.changes import BindingRow, compute_change
from taskhandler_operator.publication.history import Publication, PublishOutcome, Refusal
from taskhandler_operator.reconcile.steps import PassOutcome
from tests.unit.controller.test_report import ANSWERS, a_pass, cond, types
from tests.unit.reconcile.test_steps import bundle as bundle  # the fixture: three artifacts

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
REMOVAL = compute_change(
    [BindingRow(dag_id="etl", task_id="load", artifact_path="load.min.mjs")], []
)
ADDITION = compute_change([], [BindingRow(dag_id="etl", task_id="new", artifact_path="x.mjs")])


@pytest.fixture
async def good(bundle: Path) -> PassOutcome:
    (bundle / "broken.min.mjs").unlink()
    return await a_pass(bundle, ANSWERS)


def with_publication(outcome: PassOutcome, publication: PublishOutcome) -> PassOutcome:
    written = outcome.written.model_copy(update={"publication": publication})
    return dataclasses.replace(outcome, written=written)


def recorded(kind: str, revision: str, **fields: object) -> Publication:
    return Publication.model_validate(
        {"id": 1, "bundle_name": "b", "kind": kind, "revision": revision, "recorded_at": T0}
        | fields
    )


def held(outcome: PassOutcome, refused: Refusal | None = None) -> PassOutcome:
    revision = outcome.summary.revision
    return with_publication(
        outcome,
        PublishOutcome(
            pending=recorded("held", revision, counts=REMOVAL.counts()),
            pending_change=REMOVAL.summary(5),
            held_reason="publish policy NoRemoval holds a change that removes the binding "
            "of etl/load",
            refused=refused,
        ),
    )


async def test_a_publication_is_listed_and_announced_once(good: PassOutcome) -> None:
    outcome = with_publication(
        good,
        PublishOutcome(
            recorded=recorded("published", "r1", counts=ADDITION.counts()),
            change=ADDITION.summary(5),
        ),
    )
    status = bundle_status(TaskHandlerBundleStatus(), Observation(1, T0, outcome=outcome))
    assert [(p.kind, p.revision, p.counts.added) for p in status.publications] == [
        ("published", "r1", 1)
    ]
    assert status.pending_change is None
    events = transition_events(TaskHandlerBundleStatus(), status)
    changed = [e for e in events if e.reason == "BindingsChanged"]
    assert [e.note for e in changed] == ["published, revision r1: 1 added: added etl/new: x.mjs"]
    again = bundle_status(status, Observation(1, T0, outcome=outcome))
    assert again.publications == status.publications  # the same outcome kept: not listed twice
    assert not [e for e in transition_events(status, again) if e.reason == "BindingsChanged"]


async def test_a_held_change_stalls_with_the_change_and_keeps_the_published_revision(
    good: PassOutcome,
) -> None:
    before = TaskHandlerBundleStatus(published_revision="r0")
    status = bundle_status(before, Observation(1, T0, outcome=held(good)))
    assert cond(status, "BindingsPublished") == ("False", "PublishHeld")
    assert cond(status, "Ready") == ("False", "PublishHeld")
    assert cond(status, "Stalled") == ("True", "PublishHeld")  # a person must approve
    assert "Reconciling" not in types(status)
    message = next(c.message for c in status.conditions if c.type == "BindingsPublished")
    assert "removed etl/load" in message and "langsdk.dev/approve-revision=" in message
    assert status.published_revision == "r0"
    pending = status.pending_change
    assert pending is not None and pending.counts.removed == 1
    assert pending.first == ["removed etl/load: was load.min.mjs"]
    assert "PublishHeld" in STALLS

    refusal = Refusal(reason="ApprovalRefused", message="approval of revision r9 refused")
    refused = bundle_status(status, Observation(1, T0, outcome=held(good, refusal)))
    events = transition_events(status, refused)
    assert [(e.type, e.reason, e.note) for e in events] == [
        ("Warning", "ApprovalRefused", "approval of revision r9 refused")
    ]


async def test_a_rollback_is_reported_and_a_refused_one_stalls(good: PassOutcome) -> None:
    rolled = with_publication(
        good,
        PublishOutcome(
            recorded=recorded("rolled_back", "r1", approved_by="kubectl-annotate"),
            change=REMOVAL.summary(5),
            rolled_back_to="r1",
        ),
    )
    status = bundle_status(TaskHandlerBundleStatus(), Observation(1, T0, outcome=rolled))
    assert cond(status, "BindingsPublished") == ("True", "RolledBack")
    assert status.published_revision == "r1"
    assert status.publications[0].approved_by == "kubectl-annotate"
    note = next(
        e.note
        for e in transition_events(TaskHandlerBundleStatus(), status)
        if e.reason == "BindingsChanged"
    )
    assert note.startswith("rolled back by kubectl-annotate, revision r1: 1 removed")

    refusal = Refusal(reason="RollbackRefused", message="rollback to revision r0 refused")
    failed = with_publication(good, PublishOutcome(refused=refusal, held_reason=refusal.message))
    status = bundle_status(TaskHandlerBundleStatus(), Observation(1, T0, outcome=failed))
    assert cond(status, "BindingsPublished") == ("False", "RollbackRefused")
    assert cond(status, "Stalled") == ("True", "RollbackRefused")
    events = transition_events(TaskHandlerBundleStatus(), status)
    assert ("Warning", "RollbackRefused") in [(e.type, e.reason) for e in events]

    # Refused while a change is held: one Event, the rollback's, not an approval's.
    with_held = bundle_status(TaskHandlerBundleStatus(), Observation(1, T0, outcome=held(good)))
    refused_held = bundle_status(with_held, Observation(1, T0, outcome=held(good, refusal)))
    assert cond(refused_held, "BindingsPublished") == ("False", "RollbackRefused")
    reasons = [(e.type, e.reason) for e in transition_events(with_held, refused_held)]
    assert reasons == [("Warning", "RollbackRefused")]


def test_who_set_an_annotation_is_the_newest_manager_owning_it() -> None:
    key = "langsdk.dev/approve-revision"

    def entry(manager: str, time: str, *keys: str) -> dict[str, object]:
        owned: dict[str, object] = {f"f:{k}": {} for k in keys}
        return {
            "manager": manager,
            "time": time,
            "fieldsV1": {"f:metadata": {"f:annotations": owned}},
        }

    fields = [
        entry("kubectl-client-side-apply", "2026-03-01T10:00:00Z", key, "other"),
        entry("kubectl-annotate", "2026-03-01T11:00:00Z", key),
        entry("kopf", "2026-03-01T12:00:00Z", "kopf.langsdk.dev/last"),
    ]
    assert annotation_managers(fields, [key, "langsdk.dev/rollback-to"]) == {
        key: "kubectl-annotate"
    }
    body = {
        "metadata": {
            "name": "b",
            "namespace": "ns",
            "annotations": {key: " r2 "},
            "managedFields": fields,
        }
    }
    assert BundleInputs.from_body(body).publish_control() == ("r2", "kubectl-annotate", None)


def test_the_kept_managed_fields_name_the_same_managers() -> None:
    approve, rollback = "langsdk.dev/approve-revision", "langsdk.dev/rollback-to"
    status_fields: dict[str, Any] = {
        "f:status": {"f:artifacts": {}, "f:conditions": {'k:{"type":"Ready"}': {}}}
    }
    fields: list[Any] = [
        {
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "time": "2026-03-01T10:00:00Z",
            "fieldsV1": {
                "f:metadata": {"f:annotations": {f"f:{approve}": {}, "f:other": {}}},
                "f:spec": {"f:bundleName": {}},
            },
        },
        {
            "manager": "taskhandler-operator",
            "operation": "Update",
            "subresource": "status",
            "time": "2026-03-01T10:30:00Z",
            "fieldsV1": status_fields,
        },
        {
            "manager": "kubectl-annotate",
            "time": "2026-03-01T11:00:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{rollback}": {}}}},
        },
        {"manager": "kopf", "time": "2026-03-01T12:00:00Z", "fieldsV1": {"f:metadata": {}}},
        "not an entry",
    ]
    before = annotation_managers(fields, [approve, rollback])
    meta: dict[str, Any] = {"name": "b", "managedFields": fields}
    slim_managed_fields(meta)
    assert (
        annotation_managers(meta["managedFields"], [approve, rollback])
        == before
        == {
            approve: "kubectl-client-side-apply",
            rollback: "kubectl-annotate",
        }
    )
    # Only the entries owning a control annotation stay, and only with those keys.
    assert meta["managedFields"] == [
        {
            "manager": "kubectl-client-side-apply",
            "time": "2026-03-01T10:00:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{approve}": {}}}},
        },
        {
            "manager": "kubectl-annotate",
            "time": "2026-03-01T11:00:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{rollback}": {}}}},
        },
    ]
    untouched: dict[str, object] = {"name": "b"}
    slim_managed_fields(untouched)
    assert untouched == {"name": "b"}


def test_the_publication_metrics_have_the_names_the_chart_alerts_on() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.count_publication("ns", "b", "approved")
    metrics.set_publication_held("ns", "b", 1700000000.0)
    r = metrics.registry
    labels = {"namespace": "ns", "name": "b"}
    total = "taskhandler_operator_publications_total"
    assert r.get_sample_value(total, {**labels, "kind": "approved"}) == 1
    assert r.get_sample_value("taskhandler_operator_publication_held", labels) == 1
    since = "taskhandler_operator_publication_held_since_timestamp_seconds"
    assert r.get_sample_value(since, labels) == 1700000000.0
    metrics.set_publication_held("ns", "b", None)
    assert r.get_sample_value("taskhandler_operator_publication_held", labels) == 0
    assert r.get_sample_value(since, labels) == 0
    metrics.remove_bundle("ns", "b")
    assert r.get_sample_value("taskhandler_operator_publication_held", labels) is None


async def test_a_held_change_counts_the_bindings_still_published(good: PassOutcome) -> None:
    outcome = held(good)
    written = outcome.written.model_copy(
        update={
            "publication": outcome.written.publication.model_copy(  # type: ignore[union-attr]
                update={"published_bindings": 0}
            )
        }
    )
    status = bundle_status(
        TaskHandlerBundleStatus(),
        Observation(1, T0, outcome=dataclasses.replace(outcome, written=written)),
    )
    assert good.summary.counts.bindings == 2 and status.counts.bindings == 0
