"""Which folders a volume source may read: below an allowed root, never a protected folder.

``spec.source.volume.path`` is written by whoever may create a TaskHandlerBundle in a
namespace, but it is read with the operator's own file-system view, which holds the revision
store (every namespace's artifacts), the mounted Secrets (database URL, signing key, the
service-account token) and ``/proc``. So a volume source reads only below a root the
operator's administrator allows (``THOP_VOLUME_ROOTS``; none by default: every volume source is
refused), and never a protected folder, whatever the roots.

The check is made on the path with every symlink resolved (:func:`os.path.realpath`), and the
folder is then opened from the root's descriptor one component at a time with ``O_NOFOLLOW``:
a component swapped for a symlink between the resolution and the open fails the open instead
of leading out of the root. :func:`check_volume_path` is the pure rule; :meth:`VolumeAccess.
open_folder` applies it to the file system.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from taskhandler_operator.sources.errors import VolumeNotAllowed

__all__ = [
    "ALWAYS_PROTECTED",
    "VolumeAccess",
    "VolumeNotAllowed",
    "check_volume_path",
]

#: Never read by a volume source: the kernel's views of processes and devices, and where
#: Kubernetes and container runtimes mount Secrets (the service-account token among them).
ALWAYS_PROTECTED: tuple[PurePosixPath, ...] = tuple(
    PurePosixPath(p) for p in ("/proc", "/sys", "/dev", "/run/secrets", "/var/run/secrets")
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _within(path: PurePosixPath, folder: PurePosixPath) -> bool:
    return path == folder or folder in path.parents


def check_volume_path(
    resolved: PurePosixPath,
    roots: Sequence[PurePosixPath],
    protected: Iterable[PurePosixPath],
    *,
    shown: str | None = None,
) -> PurePosixPath:
    """The allowed root that holds ``resolved`` (an absolute path with its symlinks resolved),
    or :class:`VolumeNotAllowed` saying why not.

    ``roots`` and ``protected`` must be resolved too. A protected folder is refused both when
    the path is inside it and when it is inside the path (reading ``/var`` would read the
    store under it). ``shown`` is the path as the spec wrote it, for the message.
    """
    named = shown if shown is not None else str(resolved)
    via = "" if shown is None or shown == str(resolved) else f" (resolves to {resolved})"
    if not resolved.is_absolute() or ".." in resolved.parts:
        raise VolumeNotAllowed(f"volume path {named!r} is not an absolute, normalised path")
    for folder in protected:
        if _within(resolved, folder) or _within(folder, resolved):
            raise VolumeNotAllowed(
                f"volume path {named}{via} overlaps {folder}, which holds the operator's own "
                "files, Secrets or kernel views; a volume source may never read it"
            )
    if not roots:
        raise VolumeNotAllowed(
            f"volume path {named}: this operator allows no volume sources (its administrator "
            "sets THOP_VOLUME_ROOTS, chart value volumeSources.roots, to the folders bundles "
            "may read)"
        )
    for root in roots:
        if _within(resolved, root):
            return root
    allowed = ", ".join(str(r) for r in roots)
    raise VolumeNotAllowed(
        f"volume path {named}{via} is outside the folders this operator allows volume sources "
        f"to read (THOP_VOLUME_ROOTS: {allowed}); use a path below one of them"
    )


def _resolved(path: Path | str) -> PurePosixPath:
    return PurePosixPath(os.path.realpath(path))


@dataclass(frozen=True)
class VolumeAccess:
    """The roots volume sources may read below and the folders they never read.

    ``VolumeAccess()`` allows nothing (the operator's default). ``roots`` and ``protected``
    are resolved at every check, so a root that is a symlink (``/bundles`` -> a mount) works,
    and one re-pointed later is followed.
    """

    roots: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = field(default=())

    @classmethod
    def for_operator(
        cls, roots: Iterable[Path], *, store: Path, secret_files: Iterable[Path | None] = ()
    ) -> VolumeAccess:
        """The operator's policy: ``roots``; protected are the revision store (its git mirrors
        included), the folder of git's credential files, the folders of the given Secret
        files, and :data:`ALWAYS_PROTECTED`."""
        from taskhandler_operator.sources.git import credentials_dir

        protected = [
            store,
            credentials_dir(),
            *(Path(p).parent for p in secret_files if p is not None),
        ]
        return cls(tuple(Path(r) for r in roots), tuple(protected))

    def resolved_protected(self) -> list[PurePosixPath]:
        found = [*ALWAYS_PROTECTED, *(_resolved(p) for p in self.protected)]
        # "/" as a protected folder would refuse everything (a Secret file at the root).
        return [p for p in found if p != PurePosixPath("/")]

    def check(self, path: str) -> tuple[PurePosixPath, PurePosixPath]:
        """(root, resolved path) for ``path``, or :class:`VolumeNotAllowed`."""
        resolved = _resolved(path)
        roots = [_resolved(r) for r in self.roots]
        root = check_volume_path(resolved, roots, self.resolved_protected(), shown=path)
        return root, resolved

    def open_folder(self, path: str) -> int:
        """A descriptor of the folder ``path`` (blocking), checked and opened without following
        a symlink below its root. Raises :class:`VolumeNotAllowed`, or the OSError of the open
        (FileNotFoundError, NotADirectoryError, PermissionError) for the caller to word."""
        root, resolved = self.check(path)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in resolved.relative_to(root).parts:
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    # A symlink where the resolution found a folder (a race): O_NOFOLLOW |
                    # O_DIRECTORY fails with ELOOP or ENOTDIR.
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                        raise VolumeNotAllowed(
                            f"volume path {path}: {part!r} became a symlink while it was "
                            "opened; refusing to follow it"
                        ) from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
