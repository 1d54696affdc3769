"""``sync``: one entry point for every source kind, from a spec to a kept revision.

Each kind (git, http, s3, volume) resolves its source's identity without writing anything,
returns the kept revision when that identity is already in the store, and otherwise fills a
staging folder through a :class:`~taskhandler_operator.sources.tree.TreeWriter`, which the
store then publishes atomically. This module holds what they share: the bundle lock, the
timeout, redaction of every error message, and running blocking steps in a worker thread that
stops when the sync is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from taskhandler_operator.sources.errors import (
    InvalidSource,
    SourceError,
    SourceTimeout,
    StorageFailed,
    redact,
    shown_url,
)
from taskhandler_operator.sources.models import Revision, RevisionRecord
from taskhandler_operator.sources.paths import check_name
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore, Staging
from taskhandler_operator.sources.tree import Cancelled, TreeWriter

__all__ = ["DEFAULT_TIMEOUT", "SyncContext", "describe_source", "sync"]

DEFAULT_TIMEOUT = 300.0

P = ParamSpec("P")
T = TypeVar("T")


def describe_source(source: SourceSpec) -> str:
    """The source as an error message names it (no credentials, no query strings)."""
    if source.git is not None:
        path = f" path {source.git.path}" if source.git.path else ""
        return f"git {shown_url(source.git.url)} ref {source.git.ref}{path}"
    if source.http is not None:
        return f"http {shown_url(source.http.url)}"
    if source.s3 is not None:
        endpoint = f" at {shown_url(source.s3.endpoint)}" if source.s3.endpoint else ""
        return f"s3 bucket {source.s3.bucket} prefix {source.s3.prefix or '/'}{endpoint}"
    assert source.volume is not None
    return f"volume {source.volume.path}" + (
        f" subPath {source.volume.sub_path}" if source.volume.sub_path else ""
    )


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


async def sync(
    source: SourceSpec,
    credentials: Mapping[str, bytes] | None,
    store: RevisionStore,
    *,
    namespace: str,
    bundle: str,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the agreed contract: a per-source bound
) -> Revision:
    """Bring ``source`` into ``store`` as a revision of ``namespace/bundle`` and return it.

    ``credentials`` is the data of the Secret named by the source's ``secretRef`` (already read
    by the caller). Raises a :class:`SourceError` subclass whose ``reason`` suits a condition
    and whose message contains no credential. Cancellable; bounded by ``timeout`` seconds.
    """
    try:
        check_name(namespace, "namespace")
        check_name(bundle, "bundle")
    except ValueError as exc:
        raise InvalidSource(str(exc)) from None
    creds = None if credentials is None else dict(credentials)
    secrets = list(creds.values()) if creds else []
    ctx = SyncContext(store, namespace, bundle)
    try:
        async with asyncio.timeout(timeout):
            async with store.lock(namespace, bundle):
                return await _dispatch(source, creds, ctx)
    except TimeoutError:
        ctx.cancel.set()
        raise SourceTimeout(
            f"sync of {describe_source(source)} did not finish within {timeout:g}s; check that "
            "the source is reachable, or raise the bundle's sync timeout"
        ) from None
    except SourceError as exc:
        # Every message is redacted once more here, whatever produced it.
        raise type(exc)(redact(exc.message, secrets)) from None
    except Cancelled:  # pragma: no cover - only raised after a cancellation
        raise asyncio.CancelledError from None
    except OSError as exc:
        raise StorageFailed(
            redact(f"sync of {describe_source(source)} failed on local storage: {exc}", secrets)
        ) from None


async def _dispatch(
    source: SourceSpec, creds: dict[str, bytes] | None, ctx: SyncContext
) -> Revision:
    if source.volume is not None:
        from taskhandler_operator.sources.volume import sync_volume

        return await sync_volume(source.volume, ctx)
    if source.http is not None:
        from taskhandler_operator.sources.http import sync_http

        return await sync_http(source.http, creds, ctx)
    if source.git is not None:
        from taskhandler_operator.sources.git import sync_git

        return await sync_git(source.git, creds, ctx)
    assert source.s3 is not None
    from taskhandler_operator.sources.s3 import sync_s3

    return await sync_s3(source.s3, creds, ctx)
