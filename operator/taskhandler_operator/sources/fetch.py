"""``taskhandler-operator fetch``: download a manifest of signed URLs into a folder, verified.

What a probe pod's init container runs. Standard library only (``urllib``), imported lazily by
the command, so a pod pays a few tens of milliseconds of imports, not an HTTP framework's.

Manifest: a JSON list of ``{"path", "url", "sha256", "size"}`` (optional ``"executable"``).
Each file is streamed to a hidden temporary file next to its destination while it is hashed
and counted, checked against ``size`` and ``sha256``, and renamed into place: a destination
file is either absent or complete and verified. A destination that already holds the right
bytes (an init container restarted in the same pod) is kept. Connection errors, 5xx answers,
short reads and digest mismatches are retried with exponential back-off; 4xx answers are not
(an expired or altered URL will not get better). The whole run is bounded by ``timeout``
seconds and ``max_bytes``; the first failure stops the others and is reported as one line.

The timeout is a deadline, not a per-read timeout: a server trickling a byte a second resets a
socket timeout at every byte, so every connection is registered with the run and a watchdog
shuts them all down when the deadline passes, waking any read blocked on them.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import stat
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskhandler_operator.redaction import scrub
from taskhandler_operator.sources.paths import UnsafePath, safe_rel_path

__all__ = [
    "FetchError",
    "FetchItem",
    "FetchResult",
    "ManifestError",
    "fetch_all",
    "parse_manifest",
]

CHUNK = 1 << 16
DEFAULT_TIMEOUT = 300.0
DEFAULT_MAX_BYTES = 4 << 30
DEFAULT_ATTEMPTS = 5
DEFAULT_PARALLEL = 4
READ_TIMEOUT = 30.0  # longest silence on one connection before it counts as dead
BACKOFF_START = 0.25
BACKOFF_MAX = 5.0
USER_AGENT = "taskhandler-operator-fetch"
DIGEST_HEADER = "X-Artifact-Sha256"  # the artifact server's; checked when present
EXECUTABLE_HEADER = "X-Artifact-Executable"
_SHA256 = re.compile(r"[0-9a-f]{64}")  # fullmatch: '$' also matches before a final newline
_KEYS = frozenset({"path", "url", "sha256", "size", "executable"})
MAX_MANIFEST_ITEMS = 100_000
MAX_URL_CHARS = 8192


class ManifestError(ValueError):
    """The manifest is not a list of valid items; the message names the first bad one."""


class FetchError(Exception):
    """A download failed for good; the message is one line naming the file (scrubbed of
    credentials)."""

    def __init__(self, message: str) -> None:
        super().__init__(scrub(message))


class _Retry(Exception):
    """A failure worth another attempt (connection, 5xx, short read, digest)."""


@dataclass(frozen=True)
class FetchItem:
    path: str
    url: str
    sha256: str
    size: int
    executable: bool | None = None


@dataclass(frozen=True)
class FetchResult:
    files: int
    bytes: int
    downloaded: int  # files actually transferred (the rest were already in place)
    attempts: int
    seconds: float


def _shown(url: str) -> str:
    return url.split("?", 1)[0]  # the query holds the signature


def parse_manifest(text: str) -> list[FetchItem]:
    from taskhandler_operator.inputfiles import InputError, parse_json

    try:
        data = parse_json(text, "manifest")
    except InputError as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(data, list):
        raise ManifestError("manifest must be a JSON list of {path, url, sha256, size}")
    if len(data) > MAX_MANIFEST_ITEMS:
        raise ManifestError(f"manifest lists {len(data)} items, more than {MAX_MANIFEST_ITEMS}")
    items: list[FetchItem] = []
    seen: set[str] = set()
    for index, raw in enumerate(data):
        where = f"manifest item {index}"
        if not isinstance(raw, dict):
            raise ManifestError(f"{where} is not an object")
        unknown = set(raw) - _KEYS
        missing = {"path", "url", "sha256", "size"} - set(raw)
        if unknown or missing:
            raise ManifestError(
                f"{where}: "
                + "; ".join(
                    part
                    for part in (
                        f"unknown keys {sorted(unknown)}" if unknown else "",
                        f"missing keys {sorted(missing)}" if missing else "",
                    )
                    if part
                )
            )
        path, url, sha256, size = raw["path"], raw["url"], raw["sha256"], raw["size"]
        executable = raw.get("executable")
        if not isinstance(path, str):
            raise ManifestError(f"{where}: path must be a string")
        try:
            clean = safe_rel_path(path)
        except UnsafePath as exc:
            raise ManifestError(f"{where}: path {exc}") from None
        if clean in seen:
            raise ManifestError(f"{where}: path {clean!r} appears twice")
        seen.add(clean)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ManifestError(f"{where} ({clean}): url must be an http:// or https:// URL")
        _check_url(url, f"{where} ({clean})")
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ManifestError(f"{where} ({clean}): sha256 must be 64 lowercase hex digits")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where} ({clean}): size must be a non-negative integer")
        if executable is not None and not isinstance(executable, bool):
            raise ManifestError(f"{where} ({clean}): executable must be true or false")
        items.append(FetchItem(clean, url, sha256, size, executable))
    return items


def _check_url(url: str, where: str) -> None:
    """Refuse a URL urllib would fail on later with a bare ValueError."""
    from urllib.parse import urlsplit

    if len(url) > MAX_URL_CHARS or any(c <= " " or c == "\x7f" for c in url):
        raise ManifestError(f"{where}: url is over {MAX_URL_CHARS} characters or has a space")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ManifestError(f"{where}: url {_shown(url)!r} is not a valid URL ({exc})") from None
    if not parts.hostname or port == 0:
        raise ManifestError(f"{where}: url {_shown(url)!r} has no host or a bad port")


class _Run:
    """Shared state of one fetch: deadline, stop flag, counters."""

    def __init__(self, dest: Path, timeout: float, attempts: int) -> None:
        self.dest = dest
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.attempts = attempts
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.total_attempts = 0
        self.downloaded = 0
        self.expired = False
        self._sockets: set[Any] = set()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def register(self, sock: Any) -> None:
        """A connection's socket, shut down by :meth:`expire` if still open at the deadline."""
        with self.lock:
            if self.expired:
                _shut(sock)
            self._sockets.add(sock)

    def expire(self) -> None:
        """The deadline passed: wake every read blocked on a socket, and stop."""
        with self.lock:
            self.expired = True
            sockets = list(self._sockets)
        self.stop.set()
        for sock in sockets:
            _shut(sock)

    def check(self, item: FetchItem) -> None:
        if self.expired or self.remaining() <= 0:
            raise FetchError(f"{item.path}: not done within the {self.timeout:g}s timeout")
        if self.stop.is_set():
            raise FetchError(f"{item.path}: stopped after another file failed")


