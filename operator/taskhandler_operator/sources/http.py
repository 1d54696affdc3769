"""HTTP sources: one file or an archive at a URL, pinned by sha256.

Every sync asks the server whether the URL changed: with ``If-None-Match`` / ``If-Modified-Since``
from the kept revision, a ``304 Not Modified`` returns that revision without a download. A
``200`` is streamed to the staging folder while it is hashed and counted against the store's
byte cap; a digest other than the pin is refused, naming both. When the server offers no
validator (no ETag, no Last-Modified) a kept revision with the pinned digest is returned
without asking: the pin already says what the content is.

Credentials (a bearer ``token`` or ``username``/``password``) are sent to the URL's own origin
only: redirects are followed by hand, and a redirect to another scheme, host or port drops them;
a redirect to a URL that cannot be parsed (a port out of range) is a typed ``HttpFetchFailed``.

Validators are the server's text sent back on the next sync, so they are checked before they are
stored and again when read back (RFC 9110 syntax: visible ASCII, bounded length): an invalid one
is dropped with a warning, and a record written before this check cannot poison later syncs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from taskhandler_operator.redaction import cut, scrub
from taskhandler_operator.sources.archive import extract_archive
from taskhandler_operator.sources.credentials import secret_text
from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    ChecksumMismatch,
    HttpFetchFailed,
    InvalidSource,
    NotFound,
    shown_url,
)
from taskhandler_operator.sources.paths import UnsafePath, safe_rel_path
from taskhandler_operator.sources.spec import HttpSource

if TYPE_CHECKING:
    import aiohttp

    from taskhandler_operator.sources.context import Build, SyncContext
    from taskhandler_operator.sources.models import Revision

__all__ = ["file_name", "sync_http"]

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
CHUNK = 1 << 20
CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 60.0  # between two reads of the body; the sync's timeout bounds the whole
USER_AGENT = "taskhandler-operator"
# RFC 9110 §8.8.3: entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE, etagc = visible ASCII but '"'
# (obs-text refused: it would not survive being sent back). Unquoted tags, which some servers
# send, are accepted when they are visible ASCII too. §5.6.7: an HTTP-date is visible ASCII and
# spaces. Both bounded: a validator is stored and sent back on every sync.
MAX_VALIDATOR_CHARS = 256
_ETAG = re.compile(r'(?:W/)?"[\x21\x23-\x7e]*"|[\x21-\x7e]+')
_HTTP_DATE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_VALIDATORS = {"etag": ("ETag", _ETAG), "lastModified": ("Last-Modified", _HTTP_DATE)}


def valid_validator(key: str, value: object) -> str | None:
    """``value`` when it is a well-formed ETag (``key`` 'etag') or Last-Modified
    ('lastModified'), else None."""
    if not isinstance(value, str) or not value or len(value) > MAX_VALIDATOR_CHARS:
        return None
    return value if _VALIDATORS[key][1].fullmatch(value) else None


def _checked_validators(found: Mapping[str, object], url: str, where: str) -> dict[str, str]:
    """The well-formed validators of ``found``; each bad one is dropped with a warning."""
    kept: dict[str, str] = {}
    for key, (header, _pattern) in _VALIDATORS.items():
        value = found.get(key)
        if value is None or value == "":
            continue
        checked = valid_validator(key, value)
        if checked is None:
            log.warning(
                "ignoring the invalid %s %s for %s (not visible ASCII, or over %d characters)",
                header,
                where,
                shown_url(url),
                MAX_VALIDATOR_CHARS,
            )
            continue
        kept[key] = checked
    return kept


def file_name(spec: HttpSource) -> str:
    """The name a single-file download is stored under: the URL's last path segment."""
    name = unquote(posixpath.basename(urlsplit(spec.url).path))
    try:
        clean = safe_rel_path(name)
    except UnsafePath:
        clean = ""
    if not clean or "/" in clean:
        raise InvalidSource(
            f"http url {shown_url(spec.url)} does not end in a file name to store the download "
            "under"
        )
    return clean


