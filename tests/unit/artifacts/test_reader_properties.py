"""Property: any bytes give a candidate, a skip, a listing problem or a typed error, in bounds.

One property per reader, over structure-aware strategies that reach past each format's first
checks (a trailer with arbitrary region lengths and YAML, a zip with arbitrary 64-bit zip64
values, a layout line with arbitrary JSON), plus plain random bytes. For each example:

* the listing reader returns a :class:`Candidate` or None, and ``list_candidates`` a candidate
  or a :class:`ListingProblem`: nothing escapes;
* ``verify_artifact`` returns or raises :class:`ArtifactVerificationError`: nothing else;
* within a memory bound (tracemalloc peak) and Hypothesis' per-example deadline, both far above
  what a well-behaved reader needs for inputs of this size, and far below what an unbounded
  expansion (an alias chain, a claimed 4 GiB allocation) would take.
"""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhandler_devenv.packers import (
    GO_FOOTER_MAGIC,
    GO_TRAILER,
    hostile_jar,
    render_manifest,
)
from taskhandler_operator.artifacts.listing import READERS, list_candidates
from taskhandler_operator.artifacts.models import Candidate, Language, OpenFile
from taskhandler_operator.artifacts.verify import ArtifactVerificationError, verify_artifact

pytestmark = pytest.mark.timeout(600)

BOUNDED = settings(
    max_examples=150,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_PEAK_BYTES = 48 * 1024 * 1024
NAMES = {Language.GO: "artifact", Language.JAVA: "a.jar", Language.TYPESCRIPT: "a.min.mjs"}


@contextmanager
def bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"peak {peak} bytes"


def check_contract(language: Language, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as raw, bounded_memory():
        path = Path(raw) / NAMES[language]
        path.write_bytes(data)
        path.chmod(0o755)
        with OpenFile.open(path) as f:
            candidate = READERS[language](f, path.name)
        assert candidate is None or isinstance(candidate, Candidate)
        listing = list_candidates(Path(raw), language)
        assert len(listing.candidates) + len(listing.problems) <= 1
        try:
            verify_artifact(path, language, bundle_root=path.parent, timeout=30)
        except ArtifactVerificationError as exc:
            assert str(exc) and "\n" not in str(exc)
            assert len(str(exc)) < 2000  # never an unbounded quote


# -- Go --------------------------------------------------------------------------------------

EMPTY_SHA = hashlib.sha256(b"").hexdigest()
# Metadata that passes every check up to the sources, so hostile pieces reach the deep ones.
VALID_YAML = (
    "sdk: {supervisor_schema_version: '2026-10-30'}\n"
    f"sources: [{{path: a, offset: 0, length: 0, sha256: {EMPTY_SHA}}}]\n"
)
# An alias chain: 10**8 strings once expanded (what a careless error message would print).
ALIAS_CHAIN = "l0: &l0 [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)
)
HOSTILE_YAML = st.sampled_from(
    [
        ALIAS_CHAIN + "entrypoint_path: *l8\n",
        ALIAS_CHAIN + "dag_source_paths: {d: *l8}\n",
        ALIAS_CHAIN + "dag_source_paths: {*l8 : x}\n",
        "entrypoint_path: " + "p" * 200_000 + "\n",
        "dag_source_paths: {" + "k" * 200_000 + ": nope}\n",
        f"sources: [{{path: a, offset: 0, length: 18446744073709551615, sha256: {EMPTY_SHA}}}]\n",
        "sources: [{path: a, offset: -1, length: 1}]\n",
        "sources: [" + ",".join(["{path: a, offset: 0, length: 0}"] * 2) + "]\n",
        "entrypoint_path: [1, 2]\n",
        "dag_source_paths: {[1]: a}\n",
        "n: " + "9" * 5000 + "\n",
        "sdk: {supervisor_schema_version: '" + "9" * 5000 + "'}\n",
        "x: " + "[" * 200 + "]" * 200 + "\n",
        "!!python/object:os.system {}\n",
        "\ufeff",
        "\t\x00\x85",
    ]
)


@st.composite
def go_bundles(draw: st.DrawFn) -> bytes:
    binary = draw(st.binary(min_size=1, max_size=64))
    metadata = VALID_YAML + draw(HOSTILE_YAML) + draw(st.text(max_size=32))
    meta = metadata.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):  # a valid trailer, so the hostile metadata is what is checked
        return (
            binary
            + meta
            + GO_TRAILER.pack(
                0, len(meta), 1, hashlib.sha256(binary).digest(), bytes(12), GO_FOOTER_MAGIC
            )
        )
    lengths = st.one_of(
        st.just(None), st.integers(0, 2**32 - 1), st.sampled_from([0, 2**31, 2**32 - 1])
    )
    source = draw(st.binary(max_size=64))
    source_len, meta_len = draw(lengths), draw(lengths)
    trailer = GO_TRAILER.pack(
        len(source) if source_len is None else source_len,
        len(meta) if meta_len is None else meta_len,
        draw(st.sampled_from([1, 1, 0, 2**32 - 1])),
        draw(st.sampled_from([hashlib.sha256(binary).digest(), bytes(32)])),
        draw(st.sampled_from([bytes(12), b"\x01" * 12])),
        GO_FOOTER_MAGIC,
    )
    return binary + source + meta + trailer


