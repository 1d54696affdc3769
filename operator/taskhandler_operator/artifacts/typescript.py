"""TypeScript ``.min.mjs`` bundles: a runnable ES module framed by comment regions.

Layout (reference airflow-langsdk.md §3)::

    //# airflowBundle=<compact JSON layout>\\n           line 1, at most 4096 bytes
    //# airflowMetadata=<compact JSON metadata>\\n       line 2, at most 1 MiB
    /*# airflowSource:<path>\\n<escaped source>\\n#*/\\n   0..N blocks, each at most 1 MiB
    <JavaScript code to end of file>

The layout line records every region's byte range and SHA-256, so the cache digest
is the SHA-256 of that line (``head -n1 bundle.min.mjs | sha256sum``). Listing reads
line 1 only; verification checks every region.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskhandler_operator.artifacts.models import (
    TYPESCRIPT_SUFFIX,
    ArtifactVerificationError,
    Candidate,
    Language,
    OpenFile,
    VerifiedArtifact,
    check_schema_version,
    quote,
    verify_path,
)
from taskhandler_operator.limits import (
    TS_MAX_LAYOUT_LINE,
    TS_MAX_METADATA_LINE,
    TS_MAX_SOURCE_BYTES,
)

SUFFIX = TYPESCRIPT_SUFFIX
LAYOUT_PREFIX = b"//# airflowBundle="
METADATA_PREFIX = b"//# airflowMetadata="
SOURCE_OPENER_PREFIX = b"/*# airflowSource:"
SOURCE_CLOSER = b"\n#*/\n"
SUPPORTED_MAJOR = 1

# Most layout lines are a few hundred bytes: read this much first, the rest only if needed.
_FIRST_READ = 1024
_OFFSET = re.compile(r"[0-9a-f]{16}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# At most 9 digits a part: a version is a small number, and int() of thousands of digits is
# slow and then refused by Python with a message about its own limits.
_METADATA_VERSION = re.compile(r"([0-9]{1,9})\.[0-9]{1,9}(\.[0-9]{1,9})?")
# Characters that would end a JavaScript line comment early and so break the framing.
_LINE_BREAKERS = (b"\r", "\u2028".encode(), "\u2029".encode())


class LayoutError(ValueError):
    """The layout line is unusable; the message is the reason, without the file name."""


@dataclass(frozen=True, slots=True)
class Region:
    start: int
    end: int
    sha256: str


@dataclass(frozen=True, slots=True)
class SourceRegion:
    path: str
    region: Region

    @property
    def opener(self) -> bytes:
        return SOURCE_OPENER_PREFIX + self.path.encode() + b"\n"


@dataclass(frozen=True, slots=True)
class Layout:
    line: bytes  # the whole first line including its newline
    code: Region
    metadata: Region
    sources: tuple[SourceRegion, ...]

    @property
    def cache_digest(self) -> str:
        return hashlib.sha256(self.line).hexdigest()


def read_layout_line(f: OpenFile) -> bytes | None:
    """Line 1 including its newline; None when the file does not start with the marker.

    Raises LayoutError when the marker is there but the line is unterminated or too long.
    """
    head = f.read_at(0, _FIRST_READ)
    if not head.startswith(LAYOUT_PREFIX):
        return None
    end = head.find(b"\n")
    if end < 0 and len(head) == _FIRST_READ:
        head += f.read_at(_FIRST_READ, TS_MAX_LAYOUT_LINE - _FIRST_READ)
        end = head.find(b"\n")
    if end < 0:
        if len(head) >= TS_MAX_LAYOUT_LINE:
            raise LayoutError(f"the layout line is longer than {TS_MAX_LAYOUT_LINE} bytes")
        raise LayoutError("the layout line has no terminating newline")
    # head holds at most TS_MAX_LAYOUT_LINE bytes, so a newline found in it is within the limit.
    return head[: end + 1]


def _check_comment_payload(payload: bytes, what: str) -> None:
    if any(breaker in payload for breaker in _LINE_BREAKERS):
        raise LayoutError(
            f"the {what} line contains a carriage return or a U+2028/U+2029 line separator"
        )


def _load_json(payload: bytes, what: str) -> Any:
    # Decoded as UTF-8 here: json.loads on bytes would guess UTF-16 or UTF-32 from a BOM or
    # from zero bytes, and Airflow refuses anything but UTF-8.
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LayoutError(
            f"the {what} line is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise LayoutError(f"the {what} line is not valid JSON (nested too deeply)") from None
    except json.JSONDecodeError as exc:  # one short line: the message, line, column, offset
        raise LayoutError(f"the {what} line is not valid JSON ({exc})") from None
    except ValueError:  # int() of a number past Python's digit limit
        raise LayoutError(
            f"the {what} line is not valid JSON (a number has too many digits)"
        ) from None


def _region(value: object, where: str) -> Region:
    if not isinstance(value, dict):
        raise LayoutError(f"layout {where} is not an object")
    bounds: list[int] = []
    for key in ("start", "end"):
        raw = value.get(key)
        if not isinstance(raw, str) or not _OFFSET.fullmatch(raw):
            raise LayoutError(f"layout {where}.{key} is not 16 lowercase hex digits")
        bounds.append(int(raw, 16))
    digest = value.get("sha256")
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
        raise LayoutError(f"layout {where}.sha256 is not 64 lowercase hex digits")
    start, end = bounds
    if start >= end:
        raise LayoutError(f"layout {where} is empty or reversed (start {start}, end {end})")
    return Region(start, end, digest)


def parse_layout(line: bytes, file_size: int) -> Layout:
    """Check line 1 and every offset it implies; needs nothing but the line and the size."""
    payload = line[len(LAYOUT_PREFIX) : -1]
    _check_comment_payload(payload, "layout")
    doc = _load_json(payload, "layout")
    if not isinstance(doc, dict):
        raise LayoutError("the layout line is not a JSON object")
    for key in ("code", "metadata", "sources"):
        if key not in doc:
            raise LayoutError(f"layout has no {key!r} key")
    metadata = _region(doc["metadata"], "metadata")
    code = _region(doc["code"], "code")
    raw_sources = doc["sources"]
    if not isinstance(raw_sources, list):
        raise LayoutError("layout sources is not a list")
    sources: list[SourceRegion] = []
    seen: set[str] = set()
    for index, item in enumerate(raw_sources):
        where = f"sources[{index}]"
        region = _region(item, where)
        assert isinstance(item, dict)
        path = item.get("path")
        if not isinstance(path, str) or not path or "\n" in path:
            raise LayoutError(f"layout {where}.path is missing, empty or contains a newline")
        if not path.isascii():
            try:
                path.encode()
            except UnicodeEncodeError:
                # A JSON \u escape can spell a lone surrogate, which no UTF-8 opener holds.
                raise LayoutError(
                    f"layout {where}.path is not valid Unicode (a lone surrogate)"
                ) from None
        if path in seen:
            raise LayoutError(f"layout lists source {quote(path)} twice")
        seen.add(path)
        sources.append(SourceRegion(path, region))

    expected = len(line) + len(METADATA_PREFIX)
    if metadata.start != expected:
        raise LayoutError(
            f"layout metadata.start is {metadata.start}, the metadata line puts it at {expected}"
        )
    if metadata.end - metadata.start + len(METADATA_PREFIX) + 1 > TS_MAX_METADATA_LINE:
        raise LayoutError(f"the metadata line is longer than {TS_MAX_METADATA_LINE} bytes")
    cursor = metadata.end + 1  # past the metadata line's newline
    for source in sources:
        expected = cursor + len(source.opener)
        if source.region.start != expected:
            raise LayoutError(
                f"layout source {quote(source.path)} starts at {source.region.start}, "
                f"its opener puts it at {expected}"
            )
        if source.region.end - source.region.start > TS_MAX_SOURCE_BYTES:
            raise LayoutError(
                f"layout source {quote(source.path)} is longer than {TS_MAX_SOURCE_BYTES} bytes"
            )
        cursor = source.region.end + len(SOURCE_CLOSER)
    if code.start != cursor:
        raise LayoutError(
            f"layout code.start is {code.start}, the regions before it end at {cursor}"
        )
    if code.end != file_size:
        raise LayoutError(f"layout code.end is {code.end}, the file is {file_size} bytes")
    return Layout(line, code, metadata, tuple(sources))


# -- listing -------------------------------------------------------------------------------


def read_candidate(f: OpenFile, rel_path: str) -> Candidate | None:
    """Listing entry point: a ``.min.mjs`` starting with the layout marker.

    One without the marker may be any minified module, so it is skipped; one whose
    layout line is unusable is listed with the reason and no digest.
    """
    if not rel_path.endswith(SUFFIX):
        return None
    try:
        line = read_layout_line(f)
        if line is None:
            return None
        layout = parse_layout(line, f.size)
    except LayoutError as exc:
        return Candidate(rel_path, f.size, None, f"{rel_path}: {exc}")
    return Candidate(rel_path, f.size, layout.cache_digest)


# -- verification --------------------------------------------------------------------------


def verify_file(path: Path, name: str) -> VerifiedArtifact:
    """Open ``path`` and run :func:`verify_open`; ``name`` is how messages refer to it."""
    return verify_path(path, name, verify_open)


def verify_open(f: OpenFile, name: str) -> VerifiedArtifact:
    """The full check of reference §3.3: framing, every region's SHA-256, the metadata."""

    def fail(reason: str) -> ArtifactVerificationError:
        return ArtifactVerificationError(f"{name}: {reason}")

    if not f.path.name.endswith(SUFFIX):
        raise fail(f"a TypeScript bundle's name must end with {SUFFIX}")
    try:
        line = read_layout_line(f)
        if line is None:
            raise fail("not a TypeScript bundle (the first line is not //# airflowBundle=...)")
        layout = parse_layout(line, f.size)
    except LayoutError as exc:
        raise fail(str(exc)) from None

    meta = layout.metadata
    meta_line = f.read_at(len(line), meta.end + 1 - len(line))
    if not meta_line.startswith(METADATA_PREFIX):
        raise fail("line 2 does not start with //# airflowMetadata=")
    payload = meta_line[len(METADATA_PREFIX) : -1]
    if not meta_line.endswith(b"\n") or b"\n" in payload:
        raise fail("the metadata line does not end where layout metadata.end says")
    try:
        _check_comment_payload(payload, "metadata")
    except LayoutError as exc:
        raise fail(str(exc)) from None
    _check_digest(payload, meta.sha256, "metadata region", fail)

    for source in layout.sources:
        region = source.region
        opener_at = region.start - len(source.opener)
        if f.read_at(opener_at, len(source.opener)) != source.opener:
            raise fail(
                f"source {quote(source.path)}: the opener at byte {opener_at} does not match"
            )
        body = f.read_at(region.start, region.end - region.start)
        if f.read_at(region.end, len(SOURCE_CLOSER)) != SOURCE_CLOSER:
            raise fail(f"source {quote(source.path)}: no closer at byte {region.end}")
        if b"*/" in body:
            raise fail(f"source {quote(source.path)} contains an unescaped */")
        _check_digest(body, region.sha256, f"source {quote(source.path)}", fail)

    code = hashlib.sha256()
    for chunk in f.iter_range(layout.code.start, layout.code.end):
        code.update(chunk)
    if code.hexdigest() != layout.code.sha256:
        raise fail(
            f"code region SHA-256 does not match the layout line "
            f"(layout {layout.code.sha256}, region {code.hexdigest()})"
        )
    if not f.unchanged_since_open():
        raise fail("file changed while it was being verified")

    try:
        schema_version = _schema_version(_load_json(payload, "metadata"))
    except ValueError as exc:
        raise fail(str(exc)) from None
    return VerifiedArtifact(
        path=f.path,
        language=Language.TYPESCRIPT,
        schema_version=schema_version,
        size_bytes=f.size,
        cache_digest=layout.cache_digest,
    )


def _check_digest(
    data: bytes, expected: str, region: str, fail: Callable[[str], ArtifactVerificationError]
) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise fail(
            f"{region} SHA-256 does not match the layout line (layout {expected}, region {actual})"
        )


def _schema_version(metadata: object) -> str:
    if not isinstance(metadata, dict):
        raise ValueError("the metadata line is not a JSON object")
    version = metadata.get("airflow_bundle_metadata_version")
    match = _METADATA_VERSION.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(
            "metadata airflow_bundle_metadata_version is missing or not MAJOR.MINOR[.PATCH] "
            "(numbers of at most 9 digits)"
        )
    if int(match.group(1)) != SUPPORTED_MAJOR:
        raise ValueError(
            f"metadata airflow_bundle_metadata_version {quote(version)} is not supported "
            f"(this operator reads major version {SUPPORTED_MAJOR})"
        )
    sdk = metadata.get("sdk")
    if not isinstance(sdk, dict):
        raise ValueError("missing or invalid sdk.supervisor_schema_version")
    return check_schema_version(sdk.get("supervisor_schema_version"))
