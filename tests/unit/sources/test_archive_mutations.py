"""Truncated, flipped and spliced archives: extraction refuses them with ArchiveRefused, or
extracts them, and never raises anything else nor writes outside its folder."""

from __future__ import annotations

import io
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhandler_operator.sources.archive import extract_archive
from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import TreeLimits, TreeWriter
from tests.fixtures.hostile_archives import zip_records

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FILES = {
    "META-INF/": b"",
    "META-INF/MANIFEST.MF": b"Main-Class: x\r\n",
    "a/B.class": b"\xca\xfe" * 40,
}


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in FILES.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tar(gz: bool) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as archive:
        for name, data in FILES.items():
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SEEDS = {"zip": _zip(), "tar": _tar(False), "tar.gz": _tar(True)}


def mutated(seed: bytes) -> st.SearchStrategy[bytes]:
    def flips(data: bytes, edits: list[tuple[int, int]]) -> bytes:
        out = bytearray(data)
        for offset, value in edits:
            out[offset % len(out)] = value
        return bytes(out)

    edits = st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6
    )
    return st.one_of(
        st.builds(flips, st.just(seed), edits),
        st.builds(lambda n: seed[: n % (len(seed) + 1)], st.integers(0, 1 << 16)),
        st.builds(
            lambda at, junk: seed[: at % len(seed)] + junk + seed[at % len(seed) :],
            st.integers(0, 1 << 16),
            st.binary(min_size=1, max_size=32),
        ),
    )


@pytest.mark.parametrize("kind", list(SEEDS))
@FAST
@given(data=st.data())
def test_mutated_archives_are_extracted_or_refused(kind: str, data: st.DataObject) -> None:
    archive = data.draw(mutated(SEEDS[kind]))
    with tempfile.TemporaryDirectory() as raw:
        base = Path(raw)
        source = base / f"archive.{kind}"
        source.write_bytes(archive)
        tree = base / "tree"
        tree.mkdir()
        with TreeWriter(tree, TreeLimits(max_files=100, max_bytes=1 << 20)) as writer:
            try:
                extract_archive(source, kind, writer)
                writer.finish()
            except ArchiveRefused as exc:
                assert exc.message
        assert sorted(p.name for p in base.iterdir()) == [source.name, "tree"]


def test_a_zip_entry_without_a_name_is_refused(tmp_path: Path) -> None:
    """An entry whose name is empty (zipfile's is_dir() fails on it with IndexError)."""
    crc = zlib.crc32(b"x")
    archive = zip_records([("", 0, crc, 1, stat.S_IFREG | 0o644, b"x")])
    (tmp_path / "a.zip").write_bytes(archive)
    (tmp_path / "tree").mkdir()
    with (
        TreeWriter(tmp_path / "tree", TreeLimits()) as writer,
        pytest.raises(ArchiveRefused, match="names the revision root"),
    ):
        extract_archive(tmp_path / "a.zip", "zip", writer)
