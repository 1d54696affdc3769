"""Pure rules for names inside a revision: relative paths, revision ids, store keys.

One function decides whether a path named by an archive entry, an S3 key, a git tree, a fetch
manifest or a download URL may exist inside a revision folder, so every way in refuses the
same things: absolute paths, ``..``, backslashes, control characters, over-long names.
Imported by the ``fetch`` command too, so it stays stdlib-only and cheap to import.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_COMPONENT_BYTES",
    "MAX_PATH_BYTES",
    "UnsafePath",
    "check_name",
    "check_revision_id",
    "safe_rel_path",
]

MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux file systems
MAX_PATH_BYTES = 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Kubernetes object names (DNS-1123 subdomain) are what namespaces and bundles are named with.
# Matched whole (fullmatch): '$' would also match before a final newline ("ns\n").
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_REVISION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class UnsafePath(ValueError):
    """The path may not exist inside a revision; the message says which rule it breaks."""


def safe_rel_path(name: str) -> str:
    """``name`` as a normalised relative POSIX path inside a revision, or :class:`UnsafePath`.

    ``./a//b/`` becomes ``a/b``. The root itself (``''``, ``.``) is refused: callers that
    accept it (a folder entry for the root) check for it first.
    """
    if _CONTROL.search(name):
        raise UnsafePath(f"{name!r} contains a control character")
    if "\\" in name:
        raise UnsafePath(f"{name!r} contains a backslash")
    if name.startswith("/"):
        raise UnsafePath(f"{name!r} is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts:
        raise UnsafePath(f"{name!r} names the revision root, not a file")
    if ".." in parts:
        raise UnsafePath(f"{name!r} escapes the revision folder ('..')")
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
            raise UnsafePath(f"{name[:80]!r}...: a path component is over 255 bytes")
    clean = "/".join(parts)
    if len(clean.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise UnsafePath(f"{name[:80]!r}...: the path is over {MAX_PATH_BYTES} bytes")
    return clean


def check_name(value: str, what: str) -> str:
    """A namespace or bundle name usable as one folder name (Kubernetes naming rules)."""
    if not isinstance(value, str) or len(value) > 253 or not _NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a valid Kubernetes object name")
    return value


def check_revision_id(value: str) -> str:
    """A revision id usable as one folder name (never hidden, never '..')."""
    if not isinstance(value, str) or not _REVISION_ID.fullmatch(value):
        raise ValueError(f"revision id {value!r} is not [A-Za-z0-9][A-Za-z0-9._-]*")
    return value
