"""Why a pass stopped, as typed errors that carry their reporting policy.

A pass either returns a :class:`~taskhandler_operator.reconcile.models.PassSummary` (which may
list artifacts that gave no answer and Dags with problems: those are results, not errors) or
raises one :class:`PassError`. Each says which step failed, which part is to blame (the
on-call engineer's first question), the condition reason to publish, and whether trying again
soon can help:

============================  ==========  =========  ==========  =========================
error                         step        component  retryable   reason
============================  ==========  =========  ==========  =========================
:class:`SourceFailed`         sync        source     yes         ``SourceUnavailable``
:class:`ListingFailed`        list        source     yes         ``ListingFailed``
:class:`DatabaseFailed`       plan,       database   as the      ``DatabaseUnavailable``,
                              validate,              database    ``TransactionConflict``,
                              write                  says        ``DatabaseError``
:class:`OwnershipConflict`    write       ownership  no          ``BundleClaimed``,
                                                                 ``QueueClaimed``
:class:`ProberFailed`         probe       prober     yes         ``ProberFailed``
:class:`PassTimedOut`         any         operator   yes         ``PassTimedOut``
:class:`Deposed`              write       operator   no          ``LeaderDeposed``
:class:`InternalError`        any         operator   yes         ``InternalError``
============================  ==========  =========  ==========  =========================

``Deposed`` is never published: a replica whose write the leader fence refused writes nothing
more, its status included, and steps down (``db/fence.py``).

A non-retryable error lasts until something outside the operator changes (another resource,
the spec); retrying it on every interval is harmless but pointless.
"""

from __future__ import annotations

from typing import Literal

from taskhandler_operator.db.claims import BundleClaimed, ClaimError, QueueClaimed
from taskhandler_operator.db.engine import DatabaseError, DatabaseUnavailable, TransactionConflict
from taskhandler_operator.db.fence import FencedOut
from taskhandler_operator.kube.conditions import Reason
from taskhandler_operator.reconcile.models import StepName

Component = Literal["source", "database", "ownership", "prober", "operator"]


class PassError(Exception):
    component: Component = "operator"
    retryable = True
    #: The condition reason when the raiser names none.
    default_reason: str = Reason.INTERNAL_ERROR

    def __init__(self, step: StepName, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.message = message
        self.reason = reason or self.default_reason

    def __str__(self) -> str:
        return f"{self.step}: {self.message}"


class SourceFailed(PassError):
    component: Component = "source"

    def __init__(self, step: StepName, message: str) -> None:
        super().__init__(step, message, reason=Reason.SOURCE_UNAVAILABLE)


class ListingFailed(PassError):
    component: Component = "source"
    default_reason = Reason.LISTING_FAILED


class DatabaseFailed(PassError):
    component: Component = "database"

    def __init__(self, step: StepName, error: DatabaseError) -> None:
        if isinstance(error, DatabaseUnavailable):
            reason = Reason.DATABASE_UNAVAILABLE
        elif isinstance(error, TransactionConflict):
            reason = Reason.TRANSACTION_CONFLICT
        else:
            reason = Reason.DATABASE_ERROR
        super().__init__(step, str(error), reason=reason)
        self.retryable = error.retryable


class OwnershipConflict(PassError):
    component: Component = "ownership"
    retryable = False

    def __init__(self, step: StepName, error: ClaimError) -> None:
        reason = "QueueClaimed" if isinstance(error, QueueClaimed) else "BundleClaimed"
        super().__init__(step, str(error), reason=reason)
        self.owner = error.owner if isinstance(error, BundleClaimed | QueueClaimed) else None


class ProberFailed(PassError):
    component: Component = "prober"
    default_reason = Reason.PROBER_FAILED


class PassTimedOut(PassError):
    """The pass ran past its deadline (``THOP_PASS_TIMEOUT``) and was abandoned in ``step``."""

    component: Component = "operator"
    default_reason = Reason.PASS_TIMED_OUT

    def __init__(self, step: StepName, timeout: float) -> None:
        super().__init__(
            step,
            f"the pass did not finish within {timeout:g}s (THOP_PASS_TIMEOUT) and was "
            f"abandoned in step {step}; retrying (probe Jobs keep running and are adopted)",
        )


class Deposed(PassError):
    """The leader fence refused the write: another replica leads now."""

    component: Component = "operator"
    retryable = False
    default_reason = Reason.LEADER_DEPOSED


class InternalError(PassError):
    component: Component = "operator"


def classify(step: StepName, error: BaseException) -> PassError:
    """The :class:`PassError` reporting ``error`` raised in ``step``."""
    if isinstance(error, PassError):
        return error
    if isinstance(error, ClaimError):
        return OwnershipConflict(step, error)
    if isinstance(error, FencedOut):
        return Deposed(step, str(error))
    if isinstance(error, DatabaseError):
        return DatabaseFailed(step, error)
    text = str(error) or type(error).__name__
    if step == "sync":
        return SourceFailed(step, text)
    if step == "list":
        return ListingFailed(step, f"cannot list the revision folder: {text}")
    if step == "probe":
        return ProberFailed(step, text)
    return InternalError(step, f"{type(error).__name__}: {text}")