def _shut(sock: Any) -> None:
    import contextlib
    import socket

    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def _opener(run: _Run) -> Any:
    """A urllib opener without proxies whose connections register with ``run``."""
    import http.client
    import urllib.request

    class _Tracked:
        # Registered for the whole run: the connection object lets go of its socket after the
        # headers while the response still reads the body from it. A socket object closed for
        # real has no file descriptor left, so a late shutdown cannot hit another one.
        def connect(self) -> None:
            super().connect()  # type: ignore[misc]
            run.register(self.sock)  # type: ignore[attr-defined]

    class _Http(_Tracked, http.client.HTTPConnection):
        pass

    class _Https(_Tracked, http.client.HTTPSConnection):
        pass

    class _HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(_Http, req)

    class _HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(_Https, req)

    # No proxies from the environment: the artifact server is reached directly.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _HttpHandler(), _HttpsHandler()
    )


def _parent(dest: Path, rel: str) -> Path:
    """The destination's folder, created; refuses a path through a symlink."""
    folder = dest
    for part in rel.split("/")[:-1]:
        folder = folder / part
        try:
            st = folder.lstat()
        except FileNotFoundError:
            folder.mkdir(mode=0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):  # lstat: a symlink is refused, not followed
            raise FetchError(f"{rel}: {folder} is not a folder (a file or a symlink is there)")
    return folder


