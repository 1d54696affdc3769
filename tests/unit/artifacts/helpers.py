"""Small helpers shared by the artifact tests."""

from __future__ import annotations

from pathlib import Path

from taskhandler_operator.artifacts.models import Candidate, OpenFile


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    """XOR one byte of the file in place (negative offsets count from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def read_with(reader: object, path: Path, rel_path: str | None = None) -> Candidate | None:
    """Run a listing reader on one file, as the listing does."""
    assert callable(reader)
    with OpenFile.open(path) as f:
        result = reader(f, rel_path if rel_path is not None else path.name)
    assert result is None or isinstance(result, Candidate)
    return result
