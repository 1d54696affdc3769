"""What a source kind works with while it syncs: the store, the bundle, the shared steps.

Kept apart from ``sync.py`` (which dispatches to the kinds) so the kinds depend on this
module and ``sync`` depends on them, without a cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.models import Revision, RevisionRecord
from taskhandler_operator.sources.store import RevisionStore, Staging
from taskhandler_operator.sources.tree import TreeWriter

__all__ = ["Build", "SyncContext"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Build:
    """A revision being built; ``fill`` sets the id, identity and details once it knows them."""

    staging: Staging
    writer: TreeWriter
    revision_id: str = ""
    source: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class SyncContext:
    """What a source kind gets: the store, the bundle, and the shared steps."""

    store: RevisionStore
    namespace: str
    bundle: str
    cancel: threading.Event = field(default_factory=threading.Event)
    volumes: VolumeAccess = field(default_factory=VolumeAccess)
    """Where volume sources may read; the default allows nothing."""

    async def blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in a worker thread. When the sync is cancelled the cancel event is set
        (writers stop at their next chunk) and the thread is waited for, so nothing writes to
        a staging folder after it is removed."""
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self.cancel.set()
            with contextlib.suppress(BaseException):
                await task
            raise

    async def existing(self, revision_id: str) -> Revision | None:
        """The kept revision ``revision_id``, made current; None when it is not kept."""
        revision = await self.store.get(self.namespace, self.bundle, revision_id)
        if revision is not None:
            await self.store.touch(self.namespace, self.bundle, revision_id)
        return revision

    async def previous(self) -> RevisionRecord | None:
        """The current revision's record (what the last sync returned)."""
        records = await self.store.records(self.namespace, self.bundle)
        return records[0] if records else None

    async def build(self, kind: str, fill: Callable[[Build], Awaitable[None]]) -> Revision:
        """Stage a revision, let ``fill`` write it, publish it and prune old ones.

        When ``fill`` ends with an id that is already kept (the source changed back between
        the check and the download), the staging folder is dropped and that revision returned.
        """
        store = self.store
        staging = await store.stage(self.namespace, self.bundle)
        try:
            writer = TreeWriter(staging.tree, store.limits, self.cancel)
            try:
                build = Build(staging, writer)
                await fill(build)
                stats = await self.blocking(writer.finish)
            finally:
                writer.close()
            if not build.revision_id:  # pragma: no cover - every kind sets it
                raise RuntimeError(f"{kind} sync produced no revision id")
            existing = await self.existing(build.revision_id)
            if existing is not None:
                await store.discard(staging)
                return existing
            record = store.new_record(
                namespace=self.namespace,
                bundle=self.bundle,
                revision_id=build.revision_id,
                kind=kind,
                source=build.source,
                file_count=stats.files,
                size=stats.bytes,
                details=build.details,
            )
            revision = await store.commit(staging, record)
        except BaseException:
            await store.discard(staging)
            raise
        await store.prune(self.namespace, self.bundle)
        return revision
