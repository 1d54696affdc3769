"""The artifact server: probe pods download revision files from the operator over HTTP.

An aiohttp application that runs in the operator's own event loop. Every URL is signed by
the operator (:meth:`ArtifactServer.sign_url`) and expires; the server answers only requests
whose signature matches, for files inside a revision the store still keeps. Responses are
sent with ``sendfile`` (memory does not grow with the file) and carry the file's sha256 in
``X-Artifact-Sha256`` (and whether it is executable in ``X-Artifact-Executable``), which the
``fetch`` command checks against its manifest.

Refusals: a path that is not a clean relative path (``..``, ``%2e%2e``, absolute, backslash)
is 404 ``escaping``; a missing, malformed or wrong signature is 403 ``unsigned``/``tampered``;
a past expiry is 403 ``expired``; a revision no longer kept or a file not in it is 404
``missing``. Each outcome is counted (``counts``, an optional Prometheus counter, and an
optional callback). Nothing logs a request's query string: it holds the signature.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from taskhandler_operator.sources import signing
from taskhandler_operator.sources.paths import UnsafePath
from taskhandler_operator.sources.signing import Verdict

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from taskhandler_operator.sources.store import RevisionStore

__all__ = ["DIGEST_HEADER", "EXECUTABLE_HEADER", "ArtifactServer"]

log = logging.getLogger(__name__)


class _ClientErrorsWithoutTraceback(logging.Filter):
    """aiohttp logs a request it cannot parse (a raw non-ASCII byte in the query, a bad
    request line) with ``logger.exception``: a traceback at ERROR for the client's mistake.
    Those become one INFO line; a server-side error keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and 400 <= error.code < 500:
            record.msg = "malformed HTTP request refused (%s): %s"
            record.args = (error.code, str(error.message)[:200])
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.INFO
            record.levelname = logging.getLevelName(logging.INFO)
        return True


# aiohttp's per-request logger for this server only (its default, aiohttp.server, is shared).
http_log = logging.getLogger(f"{__name__}.http")
http_log.addFilter(_ClientErrorsWithoutTraceback())

