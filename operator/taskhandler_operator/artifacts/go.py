"""Go executable bundles: an executable with source, metadata and a 64-byte ``AFBNDL01`` trailer.

Layout (reference airflow-langsdk.md §2)::

    [0, source_start)               binary region, never empty
    [source_start, metadata_start)  source region, may be empty
    [metadata_start, size - 64)     metadata region: UTF-8 YAML mapping
    [size - 64, size)               trailer "<III 32s 12s 8s": source_len, metadata_len,
                                    footer_ver, binary_sha256, reserved (zero), magic

Two entry points: :func:`read_candidate` (listing: trailer and stored digest only,
never hashes) and :func:`verify_file` (everything a worker checks before running it).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskhandler_operator.artifacts.models import (
    ArtifactVerificationError,
    Candidate,
    Language,
    OpenFile,
    VerifiedArtifact,
    check_schema_version,
    is_executable,
    normalize_cache_digest,
    quote,
    verify_path,
)
from taskhandler_operator.limits import GO_MAX_METADATA_BYTES

FOOTER_MAGIC = b"AFBNDL01"
FOOTER_SIZE = 64
FOOTER_VERSION = 1
TRAILER = struct.Struct("<III32s12s8s")

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

assert TRAILER.size == FOOTER_SIZE


def _yaml_loader() -> Any:
    # libyaml when present: several times faster on the listing path. PyYAML is imported on
    # first use, so a Java or TypeScript probe (which imports this module through the
    # verifier) does not pay for it.
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def not_executable_message(rel_path: str) -> str:
    return (
        f"{rel_path} is not executable. Use a Dag bundle that keeps the executable bit; "
        "object-store Dag bundles such as S3DagBundle drop it."
    )


def unsupported_version_message(rel_path: str, version: int) -> str:
    return (
        f"Unsupported bundle footer_ver={version} in {rel_path}: this operator reads "
        f"footer_ver={FOOTER_VERSION} only. Repack the artifact with an airflow-go-pack "
        "matching the Go SDK this operator supports."
    )


@dataclass(frozen=True, slots=True)
class Trailer:
    source_len: int
    metadata_len: int
    footer_ver: int
    binary_sha256: bytes
    reserved: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Trailer | None:
        """The trailer in the last 64 bytes, or None when the magic is absent."""
        if len(raw) != FOOTER_SIZE or raw[-8:] != FOOTER_MAGIC:
            return None
        source_len, metadata_len, version, digest, reserved, _magic = TRAILER.unpack(raw)
        return cls(source_len, metadata_len, version, digest, reserved)

    def metadata_start(self, size: int) -> int:
        return size - FOOTER_SIZE - self.metadata_len

    def source_start(self, size: int) -> int:
        return self.metadata_start(size) - self.source_len


def trailer_problem(trailer: Trailer, size: int) -> str | None:
    """Why a version-1 trailer cannot describe this file, or None (reference §2.3 steps 4-5)."""
    if any(trailer.reserved):
        return "trailer reserved bytes 44..55 are not zero"
    source_start = trailer.source_start(size)
    if source_start < 0:
        return (
            f"trailer regions (source {trailer.source_len} bytes + metadata "
            f"{trailer.metadata_len} bytes) are larger than the file ({size} bytes): the file "
            "was cut short or is not a whole bundle; upload it again"
        )
    if source_start == 0:
        return "binary region is empty"
    return None


def read_trailer(f: OpenFile) -> Trailer | None:
    if f.size < FOOTER_SIZE:
        return None
    return Trailer.parse(f.read_at(f.size - FOOTER_SIZE, FOOTER_SIZE))


def parse_metadata(raw: bytes) -> dict[str, Any]:
    """The metadata region as a mapping; ValueError says why it is not one.

    YAML anchors and aliases are refused: airflow-go-pack never writes them, and an alias
    chain ("billion laughs") lets a small region stand for a structure of gigabytes as soon
    as anything walks or prints it.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"metadata region is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    import yaml

    try:
        _refuse_anchors(text)
        loaded = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 -- a safe loader
    except yaml.YAMLError as exc:
        raise ValueError(f"metadata region is not valid YAML ({_first_line(exc)})") from None
    except RecursionError:
        raise ValueError("metadata region is not valid YAML (nested too deeply)") from None
    except _AnchorsRefused:
        raise
    except ValueError:
        # A constructor's own error, e.g. an integer of more than 4300 digits.
        raise ValueError(
            "metadata region is not valid YAML (a value cannot be read, such as a number "
            "with too many digits)"
        ) from None
    if not isinstance(loaded, dict):
        raise ValueError("metadata region is not a YAML mapping")
    return loaded


