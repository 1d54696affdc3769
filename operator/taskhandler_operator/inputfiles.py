"""One bounded reader for every file the CLI takes: bytes, type, encoding, nesting, aliases.

A file named on the command line may be anything: a FIFO nobody writes to, ``/dev/zero``, a
folder, a gigabyte, Latin-1, a YAML alias bomb, JSON nested a hundred thousand deep. Each is
refused here before it is parsed, with an :class:`InputError` whose message is one line naming
the file and the problem (the commands print it and exit 2):

* the file is opened with ``O_NONBLOCK`` (a FIFO without a writer does not block the open) and
  checked with ``fstat`` on the open descriptor: only a regular file is read;
* at most ``max_bytes`` are read; more is refused, not cut;
* text must be UTF-8 (the offset of the first bad byte is named);
* YAML goes through PyYAML's safe loader with aliases refused (``*ref`` repeats a node, and a
  few lines of them expand into gigabytes once printed or converted) and nesting bounded;
* JSON nesting is counted before ``json.loads`` sees the text.

Standard library only, except the YAML loader which imports PyYAML when first used (the
``fetch`` command, which reads JSON in every probe pod, never pays for it).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_INPUT_BYTES",
    "InputError",
    "decode_utf8",
    "load_yaml_documents",
    "parse_json",
    "read_bounded",
    "read_text",
]

MAX_INPUT_BYTES = 4 << 20  # a bundle, Secret or manifest file is kilobytes
MAX_DEPTH = 64  # a TaskHandlerBundle is about 6 levels deep
MAX_YAML_DOCUMENTS = 16


class InputError(ValueError):
    """A file or text the CLI cannot accept; the message is one line naming it and why."""


def read_bounded(path: Path | str, what: str = "", *, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``; never blocks on a FIFO
    or a device and never reads more than ``max_bytes + 1`` bytes."""
    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise InputError(f"{name}: cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{name}: is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{name}: is not a regular file")
        if st.st_size > max_bytes:
            raise InputError(f"{name}: is {st.st_size} bytes, more than the {max_bytes}-byte limit")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # the file may grow after fstat
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise InputError(f"{name}: is more than the {max_bytes}-byte limit")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def decode_utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{name}: is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_text(path: Path | str, what: str = "", *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_bounded`, decoded as UTF-8."""
    name = f"{what} {path}" if what else str(path)
    return decode_utf8(read_bounded(path, what, max_bytes=max_bytes), name)


# JSON strings (skipped whole) and brackets: the nesting is counted without parsing.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def parse_json(text: str, name: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` with nesting bounded (deep JSON costs recursion, not just bytes)."""
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        bracket = match.group()
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                raise InputError(f"{name}: is nested more than {max_depth} levels deep")
        elif bracket in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{name}: is not JSON ({' '.join(str(exc).split())[:200]})") from None


def load_yaml_documents(text: str, name: str, *, max_depth: int = MAX_DEPTH) -> list[Any]:
    """The non-empty YAML documents of ``text`` (safe loader, no aliases, bounded nesting)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise InputError(
                    f"{name}: YAML aliases (*{event.anchor}) are not accepted "
                    f"(line {event.start_mark.line + 1}); write the value out"
                )
            self.depth += 1
            if self.depth > max_depth:
                raise InputError(f"{name}: is nested more than {max_depth} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    try:
        documents: list[Any] = []
        for document in yaml.load_all(text, Loader=_Loader):
            if document is not None:
                documents.append(document)
            if len(documents) > MAX_YAML_DOCUMENTS:
                raise InputError(f"{name}: holds more than {MAX_YAML_DOCUMENTS} YAML documents")
        return documents
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: is not YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise InputError(f"{name}: is nested too deeply") from None
