"""Java JARs: a handler JAR is one whose manifest carries ``Airflow-Cache-Digest``.

The listing must decide about every JAR of a bundle (a Spark bundle has 167, some
with tens of thousands of entries) without reading them, so the manifest is found
here with a bounded scan of the zip central directory that stops at the manifest
entry: a few kilobytes per JAR instead of the whole directory ``zipfile`` parses.
Verification of the one JAR about to run also checks every entry's CRC-32 with
``zipfile``.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskhandler_operator.artifacts.models import (
    JAVA_SUFFIX,
    ArtifactVerificationError,
    Candidate,
    Language,
    OpenFile,
    VerifiedArtifact,
    check_deadline,
    check_schema_version,
    excerpt,
    normalize_cache_digest,
    quote,
)
from taskhandler_operator.limits import (
    JAVA_MAX_CENTRAL_DIRECTORY_BYTES,
    JAVA_MAX_CLASS_NAME,
    JAVA_MAX_MANIFEST_BYTES,
    JAVA_MAX_UNCOMPRESSED_BYTES,
)

SUFFIX = JAVA_SUFFIX
MANIFEST_NAME = b"META-INF/MANIFEST.MF"

MAIN_CLASS = "main-class"
SCHEMA_VERSION = "airflow-supervisor-schema-version"
CACHE_DIGEST = "airflow-cache-digest"

_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD_SIG = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_LOCATOR_SIG = b"PK\x06\x07"
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_EOCD_SIG = b"PK\x06\x06"
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_CENTRAL_SIG = b"PK\x01\x02"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIG = b"PK\x03\x04"
_MAX_COMMENT = 0xFFFF
_STORED, _DEFLATED = 0, 8
# The manifest is nearly always among the first central-directory entries:
# start with a small read and grow it only while still looking.
_FIRST_CD_READ = 1024
_MAX_CD_READ = 64 << 10
_LINE_SPLIT = re.compile(rb"\r\n|\r|\n")
# A Java binary class name (JLS 13.1): identifiers joined by '.', '$' for nested classes. Any
# other Main-Class (one starting with '-', say) would reach the java launcher as an option.
_JAVA_BINARY_NAME = re.compile(r"(?:[^\W\d]|\$)[\w$]*(?:\.(?:[^\W\d]|\$)[\w$]*)*")


def is_java_binary_name(name: str) -> bool:
    return len(name) <= JAVA_MAX_CLASS_NAME and _JAVA_BINARY_NAME.fullmatch(name) is not None


class ZipFormatError(ValueError):
    """The JAR's manifest cannot be read; the message says why."""


def missing_main_class_message(rel_path: str) -> str:
    return f"{rel_path} has an Airflow-Cache-Digest manifest attribute but no Main-Class"


@dataclass(frozen=True, slots=True)
class _Entry:
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    local_offset: int


@dataclass(frozen=True, slots=True)
class _Directory:
    start: int  # absolute file offset of the central directory
    size: int
    prepended: int  # bytes before the archive (a launcher script, say); offsets count after it


def _central_directory(f: OpenFile) -> _Directory:
    size = f.size
    if size < _EOCD.size:
        raise ZipFormatError("too small to be a zip archive")
    tail = f.read_at(size - _EOCD.size, _EOCD.size)
    if tail[:4] == _EOCD_SIG and tail[-2:] == b"\0\0":
        eocd_at, record = size - _EOCD.size, tail
    else:  # an archive comment follows the record: search the last 64 KiB
        window_start = max(0, size - _EOCD.size - _MAX_COMMENT)
        window = f.read_at(window_start, size - window_start)
        pos = window.rfind(_EOCD_SIG)
        while pos >= 0:
            comment_len = int.from_bytes(window[pos + 20 : pos + 22], "little")
            if pos + _EOCD.size + comment_len == len(window):
                break
            pos = window.rfind(_EOCD_SIG, 0, pos)
        if pos < 0:
            raise ZipFormatError("no end-of-central-directory record")
        eocd_at, record = window_start + pos, window[pos : pos + _EOCD.size]
    _sig, _disk, _cd_disk, _n_disk, entries, cd_size, cd_offset, _clen = _EOCD.unpack(record)
    cd_end = eocd_at
    if entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        locator_at = eocd_at - _ZIP64_LOCATOR.size
        locator = f.read_at(locator_at, _ZIP64_LOCATOR.size) if locator_at >= 0 else b""
        if len(locator) == _ZIP64_LOCATOR.size and locator[:4] == _ZIP64_LOCATOR_SIG:
            cd_end = locator_at - _ZIP64_EOCD.size
            record64 = f.read_at(cd_end, _ZIP64_EOCD.size) if cd_end >= 0 else b""
            if len(record64) != _ZIP64_EOCD.size or record64[:4] != _ZIP64_EOCD_SIG:
                raise ZipFormatError("zip64 end-of-central-directory record is missing")
            fields = _ZIP64_EOCD.unpack(record64)
            cd_size, cd_offset = fields[8], fields[9]
    # zip64 sizes and offsets are 64-bit and may claim anything: a directory that does not
    # end where the end records start lies outside the file.
    prepended = cd_end - cd_size - cd_offset
    if prepended < 0:
        raise ZipFormatError("central directory lies outside the file")
    return _Directory(cd_offset + prepended, cd_size, prepended)


