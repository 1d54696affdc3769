"""Writing a revision tree safely: every file, folder and link goes through :class:`TreeWriter`.

The writer is the one place that touches a revision folder being built, and it guarantees
that nothing is ever written outside it:

* every name passes :func:`~taskhandler_operator.sources.paths.safe_rel_path`;
* folders are opened component by component relative to the root's descriptor with
  ``O_NOFOLLOW``, so a symlink planted by an earlier entry is never followed;
* files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a duplicate entry is refused, not
  overwritten);
* symlinks are created inert (never written through) and checked once the tree is complete:
  each must resolve inside the root;
* hard links may only point at a regular file already in the tree;
* devices, FIFOs, sockets and setuid/setgid files are refused; modes become 0644/0755;
* the number of entries and the bytes of the tree are capped, counted as data arrives, so a
  zip bomb stops at the cap, not at the size its header claims.

Blocking by design: callers run it in a worker thread (``asyncio.to_thread``) and cancel it by
setting the ``cancel`` event, which is checked between chunks.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from taskhandler_operator.sources.errors import ArchiveRefused, StorageFailed
from taskhandler_operator.sources.paths import UnsafePath, safe_rel_path

__all__ = [
    "Cancelled",
    "TreeLimits",
    "TreeStats",
    "TreeWriter",
    "open_folder",
    "open_sub_folder",
    "snapshot_tree",
]

GiB = 1 << 30
CHUNK = 1 << 20
MAX_SYMLINK_TARGET = 1024
_FICLONE = 0x40049409  # linux/fs.h: share the source's extents (copy-on-write) when supported
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Cancelled(Exception):
    """The caller set the cancel event; the tree is incomplete and will be removed."""


@dataclass(frozen=True)
class TreeLimits:
    """Caps on one revision: entries (files, folders, links) and bytes of file content."""

    max_files: int = 50_000
    max_bytes: int = 8 * GiB

    def __post_init__(self) -> None:
        if self.max_files < 1 or self.max_bytes < 0:
            raise ValueError("max_files must be positive and max_bytes not negative")


@dataclass(frozen=True)
class TreeStats:
    files: int  # regular files, hard links included
    bytes: int  # their content, hard links counted at their target's size
    entries: int  # files, folders and symlinks


_F = TypeVar("_F", bound=Callable[..., Any])


def _storage_errors(method: _F) -> _F:
    """Turn an OSError while writing the revision folder into StorageFailed, so that callers
    reading an archive can treat their own OSErrors as a broken archive without mistaking a
    full disk for one."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise StorageFailed(
                f"cannot write the revision folder{where}: {exc.strerror or exc}"
            ) from None

    return cast(_F, wrapper)


def _file_mode(mode: int, what: str) -> int:
    """The mode a revision file gets: read-only (revisions are immutable), executable or not."""
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise ArchiveRefused(f"{what} has the setuid or setgid bit")
    return 0o555 if mode & 0o111 else 0o444


class OpenEntry:
    """A file being written by :meth:`TreeWriter.begin_file`."""

    __slots__ = ("fd", "mode", "rel", "size")

    def __init__(self, fd: int, rel: str, mode: int) -> None:
        self.fd = fd
        self.rel = rel
        self.mode = mode
        self.size = 0


