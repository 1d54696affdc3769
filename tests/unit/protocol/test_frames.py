from __future__ import annotations

import asyncio
import datetime as dt
import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhandler_operator.limits import MAX_FRAME_SIZE
from taskhandler_operator.protocol.frames import (
    FrameTooLarge,
    FrameTruncated,
    MalformedFrame,
    RequestFrame,
    ResponseFrame,
    decode_request,
    decode_response,
    encode_payload,
    encode_request,
    encode_response,
    read_frame,
)
from tests.unit.protocol.frame_inputs import (
    hostile_payloads,
    json_values,
    length_headed,
    read_to_end,
    reader_with,
)

bodies = st.none() | st.dictionaries(st.text(), json_values, max_size=5)
ids = st.integers(0, 2**63 - 1)


def payload_of(value: object) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True, datetime=True)
    return packed


def split(frame: bytes) -> bytes:
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


@given(ids, bodies, bodies)
def test_request_round_trip(frame_id: int, body: dict | None, carrier: dict | None) -> None:
    frame = RequestFrame(frame_id, body, carrier)
    assert decode_request(split(encode_request(frame))) == frame


@given(ids, bodies, bodies)
def test_response_round_trip(frame_id: int, body: dict | None, error: dict | None) -> None:
    frame = ResponseFrame(frame_id, body, error)
    assert decode_response(split(encode_response(frame))) == frame


def test_empty_ack_is_three_elements_on_the_wire() -> None:
    # The reference's example: an empty acknowledgement of request 5 is 93 05 c0 c0.
    assert encode_response(ResponseFrame(5)) == bytes.fromhex("00000004" + "9305c0c0")


def test_two_element_request_as_go_sends_it() -> None:
    frame = decode_request(payload_of([3, {"type": "GetVariable", "key": "k"}]))
    assert frame == RequestFrame(3, {"type": "GetVariable", "key": "k"}, None)


def test_two_element_response() -> None:
    assert decode_response(payload_of([0, None])) == ResponseFrame(0, None, None)


def test_msgpack_timestamps_become_datetimes() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    payload = msgpack.packb([1, {"at": when}, None], datetime=True)
    assert decode_request(payload).body == {"at": when}


@pytest.mark.parametrize("seconds", [2**62, -(2**62)])
def test_timestamp_beyond_datetime_range_is_a_malformed_frame(seconds: int) -> None:
    # timestamp 96: 4-byte nanoseconds, 8-byte signed seconds (ext type -1)
    stamp = b"\xc7\x0c\xff" + struct.pack(">Iq", 0, seconds)
    with pytest.raises(MalformedFrame) as info:
        decode_request(b"\x92\x00\x81\xa2at" + stamp)
    assert str(info.value).startswith("payload is not valid msgpack (OverflowError: ")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"id": 1}, "frame is a msgpack map, expected an array"),
        ("text", "frame is a msgpack string, expected an array"),
        (7, "frame is a msgpack integer, expected an array"),
        ([1], "frame array has 1 elements, expected 2 or 3"),
        ([1, None, None, None], "frame array has 4 elements, expected 2 or 3"),
        (["1", None], "frame id is a msgpack string, expected an integer"),
        ([True, None], "frame id is a msgpack boolean, expected an integer"),
        ([1.0, None], "frame id is a msgpack float, expected an integer"),
        ([None, None], "frame id is a msgpack nil, expected an integer"),
        ([-1, None], "frame id -1 is negative"),
        ([1, [1, 2]], "frame body is a msgpack array, expected a map or nil"),
        ([1, "body"], "frame body is a msgpack string, expected a map or nil"),
        ([1, None, 5], "frame third element is a msgpack integer, expected a map or nil"),
        ([1, None, b"x"], "frame third element is a msgpack binary, expected a map or nil"),
        (
            [1, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)],
            "frame body is a msgpack datetime, expected a map or nil",
        ),
    ],
)
def test_malformed_frames(value: object, message: str) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode_request(payload_of(value))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "payload is not valid msgpack (ValueError: Unpack failed: incomplete input)"),
        (b"\xc1" * 4, "payload is not valid msgpack (FormatError)"),
        (b"\x92\x01\xc0\xc0", "payload has bytes after its msgpack value"),
        (b"\x92\x01\xd6\x01\x00\x00\x00\x00", "unsupported msgpack extension type 1"),
        (b"\x92\x01\x81\x01\x02", "payload is not valid msgpack"),  # integer map key
        (b"\x92\x01\xa2\xff\xfe", "payload is not valid msgpack"),  # not UTF-8
    ],
)
def test_undecodable_payloads(payload: bytes, message: str) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode_request(payload)
    assert message in str(info.value)


async def test_read_frames_until_clean_end() -> None:
    stream = encode_request(RequestFrame(0, {"a": 1})) + encode_request(RequestFrame(1, None))
    reader = reader_with(stream)
    first = await read_frame(reader)
    second = await read_frame(reader)
    assert first is not None and decode_request(first).body == {"a": 1}
    assert second is not None and decode_request(second).id == 1
    assert await read_frame(reader) is None


