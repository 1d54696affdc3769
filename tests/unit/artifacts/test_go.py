"""Go AFBNDL01 bundles: listing and verification rules, reference airflow-langsdk.md §2."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from taskhandler_devenv.packers import (
    GO_TRAILER,
    go_cache_digest,
    pack_go_bundle,
    write_go_bundle,
)
from taskhandler_operator.artifacts import go
from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.artifacts.verify import ArtifactVerificationError, verify_artifact
from taskhandler_operator.limits import GO_MAX_METADATA_BYTES
from tests.unit.artifacts.helpers import flip, read_with

BINARY = b"\x7fELF" + bytes(range(19))  # 23 bytes, like the reference's worked example


def test_trailer_layout_matches_the_reference_worked_example(tmp_path: Path) -> None:
    # Reference §2.2: 23-byte binary, 29-byte source, 39-byte metadata -> 155 bytes.
    source, metadata = b"s" * 29, b"m" * 39
    trailer = GO_TRAILER.pack(29, 39, 1, hashlib.sha256(BINARY).digest(), bytes(12), b"AFBNDL01")
    data = BINARY + source + metadata + trailer
    assert len(data) == 155
    assert trailer.hex().startswith("1d000000" + "27000000" + "01000000")
    parsed = go.Trailer.parse(data[-64:])
    assert parsed is not None
    assert parsed.source_start(len(data)) == 23
    assert parsed.metadata_start(len(data)) == 52


def test_packed_bundle_is_a_candidate_with_its_stored_digest(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, sources={"main.go": b"package main\n"})
    candidate = read_with(go.read_candidate, path, "bin/etl")
    metadata = go.parse_metadata(
        path.read_bytes()[-64 - GO_TRAILER.unpack(path.read_bytes()[-64:])[1] : -64]
    )
    assert candidate == Candidate("bin/etl", path.stat().st_size, metadata["digests"]["cache"])


def test_cache_digest_is_computed_as_airflow_go_pack_does() -> None:
    # §2.6: label || sha(binary) || sha(source) || sha(manifest without digests).
    digest = go_cache_digest(hashlib.sha256(b"b").digest(), b"src", b"manifest")
    expected = hashlib.sha256(
        b"airflow-go-pack cache digest v1\x00"
        + hashlib.sha256(b"b").digest()
        + hashlib.sha256(b"src").digest()
        + hashlib.sha256(b"manifest").digest()
    ).hexdigest()
    assert digest == expected


def test_listing_never_hashes_the_binary(tmp_path: Path) -> None:
    # A wrong binary hash is an integrity problem, not a listing one: still a candidate.
    path = write_go_bundle(tmp_path / "etl", BINARY, cache_digest="d" * 64)
    flip(path, 0)
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None and candidate.error is None and candidate.cache_digest == "d" * 64


def test_file_without_the_magic_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_bytes(b"#!/bin/sh\n" * 20)
    assert read_with(go.read_candidate, path) is None


def test_file_smaller_than_a_trailer_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tiny"
    path.write_bytes(b"AFBNDL01")
    assert read_with(go.read_candidate, path) is None


def test_not_executable_is_listed_with_the_reference_error(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, cache_digest="c" * 64)
    path.chmod(0o644)
    candidate = read_with(go.read_candidate, path, "jobs/etl")
    assert candidate is not None
    assert candidate.error == (
        "jobs/etl is not executable. Use a Dag bundle that keeps the executable bit; "
        "object-store Dag bundles such as S3DagBundle drop it."
    )
    assert candidate.cache_digest == "c" * 64


def test_unsupported_footer_version_is_listed_without_digest(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, footer_version=2)
    candidate = read_with(go.read_candidate, path, "etl")
    assert candidate is not None
    assert candidate.cache_digest is None
    assert candidate.error is not None
    assert candidate.error.startswith("Unsupported bundle footer_ver=2 in etl: ")
    assert "reads footer_ver=1 only" in candidate.error


def test_a_bundle_cut_short_is_listed_with_its_problem(tmp_path: Path) -> None:
    # The middle went missing (a short write, a cut download re-joined to its trailer): the
    # trailer still counts bytes that are not there. Airflow lists it with the trailer's error.
    whole = write_go_bundle(
        tmp_path / "whole", BINARY, cache_digest="c" * 64, sources={"main.go": b"package main\n"}
    ).read_bytes()
    cut = tmp_path / "etl"
    cut.write_bytes(whole[:4] + whole[-80:])
    cut.chmod(0o755)
    candidate = read_with(go.read_candidate, cut, "jobs/etl")
    assert candidate is not None
    assert candidate.cache_digest is None
    assert candidate.error == (
        "jobs/etl: trailer regions (source 13 bytes + metadata "
        f"{len(whole) - len(BINARY) - 13 - 64} bytes) are larger than the file (84 bytes): the "
        "file was cut short or is not a whole bundle; upload it again"
    )
    assert _verify_error(cut).startswith("etl: trailer regions (source 13 bytes")


def test_a_trailer_with_reserved_bytes_set_is_listed_with_its_problem(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, cache_digest="c" * 64)
    flip(path, -15)
    candidate = read_with(go.read_candidate, path, "etl")
    assert candidate is not None and candidate.cache_digest is None
    assert candidate.error == "etl: trailer reserved bytes 44..55 are not zero"


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"cache_digest": None}, "no digests.cache"),
        ({"cache_digest": ""}, "empty digest"),
        ({"cache_digest": "x" * 129}, "longer than the column"),
    ],
)
def test_unusable_stored_digest_becomes_none(
    tmp_path: Path, kwargs: dict[str, object], why: str
) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, **kwargs)
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None, why
    assert candidate.cache_digest is None and candidate.error is None, why


def test_digest_of_exactly_128_characters_is_kept(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, cache_digest="y" * 128)
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None and candidate.cache_digest == "y" * 128


def _bundle_with_metadata(tmp_path: Path, metadata: bytes, name: str = "etl") -> Path:
    trailer = GO_TRAILER.pack(
        0, len(metadata), 1, hashlib.sha256(BINARY).digest(), bytes(12), b"AFBNDL01"
    )
    path = tmp_path / name
    path.write_bytes(BINARY + metadata + trailer)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "metadata",
    [
        b"",
        b"\xff\xfe not utf-8",
        b"key: [unclosed",
        b"- a list\n- not a mapping\n",
        b"digests: 3\n",
    ],
)
def test_undecodable_metadata_lists_a_candidate_without_digest(
    tmp_path: Path, metadata: bytes
) -> None:
    path = _bundle_with_metadata(tmp_path, metadata)
    candidate = read_with(go.read_candidate, path)
    assert candidate == Candidate("etl", path.stat().st_size, None)


def test_regions_larger_than_the_file_list_with_the_trailer_error(tmp_path: Path) -> None:
    # Airflow's listing: a trailer it cannot read lists the file with no digest and the error.
    trailer = GO_TRAILER.pack(10**6, 10, 1, bytes(32), bytes(12), b"AFBNDL01")
    path = tmp_path / "liar"
    path.write_bytes(BINARY + trailer)
    path.chmod(0o755)
    assert read_with(go.read_candidate, path) == Candidate(
        "liar",
        path.stat().st_size,
        None,
        "liar: trailer regions (source 1000000 bytes + metadata 10 bytes) are larger than the "
        f"file ({len(BINARY) + 64} bytes): the file was cut short or is not a whole bundle; "
        "upload it again",
    )


def test_listing_reads_only_trailer_and_metadata(tmp_path: Path) -> None:
    from taskhandler_operator.artifacts.models import OpenFile

    path = write_go_bundle(tmp_path / "big", b"\x7fELF" + bytes(5 << 20))
    with OpenFile.open(path) as f:
        assert go.read_candidate(f, "big") is not None
        metadata_len = struct.unpack("<I", path.read_bytes()[-60:-56])[0]
        assert f.bytes_read == 64 + metadata_len


# -- verification --------------------------------------------------------------------------


def test_packed_bundle_verifies(tmp_path: Path) -> None:
    path = write_go_bundle(
        tmp_path / "etl", BINARY, sources={"main.go": b"package main\n", "x.go": b"x"}
    )
    verified = verify_artifact(path, Language.GO)
    assert verified.schema_version == "2026-10-30"
    assert verified.path == path.resolve()
    assert verified.size_bytes == path.stat().st_size
    assert verified.language is Language.GO
    assert verified.cache_digest is not None and len(verified.cache_digest) == 64


def test_single_source_bundle_verifies(tmp_path: Path) -> None:
    data = pack_go_bundle(BINARY, metadata_extra={"source": "main.go"})
    path = tmp_path / "etl"
    path.write_bytes(data)
    path.chmod(0o755)
    assert verify_artifact(path, Language.GO).schema_version == "2026-10-30"


def _verify_error(path: Path) -> str:
    with pytest.raises(ArtifactVerificationError) as info:
        verify_artifact(path, Language.GO, bundle_root=path.parent)
    return str(info.value)


def test_flipped_binary_byte_names_the_binary_region(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY)
    flip(path, 5)
    assert _verify_error(path).startswith("etl: binary region SHA-256 does not match the trailer")


def test_flipped_source_byte_names_the_source_file(tmp_path: Path) -> None:
    path = write_go_bundle(
        tmp_path / "etl",
        BINARY,
        sources={"main.go": b"package main\n", "util.go": b"package util\n"},
    )
    flip(path, len(BINARY) + len(b"package main\n") + 2)
    assert _verify_error(path).startswith(
        "etl: source region file 'util.go' SHA-256 does not match"
    )


@pytest.mark.parametrize(
    ("offset_from_end", "expected"),
    [
        (-64, "etl: binary region SHA-256 does not match the trailer"),  # source_len
        (-60, "etl: binary region SHA-256 does not match the trailer"),  # metadata_len
        (-40, "etl: binary region SHA-256 does not match the trailer"),  # binary_sha256
        (-56, "Unsupported bundle footer_ver=0 in etl"),  # footer_ver 1 -> 0
        (-15, "etl: trailer reserved bytes 44..55 are not zero"),
        (-1, "etl: not a Go executable bundle (no AFBNDL01 trailer in the last 64 bytes)"),
    ],
)
def test_flipped_trailer_byte_fails_naming_the_rule(
    tmp_path: Path, offset_from_end: int, expected: str
) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, sources={"main.go": b"package main\n"})
    flip(path, offset_from_end)
    assert _verify_error(path).startswith(expected)


def test_metadata_flip_that_breaks_the_schema_version_is_caught(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, schema_version="2026-10-30")
    data = path.read_bytes()
    at = data.rindex(b"2026-10-30") + 5  # the month's first digit: 1 -> 0 gives month 00
    flip(path, at)
    assert (
        _verify_error(path)
        == "etl: supervisor schema version '2026-00-30' is not a YYYY-MM-DD date"
    )


def test_regions_larger_than_file_fail(tmp_path: Path) -> None:
    trailer = GO_TRAILER.pack(10**6, 10, 1, bytes(32), bytes(12), b"AFBNDL01")
    path = tmp_path / "etl"
    path.write_bytes(BINARY + trailer)
    path.chmod(0o755)
    assert _verify_error(path) == (
        f"etl: trailer regions (source 1000000 bytes + metadata 10 bytes) are larger than the "
        f"file ({len(BINARY) + 64} bytes): the file was cut short or is not a whole bundle; "
        "upload it again"
    )


def test_empty_binary_region_fails(tmp_path: Path) -> None:
    metadata = b"sdk: {supervisor_schema_version: '2026-10-30'}\n"
    trailer = GO_TRAILER.pack(
        0, len(metadata), 1, hashlib.sha256(b"").digest(), bytes(12), b"AFBNDL01"
    )
    path = tmp_path / "etl"
    path.write_bytes(metadata + trailer)
    path.chmod(0o755)
    assert _verify_error(path) == "etl: binary region is empty"


def test_not_executable_fails_with_the_reference_text(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY)
    path.chmod(0o600)
    assert _verify_error(path) == (
        "etl is not executable. Use a Dag bundle that keeps the executable bit; "
        "object-store Dag bundles such as S3DagBundle drop it."
    )


def test_oversized_metadata_fails_before_reading_it(tmp_path: Path) -> None:
    metadata_len = GO_MAX_METADATA_BYTES + 1
    trailer = GO_TRAILER.pack(
        0, metadata_len, 1, hashlib.sha256(BINARY).digest(), bytes(12), b"AFBNDL01"
    )
    path = tmp_path / "etl"
    with path.open("wb") as out:
        out.write(BINARY)
        out.truncate(len(BINARY) + metadata_len)  # sparse: nothing to write
        out.seek(0, 2)
        out.write(trailer)
    path.chmod(0o755)
    assert (
        _verify_error(path)
        == f"etl: metadata region is {metadata_len} bytes, more than the 1048576-byte limit"
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (b"\xff", "etl: metadata region is not UTF-8 (invalid start byte at byte 0)"),
        (b"a: [", "etl: metadata region is not valid YAML ("),
        (b"[1, 2]", "etl: metadata region is not a YAML mapping"),
        (b"sdk: {}", "etl: missing or invalid sdk.supervisor_schema_version"),
        (b"sdk: 3", "etl: missing or invalid sdk.supervisor_schema_version"),
        (
            b"sdk: {supervisor_schema_version: 2026-10-30}",
            "etl: missing or invalid sdk.supervisor_schema_version",
        ),
        (
            b"sdk: {supervisor_schema_version: 'soon'}",
            "etl: supervisor schema version 'soon' is not a YYYY-MM-DD date",
        ),
        (
            b"sdk: {supervisor_schema_version: '2026-1-30'}",
            "etl: supervisor schema version '2026-1-30' is not a YYYY-MM-DD date",
        ),
    ],
)
def test_metadata_errors(tmp_path: Path, metadata: bytes, expected: str) -> None:
    assert _verify_error(_bundle_with_metadata(tmp_path, metadata)).startswith(expected)


EMPTY_SHA = hashlib.sha256(b"").hexdigest()
_GOOD_SDK = "sdk: {supervisor_schema_version: '2026-10-30'}\n"


@pytest.mark.parametrize(
    ("sources_yaml", "expected"),
    [
        ("sources: 3\n", "etl: metadata sources is not a list"),
        ("sources: [3]\n", "etl: metadata sources[0] is not a mapping"),
        ("sources: [{path: ''}]\n", "etl: metadata sources[0].path is missing or empty"),
        (
            "sources: [{path: a, offset: -1, length: 0}]\n",
            "etl: metadata sources[0].offset is not a non-negative integer",
        ),
        (
            "sources: [{path: a, offset: 0, length: true}]\n",
            "etl: metadata sources[0].length is not a non-negative integer",
        ),
        (
            "sources: [{path: a, offset: 0, length: 9}]\n",
            "etl: metadata sources[0] ('a') ends at 9, past the 0-byte source region",
        ),
        (
            "sources: [{path: a, offset: 0, length: 0, sha256: XYZ}]\n",
            "etl: metadata sources[0].sha256 is not 64 lowercase hex digits",
        ),
        (
            f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}},"
            f" {{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n",
            "etl: metadata sources[1].path 'a' is listed twice",
        ),
        (
            f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n"
            "entrypoint_path: b\n",
            "etl: metadata entrypoint_path 'b' is not one of the listed sources",
        ),
        (
            f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n"
            "dag_source_paths: {d1: c}\n",
            "etl: metadata dag_source_paths['d1'] 'c' is not one of the listed sources",
        ),
        # YAML gives unhashable values here; they must fail as a clear error, not a TypeError.
        (
            f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n"
            "entrypoint_path: [a]\n",
            "etl: metadata entrypoint_path a list of 1 item(s) is not one of the listed sources",
        ),
        (
            f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n"
            "dag_source_paths: {d1: {x: 1}}\n",
            "etl: metadata dag_source_paths['d1'] a mapping of 1 key(s) is not one of the "
            "listed sources",
        ),
    ],
)
def test_sources_metadata_errors(tmp_path: Path, sources_yaml: str, expected: str) -> None:
    path = _bundle_with_metadata(tmp_path, (_GOOD_SDK + sources_yaml).encode())
    assert _verify_error(path) == expected


def test_sources_repeating_one_range_are_refused_before_hashing_it_again(
    tmp_path: Path,
) -> None:
    # Each entry alone is in range and intact; together they list more bytes than the
    # region holds, which only overlapping files can do (and which would make
    # verification hash the same range once per entry).
    content = b"package main\n" * 100
    entry = {
        "path": "main.go",
        "offset": 0,
        "length": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
    }
    path = write_go_bundle(
        tmp_path / "etl",
        BINARY,
        sources={"main.go": content},
        metadata_extra={"sources": [entry, {**entry, "path": "copy.go"}]},
    )
    assert _verify_error(path) == (
        f"etl: metadata sources list {2 * len(content)} bytes by metadata sources[1], more "
        f"than the {len(content)}-byte source region: the listed files overlap"
    )


def test_verify_names_file_by_given_path_without_bundle_root(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY)
    flip(path, 0)
    with pytest.raises(ArtifactVerificationError, match=r"^/.*/etl: binary region SHA-256"):
        verify_artifact(path, Language.GO)


def test_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(ArtifactVerificationError, match=r"gone: is not a file"):
        verify_artifact(tmp_path / "gone", Language.GO)


@pytest.mark.parametrize("language", list(Language))
def test_a_file_changing_during_verification_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, language: Language
) -> None:
    # Unit test of the final identity check only; a real race cannot be timed reliably.
    from taskhandler_devenv.packers import write_jar, write_typescript_bundle
    from taskhandler_operator.artifacts.models import OpenFile

    if language is Language.GO:
        path = write_go_bundle(tmp_path / "a", BINARY)
    elif language is Language.TYPESCRIPT:
        path = write_typescript_bundle(tmp_path / "a.min.mjs", b"x")
    else:
        path = write_jar(
            tmp_path / "a.jar",
            manifest={"Main-Class": "a.B", "Airflow-Supervisor-Schema-Version": "2026-10-30"},
        )
    monkeypatch.setattr(OpenFile, "unchanged_since_open", lambda self: False)
    with pytest.raises(ArtifactVerificationError) as info:
        verify_artifact(path, language, bundle_root=tmp_path)
    assert str(info.value) == f"{path.name}: file changed while it was being verified"


# -- found by mutation testing (docs/mutation-testing.md) -----------------------------------


def test_unsupported_footer_version_message_in_full(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, footer_version=2)
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None
    assert candidate.error == (
        "Unsupported bundle footer_ver=2 in etl: this operator reads footer_ver=1 only. Repack "
        "the artifact with an airflow-go-pack matching the Go SDK this operator supports."
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (
            b"a: [",
            "etl: metadata region is not valid YAML (while parsing a flow node)",
        ),
        (
            b"a: " + b"[" * 2000 + b"]" * 2000,
            "etl: metadata region is not valid YAML (while increasing flow level)",
        ),
        (
            b"sdk: {supervisor_schema_version: '2026-10-30'}\ndag_source_paths: [a]\nsources: []\n",
            "etl: metadata dag_source_paths is not a mapping",
        ),
    ],
)
def test_metadata_errors_in_full(tmp_path: Path, metadata: bytes, expected: str) -> None:
    assert _verify_error(_bundle_with_metadata(tmp_path, metadata)) == expected


@pytest.mark.parametrize(
    "metadata",
    [
        b"sdk: {supervisor_schema_version: '2026-10-30'}\nx: &anchor 1\n",  # anchor alone
        b"sdk: {supervisor_schema_version: '2026-10-30'}\nx: *alias\n",  # alias alone
        b"sdk: &s {supervisor_schema_version: '2026-10-30'}\ny: *s\n",
    ],
)
def test_any_anchor_or_alias_is_refused(tmp_path: Path, metadata: bytes) -> None:
    assert _verify_error(_bundle_with_metadata(tmp_path, metadata)) == (
        "etl: metadata region uses YAML anchors or aliases, which Airflow metadata never "
        "needs (refused: an alias chain can expand without bound)"
    )


def test_ampersands_and_asterisks_in_values_are_fine(tmp_path: Path) -> None:
    metadata = (
        b"sdk: {supervisor_schema_version: '2026-10-30', version: 'v1 & *2*'}\nnote: 'a * b & c'\n"
    )
    verified = verify_artifact(_bundle_with_metadata(tmp_path, metadata), Language.GO)
    assert verified.schema_version == "2026-10-30"


def _metadata_of_exactly(size: int) -> bytes:
    head = b"sdk: {supervisor_schema_version: '2026-10-30'}\ndigests: {cache: c1}\n# "
    return head + b"p" * (size - len(head) - 1) + b"\n"


def test_metadata_of_exactly_the_limit_is_read_and_verified(tmp_path: Path) -> None:
    metadata = _metadata_of_exactly(GO_MAX_METADATA_BYTES)
    assert len(metadata) == GO_MAX_METADATA_BYTES
    path = _bundle_with_metadata(tmp_path, metadata)
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None and candidate.cache_digest == "c1"
    assert verify_artifact(path, Language.GO).cache_digest == "c1"


def test_a_bundle_without_a_binary_is_listed_with_the_trailer_error(tmp_path: Path) -> None:
    # No binary at all: Airflow's trailer reader refuses it, so the listing names why.
    metadata = b"digests: {cache: c2}\n"
    path = tmp_path / "etl"
    path.write_bytes(
        metadata + GO_TRAILER.pack(0, len(metadata), 1, bytes(32), bytes(12), b"AFBNDL01")
    )
    path.chmod(0o755)
    candidate = read_with(go.read_candidate, path)
    assert candidate == Candidate("etl", path.stat().st_size, None, "etl: binary region is empty")
    assert _verify_error(path) == "etl: binary region is empty"


def test_an_error_candidate_keeps_its_path(tmp_path: Path) -> None:
    path = write_go_bundle(tmp_path / "etl", BINARY, footer_version=7)
    candidate = read_with(go.read_candidate, path, "bin/etl")
    assert candidate is not None
    assert (candidate.rel_path, candidate.size_bytes) == ("bin/etl", path.stat().st_size)


def test_a_yaml_error_quoting_a_long_tag_is_cut(tmp_path: Path) -> None:
    # PyYAML puts the tag in the first line of its message; the tag is the artifact's text.
    metadata = b"x: !" + b"t" * 500 + b" 1\n"
    message = _verify_error(_bundle_with_metadata(tmp_path, metadata))
    prefix = "etl: metadata region is not valid YAML ("
    assert message.startswith(prefix + "could not determine a constructor for the tag '!ttt")
    assert len(message) == len(prefix) + 200 + 1
