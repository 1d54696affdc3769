"""kstatus conditions: set, merge, summarize, and tell whether a status changed (pure).

The reconcile steps set the domain conditions (``SourceReady``, ``ArtifactsProbed``,
``BindingsPublished``); :func:`summarize` then derives the three kstatus conditions from them,
the way Flux's summarizer does (operator-anchors §1.3):

* ``Stalled`` (abnormal-true, present only when True): the bundle cannot progress without a
  human — a conflict, an invalid spec. ``Ready`` is False with the same reason; ``Reconciling``
  is removed.
* ``Reconciling`` (abnormal-true): work is under way (``progressing`` given, e.g. a new
  generation or revision), or a domain condition is False and the operator retries
  (``ProgressingWithRetry``).
* ``Ready``: False with the reason of the first False domain condition; Unknown while
  progressing or while a domain condition is missing or Unknown; True (``Succeeded``) when all
  three domain conditions are True.

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

__all__ = [
    "DOMAIN_CONDITIONS",
    "EventReason",
    "Reason",
    "Reasoned",
    "find_condition",
    "remove_condition",
    "set_condition",
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
    # SourceReady.
    SYNCED = "Synced"
    SOURCE_UNAVAILABLE = "SourceUnavailable"
    SECRET_NOT_FOUND = "SecretNotFound"  # noqa: S105 - a reason, not a secret
    SECRET_UNREADABLE = "SecretUnreadable"  # noqa: S105 - a reason, not a secret
    LISTING_FAILED = "ListingFailed"
    # ArtifactsProbed.
    PROBED = "Probed"
    ARTIFACTS_FAILED = "ArtifactsFailed"
    PROBER_FAILED = "ProberFailed"
    # BindingsPublished.
    PUBLISHED = "Published"
    STUBS_UNBOUND = "StubsUnbound"
    DATABASE_UNAVAILABLE = "DatabaseUnavailable"
    TRANSACTION_CONFLICT = "TransactionConflict"
    DATABASE_ERROR = "DatabaseError"
    INTERNAL_ERROR = "InternalError"
    # Any of the three, by the step that ran out of time.
    PASS_TIMED_OUT = "PassTimedOut"  # noqa: S105 - a reason, not a secret
    # Never published: a deposed replica writes no status (reconcile/errors.py).
    LEADER_DEPOSED = "LeaderDeposed"
    # Stalled (Ready False with the same reason).
    INVALID_SPEC = "InvalidSpec"
    BUNDLE_NAME_CONFLICT = "BundleNameConflict"
    QUEUE_CONFLICT = "QueueConflict"


class EventReason(StrEnum):
    """Reasons of the Events that report something other than a condition turning False (such
    an Event takes the condition's reason)."""

    NEW_REVISION = "NewRevision"
    BINDINGS_PUBLISHED = "BindingsPublished"
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
    ready_message: str = "",
) -> list[Condition]:
    """Derive ``Ready``, ``Reconciling`` and ``Stalled`` from the domain conditions."""
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

    out = remove_condition(out, ConditionType.STALLED)
    domain = [find_condition(out, t) for t in DOMAIN_CONDITIONS]
    failing = next((c for c in domain if c is not None and c.status == ConditionStatus.FALSE), None)
    if progressing is not None:
        put(ConditionType.RECONCILING, ConditionStatus.TRUE, progressing)
    elif failing is not None:
        retry = Reasoned(Reason.PROGRESSING_WITH_RETRY, failing.message)
        put(ConditionType.RECONCILING, ConditionStatus.TRUE, retry)
    else:
        out = remove_condition(out, ConditionType.RECONCILING)

    if failing is not None:
        put(ConditionType.READY, ConditionStatus.FALSE, Reasoned(failing.reason, failing.message))
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