async def test_size_limit_is_enforced_from_the_header_alone() -> None:
    # Only the header is available and the stream stays open: a reader that tried to read
    # the body would wait forever, so returning at all proves the check comes first.
    reader = reader_with(struct.pack(">I", MAX_FRAME_SIZE + 1), eof=False)
    with pytest.raises(FrameTooLarge) as info:
        await asyncio.wait_for(read_frame(reader), 5)
    assert str(info.value) == "frame of 16777217 bytes exceeds the limit of 16777216 bytes"
    assert info.value.length == MAX_FRAME_SIZE + 1


async def test_configurable_limit() -> None:
    frame = encode_request(RequestFrame(0, {"k": "v" * 100}))
    with pytest.raises(FrameTooLarge, match="exceeds the limit of 64 bytes"):
        await read_frame(reader_with(frame), max_size=64)
    assert await read_frame(reader_with(frame), max_size=len(frame) - 4) == frame[4:]


async def test_truncated_header() -> None:
    with pytest.raises(FrameTruncated, match="stream ended after 2 of 4 header bytes"):
        await read_frame(reader_with(b"\x00\x00"))


async def test_truncated_body() -> None:
    frame = encode_request(RequestFrame(0, {"a": 1}))
    with pytest.raises(FrameTruncated, match=f"stream ended after 3 of {len(frame) - 4} body"):
        await read_frame(reader_with(frame[:7]))


def test_encode_payload_rejects_what_uint32_cannot_frame() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 2**32

    with pytest.raises(FrameTooLarge):
        encode_payload(Huge())


# -- properties: any bytes are a frame or a typed error, in bounded time and memory ----------

BOUNDED = settings(
    max_examples=300,
    deadline=None,  # never on timing (tests/conftest.py)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@BOUNDED
@given(payload=st.one_of(hostile_payloads, st.binary(max_size=4096)))
def test_any_payload_decodes_or_is_a_malformed_frame(payload: bytes) -> None:
    tracemalloc.start()
    try:
        try:
            frame = decode_request(payload)
        except MalformedFrame as exc:
            assert str(exc)
        else:
            assert isinstance(frame, RequestFrame)
            assert isinstance(frame.id, int) and frame.id >= 0
            assert frame.body is None or isinstance(frame.body, dict)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024


@BOUNDED
@given(
    stream=st.one_of(
        st.binary(max_size=512),
        length_headed(
            st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1, 2**31])),
            st.binary(max_size=256),
        ),
    ),
    limit=st.sampled_from([64, 256, MAX_FRAME_SIZE, 2**32 - 1]),
)
async def test_any_stream_gives_payloads_an_end_or_a_typed_error(stream: bytes, limit: int) -> None:
    await read_to_end(stream, limit, 5)


# -- the frame-size contract at the uint32 boundary ---------------------------------------------


@pytest.mark.parametrize(
    ("length", "limit"),
    [(2**32 - 1, MAX_FRAME_SIZE), (2**32 - 1, 2**32 - 2), (MAX_FRAME_SIZE + 1, MAX_FRAME_SIZE)],
)
async def test_frame_too_large_carries_length_and_limit(length: int, limit: int) -> None:
    with pytest.raises(FrameTooLarge) as info:
        await read_frame(reader_with(struct.pack(">I", length), eof=False), limit)
    assert (info.value.length, info.value.limit) == (length, limit)
    assert str(info.value) == f"frame of {length} bytes exceeds the limit of {limit} bytes"


async def test_the_largest_wire_length_is_within_a_limit_of_the_same_size() -> None:
    # Equal to the limit is allowed: the body is then awaited (and here the stream ends).
    with pytest.raises(FrameTruncated, match=r"stream ended after 0 of 4294967295 body bytes"):
        await read_frame(reader_with(struct.pack(">I", 2**32 - 1)), 2**32 - 1)


def test_encode_payload_error_carries_the_uint32_limit() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 2**32

    with pytest.raises(FrameTooLarge) as info:
        encode_payload(Huge())
    assert (info.value.length, info.value.limit) == (2**32, 2**32 - 1)


# -- found by mutation testing (docs/mutation-testing.md) -----------------------------------


def test_the_largest_wire_length_can_be_encoded() -> None:
    class Largest(bytes):
        def __len__(self) -> int:
            return 2**32 - 1

    assert encode_payload(Largest()).startswith(b"\xff\xff\xff\xff")


def test_binary_and_datetime_values_are_encoded_as_their_msgpack_types() -> None:
    when = dt.datetime(2026, 10, 30, 12, 0, tzinfo=dt.UTC)
    payload = split(encode_response(ResponseFrame(1, {"b": b"\x01", "t": when})))
    assert b"\xc4\x01\x01" in payload  # bin 8, not a raw string
    assert b"\xd6\xff" in payload  # timestamp 32 extension
    assert decode_response(payload).body == {"b": b"\x01", "t": when}


def test_trailing_bytes_message_in_full() -> None:
    with pytest.raises(MalformedFrame) as info:
        decode_request(b"\x92\x01\xc0\xc0")
    assert str(info.value) == "payload has bytes after its msgpack value"
