"""Which bundles use each git mirror, and the removal of mirrors no bundle uses any more.

A git source fetches into a bare mirror per URL (``<cache>/git/<key>``, sources/git.py), shared
by every bundle with that URL. Without bookkeeping a mirror outlived the last bundle using it
forever, so the cache grew with every URL ever synced. Each use is recorded twice, both as
empty files or one-line files:

* ``<cache>/git/<key>.users/<namespace>_<bundle>``: who uses the mirror (Kubernetes names
  hold no ``_``, so the marker names cannot collide);
* ``<store>/<namespace>/<bundle>/.git-mirror``: which mirror the bundle used last (its
  content is ``<key>``), so a URL change or the bundle's deletion finds the marker to remove
  without scanning every mirror.

A mirror whose users folder is empty is removed under the mirror's own file lock, and only
when that lock is free at once: a sync records its use *before* it takes the lock, so a
removal either sees the marker or runs before the sync, which then fetches into a new mirror.
The store removes mirrors that have no users when it opens (leftovers of a crash, or mirrors
made before this bookkeeping existed: a bundle still using one fetches again once).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from taskhandler_operator.sources.locks import try_file_lock

__all__ = [
    "RECORD",
    "mirror_dirs",
    "prune_mirror",
    "prune_unused",
    "release",
    "use",
    "users_dir",
]

RECORD = ".git-mirror"
USERS_SUFFIX = ".users"
LOCK_SUFFIX = ".lock"


def users_dir(mirror: Path) -> Path:
    return mirror.with_name(mirror.name + USERS_SUFFIX)


def lock_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name + LOCK_SUFFIX)


def _marker(namespace: str, bundle: str) -> str:
    return f"{namespace}_{bundle}"


def use(mirror: Path, bundle_dir: Path, namespace: str, bundle: str) -> Path | None:
    """Record that ``namespace/bundle`` uses ``mirror`` (blocking; the caller holds the bundle
    lock). Returns the mirror the bundle used before when it was another one, for
    :func:`release`."""
    marker = users_dir(mirror) / _marker(namespace, bundle)
    for attempt in range(3):
        if marker.exists():  # the usual case: an unchanged sync writes nothing
            break
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            marker.touch()
            break
        except FileNotFoundError:  # a removal took the empty folder away just now
            if attempt == 2:
                raise
    record = bundle_dir / RECORD
    previous = _recorded(record, mirror.parent)
    if previous != mirror:
        temporary = bundle_dir / f".{RECORD}.{secrets.token_hex(4)}"
        temporary.write_text(mirror.name)
        temporary.replace(record)
    return previous if previous is not None and previous != mirror else None


def _recorded(record: Path, mirrors: Path) -> Path | None:
    try:
        name = record.read_text().strip()
    except FileNotFoundError:
        return None
    # Only a plain name inside the mirrors folder: the record is ours, but never trusted blindly.
    if not name or "/" in name or name.startswith("."):
        return None
    return mirrors / name


def recorded(bundle_dir: Path, mirrors: Path) -> Path | None:
    """The mirror ``bundle_dir``'s bundle used last (blocking), if any."""
    return _recorded(bundle_dir / RECORD, mirrors)


def release(mirror: Path, namespace: str, bundle: str) -> bool:
    """``namespace/bundle`` no longer uses ``mirror``; the mirror is removed when nobody else
    does (blocking). True when it was removed."""
    with contextlib.suppress(FileNotFoundError):
        (users_dir(mirror) / _marker(namespace, bundle)).unlink()
    return prune_mirror(mirror)


def prune_mirror(mirror: Path) -> bool:
    """Remove ``mirror`` (its folder, users folder and lock file) when no bundle uses it and no
    sync holds its lock (blocking). True when it was removed."""
    users = users_dir(mirror)
    lock = lock_path(mirror)
    if not mirror.parent.is_dir():
        return False
    with try_file_lock(lock) as locked:
        if not locked:
            return False  # a sync is using it, and has recorded its use first
        with contextlib.suppress(FileNotFoundError):
            if any(users.iterdir()):
                return False
        trash = mirror.with_name(f".trash-{mirror.name}-{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):
            mirror.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(mirror.with_name(f"{mirror.name}.tmp"), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError, OSError):
            users.rmdir()  # fails when a marker arrived meanwhile: that sync re-creates the mirror
        lock.unlink(missing_ok=True)  # held: a waiter notices and locks the next file
    return True


def mirror_dirs(mirrors: Path) -> list[Path]:
    """Every mirror in the folder (blocking)."""
    try:
        entries = list(os.scandir(mirrors))
    except FileNotFoundError:
        return []
    names = set()
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        for suffix in (USERS_SUFFIX, LOCK_SUFFIX, ".tmp"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        names.add(name)
    return [mirrors / name for name in sorted(names)]


def prune_unused(mirrors: Path) -> list[str]:
    """Remove every mirror no bundle uses (blocking), and trash left by a crash; returns the
    removed mirrors' names."""
    removed = [m.name for m in mirror_dirs(mirrors) if prune_mirror(m)]
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(mirrors):
            if entry.name.startswith(".trash-"):
                shutil.rmtree(entry.path, ignore_errors=True)
    return removed
