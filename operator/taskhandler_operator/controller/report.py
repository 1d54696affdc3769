"""From what a pass observed to the bundle's status and its Events (pure; no I/O).

:func:`bundle_status` rewrites the status whole from one observation: the pass' summary (or the
error that stopped it) plus the previous status, whose revision, published revision, counts and
lists are kept when this pass could not observe them (a source or database outage keeps the last
good picture, as the bindings in the database stay too). :func:`transition_events` compares the
old and new status and names the Events worth posting: only transitions, never one per pass.

Condition reasons (docs/operator.md lists them with what to do):

* ``SourceReady``: ``Synced``; or the sources package's reason (``AuthenticationFailed``,
  ``NotFound``, ``SourceTimeout``, ...), ``SecretNotFound``, ``SecretUnreadable``,
  ``ListingFailed``.
* ``ArtifactsProbed``: ``Probed``; ``ArtifactsFailed`` (some artifact's probe failed for a
  reason of its own or it was refused: stalls), ``ProbesRetrying`` (some artifact's probe failed
  for a reason outside it and is retried after a back-off), ``ProberFailed``.
* ``BindingsPublished``: ``Published``; ``StubsUnbound`` (a stub on the bundle's queues has no
  binding), ``DatabaseUnavailable``/``TransactionConflict``/``DatabaseError``; ``PublishHeld``
  (the publish policy holds the change: ``status.pendingChange``), ``RolledBack`` (the
  rollback annotation keeps an earlier publication; True when nothing else waits),
  ``RollbackRefused``. A publication is listed in ``status.publications`` and announced by a
  ``BindingsChanged`` Event; an approval naming another revision by ``ApprovalRefused``.
* ``Stalled``: ``BundleNameConflict``, ``QueueConflict``, ``InvalidSpec``, and the reason of
  the False domain conditions when each of them needs a person (``kube/conditions.py:
  STALLS``).
* ``Reconciling``: ``Probing`` while the pass's probe Jobs run (:func:`probing_status`),
  ``ProgressingWithRetry`` while a failure is retried; ``Ready=False`` ``InternalError`` when
  the pass itself failed (``Observation.failed``).
* ``DagBundleInSync`` (informational, never part of ``Ready``): ``InSync``, ``UnknownDagBundle``,
  ``Drift`` (both revisions in the message; a Warning event when it starts or the pair changes),
  ``VersionUnknown`` (:mod:`taskhandler_operator.db.dag_bundle`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from taskhandler_operator.db.dag_bundle import DagBundleSync
from taskhandler_operator.kube import names
from taskhandler_operator.kube.conditions import (
    DOMAIN_CONDITIONS,
    EventReason,
    Reason,
    Reasoned,
    set_condition,
    summarize,
)
from taskhandler_operator.kube.probe_job import ProbeFailure
from taskhandler_operator.kube.status import (
    MAX_PUBLICATIONS,
    ArtifactState,
    ArtifactStatus,
    ChangeCountsStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Counts,
    PendingChangeStatus,
    Problem,
    PublicationStatus,
    TaskHandlerBundleStatus,
    short_revision,
    status_artifacts,
    status_problems,
)
from taskhandler_operator.publication.changes import ChangeCounts, ChangeSummary
from taskhandler_operator.publication.history import PublishOutcome
from taskhandler_operator.reconcile.errors import OwnershipConflict, PassError
from taskhandler_operator.reconcile.steps import PassOutcome

__all__ = [
    "EventSpec",
    "Observation",
    "bundle_status",
    "internal_error",
    "previous_status",
    "probing_status",
    "published_bindings",
    "transition_events",
]

T = ConditionType
S = ConditionStatus


@dataclass(frozen=True)
class Observation:
    """What one pass of one bundle saw."""

    generation: int
    now: datetime
    outcome: PassOutcome | None = None
    error: PassError | None = None
    stalled: Reasoned | None = None  # invalid spec: nothing was attempted
    suspended: bool = False
    codes: Mapping[str, str] = field(default_factory=dict)  # rel_path -> failure reason
    requested_at: str | None = None
    # The revision the sync step returned when a later step failed.
    synced_revision: str | None = None
    # The source's own spelling of the synced revision (``main@sha1:<commit>``): the short
    # revision kubectl get shows is cut from it.
    source_revision: str | None = None
    # spec.queues of the generation observed (None: unknown, the stored list stays).
    queues: Sequence[str] | None = None
    # Airflow's DagBundle compared with the published revision (None: not read this pass).
    dag_bundle: DagBundleSync | None = None
    # The DagBundle check itself failed unexpectedly (DagBundleInSync Unknown, InternalError).
    dag_bundle_error: Reasoned | None = None
    # Work of this pass under way (Reconciling=True, e.g. Probing); written mid-pass.
    progressing: Reasoned | None = None
    # The pass failed outside any step (Ready=False, InternalError; retried with back-off).
    failed: Reasoned | None = None
    # The pass's inputs gave the key stored with the status (``StatusKept``): it stands.
    kept: bool = False


def previous_status(body: Mapping[str, Any] | None) -> TaskHandlerBundleStatus:
    """The stored status as a model; an unreadable one (another version wrote it) is empty."""
    try:
        return TaskHandlerBundleStatus.model_validate(body or {})
    except ValidationError:
        return TaskHandlerBundleStatus()


def _conflict_reason(error: OwnershipConflict) -> Reason:
    if error.reason == "QueueClaimed":
        return Reason.QUEUE_CONFLICT
    return Reason.BUNDLE_NAME_CONFLICT


def bundle_status(old: TaskHandlerBundleStatus, seen: Observation) -> TaskHandlerBundleStatus:
    gen, now = seen.generation, seen.now
    conditions: list[Condition] = list(old.conditions)
    update: dict[str, Any] = {"observed_generation": gen}
    if seen.requested_at is not None:
        update["last_handled_reconcile_at"] = seen.requested_at
    if seen.queues is not None:
        # kubectl get prints a list as JSON (["go","java"]); a plain string reads better.
        update["queues"] = ",".join(seen.queues)

    def revised(revision: str) -> None:
        update["revision"] = revision
        if seen.source_revision is not None:
            update["short_revision"] = short_revision(revision, seen.source_revision)
        elif revision != old.revision or old.short_revision is None:
            update["short_revision"] = short_revision(revision)

    def put(type_: T, status: S, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(
            conditions, type_, status, reason, message, generation=gen, now=now
        )

    stalled: Reasoned | None = seen.stalled
    if seen.suspended:
        # Nothing is done: the status stays as the last pass left it (Flux keeps Ready too).
        return old.model_copy(update=update)

    error = seen.error
    if isinstance(error, OwnershipConflict):
        stalled = Reasoned(_conflict_reason(error), error.message)
    elif error is not None:
        message = error.message
        if error.step == "sync" or error.component == "source":
            put(T.SOURCE_READY, S.FALSE, error.reason, message)
        elif error.step == "probe":
            put(T.ARTIFACTS_PROBED, S.FALSE, error.reason, message)
        else:  # plan, validate, write: the database (or an internal error)
            put(T.BINDINGS_PUBLISHED, S.FALSE, error.reason, message)
    outcome = seen.outcome
    ready_message = ""
    # Only a pass that may be kept leaves a key; any other report (a failure, a probe under
    # way) makes the next new process take the whole path.
    update["pass_key"] = outcome.key if outcome is not None else old.pass_key if seen.kept else None
    if seen.kept:
        ready = _cond(old, T.READY)
        ready_message = ready.message if ready is not None else ""
    if outcome is not None:
        summary = outcome.summary
        revision = summary.revision
        revised(revision)
        update["published_revision"] = revision
        put(T.SOURCE_READY, S.TRUE, Reason.SYNCED, f"revision {revision}")
        counts = summary.counts
        broken = counts.failed + counts.rejected
        if broken:
            paths = sorted({i.rel_path for i in summary.artifact_issues if i.kind != "listing"})
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            # A failure outside the artifact (a lost pod, a failed download) is probed again
            # after a back-off: the bundle is still progressing, not stalled.
            retried = sorted(f.rel_path for f in outcome.probed.failures if f.retryable)
            if retried:
                reason, then = (
                    Reason.PROBES_RETRYING,
                    f"; the probe of {', '.join(retried[:3])} failed for a reason outside the "
                    "artifact and is retried after a back-off",
                )
            else:
                reason, then = Reason.ARTIFACTS_FAILED, ""
            put(
                T.ARTIFACTS_PROBED,
                S.FALSE,
                reason,
                f"{broken} of {counts.candidates} artifacts gave no answer ({shown}); see "
                f"status.artifacts for why; the other artifacts' bindings are published{then}",
            )
        else:
            put(
                T.ARTIFACTS_PROBED,
                S.TRUE,
                Reason.PROBED,
                f"{_count(counts.candidates, 'artifact')}: {counts.probed} probed, "
                f"{counts.cached} reused",
            )
        errors = summary.errors
        unbound = [p for p in errors if p.task_id is not None]
        if errors:
            first = errors[0].message
            put(
                T.BINDINGS_PUBLISHED,
                S.FALSE,
                Reason.STUBS_UNBOUND,
                f"{_count(len(errors), 'problem')}, {_count(len(unbound), 'stub')} unbound "
                f"(first: {first}); see "
                "status.problems",
            )
        else:
            put(
                T.BINDINGS_PUBLISHED,
                S.TRUE,
                Reason.PUBLISHED,
                f"{_count(counts.bindings, 'binding')} at revision {revision}",
            )
        publication = outcome.written.publication
        if publication is not None:
            update.update(_publication_update(old, publication, now))
            published = _published_condition(publication, revision, old.published_revision)
            if published is not None:
                status_, reason_, message_, at = published
                put(T.BINDINGS_PUBLISHED, status_, reason_, message_)
                update["published_revision"] = at
        ready_message = (
            f"{_count(published_bindings(outcome), 'binding')} of "
            f"{_count(counts.handlers, 'task handler')} at "
            f"revision {update.get('published_revision', revision)}"
        )
        update["counts"] = Counts(
            candidates=counts.candidates,
            cached=counts.cached,
            probed=counts.probed,
            rejected=counts.rejected,
            failed=counts.failed,
            handlers=counts.handlers,
            bindings=published_bindings(outcome),
            unbound_stubs=len(unbound),
        )
        shown_artifacts, hidden = status_artifacts(_artifacts(outcome, seen.codes))
        update["artifacts"], update["artifacts_omitted"] = shown_artifacts, hidden
        shown_problems, hidden_problems = status_problems(_problems(outcome))
        update["problems"], update["problems_omitted"] = shown_problems, hidden_problems
    elif seen.synced_revision is not None and (error is None or error.step != "sync"):
        # A later step failed, or still runs (probing): the source is fine; the counts and
        # lists of the last good pass stay, as its bindings stay in the database.
        revised(seen.synced_revision)
        put(T.SOURCE_READY, S.TRUE, Reason.SYNCED, f"revision {seen.synced_revision}")
    if seen.dag_bundle is not None and (outcome is not None or seen.kept):
        found = seen.dag_bundle
        put(T.DAG_BUNDLE_IN_SYNC, S(found.status), found.reason, found.message)
    elif seen.dag_bundle_error is not None:
        why = seen.dag_bundle_error
        put(T.DAG_BUNDLE_IN_SYNC, S.UNKNOWN, why.reason, why.message)
    conditions = summarize(
        conditions,
        generation=gen,
        now=now,
        stalled=stalled,
        progressing=seen.progressing,
        failed=seen.failed,
        ready_message=ready_message,
    )
    update["conditions"] = conditions
    return old.model_copy(update=update)


def published_bindings(outcome: PassOutcome) -> int:
    """The binding rows published after the pass: its own, unless a hold or a rollback kept
    others."""
    publication = outcome.written.publication
    if publication is not None and publication.published_bindings is not None:
        return publication.published_bindings
    return outcome.summary.counts.bindings


def _counts_status(counts: ChangeCounts) -> ChangeCountsStatus:
    return ChangeCountsStatus(**counts.model_dump())


def _publication_update(
    old: TaskHandlerBundleStatus, publication: PublishOutcome, now: datetime
) -> dict[str, Any]:
    """``status.publications`` (the newest first) and ``status.pendingChange``."""
    update: dict[str, Any] = {}
    recorded = publication.recorded
    if recorded is not None and recorded.kind != "held":
        item = PublicationStatus(
            kind=recorded.kind,
            revision=recorded.revision,
            published_at=recorded.recorded_at,
            counts=_counts_status(recorded.counts),
            approved_by=recorded.approved_by,
            change=(publication.change or ChangeSummary(counts=recorded.counts)).describe(),
        )
        if not old.publications or old.publications[0] != item:
            update["publications"] = [item, *old.publications][:MAX_PUBLICATIONS]
    pending, change = publication.pending, publication.pending_change
    if pending is not None and change is not None:
        refused = publication.refused
        update["pending_change"] = PendingChangeStatus(
            revision=pending.revision,
            since=pending.recorded_at,
            reason=publication.held_reason or "",
            counts=_counts_status(change.counts),
            first=list(change.first),
            omitted=change.omitted,
            refused=refused.message if refused is not None else None,
        )
    else:
        update["pending_change"] = None
    return update


def _published_condition(
    publication: PublishOutcome, revision: str, last_published: str | None
) -> tuple[S, str, str, str | None] | None:
    """``BindingsPublished`` when the publish control kept this pass's change back (status,
    reason, message, the revision whose bindings are published), or None: as validated."""
    refused = publication.refused
    change = publication.pending_change
    waits = (
        f"the change of revision {revision} waits ({change.describe()})"
        if change is not None
        else "nothing else waits"
    )
    if refused is not None and refused.reason == "RollbackRefused":
        return S.FALSE, Reason.ROLLBACK_REFUSED, f"{refused.message}; {waits}", last_published
    back = publication.rolled_back_to
    if back is not None:
        annotation = names.ANNOTATION_ROLLBACK_TO
        if change is None:
            message = (
                f"rolled back to revision {back} ({annotation}); {waits}; remove the annotation "
                "to follow the source again"
            )
            return S.TRUE, Reason.ROLLED_BACK, message, back
        message = (
            f"rolled back to revision {back} ({annotation}); {waits}; remove the annotation "
            "to publish it"
        )
        return S.FALSE, Reason.ROLLED_BACK, message, back
    if publication.held and change is not None:
        approve = names.ANNOTATION_APPROVE_REVISION
        refusal = f"; {refused.message}" if refused is not None else ""
        message = (
            f"{publication.held_reason or 'held'}; {waits}; the bindings of revision "
            f"{last_published or '(none)'} stay published; annotate {approve}={revision} to "
            f"publish it{refusal}"
        )
        return S.FALSE, Reason.PUBLISH_HELD, message, last_published
    return None


def probing_status(
    old: TaskHandlerBundleStatus, seen: Observation, paths: Sequence[str]
) -> TaskHandlerBundleStatus:
    """The status written when a pass starts probing ``paths`` (``Reconciling=True``,
    ``Probing``): a bundle whose probe Jobs cannot start, or take minutes, says so at once."""
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    noun = "artifact" if len(paths) == 1 else "artifacts"
    revision = seen.synced_revision or "?"
    why = Reasoned(
        Reason.PROBING, f"probing {len(paths)} {noun} of revision {revision} in Jobs ({shown})"
    )
    status = bundle_status(old, dataclasses.replace(seen, progressing=why))
    probing = set(paths)
    # The artifacts being probed show as Probing; the others as the last pass left them.
    kept = [a for a in status.artifacts if a.path not in probing]
    items = [ArtifactStatus(path=p, state=ArtifactState.PROBING) for p in paths]
    shown_artifacts, hidden = status_artifacts([*kept, *items])
    return status.model_copy(update={"artifacts": shown_artifacts, "artifacts_omitted": hidden})


def internal_error(error: BaseException) -> Reasoned:
    """The ``InternalError`` condition for an exception nothing expected: its type and the
    first line of its text (the traceback goes to the log)."""
    text = (str(error).strip().splitlines() or [""])[0]
    name = type(error).__name__
    return Reasoned(
        Reason.INTERNAL_ERROR,
        f"{name}: {text}; retried with back-off (the operator's log has the traceback)"
        if text
        else f"{name}; retried with back-off (the operator's log has the traceback)",
    )


def _artifacts(outcome: PassOutcome, codes: Mapping[str, str]) -> list[ArtifactStatus]:
    # From the summary: a kept outcome (the unchanged pass) no longer holds the answers.
    handlers: dict[str, int] = dict(outcome.summary.handlers_by_path)
    for record in outcome.probed.records:
        artifact = record.artifact
        handlers[artifact.relative_fileloc] = sum(len(d) for d in artifact.task_handlers.values())
    probed = {a.rel_path for a in outcome.probed.accepted}
    items: list[ArtifactStatus] = []
    for candidate, _record in outcome.planned.plan.cached:
        items.append(
            ArtifactStatus(
                path=candidate.rel_path,
                state=ArtifactState.CACHED,
                handlers=handlers.get(candidate.rel_path),
            )
        )
    for rel in sorted(probed):
        items.append(
            ArtifactStatus(path=rel, state=ArtifactState.PROBED, handlers=handlers.get(rel))
        )
    for candidate in outcome.planned.plan.rejected:
        items.append(
            ArtifactStatus(
                path=candidate.rel_path,
                state=ArtifactState.REJECTED,
                reason=ProbeFailure.ARTIFACT_REFUSED,
                message=candidate.error or "unreadable",
            )
        )
    for failure in outcome.probed.failures:
        items.append(
            ArtifactStatus(
                path=failure.rel_path,
                state=ArtifactState.FAILED,
                reason=codes.get(failure.rel_path, ProbeFailure.PROBE_FAILED),
                message=failure.reason,
            )
        )
    return items


def _problems(outcome: PassOutcome) -> list[Problem]:
    out: list[Problem] = []
    for issue in outcome.summary.artifact_issues:
        if issue.kind == "listing":
            out.append(
                Problem(
                    severity="warning",
                    kind="unreadable",
                    artifact=issue.rel_path,
                    message=issue.reason,
                )
            )
    for p in outcome.summary.problems:
        out.append(
            Problem(
                severity=p.severity,
                kind=p.kind,
                dag_id=p.dag_id,
                task_id=p.task_id,
                artifact=p.relative_fileloc,
                message=p.message,
            )
        )
    return out


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    note: str


#: Reasons whose Events are per artifact (ProbeFailed, ArtifactRejected), not the condition's.
_PER_ARTIFACT = frozenset({Reason.ARTIFACTS_FAILED, Reason.PROBES_RETRYING})


def _cond(status: TaskHandlerBundleStatus, type_: T) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _failed(status: TaskHandlerBundleStatus) -> dict[str, ArtifactStatus]:
    return {
        a.path: a
        for a in status.artifacts
        if a.state in (ArtifactState.FAILED, ArtifactState.REJECTED)
    }


def transition_events(
    old: TaskHandlerBundleStatus, new: TaskHandlerBundleStatus
) -> Sequence[EventSpec]:
    """The Events a change from ``old`` to ``new`` deserves (none for an unchanged pass)."""
    events: list[EventSpec] = []
    if new.revision and new.revision != old.revision:
        events.append(
            EventSpec("Normal", EventReason.NEW_REVISION, f"synced revision {new.revision}")
        )
    old_stalled, new_stalled = _cond(old, T.STALLED), _cond(new, T.STALLED)
    # A stall that is a domain condition's reason gets that condition's Event (below).
    domain_false = {
        c.reason
        for t in DOMAIN_CONDITIONS
        if (c := _cond(new, t)) is not None and c.status == S.FALSE
    }
    if (
        new_stalled is not None
        and new_stalled.reason not in domain_false
        and (old_stalled is None or old_stalled.reason != new_stalled.reason)
    ):
        events.append(EventSpec("Warning", new_stalled.reason, new_stalled.message))
    old_ready, new_ready = _cond(old, T.READY), _cond(new, T.READY)
    if (
        new_ready is not None
        and new_ready.reason == Reason.INTERNAL_ERROR
        and Reason.INTERNAL_ERROR not in domain_false
        and (old_ready is None or old_ready.reason != Reason.INTERNAL_ERROR)
    ):
        events.append(EventSpec("Warning", new_ready.reason, new_ready.message))
    for type_ in (T.SOURCE_READY, T.BINDINGS_PUBLISHED, T.ARTIFACTS_PROBED):
        before, after = _cond(old, type_), _cond(new, type_)
        if after is None or after.status != S.FALSE or after.reason in _PER_ARTIFACT:
            continue
        if before is None or before.status != S.FALSE or before.reason != after.reason:
            events.append(EventSpec("Warning", after.reason, after.message))
    drift_before, drift = _cond(old, T.DAG_BUNDLE_IN_SYNC), _cond(new, T.DAG_BUNDLE_IN_SYNC)
    if (
        drift is not None
        and drift.reason == "Drift"
        and (
            drift_before is None
            or (drift_before.reason, drift_before.message) != ("Drift", drift.message)
        )
    ):
        events.append(EventSpec("Warning", EventReason.DAG_BUNDLE_DRIFT, drift.message))
    before_failed = _failed(old)
    for path, item in sorted(_failed(new).items()):
        if path not in before_failed or before_failed[path].message != item.message:
            reason = (
                EventReason.PROBE_FAILED
                if item.state is ArtifactState.FAILED
                else EventReason.ARTIFACT_REJECTED
            )
            events.append(EventSpec("Warning", reason, f"{path}: {item.message or item.reason}"))
    if new.publications and (not old.publications or old.publications[0] != new.publications[0]):
        latest = new.publications[0]
        by = f" by {latest.approved_by}" if latest.approved_by else ""
        events.append(
            EventSpec(
                "Normal",
                EventReason.BINDINGS_CHANGED,
                f"{latest.kind.replace('_', ' ')}{by}, revision {latest.revision}: {latest.change}",
            )
        )
    refused = new.pending_change.refused if new.pending_change is not None else None
    # A refused rollback has its own Event: BindingsPublished's turning RollbackRefused (above).
    published_now = _cond(new, T.BINDINGS_PUBLISHED)
    rollback_refused = published_now is not None and published_now.reason == Reason.ROLLBACK_REFUSED
    if (
        refused
        and not rollback_refused
        and (old.pending_change is None or old.pending_change.refused != refused)
    ):
        events.append(EventSpec("Warning", EventReason.APPROVAL_REFUSED, refused))
    published = _cond(new, T.BINDINGS_PUBLISHED)
    if (
        published is not None
        and published.status == S.TRUE
        and (
            new.published_revision != old.published_revision
            or new.counts.bindings != old.counts.bindings
            or (_cond(old, T.BINDINGS_PUBLISHED) or published).status != S.TRUE
        )
    ):
        events.append(EventSpec("Normal", EventReason.BINDINGS_PUBLISHED, published.message))
    return events


def _count(n: int, noun: str) -> str:
    """``1 problem``, ``2 problems``: status messages are read by people."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
