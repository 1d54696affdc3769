"""``sync``: one entry point for every source kind, from a spec to a kept revision.

Each kind (git, http, s3, volume) resolves its source's identity without writing anything,
returns the kept revision when that identity is already in the store, and otherwise fills a
staging folder through a :class:`~taskhandler_operator.sources.tree.TreeWriter`, which the
store then publishes atomically. This module holds the entry point: the bundle lock, the
timeout and the redaction of every error message; ``context.py`` holds the steps the kinds
share (running blocking work in a worker thread that stops when the sync is cancelled).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

from taskhandler_operator.redaction import credential_spellings
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.context import SyncContext
from taskhandler_operator.sources.errors import (
    InvalidSource,
    SourceError,
    SourceTimeout,
    StorageFailed,
    redact,
    shown_url,
)
from taskhandler_operator.sources.models import Revision
from taskhandler_operator.sources.paths import check_name
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore
from taskhandler_operator.sources.tree import Cancelled

__all__ = ["DEFAULT_TIMEOUT", "describe_source", "sync"]

DEFAULT_TIMEOUT = 300.0


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


async def sync(
    source: SourceSpec,
    credentials: Mapping[str, bytes] | None,
    store: RevisionStore,
    *,
    namespace: str,
    bundle: str,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the agreed contract: a per-source bound
    volumes: VolumeAccess | None = None,
) -> Revision:
    """Bring ``source`` into ``store`` as a revision of ``namespace/bundle`` and return it.

    ``credentials`` is the data of the Secret named by the source's ``secretRef`` (already read
    by the caller). ``volumes`` says where a volume source may read (None: nowhere, every
    volume source is refused with ``VolumeNotAllowed``). Raises a :class:`SourceError`
    subclass whose ``reason`` suits a condition and whose message contains no credential.
    Cancellable; bounded by ``timeout`` seconds.
    """
    try:
        check_name(namespace, "namespace")
        check_name(bundle, "bundle")
    except ValueError as exc:
        raise InvalidSource(str(exc)) from None
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise InvalidSource(f"the sync timeout must be a positive number of seconds, got {timeout}")
    creds = None if credentials is None else dict(credentials)
    # Values, their base64 and URL spellings, and base64(user:password) as basic auth sends it.
    secrets = sorted(credential_spellings(creds))
    ctx = SyncContext(store, namespace, bundle, volumes=volumes or VolumeAccess())
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
        # Every message is redacted once more here, whatever produced it: the uncut text, so
        # a credential across the message's length limit leaves no prefix.
        raise type(exc)(redact(exc.full_message, secrets)) from None
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