def _zip64_values(extra: bytes, size: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Apply a zip64 extra field (id 1), which holds only the fields that overflowed."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            body = extra[pos + 4 : pos + 4 + length]
            values = iter(
                int.from_bytes(body[i : i + 8], "little") for i in range(0, len(body) - 7, 8)
            )
            if size == 0xFFFFFFFF:
                size = next(values, size)
            if csize == 0xFFFFFFFF:
                csize = next(values, csize)
            if offset == 0xFFFFFFFF:
                offset = next(values, offset)
            break
        pos += 4 + length
    return size, csize, offset


class _DirectoryReader:
    """Sequential access to the central directory with reads that grow geometrically."""

    def __init__(self, f: OpenFile, directory: _Directory) -> None:
        self.f = f
        self.end = directory.start + directory.size
        self.buf = b""
        self.buf_at = directory.start  # file offset of buf[0]
        self.chunk = _FIRST_CD_READ

    def take(self, pos: int, length: int) -> bytes:
        """Bytes ``[pos, pos + length)`` of the file; ``pos`` never moves backwards."""
        if pos + length > self.end:
            raise ZipFormatError("central directory is truncated")
        self.buf, self.buf_at = self.buf[pos - self.buf_at :], pos
        while len(self.buf) < length:
            read_from = self.buf_at + len(self.buf)
            want = min(max(self.chunk, length - len(self.buf)), self.end - read_from)
            more = self.f.read_at(read_from, want)
            if not more:
                raise ZipFormatError("central directory is truncated")
            self.buf += more
            self.chunk = min(self.chunk * 2, _MAX_CD_READ)
        return self.buf[:length]


def _find_manifest(f: OpenFile) -> _Entry:
    directory = _central_directory(f)
    reader = _DirectoryReader(f, directory)
    pos = directory.start
    while pos < reader.end:
        header = reader.take(pos, _CENTRAL.size)
        if header[:4] != _CENTRAL_SIG:
            raise ZipFormatError("central directory entry is malformed")
        fields = _CENTRAL.unpack(header)
        flags, method, crc, csize, size = fields[3], fields[4], fields[7], fields[8], fields[9]
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        name = reader.take(pos + _CENTRAL.size, name_len)
        if name.upper() == MANIFEST_NAME:
            extra = reader.take(pos + _CENTRAL.size, name_len + extra_len)[name_len:]
            size, csize, offset = _zip64_values(extra, size, csize, offset)
            return _Entry(flags, method, crc, csize, size, offset + directory.prepended)
        pos += _CENTRAL.size + name_len + extra_len + comment_len
    raise ZipFormatError("no META-INF/MANIFEST.MF entry")


def read_manifest_bytes(f: OpenFile) -> bytes:
    """The manifest entry's content, bounded and CRC-checked; ZipFormatError says why not."""
    entry = _find_manifest(f)
    if entry.flags & 0x1:
        raise ZipFormatError("the manifest entry is encrypted")
    if entry.method not in (_STORED, _DEFLATED):
        raise ZipFormatError(f"the manifest uses unsupported compression method {entry.method}")
    # Cap by the declared sizes before inflating anything (zip bombs).
    if (
        entry.size > JAVA_MAX_MANIFEST_BYTES
        or entry.compressed_size > JAVA_MAX_MANIFEST_BYTES + 1024
    ):
        raise ZipFormatError(
            f"the manifest declares {entry.size} bytes, more than the "
            f"{JAVA_MAX_MANIFEST_BYTES}-byte limit"
        )
    if not 0 <= entry.local_offset <= f.size - _LOCAL.size:
        raise ZipFormatError("the manifest's local header lies outside the file")
    local = f.read_at(entry.local_offset, _LOCAL.size)
    if len(local) != _LOCAL.size or local[:4] != _LOCAL_SIG:
        raise ZipFormatError("the manifest's local header is missing")
    name_len, extra_len = _LOCAL.unpack(local)[9:11]
    data_at = entry.local_offset + _LOCAL.size + name_len + extra_len
    if data_at + entry.compressed_size > f.size:
        raise ZipFormatError("the manifest entry is truncated")
    data = f.read_at(data_at, entry.compressed_size)
    if len(data) != entry.compressed_size:
        raise ZipFormatError("the manifest entry is truncated")
    if entry.method == _STORED:
        content = data
    else:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            # Never produce more than the cap, whatever the entry claims (zip bombs).
            content = inflater.decompress(data, JAVA_MAX_MANIFEST_BYTES + 1)
        except zlib.error as exc:
            raise ZipFormatError(f"the manifest does not inflate ({exc})") from None
        if not inflater.eof:
            raise ZipFormatError("the manifest's deflate stream is truncated or oversized")
    if len(content) != entry.size:
        raise ZipFormatError("the manifest's size does not match the central directory")
    if zlib.crc32(content) != entry.crc:
        raise ZipFormatError("the manifest's CRC-32 does not match the central directory")
    return content


def parse_main_section(raw: bytes) -> dict[str, str]:
    """Main-section attributes, names lower-cased (reference §4.1).

    Continuation lines are joined as bytes before decoding, because 72-byte folding
    can split a UTF-8 sequence. Decoded as UTF-8 with replacement, as the JVM's own
    manifest reader does.
    """
    logical: list[list[bytes]] = []
    for line in _LINE_SPLIT.split(raw):
        if not line:
            break  # the main section ends at the first empty line
        if line.startswith(b" "):
            if logical:
                logical[-1].append(line[1:])
            continue
        logical.append([line])
    attributes: dict[str, str] = {}
    for parts in logical:
        name, sep, value = b"".join(parts).partition(b":")
        if not sep:
            continue
        if value.startswith(b" "):
            value = value[1:]
        key = name.strip().decode("utf-8", "replace").lower()
        attributes[key] = value.decode("utf-8", "replace")
    return attributes


def read_manifest(f: OpenFile) -> dict[str, str]:
    return parse_main_section(read_manifest_bytes(f))


def _attribute(attributes: dict[str, str], key: str) -> str | None:
    value = attributes.get(key, "").strip()
    return value or None


# -- listing -------------------------------------------------------------------------------


def read_candidate(f: OpenFile, rel_path: str) -> Candidate | None:
    """Listing entry point: a ``.jar`` whose manifest has ``Airflow-Cache-Digest``.

    Dependency JARs may declare Main-Class too, so only the digest marks a handler JAR.
    A JAR whose manifest cannot be read is skipped like any unrelated file.
    """
    if not rel_path.endswith(SUFFIX):
        return None
    try:
        attributes = read_manifest(f)
    except ZipFormatError:
        return None
    if CACHE_DIGEST not in attributes:
        return None
    digest = normalize_cache_digest(_attribute(attributes, CACHE_DIGEST))
    if _attribute(attributes, MAIN_CLASS) is None:
        return Candidate(rel_path, f.size, digest, missing_main_class_message(rel_path))
    return Candidate(rel_path, f.size, digest)


# -- verification --------------------------------------------------------------------------


def verify_file(path: Path, name: str, classpath: Sequence[tuple[str, Path]]) -> VerifiedArtifact:
    """Verify the JAR at ``path`` against the rest of its bundle.

    ``classpath`` is every ``*.jar`` of the bundle as (relative path, absolute path) in
    sorted order, the artifact included; the JVM would see exactly these.
    """

    def fail(reason: str) -> ArtifactVerificationError:
        return ArtifactVerificationError(f"{name}: {reason}")

    if not path.name.endswith(SUFFIX):
        raise fail(f"a Java artifact's name must end with {SUFFIX}, or it is not on the classpath")
    for rel, jar in classpath:
        # The launcher joins the classpath with ':'; 'x:y.jar' would become two entries, one
        # of them resolved from the working directory.
        if os.pathsep in jar.as_posix():
            raise fail(
                f"bundle JAR {quote(rel)} cannot be put on a classpath: its path contains "
                f"{os.pathsep!r}; rename it"
            )
    try:
        with OpenFile.open(path) as f:
            try:
                attributes = read_manifest(f)
            except ZipFormatError as exc:
                raise fail(f"cannot read its manifest: {exc}") from None
            _check_entries(f, fail)
            if not f.unchanged_since_open():
                raise fail("file changed while it was being verified")
            size = f.size
            identity = (f.stat.st_dev, f.stat.st_ino)
    except OSError as exc:
        raise fail(f"cannot be read ({exc})") from None

    if CACHE_DIGEST not in attributes:
        # What Airflow's worker says too: a dependency JAR may well have a Main-Class.
        raise fail(
            "has no Airflow-Cache-Digest manifest attribute, so it is not an artifact the Java "
            "runtime runs (a dependency JAR of the bundle?)"
        )
    main_class = _attribute(attributes, MAIN_CLASS)
    if main_class is None:
        raise fail("has no Main-Class manifest attribute, so the JVM has nothing to run")
    if not is_java_binary_name(main_class):
        raise fail(
            f"Main-Class {quote(main_class)} is not a Java class name (dot-separated "
            "identifiers), so the java launcher would not run it as a class"
        )
    schema_version = _attribute(attributes, SCHEMA_VERSION)
    schema_source = name
    unreadable: list[str] = []
    others = [(rel, p) for rel, p in classpath if _identity(p) != identity]
    for rel, other in others:
        other_attributes, reason = _manifest_or_reason(other)
        if other_attributes is None:
            # Only this JAR's own problem; it matters here only if its manifest was needed.
            unreadable.append(f"dependency {quote(rel)} is unreadable: {reason}")
            continue
        if _attribute(other_attributes, MAIN_CLASS) == main_class:
            raise fail(
                f"{quote(rel)} declares the same Main-Class {main_class}; the JVM would run "
                "whichever comes first on the classpath"
            )
        if schema_version is None:
            schema_version = _attribute(other_attributes, SCHEMA_VERSION)
            schema_source = rel
    if schema_version is None:
        also = f" ({'; '.join(unreadable[:3])})" if unreadable else ""
        raise fail(
            "no Airflow-Supervisor-Schema-Version: neither its manifest nor any other JAR "
            f"of the bundle (the airflow-sdk JAR a thin JAR relies on) declares one{also}"
        )
    try:
        check_schema_version(schema_version)
    except ValueError as exc:
        raise ArtifactVerificationError(
            f"{schema_source}: Airflow-Supervisor-Schema-Version: {exc}"
        ) from None
    return VerifiedArtifact(
        path=path,
        language=Language.JAVA,
        schema_version=schema_version,
        size_bytes=size,
        cache_digest=normalize_cache_digest(_attribute(attributes, CACHE_DIGEST)),
        main_class=main_class,
        classpath=tuple(p for _rel, p in classpath),
    )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _manifest_or_reason(path: Path) -> tuple[dict[str, str] | None, str]:
    """Another bundle JAR's manifest, or why it cannot be read (never an exception)."""
    try:
        with OpenFile.open(path) as f:
            return read_manifest(f), ""
    except ZipFormatError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or type(exc).__name__})"


