"""Walk a bundle root: every regular file under it, in a deterministic order, never leaving it.

The walk is deterministic (each directory's entries in sorted order, depth first), reads nothing
outside the root (a symlink leaving it is reported, not followed), survives symlink loops, and
yields a file reached through several paths once, under the first path walked. A name that is not
UTF-8, a path longer than the database can store or than the system can open, and a folder that
cannot be read each become a :class:`ListingProblem` naming it.

Its own module, apart from the listing and its readers (listing.py), because a Java probe walks
its bundle for the classpath (verify.py) and should not import the Go and TypeScript readers to
do so: every probe pod pays each import once per artifact (docs/operations.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from taskhandler_operator.limits import PATH_LENGTH

__all__ = [
    "BundleRootError",
    "ListingProblem",
    "Walk",
    "WalkedFile",
    "printable_path",
    "resolve_root",
    "walk_files",
    "walk_root",
]


@dataclass(frozen=True, slots=True)
class ListingProblem:
    """Something in the tree the listing refused or could not read; worth telling the user."""

    rel_path: str
    message: str


@dataclass(frozen=True, slots=True)
class WalkedFile:
    rel_path: str  # POSIX path from the root, through any symlinks walked
    real_path: str  # symlinks resolved, inside the root (a str: Path costs on the hot path)
    stat: os.stat_result

    @property
    def path(self) -> Path:
        return Path(self.real_path)


@dataclass
class Walk:
    files: list[WalkedFile] = field(default_factory=list)
    problems: list[ListingProblem] = field(default_factory=list)


class BundleRootError(OSError):
    """The bundle root cannot be walked at all (missing, not a folder, a symlink loop)."""


def resolve_root(root: Path) -> Path:
    """The real path of a bundle root folder; :class:`BundleRootError` says why not."""
    try:
        real = root.resolve(strict=True)
    except RuntimeError:  # Python 3.11 reports a symlink loop this way, not as OSError
        raise BundleRootError(f"{root} cannot be resolved: it is a symlink loop") from None
    except OSError as exc:
        raise BundleRootError(f"{root} cannot be resolved: {exc.strerror or exc}") from None
    if not real.is_dir():
        raise BundleRootError(f"{root} is not a folder")
    return real


def walk_files(root: Path) -> Walk:
    """Every regular file under ``root`` in deterministic order, never leaving the root."""
    walk = Walk()
    for item in walk_root(resolve_root(root), walk.problems):
        walk.files.append(item)
    return walk


def printable_path(rel_path: str) -> str:
    """A walked path as valid text: undecodable bytes shown as ``\\xNN`` escapes."""
    return rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _name_problem(rel_path: str) -> str | None:
    """Why a path cannot be listed as it is, if it cannot."""
    try:
        rel_path.encode("utf-8")
    except UnicodeEncodeError:
        # os.scandir hands over undecodable bytes as surrogates; no database, log or table
        # can hold them as text.
        return "its name is not valid UTF-8, skipped (rename it)"
    if len(rel_path) > PATH_LENGTH:
        return (
            f"its path is {len(rel_path)} characters, longer than the {PATH_LENGTH} the "
            "database stores, skipped"
        )
    return None


def walk_root(root: Path, problems: list[ListingProblem]) -> Iterator[WalkedFile]:
    """The files under an already resolved root (:func:`resolve_root`); what cannot be walked
    is appended to ``problems`` as the walk meets it."""
    root_stat = root.stat()
    seen_dirs = {(root_stat.st_dev, root_stat.st_ino)}
    seen_files: set[tuple[int, int]] = set()
    # Depth-first with an explicit stack so a very deep tree cannot exhaust recursion.
    stack: list[Iterator[tuple[str, str]]] = [_entries(str(root), "", problems)]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        entry_path, rel_path = step
        name_problem = _name_problem(rel_path)
        if name_problem is not None:
            problems.append(ListingProblem(printable_path(rel_path), name_problem))
            continue
        resolved = _resolve(root, entry_path, rel_path, problems)
        if resolved is None:
            continue
        real, st = resolved
        key = (st.st_dev, st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            if key not in seen_dirs:  # a loop or a second way into a folder already walked
                seen_dirs.add(key)
                stack.append(_entries(real, rel_path + "/", problems))
        elif stat.S_ISREG(st.st_mode) and key not in seen_files:
            seen_files.add(key)
            yield WalkedFile(rel_path, real, st)
        # sockets, FIFOs and devices are never artifacts


def _entries(
    directory: str, prefix: str, problems: list[ListingProblem]
) -> Iterator[tuple[str, str]]:
    try:
        with os.scandir(directory) as scan:
            entries = sorted((entry.name, entry.path) for entry in scan)
    except OSError as exc:
        problems.append(
            ListingProblem(prefix.rstrip("/") or ".", f"cannot read this folder: {exc}")
        )
        return
    for name, path in entries:
        yield path, prefix + name


def _resolve(
    root: Path, entry_path: str, rel_path: str, problems: list[ListingProblem]
) -> tuple[str, os.stat_result] | None:
    """(real path, stat) of an entry, following a symlink only when it stays in the root."""
    try:
        st = os.lstat(entry_path)
    except FileNotFoundError:
        return None  # vanished since the folder was read
    except OSError as exc:  # a path past the system's limit (ENAMETOOLONG), say
        problems.append(ListingProblem(rel_path, f"cannot be read, skipped ({exc.strerror})"))
        return None
    if not stat.S_ISLNK(st.st_mode):
        return entry_path, st
    try:
        target = Path(entry_path).resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # dangling, a loop, or unreadable on the way
        problems.append(ListingProblem(rel_path, f"symlink cannot be resolved, skipped ({exc})"))
        return None
    if not target.is_relative_to(root):
        problems.append(
            ListingProblem(
                rel_path, f"symlink points outside the bundle root ({target}), not followed"
            )
        )
        return None
    try:
        return str(target), target.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(ListingProblem(rel_path, f"cannot be read, skipped ({exc.strerror})"))
        return None
