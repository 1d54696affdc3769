"""Volume sources: a folder the operator can read, snapshotted into a revision.

The revision id is a digest of what the artifact listing would see: each candidate's relative
path, size, stored cache digest and executable bit, plus every other file's path, size and
modification time, every folder and every symlink's target. It is computed on the live folder
first (no write when it matches a kept revision), and again on the snapshot, whose id wins:
the snapshot is what probes see.

The snapshot copies files (a copy-on-write clone where the file system supports it) rather
than hard-linking them: a hard link shares the inode, so an in-place write on the volume would
change the revision under a probe. Files unchanged since the previous revision (same size,
modification time and mode) are hard-linked from that revision instead, which is safe because
revision files are never written.

The folder is read only below a root the operator's administrator allows
(:class:`~taskhandler_operator.sources.access.VolumeAccess`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from taskhandler_operator.artifacts import go, java, typescript
from taskhandler_operator.artifacts.models import Candidate, OpenFile
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.errors import ArchiveRefused, NotFound, VolumeReadFailed
from taskhandler_operator.sources.spec import VolumeSource
from taskhandler_operator.sources.tree import FileKey, open_sub_folder, snapshot_tree

if TYPE_CHECKING:
    from taskhandler_operator.sources.context import Build, SyncContext
    from taskhandler_operator.sources.models import Revision

__all__ = ["describe_tree", "sync_volume"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _candidate(dir_fd: int, name: str, rel: str, st: os.stat_result) -> Candidate | None:
    """What the listing's reader for this file name answers (None: not an artifact)."""
    if name.endswith(java.SUFFIX):
        reader = java.read_candidate
    elif name.endswith(typescript.SUFFIX):
        reader = typescript.read_candidate
    elif st.st_size >= go.FOOTER_SIZE:
        reader = go.read_candidate
    else:
        return None
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    with OpenFile(Path(rel), fd) as f:
        if not stat.S_ISREG(f.stat.st_mode):
            return None
        try:
            return reader(f, rel)
        except OSError:
            return None


def _lines(root_fd: int) -> Iterator[str]:
    stack = [""]
    while stack:
        prefix = stack.pop()
        fd = os.dup(root_fd)
        try:
            for part in [p for p in prefix.split("/") if p]:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            with os.scandir(fd) as scan:
                names = sorted(entry.name for entry in scan)
            folders = []
            for name in names:
                rel = prefix + name
                try:
                    st = os.lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                executable = int(bool(st.st_mode & 0o111))
                if stat.S_ISDIR(st.st_mode):
                    yield f"d {rel}"
                    folders.append(rel + "/")
                elif stat.S_ISLNK(st.st_mode):
                    yield f"l {rel} -> {os.readlink(name, dir_fd=fd)}"
                elif stat.S_ISREG(st.st_mode):
                    candidate = _candidate(fd, name, rel, st)
                    if candidate is not None:
                        yield (
                            f"c {rel} {candidate.size_bytes} {candidate.cache_digest or '-'} "
                            f"{executable} {int(candidate.error is not None)}"
                        )
                    else:
                        yield f"f {rel} {st.st_size} {st.st_mtime_ns} {executable}"
                else:
                    yield f"x {rel}"  # refused by the snapshot; here it only changes the id
            stack.extend(reversed(folders))
        finally:
            os.close(fd)


def describe_tree(root_fd: int) -> str:
    """The volume digest (sha256 hex) of the tree of the open folder ``root_fd``."""
    digest = hashlib.sha256()
    for line in _lines(root_fd):
        digest.update(line.encode("utf-8", "surrogateescape"))
        digest.update(b"\n")
    return digest.hexdigest()


def _describe_folder(path: Path) -> str:
    fd = os.open(path, _DIR_FLAGS)
    try:
        return describe_tree(fd)
    finally:
        os.close(fd)


def _open(spec: VolumeSource, access: VolumeAccess) -> int:
    where = spec.path + (f" (subPath {spec.sub_path})" if spec.sub_path else "")
    try:
        # The path is checked against the allowed roots (symlinks resolved) and opened without
        # following a symlink below its root; the subPath below it never through one either.
        return open_sub_folder(access.open_folder(spec.path), spec.sub_path)
    except FileNotFoundError:
        raise NotFound(
            f"volume folder {where} does not exist; check path and subPath, and that the "
            "volume is mounted into the operator's pod"
        ) from None
    except NotADirectoryError:
        raise NotFound(f"volume folder {where} is not a folder") from None
    except PermissionError:
        raise VolumeReadFailed(
            f"volume folder {where} cannot be read by the operator (permission denied); check "
            "the volume's owner and the pod's fsGroup"
        ) from None
    except OSError as exc:
        raise VolumeReadFailed(f"volume folder {where} cannot be opened: {exc.strerror}") from None


async def sync_volume(spec: VolumeSource, ctx: SyncContext) -> Revision:
    root_fd = await ctx.blocking(_open, spec, ctx.volumes)
    try:
        try:
            live_id = await ctx.blocking(describe_tree, root_fd)
        except OSError as exc:
            raise VolumeReadFailed(
                f"volume folder {spec.path} cannot be read: {exc.strerror}"
            ) from None
        existing = await ctx.existing(live_id)
        if existing is not None:
            return existing
        previous = await ctx.previous()
        reuse: dict[str, tuple[FileKey, Path]] = {}
        if previous is not None and previous.revision.kind == "volume":
            for rel, key in previous.details.get("files", {}).items():
                reuse[rel] = ((int(key[0]), int(key[1]), int(key[2])), previous.revision.path / rel)

        async def fill(build: Build) -> None:
            seen = await ctx.blocking(snapshot_tree, root_fd, build.writer, reuse)
            snapshot_id = await ctx.blocking(_describe_folder, build.staging.tree)
            build.revision_id = snapshot_id
            build.source = f"sha256:{snapshot_id}"
            build.details = {"path": spec.path, "subPath": spec.sub_path, "files": seen}

        try:
            return await ctx.build("volume", fill)
        except ArchiveRefused as exc:
            raise ArchiveRefused(f"volume folder {spec.path}: {exc.message}") from None
    finally:
        os.close(root_fd)