def _already_there(target: Path, item: FetchItem) -> bool:
    try:
        if target.is_symlink() or not target.is_file() or target.stat().st_size != item.size:
            return False
        digest = hashlib.sha256()
        with target.open("rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest() == item.sha256
    except OSError:
        return False


def _attempt(opener: Any, item: FetchItem, run: _Run, folder: Path, leaf: str) -> bool | None:
    """One download into a temporary file, renamed into place when verified.

    Returns the server's executable flag (None when it sent none).
    """
    import urllib.error
    from http.client import HTTPException

    temporary = folder / f".{leaf}.part-{os.getpid()}-{random.getrandbits(32):08x}"
    request_timeout = max(0.5, min(READ_TIMEOUT, run.remaining()))
    digest = hashlib.sha256()
    received = 0
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            request = _request(item.url)
            try:
                response = opener.open(request, timeout=request_timeout)
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code >= 500 or exc.code == 429:
                    raise _Retry(f"HTTP {exc.code} from {_shown(item.url)}") from None
                hint = (
                    " (the signed URL expired or was altered)"
                    if exc.code == 403
                    else " (the revision is no longer kept?)"
                    if exc.code == 404
                    else ""
                )
                raise FetchError(
                    f"{item.path}: HTTP {exc.code} from {_shown(item.url)}{hint}"
                ) from None
            with response:
                if response.status != 200:
                    raise _Retry(f"HTTP {response.status} from {_shown(item.url)}")
                announced = response.headers.get(DIGEST_HEADER)
                if announced and announced.lower() != item.sha256:
                    raise FetchError(
                        f"{item.path}: the server serves sha256 {announced.lower()}, the manifest "
                        f"expects {item.sha256}"
                    )
                flag = response.headers.get(EXECUTABLE_HEADER)
                while True:
                    run.check(item)
                    chunk = response.read(CHUNK)
                    if not chunk:
                        break
                    received += len(chunk)
                    if received > item.size:
                        raise _Retry(f"more than the {item.size} bytes the manifest lists")
                    digest.update(chunk)
                    out.write(chunk)
        if received != item.size:
            raise _Retry(f"got {received} of {item.size} bytes")
        actual = digest.hexdigest()
        if actual != item.sha256:
            raise _Retry(f"sha256 mismatch: got {actual}, expected {item.sha256}")
        executable = item.executable if item.executable is not None else flag == "1"
        temporary.chmod(0o755 if executable else 0o644)
        temporary.replace(folder / leaf)
        return None if flag is None else flag == "1"
    except (urllib.error.URLError, HTTPException, OSError) as exc:
        if run.expired or run.remaining() <= 0:
            raise FetchError(f"{item.path}: not done within the {run.timeout:g}s timeout") from None
        if not isinstance(
            exc, urllib.error.URLError | HTTPException | ConnectionError | TimeoutError
        ):
            raise  # a local file error: not worth another attempt
        reason = getattr(exc, "reason", None) or exc
        raise _Retry(f"{type(exc).__name__}: {reason}") from None
    finally:
        temporary.unlink(missing_ok=True)


def _request(url: str) -> Any:
    import urllib.request

    return urllib.request.Request(url, headers={"User-Agent": USER_AGENT})  # noqa: S310


def _fetch_one(opener: Any, item: FetchItem, run: _Run) -> bool:
    """Bring one file into place; True when it was downloaded (False: already there)."""
    folder = _parent(run.dest, item.path)
    leaf = item.path.rsplit("/", 1)[-1]
    target = folder / leaf
    if _already_there(target, item):
        return False
    delay = BACKOFF_START
    last = ""
    for attempt in range(1, run.attempts + 1):
        run.check(item)
        with run.lock:
            run.total_attempts += 1
        try:
            _attempt(opener, item, run, folder, leaf)
            with run.lock:
                run.downloaded += 1
            return True
        except _Retry as exc:
            last = str(exc)
        if attempt == run.attempts:
            break
        jitter = random.uniform(0.8, 1.2)  # noqa: S311 - spreading retries, not a secret
        pause = min(delay * jitter, max(0.0, run.remaining()))
        if run.stop.wait(pause):
            run.check(item)
        delay = min(delay * 2, BACKOFF_MAX)
        if run.remaining() <= 0:
            break
    if run.remaining() <= 0:
        raise FetchError(f"{item.path}: not done within the {run.timeout:g}s timeout ({last})")
    raise FetchError(f"{item.path}: failed after {run.attempts} attempts: {last}")


def fetch_all(
    items: Sequence[FetchItem],
    dest: Path,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    attempts: int = DEFAULT_ATTEMPTS,
    parallel: int = DEFAULT_PARALLEL,
) -> FetchResult:
    """Download ``items`` into ``dest``; raises FetchError (one line) on the first failure."""
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    started = time.monotonic()
    total = sum(item.size for item in items)
    if total > max_bytes:
        raise FetchError(f"the manifest lists {total} bytes, more than --max-bytes {max_bytes}")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create {dest}: {exc.strerror}") from None
    run = _Run(dest, timeout, max(1, attempts))
    opener = _opener(run)
    errors: list[FetchError] = []
    watchdog = threading.Timer(timeout, run.expire)
    watchdog.daemon = True
    watchdog.start()
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(items) or 1))) as pool:
        futures = [pool.submit(_fetch_one, opener, item, run) for item in items]
        for future in futures:
            try:
                future.result()
            except FetchError as exc:
                if not errors:
                    run.stop.set()
                errors.append(exc)
            except OSError as exc:
                run.stop.set()
                errors.append(FetchError(f"cannot write into {dest}: {exc}"))
    watchdog.cancel()
    if errors:
        # The first real cause, not the "stopped after another file failed" echoes.
        primary = next((e for e in errors if "stopped after" not in str(e)), errors[0])
        raise primary
    return FetchResult(
        files=len(items),
        bytes=total,
        downloaded=run.downloaded,
        attempts=run.total_attempts,
        seconds=time.monotonic() - started,
    )