class TreeWriter:
    """Builds a tree under ``root`` (an existing, empty folder) within ``limits``."""

    def __init__(
        self, root: Path, limits: TreeLimits, cancel: threading.Event | None = None
    ) -> None:
        self.root = root
        self.limits = limits
        self.cancel = cancel
        self._root_fd = os.open(root, _DIR_FLAGS)
        self._dir_fds: OrderedDict[str, int] = OrderedDict()  # a few open parents, LRU
        self._symlinks: list[str] = []
        self._sizes: dict[str, int] = {}  # regular files written: rel path -> size
        self.entries = 0
        self.files = 0
        self.bytes = 0
        # Concurrent downloads (S3) write different files through one writer from worker
        # threads; the bookkeeping and the folder cache are shared.
        self._lock = threading.RLock()

    # -- bookkeeping ---------------------------------------------------------------------------

    def check_cancelled(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled

    def _name(self, name: str, what: str = "entry") -> str:
        try:
            return safe_rel_path(name)
        except UnsafePath as exc:
            raise ArchiveRefused(f"{what} {exc}") from None

    def _count_entry(self) -> None:
        self.check_cancelled()
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise ArchiveRefused(
                f"more than {self.limits.max_files} entries (files, folders and links); "
                "the cap is the store's max_files"
            )

    def _count_bytes(self, n: int, rel: str) -> None:
        self.bytes += n
        if self.bytes > self.limits.max_bytes:
            raise ArchiveRefused(
                f"more than {self.limits.max_bytes} bytes of content (reached while writing "
                f"{rel!r}); the cap is the store's max_bytes"
            )

    # -- folders -------------------------------------------------------------------------------

    def _dir_fd(self, rel_dir: str, *, create: bool) -> int:
        """An open descriptor of folder ``rel_dir`` ('' = root), never through a symlink."""
        if not rel_dir:
            return self._root_fd
        cached = self._dir_fds.get(rel_dir)
        if cached is not None:
            self._dir_fds.move_to_end(rel_dir)
            return cached
        parent, _, leaf = rel_dir.rpartition("/")
        parent_fd = self._dir_fd(parent, create=create)
        try:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise ArchiveRefused(f"{rel_dir!r} does not exist") from None
            self._count_entry()  # an implied folder is an entry like any other
            os.mkdir(leaf, 0o755, dir_fd=parent_fd)
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ArchiveRefused(
                    f"{rel_dir!r} is a symlink or a file, and an entry is written below it"
                ) from None
            raise
        self._dir_fds[rel_dir] = fd
        if len(self._dir_fds) > 32:
            _, old = self._dir_fds.popitem(last=False)
            os.close(old)
        return fd

    def _parent(self, rel: str, *, create: bool = True) -> tuple[int, str]:
        parent, _, leaf = rel.rpartition("/")
        return self._dir_fd(parent, create=create), leaf

    @_storage_errors
    def add_dir(self, name: str) -> None:
        with self._lock:
            self._add_dir(name)

    def _add_dir(self, name: str) -> None:
        stripped = name.strip("/")
        if stripped in ("", "."):
            return  # the root itself
        rel = self._name(name, "folder")
        self._count_entry()
        parent_fd, leaf = self._parent(rel)
        try:
            os.mkdir(leaf, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            st = os.lstat(leaf, dir_fd=parent_fd)
            if not stat.S_ISDIR(st.st_mode):
                raise ArchiveRefused(f"folder {rel!r} is already a file or a link") from None

    # -- files ---------------------------------------------------------------------------------

    def _create(self, rel: str) -> int:
        parent_fd, leaf = self._parent(rel)
        try:
            return os.open(leaf, _NEW_FILE_FLAGS, 0o600, dir_fd=parent_fd)
        except FileExistsError:
            raise ArchiveRefused(f"{rel!r} appears twice") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ArchiveRefused(f"{rel!r} appears twice (first as a link)") from None
            raise

    @_storage_errors
    def begin_file(self, name: str, mode: int = 0o644) -> OpenEntry:
        """Create a regular file to be filled with :meth:`write` and closed by :meth:`end_file`."""
        with self._lock:
            rel = self._name(name)
            file_mode = _file_mode(mode, f"file {rel!r}")
            self._count_entry()
            return OpenEntry(self._create(rel), rel, file_mode)

    @_storage_errors
    def write(self, entry: OpenEntry, chunk: bytes) -> None:
        self.check_cancelled()
        if not chunk:
            return
        with self._lock:
            self._count_bytes(len(chunk), entry.rel)
        view = memoryview(chunk)
        while view:
            written = os.write(entry.fd, view)
            view = view[written:]
        entry.size += len(chunk)

    @_storage_errors
    def end_file(self, entry: OpenEntry) -> int:
        try:
            os.fchmod(entry.fd, entry.mode)
        finally:
            os.close(entry.fd)
            entry.fd = -1
        with self._lock:
            self.files += 1
            self._sizes[entry.rel] = entry.size
        return entry.size

    def abort_file(self, entry: OpenEntry) -> None:
        if entry.fd >= 0:
            os.close(entry.fd)
            entry.fd = -1

    def add_file(self, name: str, chunks: Iterable[bytes], mode: int = 0o644) -> int:
        """Write a regular file from ``chunks``; returns its size."""
        entry = self.begin_file(name, mode)
        try:
            for chunk in chunks:
                self.write(entry, chunk)
        except BaseException:
            self.abort_file(entry)
            raise
        return self.end_file(entry)

    @_storage_errors
    def add_copy(self, name: str, src: int, expected: os.stat_result | None = None) -> int:
        """Copy the regular file open as ``src``; returns its size.

        ``expected`` (from the walk) must describe the same file, or the walk raced a rename.
        Uses a copy-on-write clone when the file system supports it, else an in-kernel copy.
        """
        rel = self._name(name)
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise ArchiveRefused(f"{rel!r} is not a regular file")
        if expected is not None and (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
            raise ArchiveRefused(f"{rel!r} was replaced while it was copied")
        file_mode = _file_mode(st.st_mode, f"file {rel!r}")
        self._count_entry()
        self._count_bytes(st.st_size, rel)
        dst = self._create(rel)
        try:
            _copy_fd(src, dst, st.st_size, self)
            os.fchmod(dst, file_mode)
            # The copy keeps the source's modification time: a volume's revision id includes
            # it, and the id computed on the snapshot must match the one on the volume.
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
        self.files += 1
        self._sizes[rel] = st.st_size
        return st.st_size

    @_storage_errors
    def add_move(self, name: str, source: Path, mode: int = 0o644) -> int:
        """Move the downloaded file ``source`` (in the same staging folder) in as ``name``."""
        with self._lock:
            rel = self._name(name)
            file_mode = _file_mode(mode, f"file {rel!r}")
            st = os.lstat(source)
            if not stat.S_ISREG(st.st_mode):
                raise ArchiveRefused(f"{rel!r} is not a regular file")
            self._count_entry()
            self._count_bytes(st.st_size, rel)
            parent_fd, leaf = self._parent(rel)
            source.chmod(file_mode)
            try:
                # link + unlink rather than rename: a rename would replace an existing entry
                os.link(source, leaf, dst_dir_fd=parent_fd, follow_symlinks=False)
            except FileExistsError:
                raise ArchiveRefused(f"{rel!r} appears twice") from None
            source.unlink()
            self.files += 1
            self._sizes[rel] = st.st_size
            return st.st_size

    @_storage_errors
    def add_link_from(self, name: str, source: Path) -> int:
        with self._lock:
            return self._add_link_from(name, source)

    def _add_link_from(self, name: str, source: Path) -> int:
        """Hard-link an immutable file of an earlier revision (same store) as ``name``."""
        rel = self._name(name)
        st = os.lstat(source)
        if not stat.S_ISREG(st.st_mode):
            raise ArchiveRefused(f"{rel!r}: the earlier revision's copy is not a regular file")
        self._count_entry()
        self._count_bytes(st.st_size, rel)
        parent_fd, leaf = self._parent(rel)
        try:
            os.link(source, leaf, dst_dir_fd=parent_fd, follow_symlinks=False)
        except FileExistsError:
            raise ArchiveRefused(f"{rel!r} appears twice") from None
        self.files += 1
        self._sizes[rel] = st.st_size
        return st.st_size

    # -- links ---------------------------------------------------------------------------------

    @_storage_errors
    def add_symlink(self, name: str, target: str) -> None:
        with self._lock:
            self._add_symlink(name, target)

    def _add_symlink(self, name: str, target: str) -> None:
        rel = self._name(name, "link")
        if not target or "\x00" in target or len(target) > MAX_SYMLINK_TARGET:
            raise ArchiveRefused(f"link {rel!r} has an empty or invalid target")
        if target.startswith("/"):
            raise ArchiveRefused(f"link {rel!r} points to an absolute path ({target[:200]!r})")
        self._count_entry()
        parent_fd, leaf = self._parent(rel)
        try:
            os.symlink(target, leaf, dir_fd=parent_fd)
        except FileExistsError:
            raise ArchiveRefused(f"{rel!r} appears twice") from None
        self._symlinks.append(rel)

    @_storage_errors
    def add_hardlink(self, name: str, target: str) -> None:
        with self._lock:
            self._add_hardlink(name, target)

    def _add_hardlink(self, name: str, target: str) -> None:
        rel = self._name(name, "hard link")
        target_rel = self._name(target, f"hard link {rel!r} target")
        size = self._sizes.get(target_rel)
        if size is None:
            raise ArchiveRefused(
                f"hard link {rel!r} points to {target_rel!r}, which is not a file written "
                "before it in the archive"
            )
        self._count_entry()
        self._count_bytes(size, rel)
        target_fd, target_leaf = self._parent(target_rel, create=False)
        st = os.lstat(target_leaf, dir_fd=target_fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArchiveRefused(f"hard link {rel!r} does not point to a regular file")
        parent_fd, leaf = self._parent(rel)
        try:
            os.link(
                target_leaf,
                leaf,
                src_dir_fd=target_fd,
                dst_dir_fd=parent_fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            raise ArchiveRefused(f"{rel!r} appears twice") from None
        self.files += 1
        self._sizes[rel] = size

    # -- end -----------------------------------------------------------------------------------

    def finish(self) -> TreeStats:
        """Check every symlink resolves inside the root; return what was written."""
        real_root = self.root.resolve()
        for rel in self._symlinks:
            self.check_cancelled()
            link = real_root / rel
            try:
                inside = link.resolve().is_relative_to(real_root)
            except RuntimeError:  # Python 3.11 reports a symlink loop this way
                raise ArchiveRefused(f"link {rel!r} is part of a symlink loop") from None
            if not inside:
                target = str(link.readlink())
                raise ArchiveRefused(
                    f"link {rel!r} -> {target[:200]!r} resolves outside the revision folder"
                )
        return TreeStats(files=self.files, bytes=self.bytes, entries=self.entries)

    def close(self) -> None:
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def __enter__(self) -> TreeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_fd(src: int, dst: int, size: int, writer: TreeWriter) -> None:
    """Copy ``size`` bytes: a reflink when possible, else copy_file_range, else read/write."""
    try:
        fcntl.ioctl(dst, _FICLONE, src)
        os.ftruncate(dst, size)  # the source may have grown since fstat
        return
    except OSError:
        pass
    offset = 0
    use_range = hasattr(os, "copy_file_range")
    while offset < size:
        writer.check_cancelled()
        step = min(CHUNK * 8, size - offset)
        copied = 0
        if use_range:
            try:
                copied = os.copy_file_range(src, dst, step, offset, offset)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                use_range = False
        if not use_range:
            data = os.pread(src, min(step, CHUNK), offset)
            copied = os.pwrite(dst, data, offset) if data else 0
        if copied == 0:
            break  # the source shrank: keep what exists
        offset += copied
    os.ftruncate(dst, offset)


FileKey = tuple[int, int, int]  # (size, mtime_ns, mode) of a source file


def open_folder(base: Path, sub_path: str) -> int:
    """Open ``base`` (trusted: named by the operator's configuration) and then ``sub_path``
    (inside the volume, so never through a symlink). Raises FileNotFoundError / NotADirectoryError
    / ArchiveRefused."""
    return open_sub_folder(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), sub_path)


def open_sub_folder(fd: int, sub_path: str) -> int:
    """The folder ``sub_path`` below the open folder ``fd``, never through a symlink; ``fd``
    is consumed (closed, or returned when ``sub_path`` is empty). Raises as :func:`open_folder`."""
    try:
        for part in [p for p in sub_path.split("/") if p]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                # O_NOFOLLOW | O_DIRECTORY on a symlink fails with ELOOP or ENOTDIR.
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                    os.lstat(part, dir_fd=fd).st_mode
                ):
                    raise ArchiveRefused(f"subPath component {part!r} is a symlink") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device file"


def snapshot_tree(
    root_fd: int,
    writer: TreeWriter,
    reuse: dict[str, tuple[FileKey, Path]] | None = None,
) -> dict[str, FileKey]:
    """Copy the tree of the open folder ``root_fd`` into ``writer``; return each file's key.

    The walk goes through descriptors with ``O_NOFOLLOW`` only, so whoever writes the volume
    cannot swap a folder for a symlink mid-walk and have a file from outside copied in.
    ``reuse`` maps a relative path to the key it had when an earlier revision copied it, and
    that copy: a file that still matches is hard-linked from the earlier (immutable) revision
    instead of copied again. Symlinks are kept when they stay inside the tree; FIFOs, sockets
    and devices are refused.
    """
    seen: dict[str, FileKey] = {}
    # Pending folders are kept by name and reopened from the root when their turn comes, so a
    # wide tree never holds more descriptors open than it is deep.
    stack: list[str] = [""]
    while stack:
        prefix = stack.pop()
        fd = _open_below(root_fd, prefix)
        try:
            _snapshot_folder(fd, prefix, writer, reuse, seen, stack)
        finally:
            os.close(fd)
    return seen


def _open_below(root_fd: int, rel: str) -> int:
    fd = os.dup(root_fd)
    try:
        for part in [p for p in rel.split("/") if p]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise ArchiveRefused(
                    f"folder {rel.rstrip('/')!r} cannot be opened ({exc.strerror}); was it "
                    "replaced during the snapshot?"
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _snapshot_folder(
    fd: int,
    prefix: str,
    writer: TreeWriter,
    reuse: dict[str, tuple[FileKey, Path]] | None,
    seen: dict[str, FileKey],
    stack: list[str],
) -> None:
    try:
        with os.scandir(fd) as scan:
            names = sorted(entry.name for entry in scan)
    except OSError as exc:
        where = prefix.rstrip("/") or "."
        raise ArchiveRefused(f"folder {where!r} cannot be read ({exc.strerror})") from None
    folders: list[str] = []
    for name in names:
        writer.check_cancelled()
        rel = prefix + name
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            continue  # removed since the folder was read
        if stat.S_ISDIR(st.st_mode):
            writer.add_dir(rel)
            folders.append(rel + "/")
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
            earlier = reuse.get(rel) if reuse else None
            if earlier is not None and earlier[0] == key and earlier[1].is_file():
                writer.add_link_from(rel, earlier[1])
            else:
                try:
                    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
                except OSError as exc:
                    raise ArchiveRefused(f"{rel!r} cannot be read ({exc.strerror})") from None
                try:
                    writer.add_copy(rel, src, st)
                finally:
                    os.close(src)
            seen[rel] = key
        elif stat.S_ISLNK(st.st_mode):
            writer.add_symlink(rel, os.readlink(name, dir_fd=fd))
        else:
            raise ArchiveRefused(f"{rel!r} is {_kind(st.st_mode)}")
    stack.extend(reversed(folders))  # popped in sorted order: a deterministic walk
