"""Value types shared by the artifact readers, the listing and the planner.

Also holds :class:`OpenFile`, the one file-access primitive every reader goes
through: offset reads on a single descriptor (so size and content come from the
same open file) with a byte counter, which is how the benchmark proves the
listing reads only what identifies an artifact.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from taskhandler_operator.limits import CACHE_DIGEST_LENGTH

# Chunk size for streaming hashes: large enough to amortise syscalls, small enough
# to keep memory flat whatever the artifact size.
HASH_CHUNK_BYTES = 1 << 20


class Language(StrEnum):
    GO = "go"
    JAVA = "java"
    TYPESCRIPT = "typescript"


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
        """Up to ``length`` bytes at ``offset`` (fewer only at end of file)."""
        if length <= 0 or offset < 0:
            return b""
        parts: list[bytes] = []
        remaining = length
        while remaining > 0:
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
        parsed = date.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.isoformat() != value:
        raise ValueError(f"supervisor schema version {value!r} is not a YYYY-MM-DD date")
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
