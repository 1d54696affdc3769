"""Volume sources: snapshot semantics, the listing-shaped revision id, refusals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.packers import write_typescript_bundle
from taskhandler_operator.sources.errors import ArchiveRefused, NotFound
from taskhandler_operator.sources.store import RevisionStore
from tests.integration.sources.conftest import NAMESPACE, fingerprint, read_tree, sync_source

pytestmark = pytest.mark.integration


def volume(path: Path, sub_path: str = "") -> dict[str, object]:
    return {"volume": {"path": str(path), "subPath": sub_path}}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "pvc"
    (root / "bundles" / "lib").mkdir(parents=True)
    (root / "bundles" / "lib" / "dep.txt").write_text("dependency")
    (root / "bundles" / "run.sh").write_text("#!/bin/sh\n")
    (root / "bundles" / "run.sh").chmod(0o755)
    (root / "bundles" / "current").symlink_to("run.sh")
    (root / "elsewhere.txt").write_text("not in the subPath")
    return root


async def test_snapshot_is_a_copy_that_later_writes_do_not_reach(
    store: RevisionStore, folder: Path
) -> None:
    revision = await sync_source(store, volume(folder, "bundles"))
    assert read_tree(revision.path) == {
        "lib/dep.txt": b"dependency",
        "run.sh": b"#!/bin/sh\n",
        "current": b"-> run.sh",
    }
    assert os.access(revision.path / "run.sh", os.X_OK)
    # An in-place write on the volume (same inode) must not change the revision's copy.
    with (folder / "bundles" / "lib" / "dep.txt").open("r+") as f:
        f.write("CHANGED!!!")
    assert (revision.path / "lib" / "dep.txt").read_text() == "dependency"
    changed = await sync_source(store, volume(folder, "bundles"))
    assert changed.id != revision.id
    assert (changed.path / "lib" / "dep.txt").read_text() == "CHANGED!!!"
    assert (revision.path / "lib" / "dep.txt").read_text() == "dependency"


async def test_unchanged_volume_returns_the_revision_and_writes_nothing(
    store: RevisionStore, folder: Path
) -> None:
    first = await sync_source(store, volume(folder))
    before = fingerprint(store.root)
    assert await sync_source(store, volume(folder)) == first
    assert fingerprint(store.root) == before


async def test_unchanged_files_are_linked_from_the_previous_revision(
    store: RevisionStore, folder: Path
) -> None:
    for n in range(50):
        (folder / "bundles" / f"file{n:02d}.bin").write_bytes(os.urandom(256))
    first = await sync_source(store, volume(folder, "bundles"))
    (folder / "bundles" / "file07.bin").write_bytes(b"new content")
    second = await sync_source(store, volume(folder, "bundles"))
    assert second.id != first.id
    same = (second.path / "file08.bin").stat().st_ino == (first.path / "file08.bin").stat().st_ino
    assert same  # unchanged: one immutable file, two revisions
    assert (second.path / "file07.bin").stat().st_ino != (first.path / "file07.bin").stat().st_ino
    assert (first.path / "file07.bin").read_bytes() != b"new content"


async def test_revision_id_follows_what_the_listing_sees(
    store: RevisionStore, tmp_path: Path
) -> None:
    """A candidate is identified by its stored cache digest and size; other files by their
    modification time too."""
    root = tmp_path / "vol"
    root.mkdir()
    artifact = write_typescript_bundle(root / "handler.min.mjs", code=b"export const a = 1;\n")
    (root / "notes.txt").write_text("hello")
    first = await sync_source(store, volume(root))
    # Touching a candidate without changing size or stored digest keeps the revision.
    os.utime(artifact, ns=(1, 1_000_000_000))
    assert (await sync_source(store, volume(root))).id == first.id
    # Touching another file is a change.
    os.utime(root / "notes.txt", ns=(1, 2_000_000_000))
    assert (await sync_source(store, volume(root))).id != first.id


async def test_missing_folder_is_not_found(store: RevisionStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist; check path and subPath"):
        await sync_source(store, volume(tmp_path / "absent"))


@pytest.mark.parametrize("kind", ["fifo", "outside-link", "absolute-link", "setuid"])
async def test_refusals_keep_the_previous_revision(
    store: RevisionStore, folder: Path, tmp_path: Path, kind: str
) -> None:
    previous = await sync_source(store, volume(folder))
    before = read_tree(previous.path)
    bad = folder / "bundles" / "bad"
    if kind == "fifo":
        os.mkfifo(bad)
        reason = "is a FIFO"
    elif kind == "outside-link":
        bad.symlink_to("../../outside-the-volume")
        reason = "resolves outside"
    elif kind == "absolute-link":
        bad.symlink_to("/etc/passwd")
        reason = "absolute path"
    else:
        bad.write_bytes(b"x")
        bad.chmod(0o4755)
        reason = "setuid"
    with pytest.raises(ArchiveRefused, match=reason) as info:
        await sync_source(store, volume(folder))
    assert str(folder) in info.value.message
    assert await store.revisions(NAMESPACE, "bundle") == [previous]
    assert read_tree(previous.path) == before
    assert not any(p.name.startswith(".tmp-") for p in previous.path.parent.iterdir())


async def test_sub_path_through_a_symlink_is_refused(
    store: RevisionStore, folder: Path, tmp_path: Path
) -> None:
    (folder / "sneaky").symlink_to(tmp_path)
    with pytest.raises(ArchiveRefused, match="symlink"):
        await sync_source(store, volume(folder, "sneaky"))


async def test_a_volume_outside_the_allowed_roots_is_refused_and_nothing_is_written(
    store: RevisionStore, folder: Path, tmp_path: Path
) -> None:
    from taskhandler_operator.sources.access import VolumeAccess
    from taskhandler_operator.sources.errors import VolumeNotAllowed
    from taskhandler_operator.sources.spec import SourceSpec
    from taskhandler_operator.sources.sync import sync

    victim = await sync_source(store, volume(folder, "bundles"), bundle="victim")
    before = fingerprint(store.root)
    (folder / "to-store").symlink_to(store.root)
    allowed = VolumeAccess.for_operator([folder], store=store.root)
    cases = [
        (None, folder, "allows no volume sources"),  # the default: no roots
        (allowed, tmp_path, "overlaps"),  # holds the store
        (allowed, victim.path, "overlaps"),  # another bundle's revision
        (allowed, folder / "to-store" / NAMESPACE, "resolves to"),
        (allowed, Path("/proc/self"), "overlaps /proc"),
    ]
    for access, path, words in cases:
        with pytest.raises(VolumeNotAllowed, match=words):
            await sync(
                SourceSpec.model_validate(volume(path)),
                None,
                store,
                namespace=NAMESPACE,
                bundle="intruder",
                timeout=30,
                volumes=access,
            )
    after = fingerprint(store.root)

    # Only the intruder's own (empty) bundle folder and its lock file appeared.
    def others(found: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in found.items() if "intruder" not in k and k != NAMESPACE}

    assert others(after) == others(before)
    assert not [k for k in after if k.startswith(f"{NAMESPACE}/intruder/") and "/." not in k]
