"""The revision store: atomic publication, retention, holds, crash leftovers, locking."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from taskhandler_operator.sources import store as store_module
from taskhandler_operator.sources.errors import SourceTimeout
from taskhandler_operator.sources.store import RevisionStore
from tests.integration.sources.conftest import NAMESPACE, fingerprint, sync_source

pytestmark = pytest.mark.integration


def volume(path: Path) -> dict[str, object]:
    return {"volume": {"path": str(path)}}


async def test_layout_and_records(store: RevisionStore, tmp_path: Path) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    revision = await sync_source(store, volume(folder))
    assert revision.path == store.root / NAMESPACE / "bundle" / revision.id
    assert (revision.path / "a.txt").read_text() == "one"
    assert (store.root / NAMESPACE / "bundle" / ".meta" / f"{revision.id}.json").is_file()
    assert (revision.kind, revision.file_count, revision.bytes) == ("volume", 1, 3)
    assert await store.current(NAMESPACE, "bundle") == revision
    hidden = sorted(p.name for p in (store.root / NAMESPACE / "bundle").iterdir())
    assert hidden == sorted([".lock", ".meta", revision.id])  # no staging left behind


async def test_keeps_the_newest_n_unless_held(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path / "store", keep=2)
    folder = tmp_path / "vol"
    folder.mkdir()
    ids = []
    for n in range(3):
        (folder / "a.txt").write_text(f"version {n}")
        ids.append((await sync_source(store, volume(folder))).id)
    assert [r.id for r in await store.revisions(NAMESPACE, "bundle")] == [ids[2], ids[1]]
    assert not (store.root / NAMESPACE / "bundle" / ids[0]).exists()

    with store.hold(NAMESPACE, "bundle", ids[1]):
        for n in (3, 4):
            (folder / "a.txt").write_text(f"version {n}")
            ids.append((await sync_source(store, volume(folder))).id)
        kept = [r.id for r in await store.revisions(NAMESPACE, "bundle")]
        assert kept == [ids[4], ids[3], ids[1]]  # the held one survives beyond keep
    async with store.lock(NAMESPACE, "bundle"):
        assert await store.prune(NAMESPACE, "bundle") == [ids[1]]


async def test_returning_to_an_older_revision_makes_it_current(
    store: RevisionStore, tmp_path: Path
) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("A")
    first = await sync_source(store, volume(folder))
    (folder / "a.txt").write_text("B")
    await sync_source(store, volume(folder))
    (folder / "a.txt").write_text("A")
    os.utime(folder / "a.txt", ns=(0, (first.path / "a.txt").stat().st_mtime_ns))
    again = await sync_source(store, volume(folder))
    assert again.id == first.id
    assert (await store.current(NAMESPACE, "bundle")) == again


async def test_crash_leftovers_are_removed_at_open(store: RevisionStore, tmp_path: Path) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("kept")
    kept = await sync_source(store, volume(folder))
    base = store.root / NAMESPACE / "bundle"
    (base / ".tmp-deadbeef" / "tree").mkdir(parents=True)
    (base / ".tmp-deadbeef" / "tree" / "half.bin").write_bytes(b"x" * 10)
    (base / ".trash-cafe").mkdir()
    (base / ("f" * 40)).mkdir()  # a folder without a record
    (base / ".meta" / ("0" * 40 + ".json")).write_text("{}")  # a record without a folder
    (base / ".meta" / ".half-written").write_text("{")

    reopened = RevisionStore(store.root)
    await reopened.open()
    assert sorted(p.name for p in base.iterdir()) == sorted([".lock", ".meta", kept.id])
    assert sorted(p.name for p in (base / ".meta").iterdir()) == [f"{kept.id}.json"]
    assert await reopened.revisions(NAMESPACE, "bundle") == [kept]


async def test_open_leaves_a_bundle_locked_by_another_process_alone(
    store: RevisionStore, tmp_path: Path
) -> None:
    base = store.root / NAMESPACE / "busy"
    (base / ".tmp-inflight").mkdir(parents=True)
    fd = os.open(base / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        await RevisionStore(store.root).open()
        assert (base / ".tmp-inflight").exists()  # another sync's staging: not ours to remove
    finally:
        os.close(fd)


async def test_the_bundle_lock_holds_across_processes(store: RevisionStore, tmp_path: Path) -> None:
    """A sync waits while another process holds the bundle's file lock."""
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    base = store.root / NAMESPACE / "bundle"
    base.mkdir(parents=True)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        textwrap.dedent(
            f"""
            import fcntl, os, sys
            fd = os.open({str(base / ".lock")!r}, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
            """
        ),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert (await holder.stdout.readline()).strip() == b"locked"
        with pytest.raises(SourceTimeout):
            await sync_source(store, volume(folder), within=1.0)
        assert await store.revisions(NAMESPACE, "bundle") == []
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        await asyncio.wait_for(holder.wait(), 10)
    revision = await sync_source(store, volume(folder))  # free again
    assert (revision.path / "a.txt").read_text() == "x"


async def test_syncs_of_one_bundle_in_one_process_do_not_interleave(
    store: RevisionStore, tmp_path: Path
) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    for n in range(200):
        (folder / f"f{n:03d}").write_bytes(os.urandom(512))
    first, second = await asyncio.gather(
        sync_source(store, volume(folder)), sync_source(store, volume(folder))
    )
    assert first == second
    assert len(await store.revisions(NAMESPACE, "bundle")) == 1


