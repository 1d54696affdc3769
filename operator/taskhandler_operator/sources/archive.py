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
from typing import IO, Any

from taskhandler_operator.sources.bounded_tar import BoundedTarFile
from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import CHUNK, TreeWriter

__all__ = [
    "central_directory_bytes",
    "extract_archive",
    "extract_tar",
    "extract_zip",
    "zip_entry_count",
]

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


_ZIP64_EOCD = b"PK\x06\x06"
_ZIP64_RECORDS = 56 + 20  # the zip64 end record and its locator, between directory and end
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_CENTRAL_RECORD = 46
# zipfile's end-record fields (its _ECD_* constants)
_ECD_SIGNATURE, _ECD_SIZE, _ECD_LOCATION = 0, 5, 9
_zipfile: Any = zipfile
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
        # Headers (GNU long names, pax, sparse maps) are counted before tarfile reads them.
        with BoundedTarFile.open(path, mode=mode) as tar:  # type: ignore[call-overload]
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


def central_directory_bytes(max_files: int) -> int:
    """The cap on a zip's central directory: 1 KiB per allowed entry (real entries take
    60-300 bytes), at least 1 MiB. zipfile reads the directory whole before any entry."""
    return max(1 << 20, max_files * 1024)


def zip_entry_count(f: IO[bytes], max_files: int) -> int:
    """The number of entries in a zip's central directory, counted record by record.

    The directory is found exactly as ``zipfile`` finds it (its own end-record reader), its
    claimed size is checked against :func:`central_directory_bytes`, and it is walked in
    chunks without building anything, so a directory that holds far more entries than its end
    record claims is refused before ``zipfile`` builds one object per entry. The walk stops
    once ``max_files`` is exceeded.
    """
    end = _zipfile._EndRecData(f)  # private, but it is how ZipFile finds the directory
    if not end:
        raise ArchiveRefused("not a valid zip archive (no end of central directory record)")
    size = int(end[_ECD_SIZE])
    cap = central_directory_bytes(max_files)
    if size > cap:
        raise ArchiveRefused(
            f"the archive's central directory claims {size} bytes: more than the cap of {cap} "
            f"(1 KiB for each of the {max_files} entries allowed)"
        )
    start = int(end[_ECD_LOCATION]) - size  # where zipfile looks for it
    if end[_ECD_SIGNATURE] == _ZIP64_EOCD:
        start -= _ZIP64_RECORDS
    if start < 0:
        raise ArchiveRefused("not a valid zip archive (bad offset for central directory)")
    f.seek(start)
    count = 0
    done = 0  # bytes of the directory walked, as zipfile counts them
    unread = size  # bytes of the directory not read yet
    buffer = b""
    at = 0  # the current record's offset in buffer
    while done < size:  # the loop zipfile runs, keeping nothing
        if len(buffer) - at < _CENTRAL_RECORD:
            more = f.read(min(CHUNK, unread)) if unread > 0 else b""
            if len(buffer) - at + len(more) < _CENTRAL_RECORD:
                raise ArchiveRefused("not a valid zip archive (truncated central directory)")
            unread -= len(more)
            buffer, at = buffer[at:] + more, 0
        record = buffer[at : at + _CENTRAL_RECORD]
        if record[:4] != _CENTRAL_SIGNATURE:
            raise ArchiveRefused("not a valid zip archive (bad central directory record)")
        name, extra, comment = struct.unpack("<HHH", record[28:34])
        length = _CENTRAL_RECORD + name + extra + comment
        count += 1
        if count > max_files:
            break
        done += length
        if at + length <= len(buffer):
            at += length
        else:  # the record's variable part runs past what was read: skip it
            skip = at + length - len(buffer)
            f.seek(skip, 1)
            unread -= skip
            buffer, at = b"", 0
    return count


def extract_zip(path: Path, writer: TreeWriter) -> None:
    try:
        with path.open("rb") as raw:
            count = zip_entry_count(raw, writer.limits.max_files)
            if count > writer.limits.max_files:
                raise ArchiveRefused(
                    f"the archive lists more than {writer.limits.max_files} entries, the cap "
                    "(files, folders and links)"
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