class _AnchorsRefused(ValueError):
    pass


def _refuse_anchors(text: str) -> None:
    # Anchors and aliases need '&' or '*'; most metadata has neither, so the event scan
    # (a second parse) is skipped on the listing's fast path.
    if "&" not in text and "*" not in text:
        return
    import yaml

    for event in yaml.parse(text, Loader=_yaml_loader()):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AnchorsRefused(
                "metadata region uses YAML anchors or aliases, which Airflow metadata never "
                "needs (refused: an alias chain can expand without bound)"
            )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line[:200]


def stored_cache_digest(metadata: dict[str, Any]) -> str | None:
    digests = metadata.get("digests")
    if not isinstance(digests, dict):
        return None
    return normalize_cache_digest(digests.get("cache"))


def schema_version_of(metadata: dict[str, Any]) -> str:
    sdk = metadata.get("sdk")
    if not isinstance(sdk, dict):
        raise ValueError("missing or invalid sdk.supervisor_schema_version")
    return check_schema_version(sdk.get("supervisor_schema_version"))


# -- listing -------------------------------------------------------------------------------


def read_candidate(f: OpenFile, rel_path: str) -> Candidate | None:
    """Listing entry point: trailer + stored digest, never a hash of the artifact.

    Any regular file ending in the magic is a candidate, whatever its executable bit;
    metadata that cannot be read leaves the digest unknown (None) but is no error.
    """
    trailer = read_trailer(f)
    if trailer is None:
        return None
    if trailer.footer_ver != FOOTER_VERSION:
        return Candidate(
            rel_path, f.size, None, unsupported_version_message(rel_path, trailer.footer_ver)
        )
    # As Airflow's listing does: a trailer that cannot be read is listed, without a digest and
    # with why, rather than dropped without a word (a file cut short keeps its trailer's
    # lengths but not the bytes they count).
    broken = trailer_problem(trailer, f.size)
    if broken is not None:
        return Candidate(rel_path, f.size, None, f"{rel_path}: {broken}")
    digest = _listing_digest(f, trailer)
    error = None if is_executable(f.mode) else not_executable_message(rel_path)
    return Candidate(rel_path, f.size, digest, error)


def _listing_digest(f: OpenFile, trailer: Trailer) -> str | None:
    start = trailer.metadata_start(f.size)
    if trailer.metadata_len == 0 or trailer.metadata_len > GO_MAX_METADATA_BYTES or start < 0:
        return None
    try:
        metadata = parse_metadata(f.read_at(start, trailer.metadata_len))
    except ValueError:
        return None
    return stored_cache_digest(metadata)


# -- verification --------------------------------------------------------------------------


def verify_file(path: Path, name: str) -> VerifiedArtifact:
    """Open ``path`` and run :func:`verify_open`; ``name`` is how messages refer to it."""
    return verify_path(path, name, verify_open)


