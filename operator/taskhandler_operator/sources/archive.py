"""Extract tar, tar.gz and zip archives through a :class:`TreeWriter`, streaming and bounded.

Nothing is extracted by the standard library's ``extract*`` functions: entries are read one at
a time and handed to the writer, which enforces the path, link, type, count and byte rules.
Memory stays flat whatever the archive: a tar is read as a stream (the member list the
``tarfile`` module would otherwise accumulate is dropped as it goes), and a zip's entry count is
read from its end record and checked against the cap *before* its central directory is parsed.
"""

from __future__ import annotations

import lzma
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import CHUNK, TreeWriter

__all__ = ["extract_archive", "extract_tar", "extract_zip", "zip_entry_count"]

# What the standard library's readers raise on a damaged archive (a fuzzed zip reaches
# IndexError, struct.error, seeks to negative offsets...). The tree writer raises only
# ArchiveRefused, StorageFailed or Cancelled, none of them in this list, so a full disk is never
# mistaken for a broken archive.
_BROKEN = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    tarfile.TarError,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    struct.error,
    RuntimeError,
    TypeError,  # tarfile's stream reader on a gzip header cut short
)


def _why(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:200]


_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_MAX_COMMENT = 0xFFFF
MAX_LINK_TARGET = 4096


def extract_archive(path: Path, kind: str, writer: TreeWriter) -> None:
    """Extract ``path`` of ``kind`` ('tar.gz', 'tar' or 'zip') into ``writer``."""
    if kind == "zip":
        extract_zip(path, writer)
    elif kind in ("tar.gz", "tar"):
        extract_tar(path, writer, gzip=kind == "tar.gz")
    else:  # pragma: no cover - the spec decides the kind
        raise ValueError(f"unknown archive kind {kind!r}")


# -- tar -----------------------------------------------------------------------------------


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


def extract_tar(path: Path, writer: TreeWriter, *, gzip: bool) -> None:
    mode = "r|gz" if gzip else "r|"
    label = "tar.gz" if gzip else "tar"
    try:
        with tarfile.open(path, mode=mode) as tar:  # type: ignore[call-overload]
            while True:
                writer.check_cancelled()
                member = tar.next()
                if member is None:
                    break
                tar.members = []  # stream mode keeps every member otherwise: memory grows
                _tar_member(tar, member, writer)
    except _BROKEN as exc:
        raise ArchiveRefused(f"not a valid {label} archive ({_why(exc)})") from None


def _tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo, writer: TreeWriter) -> None:
    name = member.name
    if member.isdir():
        writer.add_dir(name)
    elif member.isreg():  # regular, contiguous and GNU sparse files
        if writer.bytes + member.size > writer.limits.max_bytes:
            raise ArchiveRefused(
                f"entry {name!r} declares {member.size} bytes: more than the "
                f"{writer.limits.max_bytes}-byte cap"
            )
        f = tar.extractfile(member)
        if f is None:  # pragma: no cover - isreg() members always have data
            raise ArchiveRefused(f"entry {name!r} has no data")
        writer.add_file(name, _chunks(f), member.mode)
    elif member.issym():
        writer.add_symlink(name, member.linkname)
    elif member.islnk():
        writer.add_hardlink(name, member.linkname)
    elif member.ischr() or member.isblk():
        raise ArchiveRefused(f"entry {name!r} is a device file")
    elif member.isfifo():
        raise ArchiveRefused(f"entry {name!r} is a FIFO")
    else:
        raise ArchiveRefused(f"entry {name!r} has an unsupported type {member.type!r}")


# -- zip -----------------------------------------------------------------------------------


def zip_entry_count(f: IO[bytes]) -> int:
    """The entry count in a zip's end-of-central-directory record (zip64 aware).

    Read directly so a hostile archive is refused before ``zipfile`` builds one object per
    entry of its central directory.
    """
    f.seek(0, 2)
    size = f.tell()
    tail_size = min(size, 22 + _MAX_COMMENT)
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise ArchiveRefused("not a valid zip archive (no end of central directory record)")
    (total,) = struct.unpack("<H", tail[at + 10 : at + 12])
    if total != 0xFFFF:
        return int(total)
    # Zip64: a locator just before the end record points at the zip64 end record.
    locator_at = size - tail_size + at - 20
    if locator_at < 0:
        raise ArchiveRefused("not a valid zip archive (zip64 locator missing)")
    f.seek(locator_at)
    locator = f.read(20)
    if locator[:4] != _ZIP64_LOCATOR:
        return int(total)
    (record_at,) = struct.unpack("<Q", locator[8:16])
    f.seek(record_at)
    record = f.read(56)
    if len(record) < 56 or record[:4] != _ZIP64_EOCD:
        raise ArchiveRefused("not a valid zip archive (zip64 end record missing)")
    (total64,) = struct.unpack("<Q", record[32:40])
    return int(total64)


def extract_zip(path: Path, writer: TreeWriter) -> None:
    try:
        with path.open("rb") as raw:
            count = zip_entry_count(raw)
            if count > writer.limits.max_files:
                raise ArchiveRefused(
                    f"the archive lists {count} entries: more than the cap of "
                    f"{writer.limits.max_files} (files, folders and links)"
                )
            raw.seek(0)
            with zipfile.ZipFile(raw) as archive:
                for info in archive.infolist():
                    writer.check_cancelled()
                    _zip_member(archive, info, writer)
    except NotImplementedError as exc:  # an unsupported compression method
        raise ArchiveRefused(f"zip entry uses an unsupported feature ({exc})") from None
    except _BROKEN as exc:
        raise ArchiveRefused(f"not a valid zip archive ({_why(exc)})") from None


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, writer: TreeWriter) -> None:
    name = info.filename
    if not name.strip("/"):
        raise ArchiveRefused(f"entry {name!r} names the revision root, not a file")
    if info.flag_bits & 0x1:
        raise ArchiveRefused(f"entry {name!r} is encrypted")
    # Unix modes live in the high half of external_attr when the archive was made on Unix.
    mode = (info.external_attr >> 16) if info.create_system == 3 else 0
    kind = stat.S_IFMT(mode)
    if info.is_dir() or kind == stat.S_IFDIR:
        writer.add_dir(name)
        return
    if kind == stat.S_IFLNK:
        if info.file_size > MAX_LINK_TARGET:
            raise ArchiveRefused(f"link {name!r} has a target over {MAX_LINK_TARGET} bytes")
        with archive.open(info) as f:
            target = f.read(MAX_LINK_TARGET + 1)
        writer.add_symlink(name, target.decode("utf-8", "surrogateescape"))
        return
    if kind in (stat.S_IFCHR, stat.S_IFBLK):
        raise ArchiveRefused(f"entry {name!r} is a device file")
    if kind == stat.S_IFIFO:
        raise ArchiveRefused(f"entry {name!r} is a FIFO")
    if kind not in (0, stat.S_IFREG):
        raise ArchiveRefused(f"entry {name!r} has an unsupported type")
    if writer.bytes + info.file_size > writer.limits.max_bytes:
        raise ArchiveRefused(
            f"entry {name!r} declares {info.file_size} bytes: more than the "
            f"{writer.limits.max_bytes}-byte cap"
        )
    # The header's size may lie; the writer counts what actually comes out.
    with archive.open(info) as f:
        writer.add_file(name, _chunks(f), mode or 0o644)
