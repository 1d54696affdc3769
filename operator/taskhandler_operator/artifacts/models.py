"""Value types shared by the artifact readers, the listing and the planner.

Also holds :class:`OpenFile`, the one file-access primitive every reader goes
through: offset reads on a single descriptor (so size and content come from the
same open file) with a byte counter, which is how the benchmark proves the
listing reads only what identifies an artifact. Offsets and lengths a file claims
are clamped to the file, so no claimed value ever reaches a system call.

Two guards every reader uses on untrusted content: :func:`quote` renders a value
for a message (a short escaped prefix, never the whole value) and
:func:`verification_deadline` bounds a whole verification in time.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from taskhandler_operator.limits import CACHE_DIGEST_LENGTH, MAX_QUOTED_CHARS

# Chunk size for streaming hashes: large enough to amortise syscalls, small enough
# to keep memory flat whatever the artifact size.
HASH_CHUNK_BYTES = 1 << 20


class Language(StrEnum):
    GO = "go"
    JAVA = "java"
    TYPESCRIPT = "typescript"


# The file names that make an artifact a JAR or a TypeScript bundle (anything else may be a Go
# executable); here rather than in each reader so that naming a language imports no reader.
JAVA_SUFFIX = ".jar"
TYPESCRIPT_SUFFIX = ".min.mjs"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A file the language reader recognises as one of its artifacts.

    Mirrors Airflow's ``TaskHandlerCandidate``: ``cache_digest`` is the digest the
    artifact *stores* (never computed from its content), ``error`` is set when the
    artifact is recognisably broken and must not be probed.
    """

    rel_path: str
    size_bytes: int
    cache_digest: str | None
    error: str | None = None


class ArtifactVerificationError(Exception):
    """The full integrity check failed; the message names the file and the failing rule."""


class VerificationTimeout(ArtifactVerificationError):
    """The verification did not finish within its deadline (see :func:`verification_deadline`)."""


# Set by verification_deadline(); checked on every read and every step that loops.
# A ContextVar, so it follows asyncio.to_thread into the worker thread.
_DEADLINE: ContextVar[tuple[float, float] | None] = ContextVar("_DEADLINE", default=None)


@contextmanager
def verification_deadline(seconds: float | None) -> Iterator[None]:
    """Make every :func:`check_deadline` inside the block raise after ``seconds``."""
    if seconds is None:
        yield
        return
    token = _DEADLINE.set((time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline[0]:
        raise VerificationTimeout(f"verification did not finish within {deadline[1]:g}s")


def excerpt(text: str, limit: int = 200) -> str:
    """A message from a library about untrusted input: cut, with control characters escaped."""
    cut = text[:limit]
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown + "…" if len(text) > limit else shown


def quote(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """An untrusted value for a message: a short escaped prefix, never the whole value.

    Strings and bytes are cut to ``limit`` characters before ``repr`` (so the work does not
    grow with the value); containers are described by kind and size, never rendered: a YAML
    alias chain can make a small document expand to gigabytes when printed.
    """
    if isinstance(value, str | bytes):
        shown = repr(value[:limit])
        return shown + "…" if len(value) > limit else shown
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        # repr of an int past 4300 digits raises; its size says enough.
        bits = value.bit_length()
        return repr(value) if bits <= 64 else f"an integer of {bits} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item(s)"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class VerifiedArtifact:
    """What a probe or a worker needs to know about an artifact that passed verification."""

    path: Path
    language: Language
    schema_version: str
    size_bytes: int
    cache_digest: str | None
    main_class: str | None = None
    classpath: tuple[Path, ...] = ()


def normalize_cache_digest(value: object) -> str | None:
    """A stored digest usable for the fast path, or None (absent, empty or too long)."""
    if not isinstance(value, str) or not value or len(value) > CACHE_DIGEST_LENGTH:
        return None
    return value


def is_executable(mode: int) -> bool:
    """Whether any execute bit is set (a Dag bundle that dropped them cannot run the file)."""
    return bool(mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))


class OpenFile:
    """A regular file opened once and read by offset, counting every byte read.

    ``size`` and ``mode`` come from ``fstat`` on the same descriptor, so they
    describe exactly the bytes that are read (no stat/open race).
    """

    __slots__ = ("bytes_read", "fd", "path", "stat")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.stat = os.fstat(fd)
        self.bytes_read = 0

    @classmethod
    def open(cls, path: Path, *, follow_symlinks: bool = True) -> OpenFile:
        """Open ``path`` read-only; raises OSError, or IsADirectoryError for a non-regular file."""
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang us
        if not follow_symlinks:
            flags |= os.O_NOFOLLOW
        fd = os.open(path, flags)
        try:
            opened = cls(path, fd)
            if not stat.S_ISREG(opened.stat.st_mode):
                raise IsADirectoryError(f"{path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return opened

    @property
    def size(self) -> int:
        return self.stat.st_size

    @property
    def mode(self) -> int:
        return self.stat.st_mode

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at end of file).

        An offset or length outside the file (a hostile zip64 record can claim 2^64-1) reads
        nothing past the end instead of reaching ``pread``, which would overflow.
        """
        if length <= 0 or offset < 0 or offset >= self.size:
            return b""
        parts: list[bytes] = []
        remaining = min(length, self.size - offset)
        while remaining > 0:
            check_deadline()
            chunk = os.pread(self.fd, min(remaining, HASH_CHUNK_BYTES), offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
            remaining -= len(chunk)
        data = b"".join(parts)
        self.bytes_read += len(data)
        return data

    def iter_range(self, start: int, end: int) -> Iterator[bytes]:
        """Stream ``[start, end)`` in bounded chunks (for hashing large regions)."""
        offset = start
        while offset < end:
            chunk = self.read_at(offset, min(HASH_CHUNK_BYTES, end - offset))
            if not chunk:
                return
            yield chunk
            offset += len(chunk)

    def unchanged_since_open(self) -> bool:
        """Whether the file still has the identity and timestamps it had when opened."""
        now = os.fstat(self.fd)
        before = self.stat
        return (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns, now.st_ctime_ns) == (
            before.st_dev,
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
            before.st_ctime_ns,
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_schema_version(value: object) -> str:
    """The supervisor schema version as given, if it is a ``YYYY-MM-DD`` calendar date.

    Raises ValueError with a reason a user can act on otherwise.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("missing or invalid sdk.supervisor_schema_version")
    try:
        parsed = date.fromisoformat(value) if len(value) == 10 else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.isoformat() != value:
        raise ValueError(f"supervisor schema version {quote(value)} is not a YYYY-MM-DD date")
    return value


def verify_path(
    path: Path, name: str, check: Callable[[OpenFile, str], VerifiedArtifact]
) -> VerifiedArtifact:
    """Open ``path`` once and run a reader's ``check`` on it; a failed read names the file."""
    try:
        with OpenFile.open(path) as f:
            return check(f, name)
    except OSError as exc:
        raise ArtifactVerificationError(f"{name}: cannot be read ({exc})") from None
