"""The tree writer on a real file system: every rule that keeps writes inside the root."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import (
    Cancelled,
    TreeLimits,
    TreeWriter,
    open_folder,
    snapshot_tree,
)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    return root, outside


def writer(root: Path, **limits: int) -> TreeWriter:
    return TreeWriter(root, TreeLimits(**limits))


def test_files_folders_and_links_inside(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with writer(root) as w:
        w.add_dir("lib/")
        w.add_file("lib/a.jar", [b"abc", b"def"], 0o644)
        w.add_file("bin/tool", [b"x"], 0o755)
        w.add_symlink("current.jar", "lib/a.jar")
        w.add_hardlink("lib/b.jar", "lib/a.jar")
        stats = w.finish()
    assert (root / "lib/a.jar").read_bytes() == b"abcdef"
    assert stat.S_IMODE((root / "lib/a.jar").stat().st_mode) == 0o444
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o555
    assert (root / "current.jar").read_bytes() == b"abcdef"
    assert (root / "lib/b.jar").stat().st_ino == (root / "lib/a.jar").stat().st_ino
    assert (stats.files, stats.bytes) == (3, 13)


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (lambda w: w.add_file("../evil", [b"x"]), "escapes"),
        (lambda w: w.add_file("/tmp/evil", [b"x"]), "absolute"),
        (lambda w: w.add_symlink("l", "/etc/passwd"), "absolute path"),
        (lambda w: w.add_hardlink("h", "../outside/secret"), "escapes"),
        (lambda w: w.add_hardlink("h", "never-written"), "not a file written before"),
        (lambda w: w.add_file("s", [b"x"], 0o4755), "setuid or setgid"),
        (lambda w: w.add_file("g", [b"x"], 0o2755), "setuid or setgid"),
    ],
)
def test_refusals(layout: tuple[Path, Path], action: object, reason: str) -> None:
    root, outside = layout
    with writer(root) as w, pytest.raises(ArchiveRefused, match=reason):
        action(w)  # type: ignore[operator]
    assert list(outside.iterdir()) == []


def test_a_symlink_is_never_written_through(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    with writer(root) as w:
        w.add_symlink("escape", "../outside")
        with pytest.raises(ArchiveRefused, match="symlink or a file"):
            w.add_file("escape/planted", [b"x"])
        with pytest.raises(ArchiveRefused, match="appears twice"):
            w.add_file("escape", [b"x"])
        with pytest.raises(ArchiveRefused, match="resolves outside"):
            w.finish()
    assert list(outside.iterdir()) == []


def test_a_symlink_through_another_symlink_is_checked_as_the_kernel_resolves_it(
    layout: tuple[Path, Path],
) -> None:
    root, _ = layout
    with writer(root) as w:
        w.add_dir("d")
        w.add_symlink("d/s", "..")  # the root: inside
        w.add_symlink("d/x", "s/..")  # lexically d/s/.. = d, but really the root's parent
        with pytest.raises(ArchiveRefused, match=r"'d/x'.*resolves outside"):
            w.finish()


def test_symlink_loops_are_refused(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with writer(root) as w:
        w.add_symlink("a", "b")
        w.add_symlink("b", "a")
        with pytest.raises(ArchiveRefused, match="loop"):
            w.finish()


def test_duplicates_are_refused_not_overwritten(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with writer(root) as w:
        w.add_file("a", [b"first"])
        with pytest.raises(ArchiveRefused, match="appears twice"):
            w.add_file("a", [b"second"])
    assert (root / "a").read_bytes() == b"first"


def test_caps_count_entries_and_bytes_as_they_arrive(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with writer(root, max_files=3) as w:
        w.add_file("a", [b"1"])
        w.add_file("b/c", [b"2"])  # b/ counts too
        with pytest.raises(ArchiveRefused, match="more than 3 entries"):
            w.add_file("d", [b"3"])
    other = root / "other"
    other.mkdir()
    with writer(other, max_bytes=10) as w:

        def endless() -> object:
            while True:
                yield b"x" * 4

        with pytest.raises(ArchiveRefused, match="more than 10 bytes"):
            w.add_file("bomb", endless())  # type: ignore[arg-type]
    assert (other / "bomb").stat().st_size <= 10


def test_cancel_stops_between_chunks(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    cancel = threading.Event()
    with TreeWriter(root, TreeLimits(), cancel) as w:

        def chunks() -> object:
            yield b"a"
            cancel.set()
            yield b"b"

        with pytest.raises(Cancelled):
            w.add_file("f", chunks())  # type: ignore[arg-type]


def test_snapshot_copies_and_refuses_special_files(tmp_path: Path) -> None:
    source = tmp_path / "vol"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"hello")
    (source / "sub" / "run").write_bytes(b"#!/bin/sh\n")
    (source / "sub" / "run").chmod(0o755)
    (source / "link").symlink_to("a.bin")
    target = tmp_path / "snap"
    target.mkdir()
    fd = open_folder(source, "")
    try:
        with writer(target) as w:
            seen = snapshot_tree(fd, w)
            w.finish()
    finally:
        os.close(fd)
    assert set(seen) == {"a.bin", "sub/run"}
    assert (target / "a.bin").read_bytes() == b"hello"
    assert (target / "a.bin").stat().st_ino != (source / "a.bin").stat().st_ino  # a copy
    assert (target / "a.bin").stat().st_mtime_ns == (source / "a.bin").stat().st_mtime_ns
    assert str((target / "link").readlink()) == "a.bin"
    assert stat.S_IMODE((target / "sub" / "run").stat().st_mode) == 0o555

    os.mkfifo(source / "pipe")
    again = tmp_path / "snap2"
    again.mkdir()
    fd = open_folder(source, "")
    try:
        with writer(again) as w, pytest.raises(ArchiveRefused, match="'pipe' is a FIFO"):
            snapshot_tree(fd, w)
    finally:
        os.close(fd)


def test_open_folder_refuses_a_symlinked_sub_path(tmp_path: Path) -> None:
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "bundle").symlink_to("/etc")
    with pytest.raises(ArchiveRefused, match="symlink"):
        open_folder(tmp_path / "vol", "bundle")