def revision_id(spec: HttpSource) -> str:
    if spec.archive_format is not None:
        return spec.sha256
    # The same bytes under another name are another tree.
    return f"{spec.sha256}-{hashlib.sha256(file_name(spec).encode()).hexdigest()[:12]}"


def _auth_header(credentials: Mapping[str, bytes] | None) -> str | None:
    if credentials is None:
        return None
    token = secret_text(credentials, "token")
    if token is not None:
        return f"Bearer {token}"
    username = secret_text(credentials, "username")
    password = secret_text(credentials, "password", strip=False)
    if username is None or password is None:
        raise InvalidSource("the http source's Secret must hold token, or username and password")
    import aiohttp

    return aiohttp.encode_basic_auth(username, password)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


class _Response:
    """The final response of a GET after redirects, and the URL it came from."""

    def __init__(self, response: aiohttp.ClientResponse, url: str) -> None:
        self.response = response
        self.url = url


async def _get(
    session: aiohttp.ClientSession,
    url: str,
    auth: str | None,
    conditional: dict[str, str],
) -> _Response:
    import yarl

    headers = {"User-Agent": USER_AGENT, **conditional}
    origin = _origin(url)
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        sent = dict(headers)
        if auth is not None and _origin(current) == origin:
            sent["Authorization"] = auth
        response = await session.get(
            yarl.URL(current, encoded=True), headers=sent, allow_redirects=False
        )
        if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
            location = response.headers["Location"]
            response.release()
            try:
                target = str(yarl.URL(current, encoded=True).join(yarl.URL(location)))
                parts = urlsplit(target)
                _port = parts.port  # raises ValueError when out of range or not a number
            except (ValueError, TypeError) as exc:
                raise HttpFetchFailed(
                    f"GET {shown_url(url)} redirected to an invalid URL ({exc}); refused"
                ) from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise HttpFetchFailed(f"GET {shown_url(url)} redirected to a non-HTTP URL; refused")
            current = target
            continue
        return _Response(response, current)
    raise HttpFetchFailed(f"GET {shown_url(url)}: more than {MAX_REDIRECTS} redirects")


def _status_error(url: str, status: int, reason: str | None, has_auth: bool) -> Exception:
    where = f"GET {shown_url(url)}: HTTP {status} {reason or ''}".rstrip()
    if status in (401, 403):
        hint = (
            "check the token or username/password in the bundle's Secret"
            if has_auth
            else "the server wants credentials: set secretRef to a Secret with token or "
            "username and password"
        )
        return AuthenticationFailed(f"{where}; {hint}")
    if status in (404, 410):
        return NotFound(f"{where}; check the URL")
    return HttpFetchFailed(where)


