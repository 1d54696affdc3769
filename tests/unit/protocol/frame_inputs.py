"""Inputs for the frame decoder's tests, shared by the unit properties
(``test_frames.py``) and the fuzz run (``tests/fuzz/test_fuzz_frames.py``): JSON-like values,
hostile msgpack prefixes, length-headed chunks, a reader over bytes, and the stream contract
(frames within the limit, then the end or a typed error) checked over a whole stream.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from hypothesis import strategies as st

from taskhandler_operator.protocol.frames import FrameTooLarge, FrameTruncated, read_frame

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)

# Headers claiming huge sizes, nested containers, extension types, bad UTF-8: the shapes a
# hostile runtime would send, plus plain random bytes.
_PREFIXES = st.sampled_from(
    [
        b"",
        b"\x92\x00",  # [0, …
        b"\x93\x00\xc0",  # [0, nil, …
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 billion items
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 4 billion pairs
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\xc9\xff\xff\xff\xff\xff",  # ext32
        b"\x91" * 5000,  # nesting deeper than any decoder's stack
        b"\xd7\xff" + b"\xff" * 8,  # timestamp64 past datetime's range
        b"\x92\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # id 2^64-1
    ]
)
hostile_payloads = st.builds(lambda p, tail: p + tail, _PREFIXES, st.binary(max_size=64))


def length_headed(
    lengths: st.SearchStrategy[int], bodies: st.SearchStrategy[bytes]
) -> st.SearchStrategy[bytes]:
    """A frame header claiming a drawn length, followed by a drawn body of any length."""
    return st.builds(lambda n, body: struct.pack(">I", n) + body, lengths, bodies)


def reader_with(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def read_to_end(
    stream: bytes,
    limit: int,
    seconds_per_frame: float,
    each: Callable[[bytes], object] = lambda payload: None,
) -> None:
    """Read ``stream`` frame by frame with ``limit``, each read bounded by
    ``seconds_per_frame``: each payload is within the limit (and handed to ``each``) until the
    stream ends, a ``FrameTooLarge`` naming the length and the limit, or a ``FrameTruncated``;
    it fails if none of those comes."""
    reader = reader_with(stream)
    for _ in range(len(stream) + 1):
        try:
            payload = await asyncio.wait_for(read_frame(reader, limit), seconds_per_frame)
        except FrameTooLarge as exc:
            assert exc.length > exc.limit == limit
            return
        except FrameTruncated:
            return
        if payload is None:
            return
        assert len(payload) <= limit
        each(payload)
    raise AssertionError("read_frame neither ended nor failed")
