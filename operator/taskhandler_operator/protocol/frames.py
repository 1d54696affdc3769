"""Length-prefixed msgpack frames of the Lang-SDK comm channel.

Wire shape (reference ``airflow-langsdk.md`` §6.1): a 4-byte big-endian unsigned length ``N``
followed by ``N`` bytes holding one msgpack array.

* Request frames (runtime → supervisor): ``[id, body, carrier]``; Go runtimes send ``[id, body]``.
* Response frames (supervisor → runtime): ``[id, body, error]``; always encoded with 3 elements.

Encoding and decoding of a payload are pure functions. :func:`read_frame` is the one I/O helper:
it checks the declared length against the limit *before* reading the body, so a hostile length
never turns into an allocation.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from taskhandler_operator.limits import MAX_FRAME_SIZE

__all__ = [
    "HEADER_SIZE",
    "FrameError",
    "FrameTooLarge",
    "FrameTruncated",
    "MalformedFrame",
    "RequestFrame",
    "ResponseFrame",
    "decode_request",
    "decode_response",
    "encode_payload",
    "encode_request",
    "encode_response",
    "read_frame",
]

HEADER_SIZE = 4
# The wire length field is a uint32; larger bodies cannot be framed at all.
_MAX_WIRE_LENGTH = 2**32 - 1
_HEADER = struct.Struct(">I")

Body = dict[str, Any]


class FrameError(ValueError):
    """A frame that cannot be read or decoded."""


class FrameTooLarge(FrameError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class FrameTruncated(FrameError):
    """The stream ended inside a frame (header or body)."""


class MalformedFrame(FrameError):
    """The payload is not msgpack, or not an array of the frame's shape."""


@dataclass(frozen=True, slots=True)
class RequestFrame:
    id: int
    body: Body | None
    carrier: Body | None = None


@dataclass(frozen=True, slots=True)
class ResponseFrame:
    id: int
    body: Body | None = None
    error: Body | None = None


def encode_payload(payload: bytes) -> bytes:
    """Prefix an already-packed msgpack payload with its length."""
    if len(payload) > _MAX_WIRE_LENGTH:
        raise FrameTooLarge(len(payload), _MAX_WIRE_LENGTH)
    return _HEADER.pack(len(payload)) + payload


def _pack(value: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True, datetime=True)
    return packed


def encode_request(frame: RequestFrame) -> bytes:
    return encode_payload(_pack([frame.id, frame.body, frame.carrier]))


def encode_response(frame: ResponseFrame) -> bytes:
    return encode_payload(_pack([frame.id, frame.body, frame.error]))


def _unpack(payload: bytes) -> object:
    try:
        # timestamp=3: msgpack timestamp extensions become aware datetimes, which pydantic
        # serializes back to JSON text; other extension types are rejected below.
        return msgpack.unpackb(
            payload, raw=False, timestamp=3, strict_map_key=True, ext_hook=_reject_ext
        )
    except msgpack.ExtraData as exc:
        raise MalformedFrame("payload has bytes after its msgpack value") from exc
    # OverflowError: a timestamp extension beyond what a datetime can hold.
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise MalformedFrame(f"payload is not valid msgpack ({reason})") from exc


def _reject_ext(code: int, data: bytes) -> object:
    # Bodies are plain JSON types; an unknown extension could not be re-emitted as JSON.
    raise ValueError(f"unsupported msgpack extension type {code}")


def _split(payload: bytes) -> tuple[int, Body | None, Body | None]:
    value = _unpack(payload)
    if not isinstance(value, list):
        raise MalformedFrame(f"frame is a msgpack {_kind(value)}, expected an array")
    if len(value) not in (2, 3):
        raise MalformedFrame(f"frame array has {len(value)} elements, expected 2 or 3")
    frame_id = value[0]
    # bool is an int subclass in Python; msgpack true/false is not an id.
    if not isinstance(frame_id, int) or isinstance(frame_id, bool):
        raise MalformedFrame(f"frame id is a msgpack {_kind(frame_id)}, expected an integer")
    if frame_id < 0:
        raise MalformedFrame(f"frame id {frame_id} is negative")
    body = _optional_map(value[1], "body")
    third = _optional_map(value[2], "third element") if len(value) == 3 else None
    return frame_id, body, third


def _optional_map(value: object, what: str) -> Body | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    raise MalformedFrame(f"frame {what} is a msgpack {_kind(value)}, expected a map or nil")


def _kind(value: object) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def decode_request(payload: bytes) -> RequestFrame:
    """Decode ``[id, body]`` or ``[id, body, carrier]`` sent by a runtime."""
    frame_id, body, carrier = _split(payload)
    return RequestFrame(frame_id, body, carrier)


def decode_response(payload: bytes) -> ResponseFrame:
    """Decode ``[id, body]`` or ``[id, body, error]`` sent by a supervisor."""
    frame_id, body, error = _split(payload)
    return ResponseFrame(frame_id, body, error)


async def read_frame(reader: asyncio.StreamReader, max_size: int = MAX_FRAME_SIZE) -> bytes | None:
    """Read one frame's payload; ``None`` on a clean end of stream between frames.

    Raises :class:`FrameTooLarge` from the header alone, and :class:`FrameTruncated` when the
    stream ends inside a frame.
    """
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameTruncated(
            f"stream ended after {len(exc.partial)} of {HEADER_SIZE} header bytes"
        ) from exc
    (length,) = _HEADER.unpack(header)
    if length > max_size:
        raise FrameTooLarge(length, max_size)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameTruncated(
            f"stream ended after {len(exc.partial)} of {length} body bytes"
        ) from exc
