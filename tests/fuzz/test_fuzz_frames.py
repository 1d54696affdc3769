"""Fuzz the frame decoder: payloads (``decode_request``/``decode_response``) and streams
(``read_frame``), at the fuzzing budget.

Inputs: the unit tests' hostile msgpack prefixes (tests/unit/protocol/frame_inputs.py), random
bytes, real msgpack arrays of drawn shapes and values (what a confused runtime could send), and
streams of several encoded frames with junk between them. Contract (docs/protocol.md): a payload
decodes to a frame or raises ``MalformedFrame``; a stream yields payloads within the limit, then
its end, ``FrameTooLarge`` or ``FrameTruncated``; nothing else escapes; under 64 MiB per example.
"""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskhandler_operator.limits import MAX_FRAME_SIZE
from taskhandler_operator.protocol.frames import (
    MalformedFrame,
    RequestFrame,
    ResponseFrame,
    decode_request,
    decode_response,
    encode_payload,
)
from tests.fuzz.budget import FUZZ, bounded_memory
from tests.unit.protocol.frame_inputs import (
    hostile_payloads,
    json_values,
    length_headed,
    read_to_end,
)

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

# msgpack values beyond JSON's: binary, floats of every kind, large and negative integers.
_VALUES = st.one_of(
    json_values,
    st.binary(max_size=64),
    st.floats(),
    st.integers(-(2**63), 2**64 - 1),
)
_FRAMES = st.lists(_VALUES, max_size=4).map(
    lambda items: msgpack.packb(items, use_bin_type=True)
) | st.tuples(st.integers(-5, 2**64 - 1), _VALUES, _VALUES).map(
    lambda t: msgpack.packb(list(t), use_bin_type=True)
)
PAYLOADS = st.one_of(hostile_payloads, _FRAMES, st.binary(max_size=8192))


@FUZZ
@given(payload=PAYLOADS)
def test_any_payload_is_a_frame_or_malformed(payload: bytes) -> None:
    with bounded_memory():
        for decode, kind in ((decode_request, RequestFrame), (decode_response, ResponseFrame)):
            try:
                frame = decode(payload)
            except MalformedFrame as exc:
                assert str(exc)
            else:
                assert isinstance(frame, kind) and isinstance(frame.id, int) and frame.id >= 0


_CHUNKS = st.one_of(
    PAYLOADS.map(encode_payload),
    st.binary(max_size=16),
    length_headed(
        st.sampled_from([0, 1, 255, MAX_FRAME_SIZE, MAX_FRAME_SIZE + 1, 2**31, 2**32 - 1]),
        st.binary(max_size=64),
    ),
)


@FUZZ
@given(
    chunks=st.lists(_CHUNKS, max_size=6),
    limit=st.sampled_from([16, 256, 4096, MAX_FRAME_SIZE, 2**32 - 1]),
)
async def test_any_stream_is_frames_then_an_end_or_a_typed_error(
    chunks: list[bytes], limit: int
) -> None:
    with bounded_memory():
        await read_to_end(b"".join(chunks), limit, 30, each=_decoded_or_malformed)


def _decoded_or_malformed(payload: bytes) -> None:
    with contextlib.suppress(MalformedFrame):
        decode_request(payload)