async def sync_http(
    spec: HttpSource, credentials: Mapping[str, bytes] | None, ctx: SyncContext
) -> Revision:
    import aiohttp

    rev_id = revision_id(spec)
    name = None if spec.archive_format is not None else file_name(spec)
    auth = _auth_header(credentials)
    url_digest = hashlib.sha256(spec.url.encode()).hexdigest()
    kept = await ctx.store.record(ctx.namespace, ctx.bundle, rev_id)
    conditional: dict[str, str] = {}
    if kept is not None:
        details = kept.details
        if details.get("urlDigest") == url_digest:
            # A record from before validators were checked may hold a bad one: ignore it.
            stored = _checked_validators(details, spec.url, "in the kept revision's record")
            if "etag" in stored:
                conditional["If-None-Match"] = stored["etag"]
            if "lastModified" in stored:
                conditional["If-Modified-Since"] = stored["lastModified"]
        if not conditional:
            # Nothing to ask the server that the pin does not already answer.
            existing = await ctx.existing(rev_id)
            if existing is not None:
                return existing

    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
    )
    try:
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            got = await _get(session, spec.url, auth, conditional)
            async with got.response as response:
                if response.status == 304 and conditional:
                    existing = await ctx.existing(rev_id)
                    if existing is not None:
                        return existing
                    raise HttpFetchFailed(  # pragma: no cover - kept was just read
                        f"GET {shown_url(spec.url)} answered 304 to a request for a revision "
                        "that is no longer kept; retrying"
                    )
                if response.status != 200:
                    raise _status_error(got.url, response.status, response.reason, auth is not None)
                validators = _checked_validators(
                    {
                        "etag": response.headers.get("ETag"),
                        "lastModified": response.headers.get("Last-Modified"),
                    },
                    spec.url,
                    "the server sent",
                )
                return await _download_and_build(
                    spec, name, rev_id, response, validators, url_digest, ctx
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise HttpFetchFailed(
            f"GET {shown_url(spec.url)} failed: {_describe_client_error(exc, spec.url)}"
        ) from None


def _describe_client_error(exc: BaseException, url: str) -> str:
    text = str(exc) or type(exc).__name__
    # aiohttp may quote the URL; the query string can hold a signature. Scrubbed, then cut.
    return cut(scrub(text.replace(url, shown_url(url))), 300)


async def _download_and_build(
    spec: HttpSource,
    name: str | None,
    rev_id: str,
    response: aiohttp.ClientResponse,
    validators: dict[str, str],
    url_digest: str,
    ctx: SyncContext,
) -> Revision:
    cap = ctx.store.limits.max_bytes
    if response.content_length is not None and response.content_length > cap:
        raise ArchiveRefused(
            f"GET {shown_url(spec.url)} announces {response.content_length} bytes, more than "
            f"the store's cap of {cap} bytes"
        )
    details: dict[str, Any] = {
        "url": shown_url(spec.url),
        "urlDigest": url_digest,
        "sha256": spec.sha256,
        **{k: v for k, v in validators.items() if v},
    }

    async def fill(build: Build) -> None:
        download = build.staging.scratch / "download"
        digest = await _stream_to(response, download, cap, spec, ctx)
        if digest != spec.sha256:
            raise ChecksumMismatch(
                f"GET {shown_url(spec.url)} returned content with sha256 {digest}, but the "
                f"source pins sha256 {spec.sha256}; if the new content is expected, update the "
                "pin"
            )
        build.revision_id = rev_id
        build.source = f"sha256:{spec.sha256}"
        build.details = details
        if await ctx.store.get(ctx.namespace, ctx.bundle, rev_id) is not None:
            # Same bytes under new validators: remember them, skip the extraction.
            await ctx.store.update_details(ctx.namespace, ctx.bundle, rev_id, details)
            return
        if spec.archive_format is not None:
            try:
                await ctx.blocking(extract_archive, download, spec.archive_format, build.writer)
                await ctx.blocking(build.writer.finish)  # link checks, named with the archive
            except ArchiveRefused as exc:
                raise ArchiveRefused(
                    f"archive {shown_url(spec.url)} refused: {exc.message}"
                ) from None
        else:
            assert name is not None
            await ctx.blocking(build.writer.add_move, name, download, 0o755)

    return await ctx.build("http", fill)


async def _stream_to(
    response: aiohttp.ClientResponse, path: Path, cap: int, spec: HttpSource, ctx: SyncContext
) -> str:
    """Write the body to ``path`` (off the event loop), counting against ``cap``; its sha256."""
    digest = hashlib.sha256()
    fd = await ctx.blocking(
        os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
    )
    size = 0
    try:
        pending: list[bytes] = []
        pending_size = 0
        async for chunk in response.content.iter_chunked(CHUNK // 4):
            size += len(chunk)
            if size > cap:
                raise ArchiveRefused(
                    f"GET {shown_url(spec.url)} sent more than the store's cap of {cap} bytes"
                )
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= CHUNK:
                await ctx.blocking(_write_all, fd, b"".join(pending), digest)
                pending, pending_size = [], 0
        if pending:
            await ctx.blocking(_write_all, fd, b"".join(pending), digest)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _write_all(fd: int, data: bytes, digest: hashlib._Hash) -> None:
    digest.update(data)  # in the worker thread: hashlib releases the GIL for large buffers
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
