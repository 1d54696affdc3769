"""controller/report.py: the status and Events a pass' observation gives (pure, no cluster).

Real passes (the reconcile steps with in-memory ports from tests/unit/reconcile/test_steps.py)
produce the outcomes; errors are the ones the steps and the syncer raise.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from taskhandler_operator.controller.report import (
    Observation,
    bundle_status,
    internal_error,
    previous_status,
    probing_status,
    transition_events,
)
from taskhandler_operator.controller.syncing import SourceSyncFailed
from taskhandler_operator.db.claims import BundleClaimed
from taskhandler_operator.db.engine import DatabaseUnavailable
from taskhandler_operator.kube.conditions import Reasoned, status_unchanged
from taskhandler_operator.kube.status import ConditionStatus, TaskHandlerBundleStatus
from taskhandler_operator.reconcile.errors import DatabaseFailed, OwnershipConflict
from taskhandler_operator.reconcile.local import LocalFolderSyncer
from taskhandler_operator.reconcile.steps import PassOutcome, PassPorts, run_pass
from taskhandler_operator.records import BundleOwner
from tests.unit.reconcile.test_steps import SPEC, FakeProber, FakeStore, etl, handler
from tests.unit.reconcile.test_steps import bundle as bundle  # the fixture: three artifacts

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def cond(status: TaskHandlerBundleStatus, type_: str) -> tuple[str, str]:
    found = next(c for c in status.conditions if c.type == type_)
    return found.status.value, found.reason


def types(status: TaskHandlerBundleStatus) -> set[str]:
    return {c.type for c in status.conditions}


async def a_pass(bundle: Path, answers: dict[str, object]) -> PassOutcome:
    prober = FakeProber(answers)  # type: ignore[arg-type]
    return await run_pass(
        SPEC, PassPorts(LocalFolderSyncer(bundle), prober, FakeStore(etl("extract", "load")))
    )


ANSWERS: dict[str, object] = {
    "extract.min.mjs": {"etl": [handler("extract")]},
    "load.min.mjs": {"etl": [handler("load")]},
}


@pytest.fixture
async def good(bundle: Path) -> PassOutcome:
    (bundle / "broken.min.mjs").unlink()  # every artifact answers
    return await a_pass(bundle, ANSWERS)


@pytest.fixture
async def one_refused(bundle: Path) -> PassOutcome:
    return await a_pass(bundle, ANSWERS)


def ready(
    outcome: PassOutcome, *, now: datetime = T0, generation: int = 1
) -> TaskHandlerBundleStatus:
    return bundle_status(TaskHandlerBundleStatus(), Observation(generation, now, outcome=outcome))


async def test_a_good_pass_is_ready_with_counts_and_announces_revision_and_bindings(
    good: PassOutcome,
) -> None:
    status = ready(good)
    revision = good.summary.revision
    assert (status.revision, status.published_revision, status.observed_generation) == (
        revision,
        revision,
        1,
    )
    assert cond(status, "Ready") == ("True", "Succeeded")
    assert "Reconciling" not in types(status) and "Stalled" not in types(status)
    assert cond(status, "SourceReady") == ("True", "Synced")
    assert cond(status, "ArtifactsProbed") == ("True", "Probed")
    assert cond(status, "BindingsPublished") == ("True", "Published")
    assert (status.counts.candidates, status.counts.probed, status.counts.bindings) == (2, 2, 2)
    ready_message = next(c for c in status.conditions if c.type == "Ready").message
    handlers = status.counts.handlers
    noun = "task handler" if handlers == 1 else "task handlers"
    assert ready_message == f"2 bindings of {handlers} {noun} at revision {revision}"
    events = transition_events(TaskHandlerBundleStatus(), status)
    assert [(e.type, e.reason) for e in events] == [
        ("Normal", "NewRevision"),
        ("Normal", "BindingsPublished"),
    ]


async def test_a_refused_artifact_is_named_while_the_others_are_published(
    one_refused: PassOutcome,
) -> None:
    status = ready(one_refused)
    assert cond(status, "ArtifactsProbed") == ("False", "ArtifactsFailed")
    assert cond(status, "BindingsPublished") == ("True", "Published")
    assert cond(status, "Ready") == ("False", "ArtifactsFailed")
    # Only a new artifact can fix it: Stalled (kstatus Failed), not retrying forever.
    assert cond(status, "Stalled") == ("True", "ArtifactsFailed")
    assert "Reconciling" not in types(status)
    assert (status.counts.candidates, status.counts.bindings, status.counts.rejected) == (3, 2, 1)
    assert [(a.path, a.state.value) for a in status.artifacts if a.reason] == [
        ("broken.min.mjs", "Rejected")
    ]
    events = transition_events(TaskHandlerBundleStatus(), status)
    assert [(e.type, e.reason) for e in events] == [
        ("Normal", "NewRevision"),
        ("Warning", "ArtifactRejected"),
        ("Normal", "BindingsPublished"),
    ]
    assert (
        transition_events(status, bundle_status(status, Observation(1, T0, outcome=one_refused)))
        == []
    )


async def test_the_same_observation_again_changes_nothing_and_posts_no_event(
    good: PassOutcome,
) -> None:
    first = ready(good)
    # A later pass (a minute on) that sees the same: conditions keep their transition times.
    again = bundle_status(first, Observation(1, T0 + timedelta(minutes=1), outcome=good))
    assert status_unchanged(first.to_body(), again)
    assert transition_events(first, again) == []


async def test_a_source_failure_keeps_the_revision_counts_and_lists_and_is_announced_once(
    good: PassOutcome,
) -> None:
    before = ready(good)
    failure = SourceSyncFailed(
        "git fetch: authentication failed for the Secret's username",
        reason="AuthenticationFailed",
        kind="auth",
        retryable=True,
    )
    later = T0 + timedelta(minutes=5)
    failed = bundle_status(before, Observation(1, later, error=failure))
    assert cond(failed, "SourceReady") == ("False", "AuthenticationFailed")
    assert cond(failed, "Ready")[0] == "False"
    assert (failed.revision, failed.published_revision) == (before.revision, before.revision)
    assert failed.counts == before.counts and failed.artifacts == before.artifacts
    [event] = transition_events(before, failed)
    assert (event.type, event.reason) == ("Warning", "AuthenticationFailed")
    assert "authentication failed" in event.note

    # The same failure on the retry: nothing new to write, no second Event.
    again = bundle_status(failed, Observation(1, later + timedelta(seconds=30), error=failure))
    assert status_unchanged(failed.to_body(), again)
    assert transition_events(failed, again) == []

    # Recovery at the same revision: Ready again, no NewRevision, bindings not re-announced.
    healed = bundle_status(again, Observation(1, later + timedelta(minutes=1), outcome=good))
    assert cond(healed, "SourceReady") == ("True", "Synced")
    assert cond(healed, "Ready")[0] == "True"
    assert [e.reason for e in transition_events(again, healed)] == []


async def test_a_database_outage_after_the_sync_names_the_database_not_the_source(
    good: PassOutcome,
) -> None:
    before = ready(good)
    error = DatabaseFailed("write", DatabaseUnavailable("connection refused"))
    seen = Observation(1, T0 + timedelta(minutes=1), error=error, synced_revision="git:next")
    failed = bundle_status(before, seen)
    assert cond(failed, "BindingsPublished") == ("False", error.reason)
    assert error.reason == "DatabaseUnavailable"
    assert cond(failed, "SourceReady") == ("True", "Synced")
    assert cond(failed, "Ready")[0] == "False"
    # Synced to the new revision, but what is published is still the last good one.
    assert (failed.revision, failed.published_revision) == ("git:next", before.revision)
    assert failed.counts == before.counts
    assert [(e.type, e.reason) for e in transition_events(before, failed)] == [
        ("Normal", "NewRevision"),
        ("Warning", "DatabaseUnavailable"),
    ]


async def test_a_conflict_stalls_with_its_reason_once(good: PassOutcome) -> None:
    before = ready(good)
    owner = BundleOwner(cluster_id="c1", namespace="team-a", name="ts", uid="uid-0")
    conflict = OwnershipConflict("write", BundleClaimed("ts", owner, T0))
    stalled = bundle_status(before, Observation(1, T0, error=conflict))
    assert cond(stalled, "Stalled") == ("True", "BundleNameConflict")
    assert cond(stalled, "Ready") == ("False", "BundleNameConflict")
    assert "Reconciling" not in types(stalled)
    assert [e.reason for e in transition_events(before, stalled)] == ["BundleNameConflict"]
    assert (
        transition_events(stalled, bundle_status(stalled, Observation(1, T0, error=conflict))) == []
    )


def test_an_invalid_spec_stalls_and_a_suspended_bundle_keeps_its_status() -> None:
    why = Reasoned("InvalidSpec", "spec.interval: not a duration")
    stalled = bundle_status(TaskHandlerBundleStatus(), Observation(2, T0, stalled=why))
    assert cond(stalled, "Stalled") == ("True", "InvalidSpec")
    assert stalled.observed_generation == 2
    suspended = bundle_status(stalled, Observation(3, T0, suspended=True, requested_at="r1"))
    assert suspended.conditions == stalled.conditions
    assert (suspended.observed_generation, suspended.last_handled_reconcile_at) == (3, "r1")


def test_an_unreadable_stored_status_starts_empty() -> None:
    assert previous_status({"conditions": "not a list"}) == TaskHandlerBundleStatus()
    assert previous_status(None) == TaskHandlerBundleStatus()
    assert not status_unchanged({"conditions": "not a list"}, TaskHandlerBundleStatus())
    assert ConditionStatus.TRUE.value == "True"


async def test_a_probe_failing_for_a_reason_outside_the_artifact_retries(bundle: Path) -> None:
    (bundle / "broken.min.mjs").unlink()
    outcome = await a_pass(bundle, ANSWERS | {"load.min.mjs": "the pod is gone"})
    # The prober marked it retryable (a lost pod), as JobProber does for TRANSIENT reasons.
    failures = tuple(dataclasses.replace(f, retryable=True) for f in outcome.probed.failures)
    outcome = dataclasses.replace(
        outcome, probed=dataclasses.replace(outcome.probed, failures=failures)
    )
    status = ready(outcome)
    assert cond(status, "ArtifactsProbed") == ("False", "ProbesRetrying")
    assert cond(status, "Reconciling") == ("True", "ProgressingWithRetry")
    assert "Stalled" not in types(status)
    assert "load.min.mjs" in next(c for c in status.conditions if c.type == "Ready").message
    # Its Event is the artifact's own (ProbeFailed), not the condition's.
    reasons = [e.reason for e in transition_events(TaskHandlerBundleStatus(), status)]
    assert "ProbesRetrying" not in reasons and "ProbeFailed" in reasons


async def test_the_probing_status_is_reconciling_and_the_final_one_drops_it(
    good: PassOutcome,
) -> None:
    before = ready(good)
    seen = Observation(1, T0 + timedelta(minutes=1), synced_revision="git:next")
    probing = probing_status(before, seen, ["extract.min.mjs"])
    assert cond(probing, "Reconciling") == ("True", "Probing")
    assert cond(probing, "Ready") == ("Unknown", "Probing")
    assert cond(probing, "SourceReady") == ("True", "Synced")
    assert probing.revision == "git:next" and probing.published_revision == before.revision
    reconciling = next(c for c in probing.conditions if c.type == "Reconciling")
    assert (
        reconciling.message == "probing 1 artifact of revision git:next in Jobs (extract.min.mjs)"
    )
    states = {a.path: a.state.value for a in probing.artifacts}
    assert states == {"extract.min.mjs": "Probing", "load.min.mjs": "Probed"}
    assert [e.reason for e in transition_events(before, probing)] == ["NewRevision"]
    done = bundle_status(probing, Observation(1, T0 + timedelta(minutes=2), outcome=good))
    assert "Reconciling" not in types(done) and cond(done, "Ready") == ("True", "Succeeded")


async def test_a_failed_pass_is_an_internal_error_retried_with_the_last_picture_kept(
    good: PassOutcome,
) -> None:
    before = ready(good)
    why = internal_error(RuntimeError("boom\nsecond line"))
    assert why.reason == "InternalError"
    assert why.message.startswith("RuntimeError: boom; retried with back-off")
    failed = bundle_status(before, Observation(1, T0 + timedelta(minutes=1), failed=why))
    assert cond(failed, "Ready") == ("False", "InternalError")
    assert cond(failed, "Reconciling") == ("True", "ProgressingWithRetry")
    assert cond(failed, "BindingsPublished") == ("True", "Published")
    assert failed.counts == before.counts
    [event] = transition_events(before, failed)
    assert (event.type, event.reason) == ("Warning", "InternalError")
    assert transition_events(failed, bundle_status(failed, Observation(1, T0, failed=why))) == []


async def test_a_failed_dag_bundle_check_is_an_internal_error_on_its_condition_only(
    good: PassOutcome,
) -> None:
    why = internal_error(ValueError("column dag_bundle.version does not exist"))
    status = bundle_status(
        TaskHandlerBundleStatus(), Observation(1, T0, outcome=good, dag_bundle_error=why)
    )
    assert cond(status, "DagBundleInSync") == ("Unknown", "InternalError")
    assert cond(status, "Ready") == ("True", "Succeeded")  # informational, as when it works


async def test_the_short_revision_and_the_queues_kubectl_get_shows(good: PassOutcome) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    seen = Observation(
        1, T0, outcome=good, source_revision=f"main@sha1:{commit}", queues=("go", "go-fast")
    )
    status = bundle_status(TaskHandlerBundleStatus(), seen)
    assert status.revision == good.summary.revision  # the full id stays
    assert (status.short_revision, status.queues) == ("main@sha1:01234567", "go,go-fast")
    body = status.to_body()
    assert (body["shortRevision"], body["queues"]) == ("main@sha1:01234567", "go,go-fast")

    # A later pass that saw no source spelling (a mid-pass write) keeps the short form of the
    # same revision; a new revision without one shows the id's first 8 characters.
    kept = bundle_status(status, Observation(1, T0, synced_revision=status.revision))
    assert (kept.short_revision, kept.queues) == ("main@sha1:01234567", "go,go-fast")
    new = bundle_status(status, Observation(1, T0, synced_revision="fedcba9876543210-abc"))
    assert new.short_revision == "fedcba98"

    # Suspended: nothing is reconciled, but the queues follow the spec.
    suspended = bundle_status(status, Observation(2, T0, suspended=True, queues=("go",)))
    assert (suspended.short_revision, suspended.queues) == ("main@sha1:01234567", "go")


async def test_only_a_kept_pass_leaves_the_pass_key_and_a_kept_status_stands(
    good: PassOutcome,
) -> None:
    key = "k1:" + "a" * 64
    status = ready(dataclasses.replace(good, key=key))
    assert status.pass_key == key and status.to_body()["passKey"] == key
    # A new process's first pass with the same key: nothing to write, no Event.
    kept = bundle_status(status, Observation(1, T0 + timedelta(minutes=5), kept=True))
    assert kept.pass_key == key and status_unchanged(status.to_body(), kept)
    assert transition_events(status, kept) == []
    # A pass that wrote (no key), a failure, a probe under way: the key goes.
    assert ready(good).pass_key is None
    failed = bundle_status(
        status, Observation(1, T0, error=DatabaseFailed("plan", DatabaseUnavailable("down")))
    )
    assert failed.pass_key is None and "passKey" not in failed.to_body()
    seen = Observation(1, T0, synced_revision=good.summary.revision)
    assert probing_status(status, seen, ["load.min.mjs"]).pass_key is None
