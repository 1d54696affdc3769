"""Which bundles this operator process holds: the ones whose reconciler runs here (no kopf here).

A shard's kopf watch sees only its own bundles (a server-side label selector). When a bundle is
relabelled to another shard, the apiserver sends this shard's watch DELETED (the object as it
was, still carrying the old label) and the new shard's watch ADDED. kopf 1.45 forgets the
object on that DELETED but stops its daemon only for an object being deleted (a
``deletionTimestamp``), so without :class:`Holds` the old shard's reconciler would run on,
orphaned, next to the new shard's (docs/operator.md, "Shards").

Each reconciler takes a :class:`Hold` when it starts and drops it when it ends; a DELETED event
releases the bundle's hold, which stops its reconciler at once (:func:`run_held`). A shard
decodes the probe Job events of every shard, and acts only on those of bundles it holds.

A watch that expired (410 Gone) is re-listed by kopf, and a relist reports nothing as gone: a
DELETED missed that way is caught by the periodic resync (``controller/shardsync.py``), which
releases the holds :func:`absent` picks from a listing of this shard's bundles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from taskhandler_operator.controller.backoff import BundleKey

__all__ = ["Hold", "Holds", "absent", "run_held"]

log = logging.getLogger(__name__)


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False)
class Hold:
    key: BundleKey
    released: asyncio.Event = field(default_factory=asyncio.Event)
    #: The reconciler of an earlier hold of the same bundle in this process, still stopping
    #: (the bundle left this shard and came back at once): the new one starts after it ends.
    previous: asyncio.Future[None] | None = None
    done: asyncio.Future[None] = field(default_factory=_future)
    #: Order of taking among this process's holds (:meth:`Holds.mark`).
    seq: int = 0


def absent(
    held: Mapping[BundleKey, int], listed: Collection[BundleKey], before: int
) -> list[BundleKey]:
    """The held bundles (key -> the hold's ``seq``) a listing of the shard's bundles shows to
    be gone: not listed, and held since before the listing was sent (``seq < before``). A hold
    taken later may be of a bundle that came into the shard after the listing's snapshot."""
    return sorted(key for key, seq in held.items() if seq < before and key not in listed)


class Holds:
    def __init__(self) -> None:
        self._by_bundle: dict[BundleKey, Hold] = {}
        #: Released holds whose reconciler has not ended yet.
        self._ending: dict[BundleKey, Hold] = {}
        self._taken = 0

    def mark(self) -> int:
        """A mark before a listing is sent: the holds taken until now have ``seq`` below it."""
        return self._taken

    def absent(self, listed: Collection[BundleKey], before: int) -> list[BundleKey]:
        """:func:`absent` of the current holds."""
        return absent({key: hold.seq for key, hold in self._by_bundle.items()}, listed, before)

    def take(self, namespace: str, name: str) -> Hold:
        key = (namespace, name)
        before = self._by_bundle.get(key) or self._ending.get(key)
        if before is not None:
            before.released.set()
        hold = Hold(key, previous=None if before is None else before.done, seq=self._taken)
        self._taken += 1
        self._by_bundle[key] = hold
        return hold

    def release(self, namespace: str, name: str) -> bool:
        """The bundle left this process (deleted, or now another shard's); True if held."""
        hold = self._by_bundle.pop((namespace, name), None)
        if hold is None:
            return False
        hold.released.set()
        if not hold.done.done():
            self._ending[hold.key] = hold
        return True

    def drop(self, hold: Hold) -> None:
        """The reconciler of ``hold`` ended."""
        if self._by_bundle.get(hold.key) is hold:
            del self._by_bundle[hold.key]
        if self._ending.get(hold.key) is hold:
            del self._ending[hold.key]
        if not hold.done.done():
            hold.done.set_result(None)

    def holds(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._by_bundle

    def __len__(self) -> int:
        return len(self._by_bundle)


async def run_held(holds: Holds, hold: Hold, reconciler: Coroutine[Any, Any, None]) -> None:
    """Run ``reconciler`` while ``hold`` is held: once released, a pass in progress is cancelled
    at once rather than finished (its database transaction rolls back; its probe Jobs keep
    running and the new holder adopts them), since the bundle's new holder starts its own pass
    now and an older pass must not write after it."""
    task: asyncio.Future[None] | None = None
    try:
        if hold.previous is not None:
            await hold.previous
        if hold.released.is_set():
            return
        task = asyncio.ensure_future(reconciler)
        released = asyncio.ensure_future(hold.released.wait())
        try:
            await asyncio.wait({task, released}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                log.info("%s/%s is no longer this shard's: its reconciler stops", *hold.key)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            released.cancel()
            if not task.done():  # this coroutine was cancelled (kopf stops the daemon)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        if task is None:
            reconciler.close()  # never started
        holds.drop(hold)
