"""Reading a source's credentials from Secret data (plain bytes, already decoded from base64)."""

from __future__ import annotations

from collections.abc import Mapping

from taskhandler_operator.sources.errors import InvalidSource

__all__ = ["secret_text"]


def secret_text(
    credentials: Mapping[str, bytes] | None, key: str, *, strip: bool = True
) -> str | None:
    """The Secret value ``key`` as text, or None when absent or empty.

    Values written from files usually end with a newline; ``strip`` removes surrounding
    whitespace (tokens, user names, keys), otherwise only a final line break goes (passwords
    may legitimately start or end with spaces).
    """
    if credentials is None or key not in credentials:
        return None
    raw = credentials[key]
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidSource(f"Secret key {key!r} is not UTF-8 text") from None
    text = text.strip() if strip else text.removesuffix("\n").removesuffix("\r")
    if any(c in text for c in "\r\n\x00") and key not in ("identity", "known_hosts"):
        raise InvalidSource(f"Secret key {key!r} contains a line break or NUL")
    return text or None