@BOUNDED
@given(data=st.one_of(go_bundles(), st.binary(max_size=2048)))
def test_go_reader_contract(data: bytes) -> None:
    check_contract(Language.GO, data)


# -- Java ------------------------------------------------------------------------------------

# Boundary values most of the time: a random 64-bit value is nearly always just "too big".
U64 = st.one_of(
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)
U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 0xFFFF, 0xFFFFFFFF]))


def mostly(draw: st.DrawFn, good: int, bad: st.SearchStrategy[int]) -> int:
    """The consistent value three times in four, so a drawn archive gets past its first checks."""
    return good if draw(st.integers(0, 3)) else draw(bad)


@st.composite
def jars(draw: st.DrawFn) -> bytes:
    """A one-entry stored zip whose header fields, zip64 extras and end records are drawn."""
    name = draw(st.sampled_from([b"META-INF/MANIFEST.MF", b"META-INF/MANIFEST.MF", b"x"]))
    attributes = {
        **draw(
            st.dictionaries(
                st.sampled_from(["Main-Class", "Airflow-Cache-Digest", "X"]),
                st.text(max_size=40),
                max_size=3,
            )
        ),
        "Airflow-Cache-Digest": "d" * 64,
        "Airflow-Supervisor-Schema-Version": "2026-10-30",
    }
    data = draw(st.one_of(st.just(render_manifest(attributes)), st.binary(max_size=128)))
    method = draw(st.sampled_from([0, 0, 8, 99]))
    if method == 8:
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        data = packer.compress(data) + packer.flush()
    crc = mostly(draw, zlib.crc32(data), st.just(0))
    size = mostly(draw, len(data), U32)
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, size, size, len(name), 0
    )
    body = local + name + data
    extra = b""
    # 0xFFFFFFFF says "the real value is in the zip64 extra field".
    offset = draw(st.sampled_from([0, 0xFFFFFFFF, 0xFFFFFFFF, 12345]))
    if offset == 0xFFFFFFFF or draw(st.booleans()):
        values = draw(st.lists(U64, min_size=1, max_size=3))
        extra = struct.pack("<HH", 1, 8 * len(values)) + b"".join(
            v.to_bytes(8, "little") for v in values
        )
    central = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, method, 0, 0, crc, size, size,
            len(name), len(extra), 0, 0, 0, 0, offset,
        )
        + name
        + extra
    )  # fmt: skip
    cd_at = len(body)
    if draw(st.booleans()):
        zip64_at = cd_at + len(central)
        tail = struct.pack(
            "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, mostly(draw, 1, U64),
            mostly(draw, 1, U64), mostly(draw, len(central), U64), mostly(draw, cd_at, U64),
        )  # fmt: skip
        tail += struct.pack("<4sIQI", b"PK\x06\x07", 0, zip64_at, 1)
        tail += struct.pack(
            "<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0
        )
    else:
        tail = struct.pack(
            "<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, mostly(draw, 1, st.just(0xFFFF)),
            mostly(draw, len(central), U32), mostly(draw, cd_at, U32), 0,
        )  # fmt: skip
    # Rarely, bytes after the end record (an archive comment its length does not announce).
    junk = draw(st.sampled_from([b"", b"", b"", b"junk"]))
    return body + central + tail + junk


# A valid handler JAR whose zip64 fields alone are drawn.
zip64_jars = st.builds(hostile_jar, manifest_offset64=st.none() | U64, cd_offset64=st.none() | U64)


@BOUNDED
@given(data=st.one_of(zip64_jars, jars(), st.binary(max_size=2048)))
def test_java_reader_contract(data: bytes) -> None:
    check_contract(Language.JAVA, data)


# -- TypeScript ------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(max_size=20),
        st.sampled_from(["0" * 16, "f" * 16, "0" * 64, "1.0", "2026-10-30", "\u2028", "*/"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.sampled_from(
                ["code", "metadata", "sources", "start", "end", "sha256", "path", "sdk",
                 "supervisor_schema_version", "airflow_bundle_metadata_version"]
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)  # fmt: skip


@st.composite
def ts_bundles(draw: st.DrawFn) -> bytes:
    layout = json.dumps(draw(JSON_VALUES)).encode()
    metadata = draw(
        st.one_of(
            st.just(json.dumps(draw(JSON_VALUES)).encode()),
            st.binary(max_size=64),
            st.just("{}".encode(draw(st.sampled_from(["utf-16", "utf-32", "utf-8"])))),
        )
    )
    separator = draw(st.sampled_from([b"\n", b"\r\n", "\u2029".encode(), b""]))
    tail = draw(st.binary(max_size=64))
    return (
        b"//# airflowBundle=" + layout + separator + b"//# airflowMetadata=" + metadata + b"\n"
    ) + tail


@BOUNDED
@given(data=st.one_of(ts_bundles(), st.binary(max_size=2048)))
def test_typescript_reader_contract(data: bytes) -> None:
    check_contract(Language.TYPESCRIPT, data)
