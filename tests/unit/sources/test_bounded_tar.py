"""Archive headers and directories are counted before they are read: the caps of
``sources/bounded_tar.py`` and of the zip central-directory walk, each just below and just
above its limit, with the archives of ``tests/fixtures/hostile_archives.py``. The memory those
caps save is measured in ``tests/integration/sources/test_hostile_archives.py``."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from taskhandler_operator.sources import bounded_tar
from taskhandler_operator.sources.archive import (
    central_directory_bytes,
    extract_archive,
    zip_entry_count,
)
from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import TreeLimits, TreeWriter
from tests.fixtures import hostile_archives as hostile


def extract(tmp_path: Path, data: bytes, kind: str, **limits: int) -> dict[str, bytes]:
    archive = tmp_path / f"archive.{kind}"
    archive.write_bytes(data)
    root = tmp_path / "out"
    root.mkdir()
    with TreeWriter(root, TreeLimits(**limits)) as writer:
        extract_archive(archive, kind, writer)
        writer.finish()
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        (tarfile.GNUTYPE_LONGNAME, "GNU long-name"),
        (tarfile.GNUTYPE_LONGLINK, "GNU long-link"),
        (tarfile.XHDTYPE, "pax"),
        (tarfile.XGLTYPE, "pax global"),
    ],
)
def test_a_header_over_the_cap_is_refused_before_it_is_read(
    tmp_path: Path, kind: bytes, what: str
) -> None:
    with pytest.raises(ArchiveRefused, match=f"a {what} header of {2 << 20} bytes"):
        extract(tmp_path, hostile.huge_header_tgz(kind, mib=2), "tar.gz")


def test_headers_under_the_cap_still_work(tmp_path: Path) -> None:
    """pax headers of up to 1 MiB pass (the x/g variants' one record), and so do GNU long
    names within the path rules."""
    for kind in (tarfile.XHDTYPE, tarfile.XGLTYPE):
        folder = tmp_path / kind.decode()
        folder.mkdir()
        assert extract(folder, hostile.huge_header_tgz(kind, mib=1), "tar.gz") == {
            "ok.txt": b"fine\n"
        }
    long_name = "d/" + "n" * 200 + "/" + "f" * 200
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(long_name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
        link = tarfile.TarInfo("l" * 150)
        link.type = tarfile.SYMTYPE
        link.linkname = long_name
        tar.addfile(link)
    folder = tmp_path / "gnu"
    folder.mkdir()
    assert extract(folder, buffer.getvalue(), "tar.gz")[long_name] == b"ok"


def test_a_chain_of_headers_is_capped(tmp_path: Path) -> None:
    limit = bounded_tar.MAX_HEADER_CHAIN
    (tmp_path / "ok").mkdir()
    assert extract(tmp_path / "ok", hostile.header_chain_tgz(limit), "tar.gz") == {
        "ok.txt": b"fine\n"
    }
    with pytest.raises(ArchiveRefused, match=f"more than {limit} extension headers in a row"):
        extract(tmp_path, hostile.header_chain_tgz(limit + 1), "tar.gz")


def test_global_header_keys_are_capped(tmp_path: Path) -> None:
    limit = bounded_tar.MAX_GLOBAL_KEYS
    (tmp_path / "ok").mkdir()
    assert extract(tmp_path / "ok", hostile.global_keys_tgz(limit), "tar.gz") == {
        "ok.txt": b"fine\n"
    }
    with pytest.raises(ArchiveRefused, match=f"hold {limit + 1} keys, more than {limit}"):
        extract(tmp_path, hostile.global_keys_tgz(limit + 1), "tar.gz")


def test_sparse_maps_are_capped(tmp_path: Path) -> None:
    limit = bounded_tar.MAX_SPARSE_ENTRIES
    (tmp_path / "ok").mkdir()
    assert extract(tmp_path / "ok", hostile.sparse_map_tgz(3), "tar.gz") == {"sparse.bin": b"x\0\0"}
    with pytest.raises(ArchiveRefused, match=f"more than {limit} data regions"):
        extract(tmp_path, hostile.sparse_map_tgz(limit + 1), "tar.gz")


def test_a_central_directory_larger_than_its_end_record_claims_is_counted(
    tmp_path: Path,
) -> None:
    data = hostile.lying_zip(101)
    assert zip_entry_count(io.BytesIO(data), 1000) == 101
    assert zip_entry_count(io.BytesIO(data), 100) == 101  # stops at the first over the cap
    assert zipfile.ZipFile(io.BytesIO(data)).testzip() is None  # zipfile itself reads it
    with pytest.raises(ArchiveRefused, match="more than 100 entries"):
        extract(tmp_path, data, "zip", max_files=100)


def test_a_central_directory_over_its_byte_cap_is_refused_unread(tmp_path: Path) -> None:
    cap = central_directory_bytes(1000)
    records = cap // 47 + 1
    data = hostile.lying_zip(records)
    with pytest.raises(ArchiveRefused, match=f"claims {records * 47} bytes: more than the cap"):
        extract(tmp_path, data, "zip", max_files=1000)


def test_zip_counts_agree_with_zipfile(tmp_path: Path) -> None:
    """Comments, zip64 end records and prepended data: the walk finds the directory zipfile
    finds and counts what it lists."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n in range(30):
            archive.writestr(f"f{n}", b"x" * n)
        archive.comment = b"an archive comment"
    for data in (
        buffer.getvalue(),
        b"#!/bin/sh\nprepended\n" + buffer.getvalue(),
        hostile.many_entries_zip(70_000),
    ):
        expected = len(zipfile.ZipFile(io.BytesIO(data)).infolist())
        assert zip_entry_count(io.BytesIO(data), 100_000) == expected


def test_old_gnu_sparse_extension_blocks_are_capped(tmp_path: Path) -> None:
    """The type-S format keeps its map in 512-byte extension blocks after the header: read
    with a count (the reimplemented loop), and the file comes out as tarfile would make it."""
    limit = bounded_tar.MAX_SPARSE_ENTRIES
    small = hostile.old_gnu_sparse_tgz(30)
    with tarfile.open(fileobj=io.BytesIO(small), mode="r|gz") as tar:  # the reference
        member = tar.next()
        assert member is not None
        expected = tar.extractfile(member).read()  # type: ignore[union-attr]
    (tmp_path / "ok").mkdir()
    assert extract(tmp_path / "ok", small, "tar.gz") == {"sparse.bin": expected}
    assert expected == b"x\0" * 30
    with pytest.raises(ArchiveRefused, match=f"more than {limit} data regions"):
        extract(tmp_path, hostile.old_gnu_sparse_tgz(limit + 30), "tar.gz")
