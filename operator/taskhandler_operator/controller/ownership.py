"""The claim check of a pass, with the take-over of a claim whose holder is gone (no kopf).

A pass asks :class:`ClaimGuard` before it plans or probes anything, so a later claimant of a
bundle name (or queue) learns of the conflict without creating a probe Job. When the holder
is a TaskHandlerBundle of this operator's cluster id that the apiserver no longer has under
that uid (its finalizer was removed by hand, say), the claim is released for this claimant
to take, with an Event on both sides. A holder from another cluster id cannot be checked: it
stays a conflict, whose message prints the ``db claims release`` command for a person.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.controller.kubeapi import KubeApi, KubeApiError, NotFound
from taskhandler_operator.db.claims import (
    BundleClaimed,
    QueueClaimed,
    check_claim,
    release_stale_claim,
)
from taskhandler_operator.kube import names
from taskhandler_operator.kube.conditions import EventReason
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.records import BundleOwner

log = logging.getLogger(__name__)

#: Event reason of a take-over, on the new holder and on what is left of the old one.
TAKEN_OVER = EventReason.CLAIM_TAKEN_OVER.value
#: Holders released in one check at most (a bundle name and a few queues' holders).
MAX_TAKEOVERS = 4


class ClaimGuard:
    """:class:`~taskhandler_operator.reconcile.ports.ClaimCheck` of one bundle in a cluster."""

    def __init__(
        self, kube: KubeApi, engine: AsyncEngine, cluster_id: str, regarding: Mapping[str, str]
    ) -> None:
        self.kube = kube
        self.engine = engine
        self.cluster_id = cluster_id
        self.regarding = dict(regarding)

    async def __call__(self, spec: BundleSpec) -> None:
        for _ in range(MAX_TAKEOVERS):
            try:
                await check_claim(self.engine, spec.bundle_name, spec.owner, spec.queues)
                return
            except (BundleClaimed, QueueClaimed) as exc:
                held = exc.bundle_name if isinstance(exc, BundleClaimed) else exc.holder_bundle
                if not await self._take_over(held, exc.owner):
                    raise
        await check_claim(self.engine, spec.bundle_name, spec.owner, spec.queues)

    async def _take_over(self, bundle_name: str, holder: BundleOwner) -> bool:
        """Release ``holder``'s claim if the apiserver says it is gone; True when released
        (or changed meanwhile: check again)."""
        if holder.cluster_id != self.cluster_id:
            return False  # another cluster's apiserver: only a person can tell
        try:
            current: Mapping[str, Any] | None = await self.kube.get_bundle(
                holder.namespace, holder.name
            )
        except NotFound:
            current = None
        except KubeApiError as exc:
            log.info("cannot tell whether %s still exists: %s", holder.describe(), exc)
            return False
        uid = None if current is None else (current.get("metadata") or {}).get("uid")
        if uid == holder.uid:
            return False  # the holder is alive: a real conflict
        if not await release_stale_claim(self.engine, bundle_name, holder):
            return True
        me = f"{self.regarding['namespace']}/{self.regarding['name']}"
        gone = f"{holder.describe()} (uid {holder.uid}), which no longer exists"
        log.warning("took over bundle name %r from %s for %s", bundle_name, gone, me)
        await self._event(
            self.regarding, "Normal", f"took over bundle name {bundle_name!r} from {gone}"
        )
        old = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "namespace": holder.namespace,
            "name": holder.name,
            # The object now under that name, or the gone one (kubectl still lists its Events).
            "uid": str(uid or holder.uid),
        }
        note = (
            f"bundle name {bundle_name!r}, claimed by TaskHandlerBundle {holder.namespace}/"
            f"{holder.name} uid {holder.uid} (no longer exists), was taken over by {me}"
        )
        await self._event(old, "Warning", note)
        return True

    async def _event(self, regarding: Mapping[str, str], type_: str, note: str) -> None:
        try:
            await self.kube.post_event(
                dict(regarding),
                reason=TAKEN_OVER,
                note=note,
                type="Warning" if type_ == "Warning" else "Normal",
            )
        except (KubeApiError, ValueError) as exc:
            log.info("cannot post Event %s: %s", TAKEN_OVER, exc)
