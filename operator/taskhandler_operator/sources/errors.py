"""Typed failures of a sync: each carries a CamelCase ``reason`` for a Kubernetes condition.

Messages say what failed, for which URL/bucket/folder, and what to check. They never contain a
credential: URLs are shown without user info or query (``shown_url``), every message is scrubbed
of recognisable credentials (:func:`taskhandler_operator.redaction.scrub`) *before* it is cut to
``MAX_MESSAGE_LENGTH``, and :func:`~taskhandler_operator.sources.sync.sync` scrubs the uncut
text once more with the Secret's values (``full_message``) before it leaves the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from taskhandler_operator.redaction import MIN_SECRET_LENGTH, cut, scrub

__all__ = [
    "ArchiveRefused",
    "AuthenticationFailed",
    "ChecksumMismatch",
    "GitFetchFailed",
    "HttpFetchFailed",
    "InvalidSource",
    "NotFound",
    "S3FetchFailed",
    "SourceError",
    "SourceTimeout",
    "StorageFailed",
    "UnsupportedContent",
    "VolumeNotAllowed",
    "VolumeReadFailed",
    "redact",
    "shown_url",
]

REDACTED = "***"
MIN_REDACTED_LENGTH = MIN_SECRET_LENGTH
MAX_MESSAGE_LENGTH = 1000
# What is kept of a message before the cut, for the second redaction in ``sync``: generous
# (a credential near the cut must be seen whole), bounded (a hostile server's text is not).
MAX_FULL_MESSAGE_LENGTH = 16 * MAX_MESSAGE_LENGTH


class SourceError(Exception):
    """A sync failed. ``reason`` is the condition reason; ``permanent`` means retrying the same
    spec, Secret and remote cannot succeed (the user must change something)."""

    reason = "SourceFailed"
    permanent = False

    def __init__(self, message: str) -> None:
        # Scrubbed whole, then cut: cutting first could leave a credential's prefix behind.
        one_line = scrub(" ".join(message[: MAX_FULL_MESSAGE_LENGTH * 2].split()))
        self.full_message = cut(one_line, MAX_FULL_MESSAGE_LENGTH)
        super().__init__(cut(one_line, MAX_MESSAGE_LENGTH))

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidSource(SourceError):
    """The spec or the Secret's keys cannot work as given."""

    reason = "InvalidSource"
    permanent = True


class AuthenticationFailed(SourceError):
    reason = "AuthenticationFailed"


class NotFound(SourceError):
    """The repository, ref, path, URL, bucket or folder does not exist."""

    reason = "NotFound"


class GitFetchFailed(SourceError):
    reason = "GitFetchFailed"


class HttpFetchFailed(SourceError):
    reason = "HttpFetchFailed"


class S3FetchFailed(SourceError):
    reason = "S3FetchFailed"


class VolumeReadFailed(SourceError):
    reason = "VolumeReadFailed"


class VolumeNotAllowed(SourceError):
    """The volume path is outside every root the operator allows, or overlaps a folder it
    protects (sources/access.py). A person must change the spec or ``THOP_VOLUME_ROOTS``."""

    reason = "VolumeNotAllowed"
    permanent = True


class ChecksumMismatch(SourceError):
    reason = "ChecksumMismatch"
    permanent = True


class ArchiveRefused(SourceError):
    """An archive or tree breaks a safety rule (escaping path, device, caps...)."""

    reason = "ArchiveRefused"
    permanent = True


class UnsupportedContent(SourceError):
    """Git LFS pointers or submodules in the bundle path."""

    reason = "UnsupportedContent"
    permanent = True


class SourceTimeout(SourceError):
    reason = "SourceTimeout"


class StorageFailed(SourceError):
    """The revision store could not be written (disk full, permissions)."""

    reason = "StorageOperationFailed"


def shown_url(url: str) -> str:
    """A URL safe to print: no user info and no query or fragment (they may hold secrets)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    if not parts.scheme or not parts.netloc:
        # scp-like git address user@host:path: keep it, minus anything before '@'
        return url.rsplit("@", 1)[-1] if "://" not in url else "<unparsable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    user = f"{parts.username}@" if parts.scheme == "ssh" and parts.username else ""
    return f"{parts.scheme}://{user}{host}{parts.path}"


def redact(text: str, secrets: Iterable[str | bytes]) -> str:
    """``text`` with every secret value (in each spelling) and every recognisable credential
    replaced by ``***`` (:func:`taskhandler_operator.redaction.scrub`)."""
    return scrub(text, secrets)
