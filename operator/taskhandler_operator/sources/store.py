"""The revision store: immutable revision folders per bundle, written atomically, kept N deep.

Layout under ``root``::

    <namespace>/<bundle>/<revision>/      the revision's files (read-only)
    <namespace>/<bundle>/.meta/<revision>.json   what the revision is (Revision + kind details)
    <namespace>/<bundle>/.lock            file lock: one writer per bundle across processes
    <namespace>/<bundle>/.tmp-*           a revision being built
    <namespace>/<bundle>/.trash-*         a revision being removed
    <namespace>/<bundle>/.git-mirror      the git mirror the bundle uses (sources/mirrors.py)
    .cache/git/                           git mirrors shared by bundles (sources/git.py)

A revision is *visible* when its folder and its record both exist. It is built under
``.tmp-*`` and published by writing the record, then renaming the folder into place: a crash at
any point leaves either the old state or leftovers under hidden names, which are removed when
the store opens and whenever the bundle is locked. Removal renames the folder away first, so a
half-removed revision is never visible either. Namespaces and bundles are Kubernetes names,
which never start with a dot, so hidden names cannot collide with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskhandler_operator.sources import mirrors
from taskhandler_operator.sources.errors import StorageFailed
from taskhandler_operator.sources.locks import file_lock
from taskhandler_operator.sources.models import Revision, RevisionRecord
from taskhandler_operator.sources.paths import check_name, check_revision_id
from taskhandler_operator.sources.tree import TreeLimits

__all__ = ["DEFAULT_KEEP", "RevisionStore", "Staging", "file_lock"]

log = logging.getLogger(__name__)

DEFAULT_KEEP = 3
META = ".meta"
LOCK = ".lock"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


@dataclass
class Staging:
    """A revision being built: ``tree`` is filled, then :meth:`RevisionStore.commit` publishes."""

    namespace: str
    bundle: str
    dir: Path  # .tmp-<random>
    tree: Path  # dir/tree: becomes the revision folder
    scratch: Path  # dir/scratch: downloads, archives; removed with dir


class RevisionStore:
    """Revision folders under ``root``; see the module docstring for the layout."""

    def __init__(
        self,
        root: Path,
        *,
        keep: int = DEFAULT_KEEP,
        limits: TreeLimits | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.keep = keep
        self.limits = limits or TreeLimits()
        self.cache_dir = cache_dir or self.root / ".cache"
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._holds: Counter[tuple[str, str, str]] = Counter()
        self._removals: set[asyncio.Task[None]] = set()

    # -- paths ---------------------------------------------------------------------------------

    def bundle_dir(self, namespace: str, bundle: str) -> Path:
        check_name(namespace, "namespace")
        check_name(bundle, "bundle")
        return self.root / namespace / bundle

    def revision_dir(self, namespace: str, bundle: str, revision: str) -> Path:
        return self.bundle_dir(namespace, bundle) / check_revision_id(revision)

    def _record_path(self, namespace: str, bundle: str, revision: str) -> Path:
        return self.bundle_dir(namespace, bundle) / META / f"{check_revision_id(revision)}.json"

    # -- start ---------------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the root and remove what crashed syncs left behind (unlocked bundles only)."""
        try:
            await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageFailed(f"revision store {self.root} cannot be created: {exc}") from None
        swept = await asyncio.to_thread(_sweep_trash, self.root)
        if swept:
            log.info("removed %d folders of deleted bundles left behind", len(swept))
        for namespace, bundle in await asyncio.to_thread(self._bundles):
            path = self.root / namespace / bundle / LOCK
            fd = await asyncio.to_thread(os.open, path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another process is syncing it; it cleans up under its own lock
            else:
                await asyncio.to_thread(self._clean_bundle, namespace, bundle)
            finally:
                os.close(fd)
        removed = await asyncio.to_thread(mirrors.prune_unused, self.mirrors_dir)
        if removed:
            log.info("removed %d git mirrors no bundle uses", len(removed))

    def _bundles(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        with os.scandir(self.root) as namespaces:
            for ns in namespaces:
                if ns.name.startswith(".") or not ns.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(ns.path) as bundles:
                    found.extend(
                        (ns.name, b.name)
                        for b in bundles
                        if not b.name.startswith(".") and b.is_dir(follow_symlinks=False)
                    )
        return found

    def _clean_bundle(self, namespace: str, bundle: str) -> list[str]:
        """Remove leftovers of crashed syncs. Caller holds the bundle lock."""
        base = self.bundle_dir(namespace, bundle)
        removed: list[str] = []
        if not base.is_dir():
            return removed
        meta = base / META
        records = {p.name[: -len(".json")] for p in meta.glob("*.json")} if meta.is_dir() else set()
        for entry in os.scandir(base):
            name = entry.name
            if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                _remove_tree(Path(entry.path))
                removed.append(name)
            elif not name.startswith(".") and name not in records:
                # a folder without a record: a crash between rename and record removal
                _remove_tree(Path(entry.path))
                removed.append(name)
        for revision in records:
            if not (base / revision).is_dir():
                (meta / f"{revision}.json").unlink(missing_ok=True)
                removed.append(f"{META}/{revision}.json")
        if meta.is_dir():
            for stray in meta.glob(".*"):  # half-written records
                stray.unlink(missing_ok=True)
        return removed

    # -- locking -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self, namespace: str, bundle: str) -> AsyncIterator[None]:
        """Exclusive use of one bundle: an asyncio lock in this process and a file lock across
        processes. Leftovers of crashed syncs are removed on entry."""
        base = self.bundle_dir(namespace, bundle)
        key = (namespace, bundle)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                await asyncio.to_thread(base.mkdir, parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageFailed(
                    f"revision store folder {base} cannot be created: {exc}"
                ) from None
            async with file_lock(base / LOCK):
                await asyncio.to_thread(self._clean_bundle, namespace, bundle)
                yield

    # -- reading -------------------------------------------------------------------------------

    def _read_record(self, namespace: str, bundle: str, revision: str) -> RevisionRecord | None:
        folder = self.revision_dir(namespace, bundle, revision)
        try:
            raw = self._record_path(namespace, bundle, revision).read_bytes()
        except FileNotFoundError:
            return None
        if not folder.is_dir():
            return None
        record = RevisionRecord.model_validate_json(raw)
        # The folder is where it is now, whatever the root was when it was written.
        return record.model_copy(
            update={"revision": record.revision.model_copy(update={"path": folder})}
        )

    async def record(self, namespace: str, bundle: str, revision: str) -> RevisionRecord | None:
        return await asyncio.to_thread(self._read_record, namespace, bundle, revision)

    async def get(self, namespace: str, bundle: str, revision: str) -> Revision | None:
        record = await self.record(namespace, bundle, revision)
        return None if record is None else record.revision

    def _records(self, namespace: str, bundle: str) -> list[RevisionRecord]:
        meta = self.bundle_dir(namespace, bundle) / META
        if not meta.is_dir():
            return []
        found = []
        for path in meta.glob("*.json"):
            record = self._read_record(namespace, bundle, path.name[: -len(".json")])
            if record is not None:
                found.append(record)
        found.sort(key=lambda r: (r.synced_at, r.revision.fetched_at), reverse=True)
        return found

    async def records(self, namespace: str, bundle: str) -> list[RevisionRecord]:
        """Visible revisions, the most recently synced first."""
        return await asyncio.to_thread(self._records, namespace, bundle)

    async def revisions(self, namespace: str, bundle: str) -> list[Revision]:
        return [r.revision for r in await self.records(namespace, bundle)]

    async def current(self, namespace: str, bundle: str) -> Revision | None:
        """The revision the last successful sync returned."""
        found = await self.records(namespace, bundle)
        return found[0].revision if found else None

    # -- writing (caller holds the bundle lock) ------------------------------------------------

    async def stage(self, namespace: str, bundle: str) -> Staging:
        base = self.bundle_dir(namespace, bundle)
        folder = base / f"{TMP_PREFIX}{secrets.token_hex(6)}"

        def make() -> None:
            folder.mkdir(mode=0o700)
            (folder / "tree").mkdir(mode=0o755)
            (folder / "scratch").mkdir(mode=0o700)

        try:
            await asyncio.to_thread(make)
        except OSError as exc:
            raise StorageFailed(f"cannot create a staging folder in {base}: {exc}") from None
        return Staging(namespace, bundle, folder, folder / "tree", folder / "scratch")

    async def discard(self, staging: Staging) -> None:
        await asyncio.shield(asyncio.to_thread(_remove_tree, staging.dir))

    async def commit(self, staging: Staging, record: RevisionRecord) -> Revision:
        """Publish ``staging.tree`` as ``record``'s revision: record first, then the rename."""
        revision = record.revision
        target = self.revision_dir(staging.namespace, staging.bundle, revision.id)
        published = record.model_copy(
            update={"revision": revision.model_copy(update={"path": target})}
        )

        def publish() -> None:
            self._write_record(staging.namespace, staging.bundle, published)
            if target.exists():  # same id published meanwhile (cannot happen under the lock)
                _remove_tree(staging.dir)
                return
            staging.tree.rename(target)
            _remove_tree(staging.dir)

        try:
            await asyncio.shield(asyncio.to_thread(publish))
        except OSError as exc:
            raise StorageFailed(f"cannot publish revision {revision.id}: {exc}") from None
        return published.revision

    async def touch(self, namespace: str, bundle: str, revision: str) -> None:
        """Make ``revision`` the current one; writes nothing when it already is."""
        found = await self.records(namespace, bundle)
        if not found or found[0].revision.id == revision:
            return
        for record in found:
            if record.revision.id == revision:
                updated = record.model_copy(update={"synced_at": datetime.now(UTC)})
                await asyncio.to_thread(self._write_record, namespace, bundle, updated)
                return

    async def update_details(
        self, namespace: str, bundle: str, revision: str, details: dict[str, Any]
    ) -> None:
        """Replace the kind-specific details of a kept revision (e.g. a new ETag)."""
        record = await self.record(namespace, bundle, revision)
        if record is None or record.details == details:
            return
        updated = record.model_copy(update={"details": details})
        await asyncio.to_thread(self._write_record, namespace, bundle, updated)

    def _write_record(self, namespace: str, bundle: str, record: RevisionRecord) -> None:
        path = self._record_path(namespace, bundle, record.revision.id)
        path.parent.mkdir(exist_ok=True)
        temporary = path.parent / f".{record.revision.id}.{secrets.token_hex(4)}"
        temporary.write_text(record.model_dump_json(indent=1))
        temporary.replace(path)

    # -- retention -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, namespace: str, bundle: str, revision: str) -> Iterator[None]:
        """Keep ``revision`` from being pruned while the block runs (e.g. probe Jobs reading
        it through the artifact server)."""
        key = (namespace, bundle, revision)
        self._holds[key] += 1
        try:
            yield
        finally:
            self._holds[key] -= 1
            if self._holds[key] <= 0:
                del self._holds[key]

    @property
    def lock_count(self) -> int:
        """Bundles with an in-process lock (dropped when the bundle is deleted)."""
        return len(self._locks)

    @property
    def hold_count(self) -> int:
        return len(self._holds)

    def held(self, namespace: str, bundle: str) -> set[str]:
        return {r for (ns, b, r), n in self._holds.items() if ns == namespace and b == bundle and n}

    async def prune(self, namespace: str, bundle: str) -> list[str]:
        """Remove revisions beyond the newest ``keep`` that nothing holds; returns their ids.
        Caller holds the bundle lock."""
        found = await self.records(namespace, bundle)
        held = self.held(namespace, bundle)
        doomed = [r.revision.id for r in found[self.keep :] if r.revision.id not in held]
        for revision in doomed:
            await asyncio.to_thread(self._remove_revision, namespace, bundle, revision)
        return doomed

    def _remove_revision(self, namespace: str, bundle: str, revision: str) -> None:
        base = self.bundle_dir(namespace, bundle)
        trash = base / f"{TRASH_PREFIX}{secrets.token_hex(6)}"
        with contextlib.suppress(FileNotFoundError):
            (base / revision).rename(trash)  # invisible from here on
        self._record_path(namespace, bundle, revision).unlink(missing_ok=True)
        _remove_tree(trash)

    async def delete_bundle(self, namespace: str, bundle: str) -> None:
        """Remove every revision of a bundle (its resource was deleted), and the git mirror it
        used when no other bundle uses it."""
        base = self.bundle_dir(namespace, bundle)
        async with self.lock(namespace, bundle):
            mirror = await asyncio.to_thread(mirrors.recorded, base, self.mirrors_dir)
            trash = base.parent / f"{TRASH_PREFIX}{bundle}-{secrets.token_hex(6)}"
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.rename, base, trash)
            # This deletion's folder, and any an earlier attempt renamed away and was stopped
            # (cancelled, or it failed) before removing.
            doomed = await asyncio.to_thread(_trash_of, base.parent, bundle)
        for path in doomed:
            if not await _remove_for_good(path):
                log.info("%s is still being written; removing it in the background", path)
                self._remove_later(path)
        self._locks.pop((namespace, bundle), None)
        if mirror is not None:
            await asyncio.to_thread(mirrors.release, mirror, namespace, bundle)

    @property
    def removal_count(self) -> int:
        """Folders of deleted bundles still being removed in the background."""
        return len(self._removals)

    def _remove_later(self, path: Path) -> None:
        """Keep removing ``path`` in the background. A sync cancelled by the deletion can still
        have a copy thread writing into it through an open folder, and on a busy machine that
        thread may only get to run after the deletion's own attempts ended."""
        task = asyncio.get_running_loop().create_task(
            _remove_eventually(path), name=f"remove {path.name}"
        )
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def close(self) -> None:
        """Stop the background removals; what they leave, the next :meth:`open` removes."""
        for task in list(self._removals):
            task.cancel()
        for task in list(self._removals):
            with contextlib.suppress(BaseException):
                await task

    @property
    def mirrors_dir(self) -> Path:
        """Where the git mirrors are (sources/git.py, sources/mirrors.py)."""
        return self.cache_dir / "git"

    # -- what a sync needs ---------------------------------------------------------------------

    def new_record(
        self,
        *,
        namespace: str,
        bundle: str,
        revision_id: str,
        kind: str,
        source: str,
        file_count: int,
        size: int,
        details: dict[str, Any] | None = None,
    ) -> RevisionRecord:
        now = datetime.now(UTC)
        revision = Revision(
            id=check_revision_id(revision_id),
            namespace=namespace,
            bundle=bundle,
            kind=kind,
            source=source,
            path=self.revision_dir(namespace, bundle, revision_id),
            file_count=file_count,
            bytes=size,
            fetched_at=now,
        )
        return RevisionRecord(revision=revision, synced_at=now, details=details or {})


#: Attempts, and seconds between them, at removing a bundle's renamed-away folder.
TRASH_ATTEMPTS = 10
TRASH_PAUSE = 0.5
#: How long, and with at most what pause, a removal goes on in the background after that.
TRASH_LATER_SECONDS = 600.0
TRASH_LATER_PAUSE_MAX = 30.0


async def _remove_for_good(path: Path) -> bool:
    """Remove a bundle's folder renamed away by its deletion; whether it is gone. A sync of the
    bundle cancelled at that moment may still hold a folder of it open and write into it while
    ``rmtree`` runs (``ENOTEMPTY``): try again for a few seconds."""
    problem: OSError | None = None
    for attempt in range(TRASH_ATTEMPTS):
        try:
            await asyncio.to_thread(_remove_tree, path)
            problem = None
        except OSError as exc:
            problem = exc
        if not await asyncio.to_thread(os.path.lexists, path):
            return True
        if attempt + 1 < TRASH_ATTEMPTS:
            await asyncio.sleep(TRASH_PAUSE)
    log.debug("%s is still being written (%s)", path, problem)
    return False


async def _remove_eventually(path: Path) -> None:
    """:func:`_remove_for_good` with growing pauses for up to :data:`TRASH_LATER_SECONDS`;
    whatever is left after that is logged, and the next :meth:`RevisionStore.open` removes it."""
    deadline = asyncio.get_running_loop().time() + TRASH_LATER_SECONDS
    pause = TRASH_PAUSE
    while True:
        if await _remove_for_good(path):
            log.info("removed %s", path)
            return
        if asyncio.get_running_loop().time() + pause > deadline:
            break
        await asyncio.sleep(pause)
        pause = min(pause * 2, TRASH_LATER_PAUSE_MAX)
    log.warning("could not remove %s; the next start removes it", path)


def _trash_of(folder: Path, bundle: str) -> list[Path]:
    """The renamed-away folders of ``bundle`` in its namespace ``folder``
    (``.trash-<bundle>-<12 hex>``; a longer bundle name that starts the same does not match)."""
    pattern = re.compile(re.escape(f"{TRASH_PREFIX}{bundle}-") + r"[0-9a-f]{12}")
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if pattern.fullmatch(e.name))
    except FileNotFoundError:
        return []


def _sweep_trash(root: Path) -> list[str]:
    """Remove the folders deletions renamed away and could not remove (``<namespace>/.trash-*``)."""
    removed: list[str] = []
    with os.scandir(root) as namespaces:
        for ns in namespaces:
            if ns.name.startswith(".") or not ns.is_dir(follow_symlinks=False):
                continue
            with os.scandir(ns.path) as entries:
                doomed = [Path(e.path) for e in entries if e.name.startswith(TRASH_PREFIX)]
            for path in doomed:
                with contextlib.suppress(OSError):
                    _remove_tree(path)
                removed.append(f"{ns.name}/{path.name}")
    return removed


def _remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it; a folder made read-only is made writable."""

    def retry(func: Callable[[str], object], failed: str, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):
            return
        with contextlib.suppress(OSError):
            Path(failed).parent.chmod(stat.S_IRWXU)
        with contextlib.suppress(FileNotFoundError):
            func(failed)

    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        elif sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=retry)
        else:
            shutil.rmtree(path, onerror=lambda func, failed, info: retry(func, failed, info[1]))
    except FileNotFoundError:
        return
