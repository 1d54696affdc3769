"""TypeScript .min.mjs bundles: listing and verification rules, reference airflow-langsdk.md §3."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.packers import (
    escape_ts_source,
    pack_typescript_bundle,
    write_typescript_bundle,
)
from taskhandler_operator.artifacts import typescript
from taskhandler_operator.artifacts.listing import list_candidates
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile
from taskhandler_operator.artifacts.verify import ArtifactVerificationError, verify_artifact
from tests.unit.artifacts.helpers import flip, read_with

CODE = b'export function main(){return "hello"}\n'
SOURCES = {"entry.ts": b"export const x = 1; /* note */\n", "lib/util.ts": b"// *\\ and */\n"}


def _write(tmp_path: Path, **kw: Any) -> Path:
    return write_typescript_bundle(tmp_path / "bundle.min.mjs", CODE, sources=SOURCES, **kw)


def test_cache_digest_is_sha256_of_the_first_line(tmp_path: Path) -> None:
    path = _write(tmp_path)
    first_line = path.read_bytes().split(b"\n", 1)[0] + b"\n"  # head -n1 | sha256sum
    candidate = read_with(typescript.read_candidate, path, "dist/bundle.min.mjs")
    assert candidate == Candidate(
        "dist/bundle.min.mjs", path.stat().st_size, hashlib.sha256(first_line).hexdigest()
    )


def test_listing_reads_the_first_line_only(tmp_path: Path) -> None:
    path = write_typescript_bundle(tmp_path / "b.min.mjs", b"x" * 100_000)
    with OpenFile.open(path) as f:
        assert typescript.read_candidate(f, "b.min.mjs") is not None
        assert f.bytes_read == 1024  # the first read; the line fits in it


def test_packer_escapes_comment_closers() -> None:
    assert escape_ts_source(b"a */ b *\\ c") == b"a *\\/ b *\\\\ c"
    data = pack_typescript_bundle(CODE, sources={"a.ts": b"/* x */"})
    assert b"/* x *\\/" in data


def test_single_region_layout_offsets_are_consistent(tmp_path: Path) -> None:
    data = pack_typescript_bundle(CODE)
    line = data.split(b"\n", 1)[0] + b"\n"
    layout = json.loads(line[len(b"//# airflowBundle=") :])
    assert list(layout) == ["code", "metadata", "sources"]
    assert layout["sources"] == []
    meta_start = int(layout["metadata"]["start"], 16)
    assert meta_start == len(line) + len(b"//# airflowMetadata=")
    assert int(layout["code"]["end"], 16) == len(data)
    assert data[int(layout["code"]["start"], 16) :] == CODE


def test_min_mjs_without_marker_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "vendor.min.mjs"
    path.write_bytes(b"export default 1;\n")
    assert read_with(typescript.read_candidate, path) is None


def test_other_names_are_skipped_even_with_the_marker(tmp_path: Path) -> None:
    path = tmp_path / "bundle.mjs"
    path.write_bytes(pack_typescript_bundle(CODE))
    assert read_with(typescript.read_candidate, path) is None


def _with_layout(tmp_path: Path, layout_line: bytes, rest: bytes = b"x") -> Path:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(layout_line + rest)
    return path


def _listing_error(path: Path) -> str | None:
    candidate = read_with(typescript.read_candidate, path)
    assert candidate is not None
    assert candidate.cache_digest is None
    return candidate.error


def _layout_of(data: bytes) -> Any:
    line = data.split(b"\n", 1)[0]
    parsed = json.loads(line[len(b"//# airflowBundle=") :])
    assert isinstance(parsed, dict)
    return parsed


def _relayout(data: bytes, layout: Any) -> bytes:
    """Replace line 1 with ``layout`` (same length when offsets are unchanged)."""
    rest = data.split(b"\n", 1)[1]
    return b"//# airflowBundle=" + json.dumps(layout, separators=(",", ":")).encode() + b"\n" + rest


GOOD = pack_typescript_bundle(CODE, sources={"entry.ts": b"let a = 1\n"})


def _mutated_layout(**changes: object) -> bytes:
    layout = _layout_of(GOOD)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node: Any = layout
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return _relayout(GOOD, layout)


_DELETE = object()
LINE_BREAK_ERROR = (
    "bad.min.mjs: the layout line contains a carriage return or a U+2028/U+2029 line separator"
)


def _shifted(key: str, index: int | None, field: str) -> str:
    """An offset of GOOD's layout moved one byte later: still a valid range, wrongly placed."""
    node = _layout_of(GOOD)[key]
    if index is not None:
        node = node[index]
    return f"{int(node[field], 16) + 1:016x}"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"//# airflowBundle={}", "bad.min.mjs: the layout line has no terminating newline"),
        (
            b"//# airflowBundle=" + b"a" * 5000 + b"\n",
            "bad.min.mjs: the layout line is longer than 4096 bytes",
        ),
        (
            b"//# airflowBundle={\r}\n",
            LINE_BREAK_ERROR,
        ),
        (
            "//# airflowBundle={\u2028}\n".encode(),
            LINE_BREAK_ERROR,
        ),
        (
            b"//# airflowBundle={nope\n",
            "bad.min.mjs: the layout line is not valid JSON (Expecting property name enclosed "
            "in double quotes: line 1 column 2 (char 1))",
        ),
        (b"//# airflowBundle=[1]\n", "bad.min.mjs: the layout line is not a JSON object"),
        (
            b"//# airflowBundle=" + b"[" * 100_000 + b"\n",
            "bad.min.mjs: the layout line is longer than 4096 bytes",
        ),
        (
            b"//# airflowBundle=" + b"[" * 4000 + b"\n",
            "bad.min.mjs: the layout line is not valid JSON",
        ),
        (_mutated_layout(sources=_DELETE), "bad.min.mjs: layout has no 'sources' key"),
        (_mutated_layout(code=_DELETE), "bad.min.mjs: layout has no 'code' key"),
        (_mutated_layout(metadata=3), "bad.min.mjs: layout metadata is not an object"),
        (_mutated_layout(sources=3), "bad.min.mjs: layout sources is not a list"),
        (
            _mutated_layout(code__start="12"),
            "bad.min.mjs: layout code.start is not 16 lowercase hex digits",
        ),
        (
            _mutated_layout(code__end="000000000000000G"),
            "bad.min.mjs: layout code.end is not 16 lowercase hex digits",
        ),
        (
            _mutated_layout(metadata__sha256="AB" * 32),
            "bad.min.mjs: layout metadata.sha256 is not 64 lowercase hex digits",
        ),
        (
            _mutated_layout(code__end=_layout_of(GOOD)["code"]["start"]),
            "bad.min.mjs: layout code is empty or reversed",
        ),
        (
            _mutated_layout(sources__0__path=""),
            "bad.min.mjs: layout sources[0].path is missing, empty or contains a newline",
        ),
        (
            _mutated_layout(metadata__start="0000000000000001"),
            "bad.min.mjs: layout metadata.start is 1, the metadata line puts it at",
        ),
        (
            _mutated_layout(sources__0__start=_shifted("sources", 0, "start")),
            "bad.min.mjs: layout source 'entry.ts' starts at ",
        ),
        (
            _mutated_layout(code__start=_shifted("code", None, "start")),
            "bad.min.mjs: layout code.start is ",
        ),
        (
            _mutated_layout(code__end="0000000000100000"),
            f"bad.min.mjs: layout code.end is 1048576, the file is {len(GOOD)} bytes",
        ),
    ],
)
def test_broken_layout_is_listed_with_the_reason(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(data)
    error = _listing_error(path)
    assert error is not None
    assert error.startswith(expected), error


def test_duplicate_source_paths_are_a_layout_error(tmp_path: Path) -> None:
    layout = _layout_of(GOOD)
    sources = layout["sources"]
    assert isinstance(sources, list)
    layout["sources"] = [sources[0], sources[0]]
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(_relayout(GOOD, layout))
    assert _listing_error(path) == "bad.min.mjs: layout lists source 'entry.ts' twice"


def test_source_path_with_a_lone_surrogate_is_a_layout_error(tmp_path: Path) -> None:
    # "\ud800ab" is as long in JSON as "entry.ts", so every offset still agrees and only
    # the path is wrong. One such file must not stop the listing of the others.
    bad = _mutated_layout(sources__0__path="\ud800ab")
    assert len(bad) == len(GOOD)
    (tmp_path / "bad.min.mjs").write_bytes(bad)
    (tmp_path / "good.min.mjs").write_bytes(GOOD)
    expected = "bad.min.mjs: layout sources[0].path is not valid Unicode (a lone surrogate)"
    assert _listing_error(tmp_path / "bad.min.mjs") == expected
    listed = list_candidates(tmp_path, Language.TYPESCRIPT).candidates
    assert [(c.rel_path, c.error) for c in listed] == [
        ("bad.min.mjs", expected),
        ("good.min.mjs", None),
    ]
    with pytest.raises(ArtifactVerificationError) as info:
        verify_artifact(tmp_path / "bad.min.mjs", Language.TYPESCRIPT, bundle_root=tmp_path)
    assert str(info.value) == expected


def test_oversized_declared_regions_are_layout_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(_mutated_layout(metadata__end=f"{2 << 20:016x}"))
    assert _listing_error(path) == "bad.min.mjs: the metadata line is longer than 1048576 bytes"
    layout = _layout_of(GOOD)
    start = int(layout["sources"][0]["start"], 16)
    path.write_bytes(_mutated_layout(sources__0__end=f"{start + (1 << 20) + 1:016x}"))
    assert (
        _listing_error(path) == "bad.min.mjs: layout source 'entry.ts' is longer than 1048576 bytes"
    )


# -- verification --------------------------------------------------------------------------


def test_packed_bundle_verifies(tmp_path: Path) -> None:
    path = _write(tmp_path)
    verified = verify_artifact(path, Language.TYPESCRIPT)
    assert verified.schema_version == "2026-10-30"
    assert verified.language is Language.TYPESCRIPT
    listed = read_with(typescript.read_candidate, path)
    assert listed is not None and verified.cache_digest == listed.cache_digest


def test_handlers_only_bundle_without_sources_verifies(tmp_path: Path) -> None:
    path = write_typescript_bundle(tmp_path / "b.min.mjs", CODE)
    assert verify_artifact(path, Language.TYPESCRIPT).schema_version == "2026-10-30"


def _verify_error(path: Path) -> str:
    with pytest.raises(ArtifactVerificationError) as info:
        verify_artifact(path, Language.TYPESCRIPT, bundle_root=path.parent)
    return str(info.value)


def _region_offsets(path: Path) -> dict[str, tuple[int, int]]:
    layout = _layout_of(path.read_bytes())
    regions = {
        "metadata": layout["metadata"],
        "code": layout["code"],
        **{f"source {s['path']!r}": s for s in layout["sources"]},
    }
    return {name: (int(r["start"], 16), int(r["end"], 16)) for name, r in regions.items()}


@pytest.mark.parametrize(
    "region", ["metadata", "code", "source 'entry.ts'", "source 'lib/util.ts'"]
)
@pytest.mark.parametrize("where", ["first", "last"])
def test_flipped_byte_in_a_region_names_the_region(tmp_path: Path, region: str, where: str) -> None:
    path = _write(tmp_path)
    start, end = _region_offsets(path)[region]
    flip(path, start if where == "first" else end - 1, 0x20)
    message = _verify_error(path)
    region_name = f"{region} region" if region in ("metadata", "code") else region
    assert message.startswith(
        f"bundle.min.mjs: {region_name} SHA-256 does not match the layout line"
    ) or (region.startswith("source") and "unescaped */" in message), message


@pytest.mark.parametrize("offset", range(0, 60, 7))
def test_flipped_byte_in_the_layout_line_fails(tmp_path: Path, offset: int) -> None:
    path = _write(tmp_path)
    flip(path, offset, 0x02)
    assert _verify_error(path).startswith("bundle.min.mjs: ")


def test_flipped_digest_in_the_layout_line_names_the_region(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    code_digest = _layout_of(data)["code"]["sha256"]
    at = data.index(code_digest.encode())
    flip(path, at, 0x01 if chr(data[at]) not in "ab" else 0x03)
    assert _verify_error(path).startswith("bundle.min.mjs: code region SHA-256 does not match")


def test_broken_opener_and_closer_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    at = data.index(b"/*# airflowSource:entry.ts")
    flip(path, at + 4)
    assert (
        _verify_error(path)
        == f"bundle.min.mjs: source 'entry.ts': the opener at byte {at} does not match"
    )
    path = _write(tmp_path)
    _start, end = _region_offsets(path)["source 'entry.ts'"]
    flip(path, end + 2)
    assert _verify_error(path) == f"bundle.min.mjs: source 'entry.ts': no closer at byte {end}"


def test_metadata_line_framing_errors(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    line2 = data.index(b"//# airflowMetadata=")
    flip(path, line2 + 3)
    assert _verify_error(path) == "bundle.min.mjs: line 2 does not start with //# airflowMetadata="
    path = _write(tmp_path)
    _start, end = _region_offsets(path)["metadata"]
    flip(path, end, 0x01)  # the newline ending line 2
    assert (
        _verify_error(path)
        == "bundle.min.mjs: the metadata line does not end where layout metadata.end says"
    )


def _repack(tmp_path: Path, code: bytes = CODE, **kw: Any) -> Path:
    return write_typescript_bundle(tmp_path / "bundle.min.mjs", code, **kw)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (
            {"schema_version": None},
            "bundle.min.mjs: missing or invalid sdk.supervisor_schema_version",
        ),
        (
            {"schema_version": "20261030"},
            "bundle.min.mjs: supervisor schema version '20261030' is not a YYYY-MM-DD date",
        ),
        (
            {"metadata_extra": {"sdk": None}},
            "bundle.min.mjs: missing or invalid sdk.supervisor_schema_version",
        ),
        (
            {"metadata_extra": {"airflow_bundle_metadata_version": None}},
            "bundle.min.mjs: metadata airflow_bundle_metadata_version is missing or not "
            "MAJOR.MINOR[.PATCH] (numbers of at most 9 digits)",
        ),
        (
            {"metadata_extra": {"airflow_bundle_metadata_version": "2.0"}},
            "bundle.min.mjs: metadata airflow_bundle_metadata_version '2.0' is not supported "
            "(this operator reads major version 1)",
        ),
    ],
)
def test_metadata_content_errors(tmp_path: Path, kw: dict[str, Any], expected: str) -> None:
    assert _verify_error(_repack(tmp_path, **kw)) == expected


def test_metadata_with_line_separator_fails(tmp_path: Path) -> None:
    # The packer escapes U+2028; a hand-made bundle that does not breaks the framing.
    data = pack_typescript_bundle(CODE, metadata_extra={"note": "\u2028"})
    data = data.replace(b"\\u2028", "\u2028".encode())
    layout = _layout_of(data)
    # Re-record the metadata range and digest so only the separator rule can fail.
    start = int(layout["metadata"]["start"], 16)
    end = data.index(b"\n", start)
    payload = data[start:end]
    layout["metadata"] = {
        "end": f"{end:016x}",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "start": f"{start:016x}",
    }
    shift = (end - start) - (int(_layout_of(data)["metadata"]["end"], 16) - start)
    code_start = int(layout["code"]["start"], 16) + shift
    layout["code"] = {
        "end": f"{len(data):016x}",
        "sha256": hashlib.sha256(data[code_start:]).hexdigest(),
        "start": f"{code_start:016x}",
    }
    path = tmp_path / "bundle.min.mjs"
    path.write_bytes(_relayout(data, layout))
    assert _verify_error(path) == (
        "bundle.min.mjs: the metadata line contains a carriage return or a U+2028/U+2029 "
        "line separator"
    )


def test_unescaped_comment_closer_in_a_source_fails(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    start, end = _region_offsets(path)["source 'lib/util.ts'"]
    body = data[start:end]
    assert b"*\\/" in body
    at = start + body.index(b"*\\/") + 1
    # Swap the escaping backslash for a second '*' and fix the recorded digest:
    # only the unescaped-closer rule can fail.
    patched = bytearray(data)
    patched[at] = ord("*")
    new_body = bytes(patched[start:end])
    layout = _layout_of(bytes(patched))
    layout["sources"][1]["sha256"] = hashlib.sha256(new_body).hexdigest()
    path.write_bytes(_relayout(bytes(patched), layout))
    assert _verify_error(path) == "bundle.min.mjs: source 'lib/util.ts' contains an unescaped */"


def test_name_must_end_with_min_mjs(tmp_path: Path) -> None:
    path = tmp_path / "bundle.js"
    path.write_bytes(pack_typescript_bundle(CODE))
    assert _verify_error(path) == "bundle.js: a TypeScript bundle's name must end with .min.mjs"


def test_file_without_marker_fails(tmp_path: Path) -> None:
    path = tmp_path / "x.min.mjs"
    path.write_bytes(b"export default 1\n")
    assert _verify_error(path) == (
        "x.min.mjs: not a TypeScript bundle (the first line is not //# airflowBundle=...)"
    )


def test_layout_errors_fail_verification_too(tmp_path: Path) -> None:
    path = tmp_path / "x.min.mjs"
    path.write_bytes(b"//# airflowBundle={}\n")
    assert _verify_error(path) == "x.min.mjs: layout has no 'code' key"


def test_reference_fixture_shape(tmp_path: Path) -> None:
    # Reference §3.5 worked fixture: opener "/*# airflowSource:entry.ts\n" is 27 bytes and the
    # source starts right after it; the closer is 5 bytes and code follows.
    data = pack_typescript_bundle(CODE, sources={"entry.ts": b"x" * 236})
    layout = _layout_of(data)
    source = layout["sources"][0]
    meta_end = int(layout["metadata"]["end"], 16)
    assert int(source["start"], 16) == meta_end + 1 + 27
    assert int(layout["code"]["start"], 16) == int(source["end"], 16) + 5
    assert re.fullmatch(rb"/\*# airflowSource:entry.ts\n", data[meta_end + 1 : meta_end + 1 + 27])


# -- framing at its exact limits ---------------------------------------------------------------

_META = {
    "airflow_bundle_metadata_version": "1.0",
    "sdk": {"supervisor_schema_version": "2026-10-30"},
}


def _bundle_with_layout_line_of(tmp_path: Path, size: int) -> Path:
    """A valid bundle whose first line (newline included) is exactly ``size`` bytes."""
    probe = pack_typescript_bundle(CODE, sources={"p": b"x"})
    grow = size - (probe.index(b"\n") + 1)
    path = write_typescript_bundle(tmp_path / "b.min.mjs", CODE, sources={"p" * (1 + grow): b"x"})
    assert path.read_bytes().index(b"\n") + 1 == size
    return path


def _metadata_payload_of(size: int) -> bytes:
    """Metadata JSON of exactly ``size`` bytes."""
    base = json.dumps({**_META, "pad": ""}, separators=(",", ":")).encode()
    return base[:-2] + b"x" * (size - len(base)) + b'"}'


@pytest.mark.parametrize("size", [1025, 2000, 4095, 4096])
def test_a_first_line_past_the_first_read_is_read_whole(tmp_path: Path, size: int) -> None:
    # Listing reads 1024 bytes first; a longer first line followed by a short one must still
    # be read to its newline, and the digest is over exactly that line.
    path = _bundle_with_layout_line_of(tmp_path, size)
    candidate = read_with(typescript.read_candidate, path)
    line = path.read_bytes()[:size]
    assert candidate == Candidate(
        "b.min.mjs", path.stat().st_size, hashlib.sha256(line).hexdigest()
    )
    assert verify_artifact(path, Language.TYPESCRIPT).cache_digest == candidate.cache_digest


def test_a_first_line_of_4097_bytes_is_refused(tmp_path: Path) -> None:
    path = _bundle_with_layout_line_of(tmp_path, 4097)
    assert _listing_error(path) == "b.min.mjs: the layout line is longer than 4096 bytes"


def test_the_metadata_line_may_be_exactly_1_mib(tmp_path: Path) -> None:
    prefix_and_newline = len(b"//# airflowMetadata=") + 1
    payload = _metadata_payload_of((1 << 20) - prefix_and_newline)
    path = write_typescript_bundle(tmp_path / "m.min.mjs", CODE, metadata_payload=payload)
    assert verify_artifact(path, Language.TYPESCRIPT).schema_version == "2026-10-30"


def test_a_metadata_line_of_1_mib_plus_1_is_refused(tmp_path: Path) -> None:
    prefix_and_newline = len(b"//# airflowMetadata=") + 1
    payload = _metadata_payload_of((1 << 20) - prefix_and_newline + 1)
    path = write_typescript_bundle(tmp_path / "m.min.mjs", CODE, metadata_payload=payload)
    assert _listing_error(path) == "m.min.mjs: the metadata line is longer than 1048576 bytes"


def test_a_source_may_be_exactly_1_mib_and_not_one_byte_more(tmp_path: Path) -> None:
    exact = write_typescript_bundle(tmp_path / "s.min.mjs", CODE, sources={"a": b"s" * (1 << 20)})
    assert verify_artifact(exact, Language.TYPESCRIPT).schema_version == "2026-10-30"
    over = write_typescript_bundle(
        tmp_path / "o.min.mjs", CODE, sources={"a": b"s" * ((1 << 20) + 1)}
    )
    assert _listing_error(over) == "o.min.mjs: layout source 'a' is longer than 1048576 bytes"


def test_a_metadata_region_that_spans_a_newline_is_refused(tmp_path: Path) -> None:
    # Every checksum matches, but the newline would end the comment early and the rest of the
    # "metadata" would run as code.
    payload = json.dumps(_META).encode()[:-1] + b',"x":1}\n;globalThis.pwned=1;//'
    path = write_typescript_bundle(tmp_path / "n.min.mjs", CODE, metadata_payload=payload)
    assert _verify_error(path) == (
        "n.min.mjs: the metadata line does not end where layout metadata.end says"
    )


@pytest.mark.parametrize("breaker", ["\u2029", "\u2028", "\r"])
def test_a_raw_line_breaker_in_the_metadata_is_refused(tmp_path: Path, breaker: str) -> None:
    # json.dumps escapes "\r" (and, with ensure_ascii, the separators): put the raw bytes in.
    payload = json.dumps({**_META, "note": "aBRKb"}).encode().replace(b"BRK", breaker.encode())
    path = write_typescript_bundle(tmp_path / "u.min.mjs", CODE, metadata_payload=payload)
    assert _verify_error(path) == (
        "u.min.mjs: the metadata line contains a carriage return or a U+2028/U+2029 line separator"
    )


@pytest.mark.parametrize("breaker", ["\u2029", "\u2028", "\r"])
def test_a_raw_line_breaker_in_the_layout_line_is_refused(tmp_path: Path, breaker: str) -> None:
    path = tmp_path / "l.min.mjs"
    layout = _layout_of(GOOD)
    layout["sources"][0]["path"] = "aBRKb"
    raw = json.dumps(layout, separators=(",", ":")).encode().replace(b"BRK", breaker.encode())
    line = b"//# airflowBundle=" + raw + b"\n"
    path.write_bytes(line + GOOD.split(b"\n", 1)[1])
    assert _listing_error(path) == (
        "l.min.mjs: the layout line contains a carriage return or a U+2028/U+2029 line separator"
    )


# -- found by mutation testing (docs/mutation-testing.md) -----------------------------------


def test_listing_reads_at_most_4096_bytes_of_a_long_first_line(tmp_path: Path) -> None:
    path = tmp_path / "long.min.mjs"
    path.write_bytes(b"//# airflowBundle=" + b"x" * 4500 + b"\n" + b"y" * 10_000)
    with OpenFile.open(path) as f:
        with pytest.raises(typescript.LayoutError, match="longer than 4096 bytes"):
            typescript.read_layout_line(f)
        assert f.bytes_read == 4096


def test_a_broken_source_region_is_named_by_its_index(tmp_path: Path) -> None:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(_mutated_layout(sources__0__start="zz"))
    assert (
        _listing_error(path)
        == "bad.min.mjs: layout sources[0].start is not 16 lowercase hex digits"
    )


def test_a_source_path_with_a_newline_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(_mutated_layout(sources__0__path="a\nb"))
    assert _listing_error(path) == (
        "bad.min.mjs: layout sources[0].path is missing, empty or contains a newline"
    )


def test_an_error_candidate_keeps_its_path_and_size(tmp_path: Path) -> None:
    path = tmp_path / "bad.min.mjs"
    path.write_bytes(b"//# airflowBundle={}\nx")
    assert read_with(typescript.read_candidate, path, "ui/bad.min.mjs") == Candidate(
        "ui/bad.min.mjs", 22, None, "ui/bad.min.mjs: layout has no 'code' key"
    )


def test_a_verified_bundle_reports_its_path_and_size(tmp_path: Path) -> None:
    path = _write(tmp_path)
    verified = verify_artifact(path, Language.TYPESCRIPT)
    assert (verified.path, verified.size_bytes) == (path, path.stat().st_size)


def test_metadata_that_is_not_an_object_in_full(tmp_path: Path) -> None:
    path = write_typescript_bundle(tmp_path / "m.min.mjs", CODE, metadata_payload=b"[1]")
    assert _verify_error(path) == "m.min.mjs: the metadata line is not a JSON object"
