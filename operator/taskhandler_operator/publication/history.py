"""Publications as recorded, and what one pass did about publishing (pure; no I/O).

:class:`Publication` is one row of ``thop_publication``: a change published (automatically,
by approval, or by a rollback), or the bundle's one held change (``kind="held"``).
:class:`PublishOutcome` is what the write path reports for one pass; the status, Events and
metrics are built from it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from taskhandler_operator.publication.changes import (
    BindingRow,
    ChangeCounts,
    ChangeSet,
    ChangeSummary,
)

__all__ = [
    "PUBLISHED_KINDS",
    "Publication",
    "PublicationKind",
    "PublishOutcome",
    "Refusal",
]

PublicationKind = Literal["published", "approved", "rolled_back", "held"]
#: The kinds of a publication (a held change is not one until approved).
PUBLISHED_KINDS: tuple[PublicationKind, ...] = ("published", "approved", "rolled_back")


class Publication(BaseModel):
    """One recorded publication (or the held change). ``change`` and ``bindings`` are loaded
    only when asked for (they may be large)."""

    model_config = ConfigDict(frozen=True)

    id: int
    bundle_name: str
    kind: PublicationKind
    revision: str | None = None
    recorded_at: datetime
    operator: str = ""
    approved_by: str | None = None
    counts: ChangeCounts = ChangeCounts()
    # For a held change: why it is held; for a rollback: the publication it restored.
    reason: str | None = None
    change: ChangeSet | None = None
    bindings: tuple[BindingRow, ...] | None = None


class Refusal(BaseModel):
    """An approval or a rollback the write path refused, and why (a Warning Event)."""

    model_config = ConfigDict(frozen=True)

    reason: Literal["ApprovalRefused", "RollbackRefused"]
    message: str


class PublishOutcome(BaseModel):
    """What one pass did about publishing its bindings."""

    model_config = ConfigDict(frozen=True)

    # The publication this pass recorded (its change in ``change``), if any.
    recorded: Publication | None = None
    change: ChangeSummary | None = None
    # The change this pass did not publish, and why (a policy, or a rollback in force).
    pending: Publication | None = None
    pending_change: ChangeSummary | None = None
    held_reason: str | None = None
    # The revision the bundle holds at because of a rollback (the annotation is set).
    rolled_back_to: str | None = None
    refused: Refusal | None = None
    # Binding rows published after the pass when that is not what it validated (a hold, a
    # rollback): the status and the bindings metric count these.
    published_bindings: int | None = None

    @property
    def held(self) -> bool:
        return self.pending is not None
