"""kstatus conditions: set, merge, summarize, and tell whether a status changed (pure).

The reconcile steps set the domain conditions (``SourceReady``, ``ArtifactsProbed``,
``BindingsPublished``); :func:`summarize` then derives the three kstatus conditions from them,
the way Flux's summarizer does (operator-anchors §1.3), so that kstatus (``status.Compute`` of
sigs.k8s.io/cli-utils, which Flux, Argo CD and GitOps health checks read) tells the truth:

* ``Stalled`` (abnormal-true, present only when True): the bundle cannot progress without a
  human. Either the caller says so (a conflict, an invalid spec), or every False domain
  condition's reason is one that :data:`STALLS` (unbound stubs, refused artifacts, a permanent
  source or database refusal). ``Ready`` is False with the same reason; ``Reconciling`` is
  removed. kstatus: ``Failed``.
* ``Reconciling`` (abnormal-true): work is under way (``progressing`` given, e.g. ``Probing``
  while probe Jobs run), or a False domain condition's reason is one that retries
  (``ProgressingWithRetry``), or the pass itself failed and is retried (``failed`` given).
  kstatus: ``InProgress``.
* ``Ready``: False with the reason of the first False domain condition (or of ``failed``);
  Unknown while progressing or while a domain condition is missing or Unknown; True
  (``Succeeded``) when all three domain conditions are True. kstatus: ``Current``.

Which reasons stall and which retry is one table (:data:`STALLS`, :data:`RETRIES`, plus the
sources package's errors by their ``permanent`` flag); docs/operator.md shows it and a unit
test fails when the two disagree. A reason in neither (a new one) retries: ``InProgress`` is
the safe answer when nobody decided.

``lastTransitionTime`` changes only when a condition's status flips, so an unchanged pass
produces an identical list, and :func:`status_unchanged` lets the caller skip the write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from taskhandler_operator.kube.status import (
    Condition,
    ConditionStatus,
    ConditionType,
    TaskHandlerBundleStatus,
)
from taskhandler_operator.sources import errors as source_errors

__all__ = [
    "DOMAIN_CONDITIONS",
    "RETRIES",
    "STALLS",
    "EventReason",
    "Reason",
    "Reasoned",
    "find_condition",
    "remove_condition",
    "set_condition",
    "stalls",
    "status_unchanged",
    "summarize",
]

DOMAIN_CONDITIONS = (
    ConditionType.SOURCE_READY,
    ConditionType.ARTIFACTS_PROBED,
    ConditionType.BINDINGS_PUBLISHED,
)
_ORDER = {t.value: i for i, t in enumerate(ConditionType)}


class Reason(StrEnum):
    """Every condition reason the operator writes, but for two families kept with their cause.

    A failed sync's reason is its ``SourceError`` subclass' ``reason``
    (:mod:`taskhandler_operator.sources.errors`); ``DagBundleInSync``'s is
    :data:`taskhandler_operator.db.dag_bundle.SyncReason`. docs/operations.md's troubleshooting
    table lists each with its fix; a unit test fails when the two disagree.
    """

    # Ready and Reconciling: written by summarize itself.
    SUCCEEDED = "Succeeded"
    PROGRESSING = "Progressing"
    PROGRESSING_WITH_RETRY = "ProgressingWithRetry"
    # Reconciling (Ready Unknown): probe Jobs of this pass are being created or awaited.
    PROBING = "Probing"
    # SourceReady.
    SYNCED = "Synced"
    SOURCE_UNAVAILABLE = "SourceUnavailable"
    SECRET_NOT_FOUND = "SecretNotFound"  # noqa: S105 - a reason, not a secret
    SECRET_UNREADABLE = "SecretUnreadable"  # noqa: S105 - a reason, not a secret
    LISTING_FAILED = "ListingFailed"
    # ArtifactsProbed.
    PROBED = "Probed"
    ARTIFACTS_FAILED = "ArtifactsFailed"
    PROBES_RETRYING = "ProbesRetrying"
    PROBER_FAILED = "ProberFailed"
    # BindingsPublished.
    PUBLISHED = "Published"
    STUBS_UNBOUND = "StubsUnbound"
    DATABASE_UNAVAILABLE = "DatabaseUnavailable"
    TRANSACTION_CONFLICT = "TransactionConflict"
    DATABASE_ERROR = "DatabaseError"
    INTERNAL_ERROR = "InternalError"
    # BindingsPublished False: the publish policy holds the change until it is approved; a
    # rollback keeps the bundle at an earlier publication; a rollback could not be done.
    PUBLISH_HELD = "PublishHeld"
    ROLLED_BACK = "RolledBack"
    ROLLBACK_REFUSED = "RollbackRefused"
    # Any of the three, by the step that ran out of time.
    PASS_TIMED_OUT = "PassTimedOut"  # noqa: S105 - a reason, not a secret
    # Never published: a deposed replica writes no status (reconcile/errors.py).
    LEADER_DEPOSED = "LeaderDeposed"
    # Stalled (Ready False with the same reason).
    INVALID_SPEC = "InvalidSpec"
    BUNDLE_NAME_CONFLICT = "BundleNameConflict"
    QUEUE_CONFLICT = "QueueConflict"


#: False-condition reasons only a person can fix: the bundle is ``Stalled`` (kstatus
#: ``Failed``) while every False domain condition has one of them. The operator still looks
#: again at its interval and on every change (spec, Dag, artifact), and heals by itself once
#: the cause is fixed.
STALLS: frozenset[str] = frozenset(
    {
        Reason.ARTIFACTS_FAILED,  # every failed artifact failed for a reason of its own
        Reason.STUBS_UNBOUND,  # a Dag or an artifact must change
        Reason.DATABASE_ERROR,  # refused: a grant, a missing database or schema
        Reason.INVALID_SPEC,
        Reason.BUNDLE_NAME_CONFLICT,
        Reason.QUEUE_CONFLICT,
        # A hold waits for a person (an approval, or a revision that needs none): nothing a
        # retry could change, so kstatus says Failed rather than InProgress forever, and a
        # GitOps health gate stops at once with the change in the message.
        Reason.PUBLISH_HELD,
        Reason.ROLLED_BACK,  # held at the rollback's revision until the annotation goes
        Reason.ROLLBACK_REFUSED,  # the annotation names what cannot be restored
    }
)
#: False-condition reasons the operator retries with back-off (``Reconciling=True``,
#: ``ProgressingWithRetry``; kstatus ``InProgress``): the cause may go away by itself.
RETRIES: frozenset[str] = frozenset(
    {
        Reason.SOURCE_UNAVAILABLE,
        Reason.SECRET_NOT_FOUND,  # GitOps may apply the Secret after the bundle
        Reason.SECRET_UNREADABLE,  # an API error reading it
        Reason.LISTING_FAILED,
        Reason.PROBES_RETRYING,  # an artifact's probe failed for a reason outside it
        Reason.PROBER_FAILED,
        Reason.DATABASE_UNAVAILABLE,
        Reason.TRANSACTION_CONFLICT,
        Reason.INTERNAL_ERROR,
        Reason.PASS_TIMED_OUT,  # the pass ran past its deadline: tried again with back-off
        Reason.LEADER_DEPOSED,  # never published: the new leader carries on
    }
)


def _source_reasons() -> dict[str, bool]:
    """The sources package's reasons, each with whether it stalls (its ``permanent`` flag)."""
    found: dict[str, bool] = {}
    pending: list[type[source_errors.SourceError]] = [source_errors.SourceError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == source_errors.__name__:  # not a test's subclass
            found[cls.reason] = cls.permanent
    return found


_SOURCE_STALLS = frozenset(reason for reason, permanent in _source_reasons().items() if permanent)


def stalls(reason: str) -> bool:
    """Whether a False condition with ``reason`` needs a person (see :data:`STALLS`)."""
    return reason in STALLS or reason in _SOURCE_STALLS


class EventReason(StrEnum):
    """Reasons of the Events that report something other than a condition turning False (such
    an Event takes the condition's reason)."""

    NEW_REVISION = "NewRevision"
    BINDINGS_PUBLISHED = "BindingsPublished"
    # A publication changed the bindings (the note names the change); an approval annotation
    # that did not match the pending change.
    BINDINGS_CHANGED = "BindingsChanged"
    APPROVAL_REFUSED = "ApprovalRefused"
    DAG_BUNDLE_DRIFT = "DagBundleDrift"
    PROBE_FAILED = "ProbeFailed"
    ARTIFACT_REJECTED = "ArtifactRejected"
    # Ownership: a gone holder's claim taken over; a deletion's database cleanup failed/skipped.
    CLAIM_TAKEN_OVER = "ClaimTakenOver"
    CLEANUP_FAILED = "CleanupFailed"
    CLEANUP_SKIPPED = "CleanupSkipped"


@dataclass(frozen=True)
class Reasoned:
    """A reason (one CamelCase word) and a message for people."""

    reason: str
    message: str


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def _sorted(conditions: Iterable[Condition]) -> list[Condition]:
    # Known types in their fixed order, others after by name: a stable order keeps equal
    # states equal.
    return sorted(conditions, key=lambda c: (_ORDER.get(c.type, len(_ORDER)), c.type))


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; its transition time kept unless the status flips."""
    old = find_condition(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since.replace(microsecond=0),
        observed_generation=generation,
    )
    return _sorted([*(c for c in conditions if c.type != type_), new])


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]


def summarize(
    conditions: Sequence[Condition],
    *,
    generation: int,
    now: datetime,
    stalled: Reasoned | None = None,
    progressing: Reasoned | None = None,
    failed: Reasoned | None = None,
    ready_message: str = "",
) -> list[Condition]:
    """Derive ``Ready``, ``Reconciling`` and ``Stalled`` from the domain conditions.

    ``stalled``: the caller knows only a person can help (a conflict, an invalid spec).
    ``progressing``: work of this pass is under way (``Probing``). ``failed``: the pass itself
    failed outside any domain condition (``InternalError``) and is retried with back-off.
    """
    out = list(conditions)

    def put(type_: ConditionType, status: ConditionStatus, why: Reasoned) -> None:
        nonlocal out
        out = set_condition(
            out, type_, status, why.reason, why.message, generation=generation, now=now
        )

    if stalled is not None:
        put(ConditionType.STALLED, ConditionStatus.TRUE, stalled)
        out = remove_condition(out, ConditionType.RECONCILING)
        put(ConditionType.READY, ConditionStatus.FALSE, stalled)
        return out

    domain = [find_condition(out, t) for t in DOMAIN_CONDITIONS]
    false = [c for c in domain if c is not None and c.status == ConditionStatus.FALSE]
    failing = failed or next((Reasoned(c.reason, c.message) for c in false), None)
    retrying = failed or next(
        (Reasoned(Reason.PROGRESSING_WITH_RETRY, c.message) for c in false if not stalls(c.reason)),
        None,
    )
    if progressing is not None:
        put(ConditionType.RECONCILING, ConditionStatus.TRUE, progressing)
        out = remove_condition(out, ConditionType.STALLED)
    elif retrying is not None:
        why = Reasoned(Reason.PROGRESSING_WITH_RETRY, retrying.message)
        put(ConditionType.RECONCILING, ConditionStatus.TRUE, why)
        out = remove_condition(out, ConditionType.STALLED)
    elif failing is not None:
        # Every False condition needs a person: retrying on a timer cannot help, so say so
        # (kstatus Failed) rather than InProgress forever.
        put(ConditionType.STALLED, ConditionStatus.TRUE, failing)
        out = remove_condition(out, ConditionType.RECONCILING)
    else:
        out = remove_condition(out, ConditionType.STALLED)
        out = remove_condition(out, ConditionType.RECONCILING)

    if failing is not None:
        put(ConditionType.READY, ConditionStatus.FALSE, failing)
    elif progressing is not None:
        put(ConditionType.READY, ConditionStatus.UNKNOWN, progressing)
    elif all(c is not None and c.status == ConditionStatus.TRUE for c in domain):
        put(ConditionType.READY, ConditionStatus.TRUE, Reasoned(Reason.SUCCEEDED, ready_message))
    else:
        waiting = [
            t.value
            for t, c in zip(DOMAIN_CONDITIONS, domain, strict=True)
            if c is None or c.status != ConditionStatus.TRUE
        ]
        why = Reasoned(Reason.PROGRESSING, f"waiting for {', '.join(waiting)}")
        put(ConditionType.READY, ConditionStatus.UNKNOWN, why)
    return out


def status_unchanged(
    old: Mapping[str, Any] | TaskHandlerBundleStatus | None, new: TaskHandlerBundleStatus
) -> bool:
    """True when writing ``new`` would not change the stored ``status`` stanza ``old``.

    ``old`` is what the apiserver returned (a dict) or a model; one that no longer validates
    (written by another version) counts as changed, so it gets rewritten.
    """
    if old is None:
        return False
    if isinstance(old, Mapping):
        try:
            old = TaskHandlerBundleStatus.model_validate(old)
        except ValidationError:
            return False
    return old.to_body() == new.to_body()