DIGEST_HEADER = "X-Artifact-Sha256"
EXECUTABLE_HEADER = "X-Artifact-Executable"
HASH_CHUNK = 1 << 20
DIGEST_CACHE_ENTRIES = 4096
STATUS = {
    Verdict.SERVED: 200,
    Verdict.UNSIGNED: 403,
    Verdict.EXPIRED: 403,
    Verdict.TAMPERED: 403,
    Verdict.ESCAPING: 404,
    Verdict.MISSING: 404,
}
_FileKey = tuple[str, int, int, int, int]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ArtifactServer:
    """Serves kept revisions of ``store`` under signed, expiring URLs."""

    def __init__(
        self,
        store: RevisionStore,
        key: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        public_url: str | None = None,
        registry: CollectorRegistry | None = None,
        on_request: Callable[[str], None] | None = None,
    ) -> None:
        signing.sign(key, signing.place("a", "b", "c", "d"), 0)  # refuses a short key now
        self.store = store
        self._key = key
        self.host = host
        self.port = port
        self._public_url = public_url.rstrip("/") if public_url else None
        self.counts: Counter[str] = Counter()
        self._on_request = on_request
        self._counter: Any = None
        if registry is not None:
            from prometheus_client import Counter as PromCounter

            self._counter = PromCounter(
                "thop_artifact_requests",
                "Requests to the artifact server, by outcome "
                "(served, unsigned, expired, tampered, escaping, missing).",
                ["outcome"],
                registry=registry,
            )
        self._digests: dict[_FileKey, str] = {}
        self._pending: dict[_FileKey, asyncio.Future[str]] = {}
        self._runner: web.AppRunner | None = None
        self.app = web.Application()
        self.app.router.add_route("GET", signing.PATH_PREFIX + "{tail:.*}", self._handle)
        self.app.router.add_route("HEAD", signing.PATH_PREFIX + "{tail:.*}", self._handle)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=5.0, logger=http_log
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("artifact server listening on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        """The base URL signed URLs start with (``public_url`` when given)."""
        if self._public_url:
            return self._public_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- signing -------------------------------------------------------------------------------

    def sign_url(
        self, namespace: str, bundle: str, revision: str, rel_path: str, expires_in: float
    ) -> str:
        """A URL for one file of a revision, valid for ``expires_in`` seconds."""
        where = signing.place(namespace, bundle, revision, rel_path)
        return self.url + signing.signed_path(self._key, where, expires_in)

    async def file_digest(self, path: Path) -> str:
        """sha256 of a revision file, computed once per file (revision files never change)."""
        st = await asyncio.to_thread(os.stat, path)
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._digests.get(key)
        if known is not None:
            return known
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(_sha256_file, path))
            self._pending[key] = pending
            try:
                digest = await asyncio.shield(pending)
            finally:
                self._pending.pop(key, None)
            if len(self._digests) >= DIGEST_CACHE_ENTRIES:
                self._digests.pop(next(iter(self._digests)))
            self._digests[key] = digest
            return digest
        return await asyncio.shield(pending)

    async def manifest_entry(
        self, namespace: str, bundle: str, revision: str, rel_path: str, expires_in: float
    ) -> dict[str, Any]:
        """One item of a ``fetch`` manifest: path, signed url, sha256 and size."""
        where = signing.place(namespace, bundle, revision, rel_path)
        path = await asyncio.to_thread(self._resolve, where)
        if path is None:
            raise FileNotFoundError(f"{where.canonical()} is not a file of a kept revision")
        st = await asyncio.to_thread(path.stat)
        return {
            "path": where.rel_path,
            "url": self.sign_url(namespace, bundle, revision, rel_path, expires_in),
            "sha256": await self.file_digest(path),
            "size": st.st_size,
        }

    # -- serving -------------------------------------------------------------------------------

    def _count(self, verdict: Verdict) -> None:
        self.counts[verdict.value] += 1
        if self._counter is not None:
            self._counter.labels(outcome=verdict.value).inc()
        if self._on_request is not None:
            self._on_request(verdict.value)

    def _refuse(self, verdict: Verdict, what: str) -> web.Response:
        self._count(verdict)
        log.info("artifact request refused (%s): %s", verdict.value, what[:300])
        return web.Response(status=STATUS[verdict], text=f"{verdict.value}\n")

    def _resolve(self, where: signing.SignedPlace) -> Path | None:
        """The regular file ``where`` names inside a kept revision, or None."""
        folder = self.store.revision_dir(where.namespace, where.bundle, where.revision)
        record = folder.parent / ".meta" / f"{where.revision}.json"
        if not record.is_file() or not folder.is_dir():
            return None
        try:
            real_folder = folder.resolve(strict=True)
            real = (folder / where.rel_path).resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(real_folder):
            return None  # a symlink inside the revision cannot reach out of it
        return real if stat.S_ISREG(real.stat().st_mode) else None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        tail = request.match_info.get("tail", "")
        parts = tail.split("/", 3)
        if len(parts) < 4:
            return self._refuse(Verdict.MISSING, raw_path)
        try:
            where = signing.place(*parts)
        except (UnsafePath, ValueError):
            return self._refuse(Verdict.ESCAPING, raw_path)
        # The path as sent must be exactly what the signature covers: no dot segments that a
        # normaliser removed on the way, no encoded slashes.
        if "/../" in f"{raw_path}/" or "/./" in f"{raw_path}/" or "%2f" in raw_path.lower():
            return self._refuse(Verdict.ESCAPING, raw_path)
        try:
            verdict = signing.verify(
                self._key, where, request.query.get("expires"), request.query.get("signature")
            )
        except (ValueError, TypeError, UnicodeError):
            # A query no signature can match (undecodable, ...): refused like a forged one,
            # never an HTTP 500 with a traceback in the operator's log.
            verdict = Verdict.TAMPERED
        if verdict is not Verdict.SERVED:
            return self._refuse(verdict, raw_path)
        path = await asyncio.to_thread(self._resolve, where)
        if path is None:
            return self._refuse(Verdict.MISSING, raw_path)
        digest = await self.file_digest(path)
        mode = (await asyncio.to_thread(path.stat)).st_mode
        self._count(Verdict.SERVED)
        headers = {
            DIGEST_HEADER: digest,
            EXECUTABLE_HEADER: "1" if mode & 0o111 else "0",
            "Cache-Control": "no-store",
            "Content-Type": "application/octet-stream",
        }
        return web.FileResponse(path, headers=headers)
