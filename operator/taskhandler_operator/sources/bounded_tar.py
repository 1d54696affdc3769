"""``tarfile`` with every header counted before it is read.

The standard library reads a GNU long-name or long-link header (``L``/``K``) and a pax header
(``x``/``g``/``X``) whole, at whatever size the header claims, before handing a member to its
caller: a 768 MiB header in a 0.8 MB ``.tar.gz`` costs about 1.6 GB. It also follows a chain of
such headers by recursion, merges every global header into one dict copied into each later
member, and reads GNU sparse maps of any length. :class:`BoundedTarFile` refuses each of those
above a cap, *before* the bytes are read, with :class:`~taskhandler_operator.sources.errors.
ArchiveRefused`; below the caps it behaves exactly as ``tarfile.TarFile``.

The hooks are ``TarInfo._proc_member`` (documented in ``tarfile`` as the method a subclass
overrides), ``_proc_sparse`` and ``_proc_gnusparse_10``: they are private, so
``tests/unit/sources/test_bounded_tar.py`` pins their behaviour on the Python in use.
"""

from __future__ import annotations

import tarfile
from typing import Any

from taskhandler_operator.sources.errors import ArchiveRefused

__all__ = [
    "MAX_GLOBAL_KEYS",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_CHAIN",
    "MAX_SPARSE_ENTRIES",
    "BoundedTarFile",
]

#: One GNU long name/link or pax header. Names are refused over 1 KiB and link targets over
#: 4 KiB anyway; pax headers of real tools (long names, xattrs, ACLs) hold a few KiB.
MAX_HEADER_BYTES = 1 << 20
#: Extension headers before one member: GNU tar writes up to 2 (L, K), pax writers 1-2 (g, x).
MAX_HEADER_CHAIN = 8
#: Keys of the global pax header, copied into every later member (git archive writes one).
MAX_GLOBAL_KEYS = 256
#: Data regions of one GNU sparse file (its map is read before its data).
MAX_SPARSE_ENTRIES = 10_000
_SPARSE_NUMBER_DIGITS = 24  # a 1.0 sparse map's numbers: 64-bit offsets fit in 20 digits
_BLOCK = tarfile.BLOCKSIZE
_tarfile: Any = tarfile  # its helper nti() is not in the type stubs

_EXTENSION_TYPES = {
    tarfile.GNUTYPE_LONGNAME: "GNU long-name",
    tarfile.GNUTYPE_LONGLINK: "GNU long-link",
    tarfile.XHDTYPE: "pax",
    tarfile.XGLTYPE: "pax global",
    tarfile.SOLARIS_XHDTYPE: "Solaris pax",
}


class BoundedTarInfo(tarfile.TarInfo):
    def _proc_member(self, tar: Any) -> Any:
        kind = _EXTENSION_TYPES.get(self.type)
        if kind is None:
            tar.header_chain = 0  # a member: the chain of headers before it ends here
            if len(tar.pax_headers) > MAX_GLOBAL_KEYS:
                raise ArchiveRefused(
                    f"the global pax headers hold {len(tar.pax_headers)} keys, more than "
                    f"{MAX_GLOBAL_KEYS}"
                )
            return super()._proc_member(tar)  # type: ignore[misc]
        if self.size > MAX_HEADER_BYTES:
            raise ArchiveRefused(
                f"a {kind} header of {self.size} bytes (at offset {self.offset}), more than "
                f"the {MAX_HEADER_BYTES}-byte cap on one header"
            )
        tar.header_chain += 1
        if tar.header_chain > MAX_HEADER_CHAIN:
            raise ArchiveRefused(
                f"more than {MAX_HEADER_CHAIN} extension headers in a row (at offset {self.offset})"
            )
        return super()._proc_member(tar)  # type: ignore[misc]

    def _proc_sparse(self, tar: Any) -> Any:
        # tarfile's loop over the extension blocks, with a count.
        structs, isextended, origsize = self._sparse_structs  # type: ignore[attr-defined]
        del self._sparse_structs  # type: ignore[attr-defined]
        while isextended:
            if len(structs) > MAX_SPARSE_ENTRIES:
                raise _too_sparse(self.name)
            buf = tar.fileobj.read(_BLOCK)
            if len(buf) < _BLOCK:
                raise tarfile.ReadError("unexpected end of data in a sparse header")
            pos = 0
            for _ in range(21):
                try:
                    offset = _tarfile.nti(buf[pos : pos + 12])
                    numbytes = _tarfile.nti(buf[pos + 12 : pos + 24])
                except ValueError:
                    break
                if offset and numbytes:
                    structs.append((offset, numbytes))
                pos += 24
            isextended = bool(buf[504])
        self.sparse = structs
        self.offset_data = tar.fileobj.tell()
        tar.offset = self.offset_data + self._block(self.size)  # type: ignore[attr-defined]
        self.size = origsize
        return self

    def _proc_gnusparse_00(self, next: Any, pax_headers: Any, buf: bytes) -> None:
        super()._proc_gnusparse_00(next, pax_headers, buf)  # type: ignore[misc]
        if len(next.sparse) > MAX_SPARSE_ENTRIES:  # bounded already by the header's size
            raise _too_sparse(next.name)

    def _proc_gnusparse_01(self, next: Any, pax_headers: Any) -> None:
        super()._proc_gnusparse_01(next, pax_headers)  # type: ignore[misc]
        if len(next.sparse) > MAX_SPARSE_ENTRIES:
            raise _too_sparse(next.name)

    def _proc_gnusparse_10(self, next: Any, pax_headers: Any, tar: Any) -> None:
        # The 1.0 map sits at the start of the member's data: its entry count and each number
        # are read with a bound (tarfile reads until it has as many numbers as claimed).
        buf = b""
        numbers: list[int] = []
        wanted: int | None = None
        while wanted is None or len(numbers) < wanted:
            while b"\n" not in buf:
                if len(buf) > _SPARSE_NUMBER_DIGITS:
                    raise ArchiveRefused(f"entry {next.name!r} has a malformed sparse map")
                more = tar.fileobj.read(_BLOCK)
                if not more:
                    raise tarfile.ReadError("unexpected end of data in a sparse map")
                buf += more
            line, buf = buf.split(b"\n", 1)
            if not line.isdigit() or len(line) > _SPARSE_NUMBER_DIGITS:
                raise ArchiveRefused(f"entry {next.name!r} has a malformed sparse map")
            if wanted is None:
                if int(line) > MAX_SPARSE_ENTRIES:
                    raise _too_sparse(next.name)
                wanted = int(line) * 2
            else:
                numbers.append(int(line))
        next.offset_data = tar.fileobj.tell()
        next.sparse = list(zip(numbers[::2], numbers[1::2], strict=True))


def _too_sparse(name: str) -> ArchiveRefused:
    return ArchiveRefused(
        f"entry {name!r} is a sparse file of more than {MAX_SPARSE_ENTRIES} data regions"
    )


class BoundedTarFile(tarfile.TarFile):
    """A ``TarFile`` reading :class:`BoundedTarInfo` headers; open it with ``.open()``."""

    tarinfo = BoundedTarInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before the base class reads the first member (it does so in __init__).
        self.header_chain = 0
        super().__init__(*args, **kwargs)