async def test_an_unchanged_source_writes_nothing(store: RevisionStore, tmp_path: Path) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("same")
    first = await sync_source(store, volume(folder))
    before = fingerprint(store.root)
    again = await sync_source(store, volume(folder))
    assert again == first
    assert fingerprint(store.root) == before


async def test_delete_bundle_removes_everything(store: RevisionStore, tmp_path: Path) -> None:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    await sync_source(store, volume(folder))
    await store.delete_bundle(NAMESPACE, "bundle")
    assert not (store.root / NAMESPACE / "bundle").exists()
    assert [p.name for p in (store.root / NAMESPACE).iterdir()] == []


async def test_delete_bundle_outlasts_a_writer_still_inside_the_folder(
    store: RevisionStore, tmp_path: Path
) -> None:
    """A sync cancelled by the deletion may still hold a folder of the bundle open and write
    into it while it is removed (rmtree then fails with ENOTEMPTY, or misses the new files):
    the deletion tries again until the folder is gone, instead of leaving it for good."""
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    await sync_source(store, volume(folder))
    inside = os.open(store.root / NAMESPACE / "bundle", os.O_RDONLY | os.O_DIRECTORY)
    for n in range(3000):  # enough for rmtree to take a while after it listed the folder
        os.close(os.open(f"early-{n}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=inside))
    writing = asyncio.Event()

    def write_for_a_while() -> None:
        try:
            for n in range(400):  # about a second of new files, through the open folder
                fd = os.open(f"late-{n}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=inside)
                os.write(fd, b"x" * 4096)
                os.close(fd)
                if n == 20:
                    loop.call_soon_threadsafe(writing.set)
                time.sleep(0.0025)
        except FileNotFoundError:
            pass  # the folder went while we wrote: fine, nothing more to write

    loop = asyncio.get_running_loop()
    writer = asyncio.ensure_future(asyncio.to_thread(write_for_a_while))
    await writing.wait()
    try:
        await store.delete_bundle(NAMESPACE, "bundle")
    finally:
        await writer
        os.close(inside)
    assert [p.name for p in (store.root / NAMESPACE).iterdir()] == []


async def test_a_folder_still_written_after_the_deletion_is_removed_in_the_background(
    store: RevisionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy machine the cancelled sync's copy thread may only run after the deletion's own
    attempts ended: the deletion returns, and the folder is removed later, counted meanwhile."""
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    await sync_source(store, volume(folder))
    real = store_module._remove_tree
    calls: list[Path] = []

    def still_written(path: Path) -> None:
        calls.append(path)
        if len(calls) <= 4:  # the two attempts of the deletion, then two in the background
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        real(path)

    monkeypatch.setattr(store_module, "_remove_tree", still_written)
    monkeypatch.setattr(store_module, "TRASH_ATTEMPTS", 2)
    monkeypatch.setattr(store_module, "TRASH_PAUSE", 0.05)
    await store.delete_bundle(NAMESPACE, "bundle")
    assert store.removal_count == 1
    [left] = (store.root / NAMESPACE).iterdir()
    assert left.name.startswith(".trash-bundle-")
    for _ in range(600):  # 30 s at most
        if not store.removal_count:
            break
        await asyncio.sleep(0.05)
    assert store.removal_count == 0
    assert list((store.root / NAMESPACE).iterdir()) == []
    assert len(calls) == 5 and set(calls) == {left}


async def test_a_retried_deletion_removes_what_an_earlier_attempt_left(
    store: RevisionStore, tmp_path: Path
) -> None:
    """A deletion stopped between its rename and its removal (cancelled, or it failed) leaves
    ``.trash-<bundle>-*``; the next attempt finds no bundle folder but removes that, and only
    that: a bundle whose name starts the same keeps its own."""
    namespace = store.root / NAMESPACE
    mine = namespace / ".trash-bundle-0123456789ab"
    theirs = namespace / ".trash-bundle-x-0123456789ab"
    for left in (mine, theirs):
        (left / "rev").mkdir(parents=True)
        (left / "rev" / "file").write_text("x")
    await store.delete_bundle(NAMESPACE, "bundle")
    assert sorted(p.name for p in namespace.iterdir()) == [theirs.name]
    assert store.removal_count == 0


async def test_open_removes_folders_deletions_left_behind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    left = root / NAMESPACE / ".trash-gone-0123456789ab"
    (left / "rev" / "deep").mkdir(parents=True)
    (left / "rev" / "deep" / "file").write_text("x")
    store = RevisionStore(root)
    await store.open()
    assert [p.name for p in (root / NAMESPACE).iterdir()] == []


@pytest.mark.parametrize(("namespace", "bundle"), [("Bad_NS", "b"), ("ns", "../escape")])
async def test_invalid_names_are_refused(
    store: RevisionStore, tmp_path: Path, namespace: str, bundle: str
) -> None:
    from taskhandler_operator.sources.errors import InvalidSource
    from taskhandler_operator.sources.spec import SourceSpec
    from taskhandler_operator.sources.sync import sync

    with pytest.raises(InvalidSource, match="not a valid Kubernetes object name"):
        await sync(
            SourceSpec.model_validate(volume(tmp_path)),
            None,
            store,
            namespace=namespace,
            bundle=bundle,
            timeout=5,
        )
    assert not store.root.exists() or not any(store.root.iterdir())
