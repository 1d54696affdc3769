"""The publish policy and what a pass hands the write path to apply it (pure; no I/O).

* ``Automatic``: every change is published (the behaviour before policies existed).
* ``NoRemoval``: a change that leaves a task bound today without a binding, or moves a task
  to or away from an artifact whose probe failed at this revision, is held.
* ``Manual``: every change is held until approved.

A held change leaves the published binding rows as they are; the artifact and probe rows are
still written, so the answers are known and approving needs no probe.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from taskhandler_operator.publication.changes import ChangeSet

__all__ = [
    "ANNOTATION_APPROVE_REVISION",
    "ANNOTATION_ROLLBACK_TO",
    "DEFAULT_HISTORY",
    "PublishControl",
    "PublishPolicy",
    "hold_reason",
]

#: Publishes the held change of exactly this revision (kube/names.py re-exports both).
ANNOTATION_APPROVE_REVISION = "langsdk.dev/approve-revision"
#: Republishes the newest recorded publication of this revision and holds there while set.
ANNOTATION_ROLLBACK_TO = "langsdk.dev/rollback-to"

#: Publications kept per bundle unless THOP_PUBLICATION_HISTORY says otherwise.
DEFAULT_HISTORY = 20


class PublishPolicy(StrEnum):
    AUTOMATIC = "Automatic"
    NO_REMOVAL = "NoRemoval"
    MANUAL = "Manual"


class PublishControl(BaseModel):
    """Everything the write path needs to decide whether this pass's change is published.

    ``revision`` is the pass's source revision; ``failed_paths`` the artifacts whose probe
    failed (or were refused) at it. ``approve_revision``/``approved_by`` come from the
    ``langsdk.dev/approve-revision`` annotation and its manager; ``rollback_to`` from
    ``langsdk.dev/rollback-to``. ``operator`` names the replica that writes (the leader's
    identity).
    """

    model_config = ConfigDict(frozen=True)

    policy: PublishPolicy = PublishPolicy.AUTOMATIC
    revision: str | None = None
    operator: str = ""
    failed_paths: tuple[str, ...] = ()
    approve_revision: str | None = None
    approved_by: str | None = None
    rollback_to: str | None = None
    history_limit: Annotated[int, Field(ge=1)] = DEFAULT_HISTORY


def hold_reason(
    policy: PublishPolicy, change: ChangeSet, failed_paths: frozenset[str] | set[str]
) -> str | None:
    """Why ``policy`` holds ``change`` (a sentence for the condition), or None to publish."""
    if not change:
        return None
    if policy == PublishPolicy.MANUAL:
        return "publish policy Manual holds every change until it is approved"
    if policy != PublishPolicy.NO_REMOVAL:
        return None
    removed = change.of_kind("removed")
    if removed:
        first = removed[0]
        more = f" and {len(removed) - 1} more" if len(removed) > 1 else ""
        return (
            f"publish policy NoRemoval holds a change that removes the binding of "
            f"{first.dag_id}/{first.task_id}{more}"
        )
    for c in change.of_kind("moved", "changed"):
        paths = {r.artifact_path for r in (c.before, c.after) if r is not None}
        broken = sorted(paths & set(failed_paths))
        if broken:
            return (
                f"publish policy NoRemoval holds a change that moves {c.dag_id}/{c.task_id} "
                f"while the probe of {broken[0]} failed"
            )
    return None
