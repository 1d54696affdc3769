"""S3 sources: the objects under a prefix of a bucket on any S3-compatible endpoint.

The revision id is a sha256 over the sorted listing (relative key, size, ETag): listing is the
only request an unchanged bucket costs. A new listing is refused before any download when a
key cannot be a file name or the objects exceed the store's caps. Then only objects whose
(size, ETag) differ from the previous revision are downloaded (``GetObject`` with ``If-Match``
on the listed ETag, so an object replaced mid-sync is noticed); the rest are hard-linked from
the previous revision, whose files are never written. A download is checked against the
listed size and, for single-part uploads (an ETag that is an MD5), against its MD5.

Requests are signed with SigV4 for ``region``; credentials come from the Secret
(``accessKeyID``, ``secretAccessKey``, optional ``sessionToken``) or, without a secretRef, from
botocore's default chain (environment, web identity, instance metadata). Objects carry no Unix
mode, so every file is stored read-only and not executable (as S3 Dag bundles store them).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskhandler_operator.sources.credentials import secret_text
from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    InvalidSource,
    NotFound,
    S3FetchFailed,
    SourceError,
    shown_url,
)
from taskhandler_operator.sources.paths import UnsafePath, safe_rel_path
from taskhandler_operator.sources.spec import S3Source

if TYPE_CHECKING:
    from taskhandler_operator.sources.context import Build, SyncContext
    from taskhandler_operator.sources.models import Revision
    from taskhandler_operator.sources.tree import OpenEntry, TreeWriter

__all__ = ["S3Object", "listing_digest", "sync_s3"]

CONCURRENCY = 8
CHUNK = 1 << 20
#: Bytes of one answer that is not an object's content (a ListObjectsV2 page, an error
#: document), read with this cap before it is parsed: a page of LIST_PAGE_KEYS keys of the
#: longest S3 allows (1024 bytes, URL-encoded) stays under it, and botocore's XML parse of a
#: hostile page this size peaks at about 50 MB.
MAX_ANSWER_BYTES = 2 << 20
LIST_PAGE_KEYS = 500
#: Pages a listing may take: servers return up to the page size asked for; this allows pages
#: averaging 50 keys before the store's entry cap is reached, and stops an endless listing.
MIN_KEYS_PER_PAGE = 50
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")  # fullmatch
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidSecurity",
        "AuthorizationHeaderMalformed",
        "XAdminUserNotFound",  # VersityGW: an unknown access key id
        "403",
        "401",
    }
)


@dataclass(frozen=True)
class S3Object:
    rel: str
    key: str
    size: int
    etag: str


def listing_digest(objects: list[S3Object]) -> str:
    digest = hashlib.sha256()
    for obj in sorted(objects, key=lambda o: o.rel):
        digest.update(f"{obj.rel}\0{obj.size}\0{obj.etag}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _where(spec: S3Source) -> str:
    endpoint = shown_url(spec.endpoint) if spec.endpoint else f"AWS S3 ({spec.region})"
    return f"s3://{spec.bucket}/{spec.key_prefix} at {endpoint}"


def _client_error(spec: S3Source, operation: str, exc: Exception) -> SourceError:
    """A typed error for a botocore failure, naming the bucket and what to check."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AuthenticationFailed(
            f"{operation} {_where(spec)}: no credentials; set secretRef to a Secret with "
            "accessKeyID and secretAccessKey, or give the operator a workload identity"
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "")) or str(
            exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
        message = str(error.get("Message", "")) or code
        if code in ("NoSuchBucket", "404") and operation == "list":
            return NotFound(
                f"bucket {spec.bucket} does not exist at "
                f"{shown_url(spec.endpoint) if spec.endpoint else 'AWS S3'}; check bucket and "
                "endpoint"
            )
        if code in _AUTH_CODES:
            return AuthenticationFailed(
                f"{operation} {_where(spec)}: {code} ({message}); check accessKeyID and "
                "secretAccessKey in the bundle's Secret, and the region"
            )
        if code in ("PreconditionFailed", "412", "NoSuchKey"):
            return S3FetchFailed(
                f"{operation} {_where(spec)}: an object changed or vanished during the sync "
                f"({code}); the next sync picks up the new listing"
            )
        return S3FetchFailed(f"{operation} {_where(spec)}: {code}: {message}")
    return S3FetchFailed(f"{operation} {_where(spec)}: {type(exc).__name__}: {exc}")


async def _read_capped(raw: Any, url: str) -> bytes:
    """The body of an aiohttp response, refused beyond :data:`MAX_ANSWER_BYTES`."""
    import aiohttp
    from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

    def too_large(what: str) -> S3FetchFailed:
        raw.close()  # the rest is never read: the connection is not reused
        return S3FetchFailed(
            f"{shown_url(url)} answered {what} where a listing page or an error document was "
            f"expected, over the {MAX_ANSWER_BYTES}-byte cap; refused, the rest unread"
        )

    declared = raw.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise too_large(f"{declared} bytes (its Content-Length)")
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := await raw.content.read(1 << 16):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise too_large("more bytes than that")
            parts.append(chunk)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        # What botocore's own read raises, so its retry rules still apply.
        raise ConnectionClosedError(error=exc, endpoint_url=url) from None
    except TimeoutError as exc:
        raise ReadTimeoutError(endpoint_url=url, error=exc) from None
    return b"".join(parts)


_bounded_session: Any = None


def _bounded_session_class() -> Any:
    """aiobotocore's HTTP session, except that an answer botocore would read whole (anything
    but an object's content, and every error) is read here with a cap first. aiobotocore reads
    such bodies whole before parsing them: a 512 MiB listing page cost 1.7 GB."""
    global _bounded_session
    if _bounded_session is None:
        from aiobotocore.httpsession import AIOHTTPSession

        class BoundedAnswers(AIOHTTPSession):
            async def send(self, request: Any) -> Any:
                streamed = request.stream_output
                request.stream_output = True  # leave the body unread: read below, capped
                try:
                    response = await super().send(request)
                finally:
                    request.stream_output = streamed
                if not streamed or response.status_code >= 300:
                    # botocore's AWSResponse keeps the body it read in _content
                    response._content = await _read_capped(response.raw, request.url)
                return response

        _bounded_session = BoundedAnswers
    return _bounded_session


def _client_kwargs(spec: S3Source, credentials: Mapping[str, bytes] | None) -> dict[str, Any]:
    from aiobotocore.config import AioConfig

    kwargs: dict[str, Any] = {
        "region_name": spec.region,
        "config": AioConfig(
            http_session_cls=_bounded_session_class(),
            signature_version="s3v4",
            s3={"addressing_style": "path" if spec.path_style else "virtual"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=30,
            read_timeout=60,
            max_pool_connections=CONCURRENCY,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_supported",
        ),
    }
    if spec.endpoint:
        kwargs["endpoint_url"] = spec.endpoint
    if credentials is not None:
        access = secret_text(credentials, "accessKeyID")
        secret = secret_text(credentials, "secretAccessKey")
        if access is None or secret is None:
            raise InvalidSource(
                "the s3 source's Secret must hold accessKeyID and secretAccessKey "
                "(and optionally sessionToken)"
            )
        kwargs["aws_access_key_id"] = access
        kwargs["aws_secret_access_key"] = secret
        token = secret_text(credentials, "sessionToken")
        if token is not None:
            kwargs["aws_session_token"] = token
    return kwargs


async def _list(client: Any, spec: S3Source, max_files: int) -> list[S3Object]:
    from botocore.parsers import ResponseParserError

    prefix = spec.key_prefix
    found: list[S3Object] = []
    listed = 0
    pages = 0
    max_pages = max_files // MIN_KEYS_PER_PAGE + 10
    paginator = client.get_paginator("list_objects_v2")
    try:
        async for page in paginator.paginate(
            Bucket=spec.bucket, Prefix=prefix, PaginationConfig={"PageSize": LIST_PAGE_KEYS}
        ):
            pages += 1
            if pages > max_pages:
                raise S3FetchFailed(
                    f"the listing of {_where(spec)} did not end within {max_pages} pages "
                    f"(pages of {LIST_PAGE_KEYS} keys were asked for); refused"
                )
            contents = page.get("Contents", [])
            if not isinstance(contents, list):
                raise _bad_listing(spec, "Contents is not a list")
            listed += len(contents)
            if listed > 2 * max_files:  # folder markers included
                raise ArchiveRefused(
                    f"{_where(spec)} lists more than {2 * max_files} keys (twice the store's cap)"
                )
            for item in contents:
                obj = _listed_object(spec, prefix, item)
                if obj is None:
                    continue  # a folder marker, not a file
                found.append(obj)
                if len(found) > max_files:
                    raise ArchiveRefused(
                        f"{_where(spec)} holds more than {max_files} objects (the store's cap)"
                    )
    except (ValueError, TypeError, KeyError, AttributeError, ResponseParserError) as exc:
        # botocore's parser on a page it cannot read ("<Size>abc</Size>", broken XML).
        raise _bad_listing(spec, f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return found


def _bad_listing(spec: S3Source, why: str) -> S3FetchFailed:
    return S3FetchFailed(
        f"{_where(spec)} answered a listing that is not a valid ListObjectsV2 page ({why}); "
        "check the endpoint"
    )


def _listed_object(spec: S3Source, prefix: str, item: object) -> S3Object | None:
    """One ``Contents`` entry checked whole: a key under the prefix that can be a file name,
    a size that is a non-negative integer, an ETag that is text. None for a folder marker."""
    if not isinstance(item, dict):
        raise _bad_listing(spec, "an entry is not a Contents element")
    key, size, etag = item.get("Key"), item.get("Size"), item.get("ETag", "")
    if not isinstance(key, str) or not key:
        raise _bad_listing(spec, "an entry has no Key")
    if not key.startswith(prefix):
        raise _bad_listing(spec, f"key {key[:200]!r} is not under the prefix asked for")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _bad_listing(spec, f"key {key[:200]!r} has the size {str(size)[:40]!r}")
    if not isinstance(etag, str):
        raise _bad_listing(spec, f"key {key[:200]!r} has no valid ETag")
    if key.endswith("/"):
        return None
    try:
        rel = safe_rel_path(key[len(prefix) :])
    except UnsafePath as exc:
        raise ArchiveRefused(
            f"object key {key[:200]!r} in {_where(spec)} cannot be a file name: {exc}"
        ) from None
    return S3Object(rel, key, size, etag)


_session: Any = None


def _botocore_session() -> Any:
    """One session per process: it caches the parsed S3 service model (~0.2 s per client
    otherwise). Sessions hold no credentials here; each client gets its own."""
    global _session
    if _session is None:
        from aiobotocore.session import get_session

        _session = get_session()
    return _session


async def sync_s3(
    spec: S3Source, credentials: Mapping[str, bytes] | None, ctx: SyncContext
) -> Revision:
    from botocore.exceptions import BotoCoreError, ClientError

    kwargs = _client_kwargs(spec, credentials)
    limits = ctx.store.limits
    operation = "list"
    try:
        async with _botocore_session().create_client("s3", **kwargs) as client:
            objects = await _list(client, spec, limits.max_files)
            if not objects:
                raise NotFound(f"no objects under {_where(spec)}; check bucket and prefix")
            total = sum(o.size for o in objects)
            if total > limits.max_bytes:
                raise ArchiveRefused(
                    f"{_where(spec)} holds {total} bytes, more than the store's cap of "
                    f"{limits.max_bytes}"
                )
            digest = listing_digest(objects)
            existing = await ctx.existing(digest)
            if existing is not None:
                return existing
            reuse = await _reusable(spec, ctx)
            operation = "download from"

            async def fill(build: Build) -> None:
                downloads = []
                for obj in sorted(objects, key=lambda o: o.rel):
                    earlier = reuse.get(obj.rel)
                    if earlier is not None and earlier[0] == (obj.size, obj.etag):
                        await ctx.blocking(build.writer.add_link_from, obj.rel, earlier[1])
                    else:
                        downloads.append(_download(client, spec, obj, build.writer, ctx))
                await _run_all(downloads, CONCURRENCY)
                build.revision_id = digest
                build.source = f"sha256:{digest}"
                build.details = {
                    "endpoint": shown_url(spec.endpoint) if spec.endpoint else None,
                    "bucket": spec.bucket,
                    "prefix": spec.prefix,
                    "downloaded": len(downloads),
                    "objects": {o.rel: [o.size, o.etag] for o in objects},
                }

            return await ctx.build("s3", fill)
    except (ClientError, BotoCoreError) as exc:
        raise _client_error(spec, operation, exc) from None


async def _reusable(spec: S3Source, ctx: SyncContext) -> dict[str, tuple[tuple[int, str], Path]]:
    """Files of the previous revision that came from the same bucket, by relative key."""
    previous = await ctx.previous()
    if previous is None or previous.revision.kind != "s3":
        return {}
    details = previous.details
    same_bucket = details.get("bucket") == spec.bucket and details.get("endpoint") == (
        shown_url(spec.endpoint) if spec.endpoint else None
    )
    if not same_bucket:
        return {}
    base = previous.revision.path
    return {
        rel: ((int(value[0]), str(value[1])), base / rel)
        for rel, value in details.get("objects", {}).items()
    }


async def _run_all(jobs: Sequence[Awaitable[None]], limit: int) -> None:
    """Await ``jobs`` at most ``limit`` at a time; the first failure cancels the rest."""
    semaphore = asyncio.Semaphore(limit)

    async def one(job: Awaitable[None]) -> None:
        async with semaphore:
            await job

    tasks = [asyncio.ensure_future(one(job)) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _download(
    client: Any, spec: S3Source, obj: S3Object, writer: TreeWriter, ctx: SyncContext
) -> None:
    extra = {"IfMatch": obj.etag} if obj.etag else {}
    response = await client.get_object(Bucket=spec.bucket, Key=obj.key, **extra)
    body = response["Body"]
    md5 = hashlib.md5(usedforsecurity=False) if _MD5_ETAG.fullmatch(obj.etag.strip('"')) else None
    entry: OpenEntry = await ctx.blocking(writer.begin_file, obj.rel, 0o644)
    try:
        pending: list[bytes] = []
        size = 0
        async with body:
            async for chunk in body.iter_chunks(CHUNK // 4):
                size += len(chunk)
                if size > obj.size:
                    raise S3FetchFailed(
                        f"object {obj.key!r} in {_where(spec)} is larger than listed; it "
                        "changed during the sync"
                    )
                pending.append(chunk)
                if sum(len(p) for p in pending) >= CHUNK:
                    await ctx.blocking(_write, writer, entry, b"".join(pending), md5)
                    pending = []
        if pending:
            await ctx.blocking(_write, writer, entry, b"".join(pending), md5)
    except BaseException:
        writer.abort_file(entry)
        raise
    await ctx.blocking(writer.end_file, entry)
    if size != obj.size:
        raise S3FetchFailed(
            f"object {obj.key!r} in {_where(spec)}: got {size} bytes, listed {obj.size}"
        )
    if md5 is not None and md5.hexdigest() != obj.etag.strip('"'):
        raise S3FetchFailed(
            f"object {obj.key!r} in {_where(spec)}: content MD5 {md5.hexdigest()} does not "
            f"match its ETag {obj.etag}"
        )


def _write(writer: TreeWriter, entry: OpenEntry, data: bytes, md5: Any) -> None:
    if md5 is not None:
        md5.update(data)
    writer.write(entry, data)
