"""Listing a bundle root: order, symlinks, skips, problems and the relisting cache."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from taskhandler_devenv.packers import (
    GO_TRAILER,
    write_go_bundle,
    write_jar,
    write_typescript_bundle,
)
from taskhandler_operator.artifacts import go, listing
from taskhandler_operator.artifacts.listing import (
    BundleRootError,
    ListingCache,
    ListingProblem,
    ListingStats,
    WalkedFile,
    _CachedAnswer,
    list_candidates,
    walk_files,
)
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile

BINARY = b"\x7fELF" + b"\x00" * 60
HANDLER = {
    "Main-Class": "x.Main",
    "Airflow-Cache-Digest": "d" * 64,
    "Airflow-Supervisor-Schema-Version": "2026-10-30",
}


def _go_tree(root: Path) -> None:
    for rel in ["b/etl", "a.txt", "a/z", "a/b/c", "c", "a-b/x"]:
        write_go_bundle(root / rel, BINARY, cache_digest=f"digest-{rel}")


def test_walk_is_depth_first_in_sorted_order(tmp_path: Path) -> None:
    _go_tree(tmp_path)
    result = list_candidates(tmp_path, Language.GO)
    # Entries sorted per folder, folders entered where they sort: "a" < "a-b" < "a.txt".
    assert [c.rel_path for c in result.candidates] == [
        "a/b/c",
        "a/z",
        "a-b/x",
        "a.txt",
        "b/etl",
        "c",
    ]
    assert [c.cache_digest for c in result.candidates] == [
        f"digest-{c.rel_path}" for c in result.candidates
    ]
    assert result.problems == []


def test_unrelated_files_are_skipped(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "etl", BINARY)
    (tmp_path / "README.md").write_text("hello\n" * 20)
    (tmp_path / "empty").write_bytes(b"")
    write_jar(tmp_path / "dep.jar", manifest={"Main-Class": "a.B"})
    write_typescript_bundle(tmp_path / "ui.min.mjs", b"code")
    result = list_candidates(tmp_path, Language.GO)
    assert [c.rel_path for c in result.candidates] == ["etl"]
    assert [c.rel_path for c in list_candidates(tmp_path, Language.JAVA).candidates] == []
    assert [c.rel_path for c in list_candidates(tmp_path, Language.TYPESCRIPT).candidates] == [
        "ui.min.mjs"
    ]


def test_java_and_typescript_files_are_filtered_by_name_before_opening(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"x" * 1000)
    (tmp_path / "notes.txt").write_bytes(b"y" * 1000)
    write_jar(tmp_path / "h.jar", manifest=HANDLER)
    result = list_candidates(tmp_path, Language.JAVA)
    assert result.stats.files_walked == 3
    assert result.stats.files_opened == 1
    assert list_candidates(tmp_path, Language.TYPESCRIPT).stats.files_opened == 0


def test_file_reached_through_several_symlinks_is_listed_once_under_the_first_path(
    tmp_path: Path,
) -> None:
    write_go_bundle(tmp_path / "real" / "etl", BINARY)
    (tmp_path / "a-link").symlink_to(tmp_path / "real" / "etl")
    (tmp_path / "z-link").symlink_to("real/etl")
    (tmp_path / "dir-link").symlink_to(tmp_path / "real", target_is_directory=True)
    result = list_candidates(tmp_path, Language.GO)
    assert [c.rel_path for c in result.candidates] == ["a-link"]
    assert result.problems == []


def test_hard_links_are_listed_once(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "a", BINARY)
    os.link(tmp_path / "a", tmp_path / "b")
    assert [c.rel_path for c in list_candidates(tmp_path, Language.GO).candidates] == ["a"]


def test_symlinked_folder_inside_the_root_is_walked(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "z-real" / "etl", BINARY)
    (tmp_path / "a-alias").symlink_to(tmp_path / "z-real", target_is_directory=True)
    assert [c.rel_path for c in list_candidates(tmp_path, Language.GO).candidates] == [
        "a-alias/etl"
    ]


def test_symlink_loops_are_survived(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "d" / "etl", BINARY)
    (tmp_path / "d" / "back").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "d" / "self").symlink_to(tmp_path / "d", target_is_directory=True)
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    result = list_candidates(tmp_path, Language.GO)
    assert [c.rel_path for c in result.candidates] == ["d/etl"]
    problems = {p.rel_path: p.message for p in result.problems}
    assert set(problems) == {"loop1", "loop2"}
    assert problems["loop1"].startswith("symlink cannot be resolved, skipped (")


def test_symlink_leaving_the_root_is_reported_and_never_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_go_bundle(outside / "secret-bundle", BINARY)
    root = tmp_path / "bundle"
    write_go_bundle(root / "etl", BINARY)
    (root / "escape").symlink_to(outside / "secret-bundle")
    (root / "escape-dir").symlink_to(outside, target_is_directory=True)
    (root / "up").symlink_to("../outside/secret-bundle")
    result = list_candidates(root, Language.GO)
    assert [c.rel_path for c in result.candidates] == ["etl"]
    assert set(result.stats.bytes_by_file) == {"etl"}
    problems = {p.rel_path: p.message for p in result.problems}
    secret = outside / "secret-bundle"
    assert problems == {
        "escape": f"symlink points outside the bundle root ({secret}), not followed",
        "escape-dir": f"symlink points outside the bundle root ({outside}), not followed",
        "up": f"symlink points outside the bundle root ({secret}), not followed",
    }


def test_dangling_symlink_is_reported(tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    result = list_candidates(tmp_path, Language.GO)
    assert result.candidates == []
    assert [p.rel_path for p in result.problems] == ["gone"]


def test_root_given_through_a_symlink_is_resolved(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "real" / "etl", BINARY)
    (tmp_path / "current").symlink_to(tmp_path / "real", target_is_directory=True)
    assert [c.rel_path for c in list_candidates(tmp_path / "current", Language.GO).candidates] == [
        "etl"
    ]


def test_fifo_is_skipped_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jar")
    os.mkfifo(tmp_path / "pipe")
    assert list_candidates(tmp_path, Language.JAVA).candidates == []
    assert list_candidates(tmp_path, Language.GO).candidates == []


def test_root_that_is_not_a_folder_raises(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleRootError, match="is not a folder"):
        list_candidates(tmp_path / "file", Language.GO)
    with pytest.raises(BundleRootError, match="cannot be resolved: No such file or directory"):
        list_candidates(tmp_path / "missing", Language.GO)


def test_walk_lists_every_regular_file(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.jar").write_bytes(b"")
    (tmp_path / "a.jar").write_bytes(b"")
    assert [f.rel_path for f in walk_files(tmp_path).files] == ["a.jar", "b/x.jar"]


_UNREADABLE_SCRIPT = """
import json, os, sys
from pathlib import Path
from taskhandler_operator.artifacts.listing import list_candidates
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile
import yaml  # the Go reader imports it on first use
# Import first: the interpreter's own files may not be readable by nobody.
os.setgid(65534)
os.setuid(65534)
result = list_candidates(Path(sys.argv[1]), Language.GO)
print(json.dumps({
    "candidates": [c.rel_path for c in result.candidates],
    "problems": [[p.rel_path, p.message] for p in result.problems],
}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to nobody to make permissions bite")
def test_unreadable_files_and_folders_are_reported() -> None:
    import json

    with tempfile.TemporaryDirectory(prefix="thop-perm-") as raw:
        root = Path(raw)
        root.chmod(0o755)
        write_go_bundle(root / "readable", BINARY).chmod(0o755)
        write_go_bundle(root / "secret", BINARY).chmod(0o711)  # executable, not readable
        (root / "closed").mkdir(mode=0o700)
        write_go_bundle(root / "closed" / "inner", BINARY)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.run(
            [sys.executable, "-c", _UNREADABLE_SCRIPT, str(root)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
    result = json.loads(proc.stdout)
    assert result["candidates"] == ["readable"]
    # Never a silent miss: the folder and the file nobody may read are both named.
    assert [problem[0] for problem in result["problems"]] == ["closed", "secret"]
    assert result["problems"][0][1].startswith(
        "cannot read this folder: [Errno 13] Permission denied"
    )
    assert result["problems"][1][1] == "cannot be opened (Permission denied)"


# -- cache ---------------------------------------------------------------------------------


def _cache() -> ListingCache:
    return ListingCache(racy_window_ns=0)  # files written by the test are "old enough"


def test_unchanged_tree_is_relisted_without_opening_a_file(tmp_path: Path) -> None:
    _go_tree(tmp_path)
    write_jar(tmp_path / "h.jar", manifest=HANDLER)
    cache = _cache()
    first = list_candidates(tmp_path, Language.GO, cache)
    second = list_candidates(tmp_path, Language.GO, cache)
    assert second.candidates == first.candidates
    assert first.stats.files_opened == 7
    assert second.stats.files_opened == 0
    assert second.stats.bytes_read == 0
    assert second.stats.cache_hits == 7  # the JAR was read by the Go reader too: a skip is cached


def test_changed_file_is_read_again(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, cache_digest="one")
    cache = _cache()
    assert list_candidates(tmp_path, Language.GO, cache).candidates[0].cache_digest == "one"
    write_go_bundle(tmp_path / "etl", BINARY, cache_digest="two")
    relisted = list_candidates(tmp_path, Language.GO, cache)
    assert relisted.candidates[0].cache_digest == "two"
    assert relisted.stats.files_opened == 1
    path.chmod(0o644)  # only ctime changes: the executable rule must be re-evaluated
    again = list_candidates(tmp_path, Language.GO, cache)
    assert (
        again.candidates[0].error is not None and "is not executable" in again.candidates[0].error
    )


def test_same_file_under_another_path_is_not_answered_from_the_cache(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "b" / "etl", BINARY)
    (tmp_path / "b" / "etl").chmod(0o644)
    cache = _cache()
    assert list_candidates(tmp_path, Language.GO, cache).candidates[0].rel_path == "b/etl"
    # Rename keeps inode, size and mtime; only the path (and ctime) change.
    (tmp_path / "b").rename(tmp_path / "c")
    candidate = list_candidates(tmp_path, Language.GO, cache).candidates[0]
    assert candidate.rel_path == "c/etl"
    assert candidate.error is not None and candidate.error.startswith("c/etl is not executable")


def test_cache_keys_include_the_language(tmp_path: Path) -> None:
    write_typescript_bundle(tmp_path / "b.min.mjs", b"code")
    cache = _cache()
    assert list_candidates(tmp_path, Language.GO, cache).candidates == []
    assert len(list_candidates(tmp_path, Language.TYPESCRIPT, cache).candidates) == 1


def test_recent_files_are_not_cached(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "etl", BINARY)
    cache = ListingCache(racy_window_ns=3600 * 10**9)
    list_candidates(tmp_path, Language.GO, cache)
    assert len(cache) == 0
    assert list_candidates(tmp_path, Language.GO, cache).stats.files_opened == 1


def test_cache_is_bounded(tmp_path: Path) -> None:
    for i in range(5):
        write_go_bundle(tmp_path / f"etl{i}", BINARY)
    cache = ListingCache(max_entries=3, racy_window_ns=0)
    list_candidates(tmp_path, Language.GO, cache)
    assert len(cache) == 3


# -- found by mutation testing (docs/mutation-testing.md) -----------------------------------

NOW = 10**18
WINDOW = 2 * 10**9


def _key(mtime_ns: int, ctime_ns: int, ino: int = 2) -> bytes:
    # ListingCache.key of a stat result with these fields (device 1, size 3).
    fields = (0o100755, ino, 1, 1, 0, 0, 3, 0, 0, 0, 0.0, 0.0, 0.0, 0, mtime_ns, ctime_ns)
    return ListingCache.key(Language.GO, os.stat_result(fields))


@pytest.mark.parametrize(
    ("mtime_ns", "ctime_ns", "cached"),
    [
        (NOW - WINDOW - 1, NOW - WINDOW - 1, True),
        (NOW - WINDOW, NOW - WINDOW - 1, False),  # exactly at the window: still racy
        (NOW, NOW - 10 * WINDOW, False),  # an mtime set into the recent past or future
        (NOW - 10 * WINDOW, NOW, False),
    ],
)
def test_the_racy_window_looks_at_mtime_and_ctime(
    mtime_ns: int, ctime_ns: int, cached: bool
) -> None:
    cache = ListingCache(racy_window_ns=WINDOW)
    cache.put(_key(mtime_ns, ctime_ns), _CachedAnswer("etl", None), NOW)
    assert (len(cache) == 1) is cached


def test_the_cache_evicts_the_least_recently_used() -> None:
    cache = ListingCache(max_entries=2, racy_window_ns=0)
    old = NOW - 1
    first, second, third = (_key(old, old, ino=i) for i in range(3))
    cache.put(first, _CachedAnswer("a", None), NOW)
    cache.put(second, _CachedAnswer("b", None), NOW)
    assert cache.get(first, "a") is not None  # first is now the most recently used
    cache.put(third, _CachedAnswer("c", None), NOW)
    assert cache.get(second, "b") is None
    assert cache.get(first, "a") is not None and cache.get(third, "c") is not None


def test_a_name_that_is_not_utf8_is_a_problem_with_an_escaped_path(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "good", BINARY)
    bad = os.fsencode(tmp_path) + b"/bad-\xff\xfe"
    Path(os.fsdecode(bad)).write_bytes((tmp_path / "good").read_bytes())
    result = list_candidates(tmp_path, Language.GO)
    assert [c.rel_path for c in result.candidates] == ["good"]
    assert [(p.rel_path, p.message) for p in result.problems] == [
        ("bad-\\xff\\xfe", "its name is not valid UTF-8, skipped (rename it)")
    ]
    result.problems[0].rel_path.encode("utf-8")  # valid text


def test_the_smallest_files_that_may_be_artifacts_are_read(tmp_path: Path) -> None:
    # A bare 64-byte trailer is a Go candidate; 18 bytes of layout marker a TypeScript one.
    trailer = GO_TRAILER.pack(0, 0, 1, bytes(32), bytes(12), b"AFBNDL01")
    (tmp_path / "etl").write_bytes(trailer)
    (tmp_path / "etl").chmod(0o755)
    (tmp_path / "x.min.mjs").write_bytes(b"//# airflowBundle=")
    assert [c.rel_path for c in list_candidates(tmp_path, Language.GO).candidates] == ["etl"]
    (ts,) = list_candidates(tmp_path, Language.TYPESCRIPT).candidates
    assert ts.error == "x.min.mjs: the layout line has no terminating newline"


def test_bytes_read_add_up_over_files(tmp_path: Path) -> None:
    write_go_bundle(tmp_path / "a", BINARY)
    write_go_bundle(tmp_path / "b", BINARY)
    stats = list_candidates(tmp_path, Language.GO).stats
    assert stats.files_opened == 2
    assert set(stats.bytes_by_file) == {"a", "b"}
    assert stats.bytes_read == sum(stats.bytes_by_file.values()) > max(stats.bytes_by_file.values())


def _walked(path: Path, rel_path: str) -> WalkedFile:
    return WalkedFile(rel_path, str(path), path.stat())


def test_a_file_that_cannot_be_opened_is_a_problem(tmp_path: Path) -> None:
    # The walk's real path became a symlink before the open (O_NOFOLLOW refuses it).
    target = write_go_bundle(tmp_path / "etl", BINARY)
    walked = _walked(target, "bin/etl")
    link = tmp_path / "link"
    link.symlink_to(target)
    problems: list[ListingProblem] = []
    moved = WalkedFile("bin/etl", str(link), walked.stat)
    assert listing._read(go.read_candidate, Language.GO, moved, ListingStats(), problems) is None
    assert [(p.rel_path, p.message) for p in problems] == [
        ("bin/etl", "cannot be opened (Too many levels of symbolic links)")
    ]


def test_a_read_error_is_a_problem_and_a_renamed_candidate_keeps_the_walked_path(
    tmp_path: Path,
) -> None:
    target = write_go_bundle(tmp_path / "etl", BINARY)
    problems: list[ListingProblem] = []

    def failing(f: OpenFile, rel_path: str) -> Candidate | None:
        raise OSError(errno.EIO, "Input/output error")

    result = listing._read(failing, Language.GO, _walked(target, "etl"), ListingStats(), problems)
    assert result is None
    assert [(p.rel_path, p.message) for p in problems] == [
        ("etl", "cannot be read (Input/output error)")
    ]

    def renaming(f: OpenFile, rel_path: str) -> Candidate | None:
        return Candidate("something else", f.size, "d")

    read = listing._read(renaming, Language.GO, _walked(target, "etl"), ListingStats(), [])
    assert read is not None and read[0] == Candidate("etl", target.stat().st_size, "d")
