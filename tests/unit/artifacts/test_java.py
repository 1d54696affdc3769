"""Java JARs: manifest parsing, listing and verification rules, reference airflow-langsdk.md §4."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from taskhandler_devenv.packers import (
    ZipEntry,
    build_zip,
    fold_manifest_line,
    render_manifest,
    write_jar,
)
from taskhandler_operator.artifacts import java
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile
from taskhandler_operator.artifacts.verify import ArtifactVerificationError, verify_artifact
from taskhandler_operator.limits import JAVA_MAX_MANIFEST_BYTES
from tests.unit.artifacts.helpers import flip, read_with

DIGEST = "0123456789abcdef" * 4
HANDLER = {
    "Main-Class": "org.example.Handlers",
    "Airflow-Cache-Digest": DIGEST,
    "Airflow-Supervisor-Schema-Version": "2026-10-30",
}


def _handler_jar(root: Path, name: str = "handlers.jar", **overrides: str) -> Path:
    manifest = {**HANDLER, **overrides}
    return write_jar(
        root / name,
        manifest=manifest,
        entries={"org/example/Handlers.class": b"\xca\xfe\xba\xbe" * 50},
    )


# -- manifest parsing ----------------------------------------------------------------------


def test_main_section_parsing_rules() -> None:
    raw = (
        b"Manifest-Version: 1.0\r\n"
        b"Main-Class: a.b.\r\n"
        b" C\r\n"  # continuation: one leading space removed
        b"Created-By:  two spaces\n"  # only one space after the colon is stripped
        b"X-Empty:\r"
        b"  No-Colon-Continuation\n"
        b"broken line without colon\n"
        b"\r\n"
        b"Name: per/entry/Section.class\r\n"
        b"Main-Class: not.the.Main\r\n"
    )
    attributes = java.parse_main_section(raw)
    assert attributes["main-class"] == "a.b.C"
    assert attributes["created-by"] == " two spaces"
    assert attributes["x-empty"] == "No-Colon-Continuation"  # unfolded, then one space removed
    assert "name" not in attributes  # after the first empty line: per-entry sections


def test_folding_splits_utf8_and_unfolds_before_decoding() -> None:
    value = "é" * 60  # 120 bytes: the 72-byte fold falls inside a two-byte character
    folded = fold_manifest_line(f"X-Texts: {value}".encode())  # odd-length prefix
    first = folded.split(b"\r\n")[0]
    assert len(first) == 72
    with pytest.raises(UnicodeDecodeError):
        first.decode()
    assert java.parse_main_section(folded)["x-texts"] == value


def test_every_folded_line_is_at_most_72_bytes() -> None:
    text = render_manifest({"Class-Path": " ".join(f"lib/dependency-{i}.jar" for i in range(50))})
    assert all(len(line) <= 72 for line in text.split(b"\r\n"))
    assert java.parse_main_section(text)["class-path"].startswith("lib/dependency-0.jar lib/")


def test_names_are_case_insensitive_and_last_wins() -> None:
    attributes = java.parse_main_section(b"MAIN-CLASS: a\r\nmain-class: b\r\n")
    assert attributes == {"main-class": "b"}


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    assert java.parse_main_section(b"Main-Class: a\xff\r\n")["main-class"] == "a\ufffd"


# -- listing -------------------------------------------------------------------------------


def test_handler_jar_is_a_candidate(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    assert read_with(java.read_candidate, path, "lib/handlers.jar") == Candidate(
        "lib/handlers.jar", path.stat().st_size, DIGEST
    )


def test_dependency_with_main_class_but_no_digest_is_skipped(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "spark-core.jar", manifest={"Main-Class": "org.apache.spark.Main"})
    assert read_with(java.read_candidate, path) is None


def test_digest_without_main_class_is_listed_with_the_reference_error(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "h.jar", manifest={"Airflow-Cache-Digest": DIGEST})
    candidate = read_with(java.read_candidate, path, "lib/h.jar")
    assert candidate == Candidate(
        "lib/h.jar",
        path.stat().st_size,
        DIGEST,
        "lib/h.jar has an Airflow-Cache-Digest manifest attribute but no Main-Class",
    )


def test_digest_longer_than_128_becomes_none(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path, **{"Airflow-Cache-Digest": "f" * 129})
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.cache_digest is None and candidate.error is None


def test_empty_digest_is_a_candidate_without_digest(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path, **{"Airflow-Cache-Digest": ""})
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.cache_digest is None


def test_non_jar_name_is_skipped(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path, "handlers.zip")
    assert read_with(java.read_candidate, path) is None


def test_stored_manifest_is_read(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "h.jar", manifest=HANDLER, compression=zipfile.ZIP_STORED)
    assert read_with(java.read_candidate, path) is not None


def test_manifest_found_after_many_entries(tmp_path: Path) -> None:
    path = tmp_path / "late.jar"
    with zipfile.ZipFile(path, "w") as jar:
        for i in range(3000):
            jar.writestr(f"pkg/C{i}.class", b"x")
        jar.writestr("META-INF/MANIFEST.MF", render_manifest(HANDLER))
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.cache_digest == DIGEST


def test_manifest_near_the_front_costs_few_bytes(tmp_path: Path) -> None:
    path = tmp_path / "big.jar"
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", render_manifest(HANDLER))
        for i in range(20_000):
            jar.writestr(f"pkg/C{i}.class", b"x")
    with OpenFile.open(path) as f:
        assert java.read_candidate(f, "big.jar") is not None
        assert f.bytes_read < 4096 < path.stat().st_size // 100


def test_archive_comment_and_prepended_launcher_are_tolerated(tmp_path: Path) -> None:
    inner = _handler_jar(tmp_path / "src")
    with zipfile.ZipFile(inner, "a") as jar:
        jar.comment = b"built by a test" * 10
    path = tmp_path / "launcher.jar"
    path.write_bytes(b"#!/bin/sh\nexec java -jar $0\n" + inner.read_bytes())
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.cache_digest == DIGEST


def _to_zip64(path: Path) -> None:
    """Rewrite the end records as zip64 (EOCD fields 0xFFFF..., a zip64 record and locator)."""
    data = path.read_bytes()
    eocd_at = data.rindex(b"PK\x05\x06")
    _sig, _disk, _cd_disk, n_disk, n_total, cd_size, cd_offset, _clen = struct.unpack(
        "<4sHHHHIIH", data[eocd_at : eocd_at + 22]
    )
    record64 = struct.pack(
        "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n_disk, n_total, cd_size, cd_offset
    )
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd_at, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    path.write_bytes(data[:eocd_at] + record64 + locator + eocd)


def test_zip64_end_records_are_read(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    _to_zip64(path)
    with zipfile.ZipFile(path) as check:  # the rewrite is a valid zip64 archive
        assert "META-INF/MANIFEST.MF" in check.namelist()
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.cache_digest == DIGEST


def _patch_central_manifest(path: Path, offset_in_header: int, value: bytes) -> None:
    """Overwrite a field of the manifest's central-directory header."""
    data = bytearray(path.read_bytes())
    name_at = data.rindex(b"META-INF/MANIFEST.MF")
    header = name_at - 46
    assert data[header : header + 4] == b"PK\x01\x02"
    data[header + offset_in_header : header + offset_in_header + len(value)] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ((8, struct.pack("<H", 0x1)), "the manifest entry is encrypted"),
        ((10, struct.pack("<H", 14)), "the manifest uses unsupported compression method 14"),
        ((16, struct.pack("<I", 0)), "the manifest's CRC-32 does not match the central directory"),
        (
            (24, struct.pack("<I", 64 << 20)),
            "the manifest declares 67108864 bytes, more than the 4194304-byte limit",
        ),
    ],
)
def test_unreadable_manifests_are_skipped_with_a_reason(
    tmp_path: Path, patch: tuple[int, bytes], reason: str
) -> None:
    path = _handler_jar(tmp_path)
    _patch_central_manifest(path, *patch)
    assert read_with(java.read_candidate, path) is None
    with OpenFile.open(path) as f, pytest.raises(java.ZipFormatError, match=f"^{reason}$"):
        java.read_manifest(f)