def verify_open(f: OpenFile, name: str) -> VerifiedArtifact:
    """The full integrity check of reference §2.3, plus the per-file source digests."""

    def fail(reason: str) -> ArtifactVerificationError:
        return ArtifactVerificationError(f"{name}: {reason}")

    trailer = read_trailer(f)
    if trailer is None:
        raise fail("not a Go executable bundle (no AFBNDL01 trailer in the last 64 bytes)")
    if trailer.footer_ver != FOOTER_VERSION:
        raise ArtifactVerificationError(unsupported_version_message(name, trailer.footer_ver))
    size = f.size
    broken = trailer_problem(trailer, size)
    if broken is not None:
        raise fail(broken)
    source_start = trailer.source_start(size)
    metadata_start = trailer.metadata_start(size)
    if not is_executable(f.mode):
        raise ArtifactVerificationError(not_executable_message(name))
    if trailer.metadata_len > GO_MAX_METADATA_BYTES:
        raise fail(
            f"metadata region is {trailer.metadata_len} bytes, more than the "
            f"{GO_MAX_METADATA_BYTES}-byte limit"
        )

    binary_digest = _sha256_range(f, 0, source_start)
    if binary_digest != trailer.binary_sha256:
        raise fail(
            "binary region SHA-256 does not match the trailer "
            f"(trailer {trailer.binary_sha256.hex()}, region {binary_digest.hex()})"
        )
    try:
        metadata = parse_metadata(f.read_at(metadata_start, trailer.metadata_len))
        schema_version = schema_version_of(metadata)
    except ValueError as exc:
        raise fail(str(exc)) from None
    _verify_sources(f, metadata, source_start, trailer.source_len, fail)
    if not f.unchanged_since_open():
        raise fail("file changed while it was being verified")
    return VerifiedArtifact(
        path=f.path,
        language=Language.GO,
        schema_version=schema_version,
        size_bytes=size,
        cache_digest=stored_cache_digest(metadata),
    )


def _sha256_range(f: OpenFile, start: int, end: int) -> bytes:
    h = hashlib.sha256()
    for chunk in f.iter_range(start, end):
        h.update(chunk)
    return h.digest()


def _verify_sources(
    f: OpenFile,
    metadata: dict[str, Any],
    source_start: int,
    source_len: int,
    fail: Callable[[str], ArtifactVerificationError],
) -> None:
    """Multi-file source region (ADR-0015): each listed file must be in range and intact."""
    sources = metadata.get("sources")
    if sources is None:
        return  # single-source bundle: the region is display text with no recorded digest
    if not isinstance(sources, list):
        raise fail("metadata sources is not a list")
    paths: set[str] = set()
    listed = 0
    for index, entry in enumerate(sources):
        where = f"metadata sources[{index}]"
        if not isinstance(entry, dict):
            raise fail(f"{where} is not a mapping")
        path = entry.get("path")
        offset = entry.get("offset")
        length = entry.get("length")
        digest = entry.get("sha256")
        if not isinstance(path, str) or not path:
            raise fail(f"{where}.path is missing or empty")
        if path in paths:
            raise fail(f"{where}.path {quote(path)} is listed twice")
        paths.add(path)
        for field, value in (("offset", offset), ("length", length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise fail(f"{where}.{field} is not a non-negative integer")
        assert isinstance(offset, int) and isinstance(length, int)
        if offset + length > source_len:
            raise fail(
                f"{where} ({quote(path)}) ends at {quote(offset + length)}, past the "
                f"{source_len}-byte source region"
            )
        # Files are concatenated, so together they fit in the region. Without this bound,
        # entries repeating one large range would make verification hash it without end.
        listed += length
        if listed > source_len:
            raise fail(
                f"metadata sources list {listed} bytes by {where}, more than the "
                f"{source_len}-byte source region: the listed files overlap"
            )
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise fail(f"{where}.sha256 is not 64 lowercase hex digits")
        start = source_start + offset
        actual = _sha256_range(f, start, start + length).hex()
        if actual != digest:
            raise fail(
                f"source region file {quote(path)} SHA-256 does not match the metadata "
                f"(metadata {digest}, region {actual})"
            )
    entrypoint = metadata.get("entrypoint_path")
    # isinstance first: YAML can give a list or a mapping, which a set lookup cannot hash.
    if entrypoint is not None and (not isinstance(entrypoint, str) or entrypoint not in paths):
        raise fail(f"metadata entrypoint_path {quote(entrypoint)} is not one of the listed sources")
    dag_paths = metadata.get("dag_source_paths")
    if dag_paths is not None:
        if not isinstance(dag_paths, dict):
            raise fail("metadata dag_source_paths is not a mapping")
        for dag_id, value in dag_paths.items():
            if not isinstance(value, str) or value not in paths:
                raise fail(
                    f"metadata dag_source_paths[{quote(dag_id)}] {quote(value)} is not one of "
                    "the listed sources"
                )
