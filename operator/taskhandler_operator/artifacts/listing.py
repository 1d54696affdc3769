"""List the candidate artifacts of a bundle root, without ever hashing an artifact.

The walk (walk.py) is deterministic (each directory's entries in sorted order, depth
first), reads nothing outside the root (a symlink leaving it is reported, not followed),
survives symlink loops, and lists a file reached through several paths once, under
the first path walked. A :class:`ListingCache` lets an unchanged tree be relisted
with one ``stat`` per file and no reads.

Nothing in the tree makes the listing fail or skip silently: a name that is not UTF-8,
a path longer than the database can store or than the system can open, and a file a
reader chokes on each become a :class:`ListingProblem` naming it.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from taskhandler_operator.artifacts import go, java, typescript
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile, excerpt
from taskhandler_operator.artifacts.walk import (
    BundleRootError,
    ListingProblem,
    Walk,
    WalkedFile,
    printable_path,
    resolve_root,
    walk_files,
    walk_root,
)
from taskhandler_operator.limits import LISTING_CACHE_MAX_ENTRIES

# The walk's names stay importable from here, where the listing's users have always found them.
__all__ = [
    "READERS",
    "BundleRootError",
    "ListingCache",
    "ListingProblem",
    "ListingResult",
    "ListingStats",
    "Walk",
    "WalkedFile",
    "list_candidates",
    "printable_path",
    "resolve_root",
    "walk_files",
]

Reader = Callable[[OpenFile, str], Candidate | None]

READERS: dict[Language, Reader] = {
    Language.GO: go.read_candidate,
    Language.JAVA: java.read_candidate,
    Language.TYPESCRIPT: typescript.read_candidate,
}


def _may_be_artifact(language: Language, rel_path: str, size: int) -> bool:
    """Cheap filter on name and size, so most unrelated files are never opened."""
    if language is Language.JAVA:
        return rel_path.endswith(java.SUFFIX)
    if language is Language.TYPESCRIPT:
        return rel_path.endswith(typescript.SUFFIX) and size >= len(typescript.LAYOUT_PREFIX)
    return size >= go.FOOTER_SIZE


# -- cache ---------------------------------------------------------------------------------

#: (language, device, inode, size, mtime_ns, ctime_ns), packed (ListingCache.key).
_CacheKey = bytes
_KEY_STAT = struct.Struct("<QQQqq")
_KEY_TIMES = struct.Struct("<qq")


@dataclass(frozen=True, slots=True)
class _CachedAnswer:
    rel_path: str
    candidate: Candidate | None  # None: the reader skipped the file


class ListingCache:
    """Reader answers keyed by (language, device, inode, size, mtime_ns, ctime_ns).

    Any write, rename-over or ``chmod`` changes mtime or ctime, so a hit means the
    file is the one read before. A file whose timestamps are too recent is not
    cached: a change within the filesystem's timestamp granularity could otherwise
    go unseen (git's "racily clean" problem). Entries are evicted least recently used.
    """

    def __init__(
        self, max_entries: int = LISTING_CACHE_MAX_ENTRIES, racy_window_ns: int = 2_000_000_000
    ) -> None:
        self.max_entries = max_entries
        self.racy_window_ns = racy_window_ns
        # A plain dict keeps insertion order: re-inserting moves an entry to the end, and the
        # first key is the least recently used (an OrderedDict's links cost ~70 B an entry).
        self._answers: dict[_CacheKey, _CachedAnswer] = {}

    def __len__(self) -> int:
        return len(self._answers)

    @staticmethod
    def key(language: Language, st: os.stat_result) -> _CacheKey:
        # Packed: a tuple of five large ints is ~250 B an entry, these bytes ~90 (20,000
        # entries at 1,000 bundles x 20 artifacts). The two times are the last 16 bytes.
        return language.value.encode() + _KEY_STAT.pack(
            st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
        )

    def get(self, key: _CacheKey, rel_path: str) -> _CachedAnswer | None:
        answer = self._answers.get(key)
        # Messages name the file, so an answer is reused only under the same path.
        if answer is None or answer.rel_path != rel_path:
            return None
        self._answers[key] = self._answers.pop(key)
        return answer

    def put(self, key: _CacheKey, answer: _CachedAnswer, now_ns: int) -> None:
        newest = max(_KEY_TIMES.unpack_from(key, len(key) - _KEY_TIMES.size))
        if newest >= now_ns - self.racy_window_ns:
            return
        self._answers.pop(key, None)
        self._answers[key] = answer
        while len(self._answers) > self.max_entries:
            del self._answers[next(iter(self._answers))]


# -- listing -------------------------------------------------------------------------------


@dataclass
class ListingStats:
    files_walked: int = 0
    files_opened: int = 0
    cache_hits: int = 0
    bytes_read: int = 0
    # bytes read per opened file, by rel_path (what the listing cost, file by file)
    bytes_by_file: dict[str, int] = field(default_factory=dict)


@dataclass
class ListingResult:
    candidates: list[Candidate]
    problems: list[ListingProblem]
    stats: ListingStats


def list_candidates(
    root: Path, language: Language, cache: ListingCache | None = None
) -> ListingResult:
    """The candidates of ``language`` under ``root``, in walk order.

    Unrelated files are skipped; unreadable files and folders, refused symlinks and names
    that cannot be listed are reported in ``problems``. Raises :class:`BundleRootError` (an
    OSError) if ``root`` is not a folder that can be walked.
    """
    real_root = resolve_root(root)
    reader = READERS[language]
    stats = ListingStats()
    problems: list[ListingProblem] = []
    candidates: list[Candidate] = []
    now_ns = time.time_ns()
    for item in walk_root(real_root, problems):
        stats.files_walked += 1
        # The suffix of the relative path is the file name's.
        if not _may_be_artifact(language, item.rel_path, item.stat.st_size):
            continue
        key = ListingCache.key(language, item.stat)
        cached = cache.get(key, item.rel_path) if cache is not None else None
        if cached is not None:
            stats.cache_hits += 1
            candidate = cached.candidate
        else:
            opened = _read(reader, language, item, stats, problems)
            if opened is None:
                continue
            candidate, key = opened
            if cache is not None:
                cache.put(key, _CachedAnswer(item.rel_path, candidate), now_ns)
        if candidate is not None:
            candidates.append(candidate)
    return ListingResult(candidates, problems, stats)


def _read(
    reader: Reader,
    language: Language,
    item: WalkedFile,
    stats: ListingStats,
    problems: list[ListingProblem],
) -> tuple[Candidate | None, _CacheKey] | None:
    """Run the reader on the file; None when it cannot be opened or changed under us."""
    try:
        f = OpenFile.open(item.path, follow_symlinks=False)
    except FileNotFoundError:
        return None  # vanished since the walk saw it
    except OSError as exc:
        problems.append(ListingProblem(item.rel_path, f"cannot be opened ({exc.strerror})"))
        return None
    with f:
        # The walk's stat and the open file must be the same file, or the walk raced a rename.
        if (f.stat.st_dev, f.stat.st_ino) != (item.stat.st_dev, item.stat.st_ino):
            return None
        stats.files_opened += 1
        try:
            candidate = reader(f, item.rel_path)
        except OSError as exc:
            problems.append(ListingProblem(item.rel_path, f"cannot be read ({exc.strerror})"))
            return None
        except Exception as exc:
            # A reader bug on a hostile file: a problem on this file, never an exception that
            # takes the whole listing (and every other artifact's plan) down with it.
            problems.append(
                ListingProblem(
                    item.rel_path,
                    f"cannot be read by the {language.value} reader "
                    f"({type(exc).__name__}: {excerpt(str(exc))})",
                )
            )
            return None
        finally:
            stats.bytes_read += f.bytes_read
            stats.bytes_by_file[item.rel_path] = f.bytes_read
        if candidate is not None and candidate.rel_path != item.rel_path:
            candidate = replace(candidate, rel_path=item.rel_path)
        # Cache under what was read (fstat of the open file), not the walk's earlier stat.
        return candidate, ListingCache.key(language, f.stat)