def test_corrupt_deflate_data_is_skipped(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    data = bytearray(path.read_bytes())
    start = data.index(b"META-INF/MANIFEST.MF") + len(b"META-INF/MANIFEST.MF")
    for i in range(start, start + 8):
        data[i] = 0xFF
    path.write_bytes(bytes(data))
    assert read_with(java.read_candidate, path) is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "too small to be a zip archive"),
        (b"not a zip file at all, just text " * 3, "no end-of-central-directory record"),
    ],
)
def test_non_zip_files_are_skipped(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "fake.jar"
    path.write_bytes(content)
    assert read_with(java.read_candidate, path) is None
    with OpenFile.open(path) as f, pytest.raises(java.ZipFormatError, match=f"^{reason}$"):
        java.read_manifest(f)


def test_jar_without_manifest_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "plain.jar"
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("a.class", b"x")
    assert read_with(java.read_candidate, path) is None
    with (
        OpenFile.open(path) as f,
        pytest.raises(java.ZipFormatError, match=r"^no META-INF/MANIFEST\.MF entry$"),
    ):
        java.read_manifest(f)


def test_bzip2_manifest_is_skipped(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "b.jar", manifest=HANDLER, compression=zipfile.ZIP_BZIP2)
    assert read_with(java.read_candidate, path) is None


# -- verification --------------------------------------------------------------------------


def test_fat_jar_verifies_with_its_own_schema_version(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    write_jar(tmp_path / "lib" / "dep.jar", manifest={"Main-Class": "other.Main"})
    verified = verify_artifact(path, Language.JAVA)
    assert verified.main_class == "org.example.Handlers"
    assert verified.schema_version == "2026-10-30"
    assert verified.cache_digest == DIGEST
    assert verified.classpath == (tmp_path / "handlers.jar", tmp_path / "lib" / "dep.jar")


def test_thin_jar_takes_the_schema_version_from_the_first_sdk_jar(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "app" / "handlers.jar", manifest=thin)
    write_jar(
        tmp_path / "lib" / "airflow-sdk-1.0.jar",
        manifest={"Airflow-Supervisor-Schema-Version": "2026-09-30"},
    )
    write_jar(
        tmp_path / "lib" / "airflow-sdk-2.0.jar",
        manifest={"Airflow-Supervisor-Schema-Version": "2026-10-30"},
    )
    write_jar(tmp_path / "lib" / "aaa-plain.jar", manifest={})
    verified = verify_artifact(path, Language.JAVA, bundle_root=tmp_path)
    assert verified.schema_version == "2026-09-30"
    assert [p.relative_to(tmp_path).as_posix() for p in verified.classpath] == [
        "app/handlers.jar",
        "lib/aaa-plain.jar",
        "lib/airflow-sdk-1.0.jar",
        "lib/airflow-sdk-2.0.jar",
    ]


def _verify_error(path: Path, root: Path | None = None) -> str:
    with pytest.raises(ArtifactVerificationError) as info:
        verify_artifact(path, Language.JAVA, bundle_root=root or path.parent)
    return str(info.value)


def test_no_schema_version_anywhere_fails(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "handlers.jar", manifest=thin)
    write_jar(tmp_path / "dep.jar", manifest={})
    assert _verify_error(path) == (
        "handlers.jar: no Airflow-Supervisor-Schema-Version: neither its manifest nor any other "
        "JAR of the bundle (the airflow-sdk JAR a thin JAR relies on) declares one"
    )


def test_invalid_schema_version_names_the_jar_holding_it(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "handlers.jar", manifest=thin)
    write_jar(tmp_path / "sdk.jar", manifest={"Airflow-Supervisor-Schema-Version": "latest"})
    assert _verify_error(path) == (
        "sdk.jar: Airflow-Supervisor-Schema-Version: supervisor schema version 'latest' is not "
        "a YYYY-MM-DD date"
    )


def test_same_main_class_in_another_jar_fails(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    write_jar(
        tmp_path / "copy" / "old-handlers.jar", manifest={"Main-Class": "org.example.Handlers"}
    )
    assert _verify_error(path) == (
        "handlers.jar: 'copy/old-handlers.jar' declares the same Main-Class "
        "org.example.Handlers; the JVM would run whichever comes first on the classpath"
    )


def test_missing_main_class_fails(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "h.jar", manifest={"Airflow-Cache-Digest": DIGEST})
    assert (
        _verify_error(path)
        == "h.jar: has no Main-Class manifest attribute, so the JVM has nothing to run"
    )


def test_unreadable_manifest_fails_with_the_reason(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    _patch_central_manifest(path, 8, struct.pack("<H", 0x1))
    assert (
        _verify_error(path)
        == "handlers.jar: cannot read its manifest: the manifest entry is encrypted"
    )


def test_flipped_byte_in_an_entry_names_the_entry(tmp_path: Path) -> None:
    path = write_jar(
        tmp_path / "handlers.jar",
        manifest=HANDLER,
        entries={"org/example/Handlers.class": bytes(range(256)) * 8},
        compression=zipfile.ZIP_STORED,
    )
    data = path.read_bytes()
    flip(path, data.index(bytes(range(256))) + 100)
    assert _verify_error(path).startswith(
        "handlers.jar: entry 'org/example/Handlers.class' is corrupt: Bad CRC-32"
    )


def test_flipped_byte_in_the_manifest_fails(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "handlers.jar", manifest=HANDLER, compression=zipfile.ZIP_STORED)
    flip(path, path.read_bytes().index(b"org.example.Handlers"))
    assert _verify_error(path) == (
        "handlers.jar: cannot read its manifest: the manifest's CRC-32 does not match the "
        "central directory"
    )


def test_declared_uncompressed_total_is_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(java, "JAVA_MAX_UNCOMPRESSED_BYTES", 1000)
    path = write_jar(tmp_path / "handlers.jar", manifest=HANDLER, entries={"big.bin": bytes(2000)})
    assert _verify_error(path).startswith("handlers.jar: entries declare ")
    assert _verify_error(path).endswith("uncompressed bytes, more than the 1000-byte limit")


def test_name_must_end_with_jar(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path, "handlers.zip")
    assert _verify_error(path) == (
        "handlers.zip: a Java artifact's name must end with .jar, or it is not on the classpath"
    )


def test_artifact_outside_the_bundle_root_fails(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path / "elsewhere")
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "link.jar").symlink_to(path)
    message = _verify_error(root / "link.jar", root)
    assert message.startswith(f"{root / 'link.jar'}: resolves to {path}, outside the bundle root")


def _patch_eocd(path: Path, offset_in_record: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.rindex(b"PK\x05\x06")
    data[at + offset_in_record : at + offset_in_record + len(value)] = value
    path.write_bytes(bytes(data))


def _manifest_error(path: Path) -> str:
    with OpenFile.open(path) as f, pytest.raises(java.ZipFormatError) as info:
        java.read_manifest(f)
    assert read_with(java.read_candidate, path) is None  # every one of these is a skip
    return str(info.value)


def test_central_directory_outside_the_file(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    _patch_eocd(path, 16, struct.pack("<I", 10**8))  # cd_offset
    assert _manifest_error(path) == "central directory lies outside the file"


def test_zip64_record_missing(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    _to_zip64(path)
    data = bytearray(path.read_bytes())
    at = data.rindex(b"PK\x06\x06")
    data[at] = ord("X")
    path.write_bytes(bytes(data))
    assert _manifest_error(path) == "zip64 end-of-central-directory record is missing"


def test_malformed_central_directory_entry(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    data = bytearray(path.read_bytes())
    first = data.index(b"PK\x01\x02")
    data[first + 3] = 0x09
    path.write_bytes(bytes(data))
    assert _manifest_error(path) == "central directory entry is malformed"


def test_truncated_central_directory(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    data = bytearray(path.read_bytes())
    first = data.index(b"PK\x01\x02")
    data[first + 28 : first + 30] = struct.pack("<H", 0xFFFF)  # name length past the end
    path.write_bytes(bytes(data))
    assert _manifest_error(path) == "central directory is truncated"


@pytest.mark.parametrize(
    ("offset_in_header", "value", "reason"),
    [
        (42, struct.pack("<I", 1), "the manifest's local header is missing"),
        (20, struct.pack("<I", 100_000), "the manifest entry is truncated"),
        (24, struct.pack("<I", 7), "the manifest's size does not match the central directory"),
    ],
)
def test_manifest_entry_inconsistencies(
    tmp_path: Path, offset_in_header: int, value: bytes, reason: str
) -> None:
    path = _handler_jar(tmp_path)
    _patch_central_manifest(path, offset_in_header, value)
    assert _manifest_error(path) == reason


def test_corrupt_deflate_reason(tmp_path: Path) -> None:
    path = _handler_jar(tmp_path)
    data = bytearray(path.read_bytes())
    start = data.index(b"META-INF/MANIFEST.MF") + len(b"META-INF/MANIFEST.MF")
    data[start] = 0xFF  # BTYPE 11: a reserved block type
    path.write_bytes(bytes(data))
    assert _manifest_error(path).startswith("the manifest does not inflate (Error -3 ")


def test_an_unreadable_dependency_gives_a_reason_never_an_exception(tmp_path: Path) -> None:
    assert java._manifest_or_reason(tmp_path / "gone.jar") == (
        None,
        "cannot be read (No such file or directory)",
    )
    (tmp_path / "x.jar").write_bytes(b"not a zip")
    assert java._manifest_or_reason(tmp_path / "x.jar") == (
        None,
        "too small to be a zip archive",
    )


# -- zip structure, field by field (found by mutation testing) -----------------------------

MANIFEST = render_manifest(HANDLER)
MF = b"META-INF/MANIFEST.MF"


def _jar_bytes(tmp_path: Path, data: bytes, name: str = "x.jar") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _listed(path: Path) -> Candidate | None:
    return read_with(java.read_candidate, path)


@pytest.mark.parametrize(
    "archive",
    [
        pytest.param(build_zip([ZipEntry(MF, MANIFEST)]), id="plain"),
        pytest.param(build_zip([ZipEntry(MF, MANIFEST, method=8)]), id="deflated"),
        pytest.param(
            build_zip([ZipEntry(MF, MANIFEST)], comment=b"a comment"), id="archive-comment"
        ),
        pytest.param(
            # A comment that holds an end-record signature of its own: the real record is
            # the one whose comment length reaches the end of the file.
            build_zip([ZipEntry(MF, MANIFEST)], comment=b"PK\x05\x06" + b"\0" * 30),
            id="comment-with-a-fake-end-record",
        ),
        pytest.param(
            build_zip([ZipEntry(MF, MANIFEST)], comment=b"c" * 0xFFFF), id="longest-comment"
        ),
        pytest.param(
            build_zip([ZipEntry(MF, MANIFEST)], prepend=b"#!/bin/sh\nexec java -jar $0\n"),
            id="launcher-script-prepended",
        ),
        pytest.param(
            build_zip(
                [
                    ZipEntry(
                        f"d{i}/".encode(), comment=b"note", extra_before=b"\x55\x54\x01\x00\x00"
                    )
                    for i in range(3000)
                ]
                + [ZipEntry(MF, MANIFEST)]
            ),
            id="manifest-after-3000-entries-with-extras-and-comments",
        ),
        *[
            pytest.param(
                build_zip([ZipEntry(MF, MANIFEST)], zip64_eocd=fields),
                id=f"zip64-end-{'+'.join(fields)}",
            )
            for fields in [("entries",), ("size",), ("offset",), ("entries", "size", "offset")]
        ],
        *[
            pytest.param(
                build_zip(
                    [
                        ZipEntry(b"a", b"x"),
                        ZipEntry(MF, MANIFEST, zip64=fields, extra_before=before),
                    ]
                ),
                id=f"zip64-entry-{'+'.join(fields)}{'-after-another-extra' if before else ''}",
            )
            for fields in [
                ("offset",),
                ("size", "csize"),
                ("size", "csize", "offset"),
                ("csize", "offset"),
            ]
            for before in (b"", b"\x55\x54\x05\x00\x01\x02\x03\x04\x05")
        ],
    ],
)
def test_handler_manifest_is_found_in_every_valid_zip_shape(archive: bytes, tmp_path: Path) -> None:
    path = _jar_bytes(tmp_path, archive)
    assert _listed(path) == Candidate("x.jar", len(archive), DIGEST)
    with OpenFile.open(path) as f:
        assert java.read_manifest_bytes(f) == MANIFEST


def test_an_empty_zip_has_no_manifest(tmp_path: Path) -> None:
    path = _jar_bytes(tmp_path, build_zip([]))
    assert path.stat().st_size == 22
    with OpenFile.open(path) as f, pytest.raises(java.ZipFormatError) as info:
        java.read_manifest_bytes(f)
    assert str(info.value) == "no META-INF/MANIFEST.MF entry"


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        (
            build_zip([ZipEntry(MF, MANIFEST)])[:-22] + b"PK\x05\x06" + bytes(18)[:-1],
            "no end-of-central-directory record",
        ),
        (
            # The end record claims one byte more of central directory than there is.
            build_zip([ZipEntry(MF, MANIFEST)])[:-10]
            + (len(b"") + 46 + len(MF) + 1).to_bytes(4, "little")
            + (len(MANIFEST) + 30 + len(MF)).to_bytes(4, "little")
            + b"\0\0",
            "central directory lies outside the file",
        ),
        (
            build_zip([ZipEntry(MF, MANIFEST, declared_size=JAVA_MAX_MANIFEST_BYTES + 1)]),
            f"the manifest declares {JAVA_MAX_MANIFEST_BYTES + 1} bytes, more than the "
            f"{JAVA_MAX_MANIFEST_BYTES}-byte limit",
        ),
        (
            build_zip([ZipEntry(MF, MANIFEST, declared_size=JAVA_MAX_MANIFEST_BYTES)]),
            "the manifest's size does not match the central directory",
        ),
        (
            build_zip([ZipEntry(MF, MANIFEST, declared_csize=JAVA_MAX_MANIFEST_BYTES + 1025)]),
            f"the manifest declares {len(MANIFEST)} bytes, more than the "
            f"{JAVA_MAX_MANIFEST_BYTES}-byte limit",
        ),
        (
            build_zip([ZipEntry(MF, MANIFEST, declared_csize=JAVA_MAX_MANIFEST_BYTES + 1024)]),
            "the manifest entry is truncated",
        ),
    ],
)
def test_zip_structure_errors_in_full(archive: bytes, message: str, tmp_path: Path) -> None:
    with (
        OpenFile.open(_jar_bytes(tmp_path, archive)) as f,
        pytest.raises(java.ZipFormatError) as info,
    ):
        java.read_manifest_bytes(f)
    assert str(info.value) == message


def test_a_truncated_central_directory_is_named(tmp_path: Path) -> None:
    archive = build_zip([ZipEntry(b"a", b"x"), ZipEntry(MF, MANIFEST)])
    # The end record says the directory is 20 bytes shorter than it is: the manifest entry
    # runs past it.
    cd_size_at = len(archive) - 22 + 12
    size = int.from_bytes(archive[cd_size_at : cd_size_at + 4], "little")
    offset = int.from_bytes(archive[cd_size_at + 4 : cd_size_at + 8], "little")
    patched = (
        archive[:cd_size_at]
        + (size - 20).to_bytes(4, "little")
        + (offset + 20).to_bytes(4, "little")
        + archive[cd_size_at + 8 :]
    )
    with (
        OpenFile.open(_jar_bytes(tmp_path, patched)) as f,
        pytest.raises(java.ZipFormatError) as info,
    ):
        java.read_manifest_bytes(f)
    assert str(info.value) in (
        "central directory is truncated",
        "central directory entry is malformed",
    )


def test_a_continuation_line_before_any_header_is_ignored() -> None:
    attributes = java.parse_main_section(b" stray\r\nMain-Class: a.B\r\n")
    assert attributes == {"main-class": "a.B"}


def test_invalid_utf8_in_a_header_name_is_replaced() -> None:
    assert java.parse_main_section(b"Ma\xffin: x\r\n") == {"ma\ufffdin": "x"}


def test_a_class_name_of_exactly_the_limit_is_accepted() -> None:
    name = "a" * 1024
    assert java.is_java_binary_name(name)
    assert not java.is_java_binary_name(name + "b")


def test_an_unreadable_dependency_does_not_stop_the_search_for_the_schema_version(
    tmp_path: Path,
) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "handlers.jar", manifest=thin)
    (tmp_path / "a-broken.jar").write_bytes(b"not a zip at all, but long enough to look")
    write_jar(tmp_path / "sdk.jar", manifest={"Airflow-Supervisor-Schema-Version": "2026-09-30"})
    verified = verify_artifact(path, Language.JAVA, bundle_root=tmp_path)
    assert verified.schema_version == "2026-09-30"
    assert (verified.path, verified.size_bytes) == (path.resolve(), path.stat().st_size)


def test_at_most_three_unreadable_dependencies_are_named(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "handlers.jar", manifest=thin)
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"{name}.jar").write_bytes(b"short")
    assert _verify_error(path) == (
        "handlers.jar: no Airflow-Supervisor-Schema-Version: neither its manifest nor any "
        "other JAR of the bundle (the airflow-sdk JAR a thin JAR relies on) declares one "
        "(dependency 'a.jar' is unreadable: too small to be a zip archive; dependency 'b.jar' "
        "is unreadable: too small to be a zip archive; dependency 'c.jar' is unreadable: too "
        "small to be a zip archive)"
    )


def test_a_bad_schema_version_is_blamed_on_the_jar_that_declares_it(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    path = write_jar(tmp_path / "handlers.jar", manifest=thin)
    write_jar(tmp_path / "sdk.jar", manifest={"Airflow-Supervisor-Schema-Version": "soon"})
    assert _verify_error(path) == (
        "sdk.jar: Airflow-Supervisor-Schema-Version: supervisor schema version 'soon' is not "
        "a YYYY-MM-DD date"
    )


def test_a_central_directory_zipfile_cannot_read_is_named(tmp_path: Path) -> None:
    # Our reader stops at the manifest; zipfile reads on and meets a broken second entry.
    archive = bytearray(build_zip([ZipEntry(MF, MANIFEST), ZipEntry(b"b.class", b"x")]))
    second = archive.rindex(b"PK\x01\x02")
    archive[second : second + 4] = b"PK\x09\x09"
    path = _jar_bytes(tmp_path, bytes(archive))
    assert _verify_error(path).startswith("x.jar: entry '(central directory)' is corrupt: ")


def test_an_encrypted_entry_cannot_be_read(tmp_path: Path) -> None:
    archive = build_zip([ZipEntry(MF, MANIFEST), ZipEntry(b"secret.class", b"x" * 20, flags=1)])
    assert _verify_error(_jar_bytes(tmp_path, archive)) == (
        "x.jar: entry 'secret.class' cannot be read: File <ZipInfo filename='secret.class' "
        "file_size=20> is encrypted, password required for extraction"
    )


def test_declared_uncompressed_total_may_be_exactly_4_gib(tmp_path: Path) -> None:
    # Folders are never read, only counted: two of 2 GiB declared make exactly the limit.
    half = 2**31
    exact = build_zip(
        [
            ZipEntry(MF, MANIFEST),
            ZipEntry(b"d1/", declared_size=half - len(MANIFEST)),
            ZipEntry(b"d2/", declared_size=half),
        ]
    )
    assert (
        verify_artifact(_jar_bytes(tmp_path, exact), Language.JAVA).main_class
        == HANDLER["Main-Class"]
    )
    over = build_zip(
        [
            ZipEntry(MF, MANIFEST),
            ZipEntry(b"d1/", declared_size=half - len(MANIFEST) + 1),
            ZipEntry(b"d2/", declared_size=half),
        ]
    )
    assert _verify_error(_jar_bytes(tmp_path, over, "y.jar")) == (
        "y.jar: entries declare 4294967297 uncompressed bytes, more than the 4294967296-byte limit"
    )


def test_the_classpath_is_ordered_by_bundle_path_not_by_real_path(tmp_path: Path) -> None:
    # "a/link.jar" -> "z/real.jar": the JVM sees it first, although its real path sorts last.
    app = _handler_jar(tmp_path / "m", "app.jar")
    real = write_jar(tmp_path / "z" / "real.jar", manifest={})
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "link.jar").symlink_to(real)
    verified = verify_artifact(app, Language.JAVA, bundle_root=tmp_path)
    assert verified.classpath == (real, app)


def test_an_entry_with_an_empty_name_is_refused(tmp_path: Path) -> None:
    # Found by the property test: zipfile's ZipInfo.is_dir() raised IndexError on it.
    archive = build_zip([ZipEntry(MF, MANIFEST), ZipEntry(b"", b"x")])
    assert _verify_error(_jar_bytes(tmp_path, archive)) == "x.jar: an entry has an empty name"


def test_a_dependency_that_is_not_a_file_gives_the_error_kind(tmp_path: Path) -> None:
    assert java._manifest_or_reason(tmp_path) == (None, "cannot be read (IsADirectoryError)")


def _jar_with_central_directory_of(size: int) -> bytes:
    """A valid handler JAR whose central directory is exactly ``size`` bytes (folders with
    long comments, which nothing reads)."""
    head = [ZipEntry(MF, MANIFEST)]
    base = len(build_zip(head)) - 22 - len(MANIFEST) - 30 - len(MF)  # the manifest's entry
    per_folder = 46 + len(b"d0000/")
    remaining = size - base
    folders = []
    index = 0
    while remaining > 0:
        comment = min(0xFFFF, remaining - per_folder)
        folders.append(ZipEntry(f"d{index:04d}/".encode(), comment=b"\0" * comment))
        remaining -= per_folder + comment
        index += 1
    archive = build_zip(head + folders)
    cd_size = int.from_bytes(archive[-10:-6], "little")
    assert cd_size == size, cd_size
    return archive


def test_the_central_directory_may_be_exactly_32_mib(tmp_path: Path) -> None:
    limit = 32 << 20
    exact = _jar_bytes(tmp_path, _jar_with_central_directory_of(limit))
    assert verify_artifact(exact, Language.JAVA).main_class == HANDLER["Main-Class"]
    over = _jar_bytes(tmp_path, _jar_with_central_directory_of(limit + 1), "y.jar")
    assert _verify_error(over) == (
        f"y.jar: its central directory is {limit + 1} bytes, more than the {limit}-byte limit"
    )