def _check_entries(f: OpenFile, fail: Callable[[str], ArtifactVerificationError]) -> None:
    """Inflate every entry and let zipfile compare its CRC-32 (what the JVM checks on load)."""
    current = "(central directory)"
    try:
        directory = _central_directory(f)
    except ZipFormatError as exc:
        raise fail(f"cannot read its central directory: {exc}") from None
    if directory.size > JAVA_MAX_CENTRAL_DIRECTORY_BYTES:
        raise fail(
            f"its central directory is {directory.size} bytes, more than the "
            f"{JAVA_MAX_CENTRAL_DIRECTORY_BYTES}-byte limit"
        )
    try:
        with os.fdopen(os.dup(f.fd), "rb") as handle, zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            declared = sum(info.file_size for info in infos)
            if declared > JAVA_MAX_UNCOMPRESSED_BYTES:
                raise fail(
                    f"entries declare {declared} uncompressed bytes, more than the "
                    f"{JAVA_MAX_UNCOMPRESSED_BYTES}-byte limit"
                )
            for info in infos:
                current = info.filename
                if not current:
                    # zipfile's own is_dir() fails on it (IndexError).
                    raise fail("an entry has an empty name")
                if info.is_dir():
                    continue
                with archive.open(info) as member:
                    while member.read(1 << 20):
                        check_deadline()
    except ArtifactVerificationError:
        raise
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        ValueError,
        NotImplementedError,
        # What zipfile lets escape on hostile zip64 values (seek past 2^63, short structs).
        OverflowError,
        OSError,
        struct.error,
        IndexError,
    ) as exc:
        raise fail(f"entry {quote(current)} is corrupt: {excerpt(str(exc))}") from None
    except RuntimeError as exc:  # zipfile's "encrypted, password required"
        raise fail(f"entry {quote(current)} cannot be read: {excerpt(str(exc))}") from None
