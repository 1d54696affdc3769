"""The periodic resync of a shard's holds with the apiserver (no kopf here).

kopf re-lists the bundles when a watch expires (410 Gone), and a relist reports no object as
gone: a bundle relabelled to another shard meanwhile never sends this shard its DELETED, and
its reconciler here would run on next to the new shard's. Every ``shard_resync_seconds`` the
leader lists its shard's bundles (the selector kopf's watch uses; metadata only, one paginated
LIST) and releases the hold of every held bundle the listing lacks, which stops its reconciler
as a DELETED would (docs/operator.md, "Shards").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from taskhandler_operator.controller.backoff import BundleKey
from taskhandler_operator.controller.holds import Holds
from taskhandler_operator.controller.kubeapi import KubeApi, KubeApiError, NotFound
from taskhandler_operator.kube import names

__all__ = ["bundle_deleted", "bundle_selector", "resync_holds", "run_resync"]

log = logging.getLogger(__name__)


def bundle_selector(shard: str) -> str:
    """The label selector of the bundles shard ``shard`` reconciles ("" is the default shard:
    the bundles without a shard label)."""
    return f"{names.LABEL_SHARD}={shard}" if shard else f"!{names.LABEL_SHARD}"


async def bundle_deleted(kube: KubeApi, meta: Mapping[str, Any]) -> bool:
    """Whether the bundle whose DELETED event carried ``meta`` was deleted, rather than
    relabelled out of this shard's selector (the apiserver then sends the object as it was,
    without a ``deletionTimestamp``). Our finalizer gives a deleted bundle a
    ``deletionTimestamp`` before it goes; one without (the finalizer removed by hand before
    the delete) is told apart by a read: gone is deleted. A failed read counts as deleted,
    since the caller's answer to a deletion (waking every bundle) is only a cost."""
    if meta.get("deletionTimestamp"):
        return True
    try:
        await kube.get_bundle(meta.get("namespace") or "", meta.get("name") or "")
    except NotFound:
        return True
    except KubeApiError as exc:
        log.warning("could not tell a deleted bundle from a relabelled one: %s", exc)
        return True
    return False


async def resync_holds(
    kube: KubeApi, holds: Holds, shard: str, namespaces: tuple[str, ...], shard_name: str
) -> list[BundleKey]:
    """One resync: the bundles whose holds it released. A failed listing releases nothing."""
    # Holds taken after this mark may be of bundles that joined the shard after the listing's
    # snapshot: they are never released by this listing.
    before = holds.mark()
    selector = bundle_selector(shard)
    listed: set[BundleKey] = set()
    try:
        for namespace in namespaces or (None,):
            listed |= await kube.list_bundle_keys(namespace, selector)
    except KubeApiError as exc:
        log.warning("shard %s: resync of its bundles failed (retried later): %s", shard_name, exc)
        return []
    released = [key for key in holds.absent(listed, before) if holds.release(*key)]
    for namespace, name in released:
        log.info(
            "TaskHandlerBundle %s/%s left shard %s (not in its listing: its watch missed the "
            "DELETED): its reconciler stops",
            namespace,
            name,
            shard_name,
        )
    return released


async def run_resync(
    kube: KubeApi,
    holds: Holds,
    shard: str,
    namespaces: tuple[str, ...],
    shard_name: str,
    interval: float,
) -> None:
    """:func:`resync_holds` every ``interval`` seconds, until cancelled (the leader's work)."""
    while True:
        await asyncio.sleep(interval)
        await resync_holds(kube, holds, shard, namespaces, shard_name)
