"""One redaction for every message that leaves the operator: logs, events, status, CLI output.

:func:`scrub` replaces credentials with ``***``: the values a caller knows (what was read from a
Secret, in the spellings they show up in: as is, base64, URL-quoted, and the base64 of
``user:password`` that HTTP basic auth sends) and the forms recognisable without knowing them
(``Bearer``/``Basic`` header values, URL userinfo, ``password=``/``token=``-like parameters, S3
access key ids, SigV4 credentials and signatures). It runs on the whole text **before** any
cut: a credential straddling a length limit must leave no prefix behind, which redacting the
already-cut text cannot promise. Standard library only, cheap to import (the ``fetch`` command
uses it in every probe pod).
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Iterable, Mapping

__all__ = ["MASK", "MIN_SECRET_LENGTH", "credential_spellings", "cut", "scrub", "spellings"]

MASK = "***"
# Values shorter than this are not masked on their own: replacing "a" or "git" everywhere
# would shred the message without protecting anything a reader could not guess.
MIN_SECRET_LENGTH = 4

# Names whose value is a credential when they appear as key=value (query strings, DSNs, CLI
# arguments, SigV4 Authorization headers) or "key": "value" (JSON); case-insensitive. Presigned
# S3 URLs carry theirs in X-Amz-* parameters, our own signed artifact URLs in sig/signature.
_SENSITIVE_NAMES = (
    "password|passwd|pwd|token|access_token|refresh_token|id_token|secret|client_secret"
    "|secret_key|secret_access_key|secretaccesskey|aws_secret_access_key|api_key|apikey"
    "|private_key|sig|signature|credential|session_token|sessiontoken|accesskeyid"
    "|access_key_id|aws_access_key_id|x-amz-signature|x-amz-credential|x-amz-security-token"
)
_KEY_VALUE = re.compile(
    rf"""(?ix)
    (?<![\w-])({_SENSITIVE_NAMES})     # the key, not the tail of a longer word
    ("?\s*[=:]\s*"?)               # = or : (JSON: closing and opening quotes)
    ([^\s&"',;}}]+)                # the value, up to a separator
    """
)
# scheme://user:password@ (any scheme) and scheme://token@ (http/https: a bare user there is a
# token; an ssh:// user name is not a secret and is kept).
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):([^/\s@]+)@")
_HTTP_USER = re.compile(r"(?i)\b(https?://)[^/\s:@]+@")
# An Authorization header's value: the scheme word stays, the rest goes. Eight characters at
# least, so prose ("a bearer token", "basic auth") is left alone; a shorter credential is
# still masked by value when the caller knows it.
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}")
# AWS access key ids (AKIA long-term, ASIA temporary, and the other IAM id prefixes).
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{12,}\b")


def spellings(value: str | bytes) -> set[str]:
    """``value`` as it shows up in text: as is (and each line), base64, URL-quoted."""
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    text = raw.decode("utf-8", "replace")
    found = {text, text.strip(), *(line.strip() for line in text.splitlines())}
    found.add(base64.b64encode(raw).decode("ascii"))
    stripped = raw.strip()
    if stripped != raw:
        found.add(base64.b64encode(stripped).decode("ascii"))
    found.add(urllib.parse.quote(text.strip(), safe=""))
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH}


# User names a token travels with as the basic-auth password (GitHub, GitLab, our git source).
_TOKEN_USERS = ("git", "x-access-token", "oauth2")


def credential_spellings(credentials: Mapping[str, bytes | str] | None) -> set[str]:
    """Every spelling of a Secret's values, plus base64(``user:password``) for each user and
    password (or token) pair it implies: what an HTTP server echoing ``Authorization`` shows."""
    if not credentials:
        return set()
    texts: dict[str, str] = {}
    found: set[str] = set()
    for key, value in credentials.items():
        found |= spellings(value)
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        texts[str(key)] = raw.decode("utf-8", "replace")
    users = {texts.get("username", "").strip(), *_TOKEN_USERS} - {""}
    passwords = {
        texts.get("password", "").removesuffix("\n").removesuffix("\r"),
        texts.get("token", "").strip(),
    } - {""}
    for user in users:
        for password in passwords:
            pair = f"{user}:{password}".encode()
            found.add(base64.b64encode(pair).decode("ascii"))
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH}


def compile_values(values: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern matching any of ``values``, longest first (a value containing another is
    masked whole)."""
    unique = sorted({v for v in values if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
    if not unique:
        return None
    return re.compile("|".join(re.escape(v) for v in unique))


def scrub_patterns(text: str) -> str:
    """The credential forms recognisable without knowing the values."""
    text = _URL_USERINFO.sub(rf"\1:{MASK}@", text)
    text = _HTTP_USER.sub(rf"\1{MASK}@", text)
    text = _KEY_VALUE.sub(rf"\1\2{MASK}", text)
    text = _AUTH_SCHEME.sub(rf"\1\2{MASK}", text)
    return _AWS_KEY_ID.sub(MASK, text)


def scrub(text: str, secrets: Iterable[str | bytes] = ()) -> str:
    """``text`` with every credential replaced by ``***``: the ``secrets`` values (in every
    spelling) and the recognisable forms. Run it before cutting the text, never after."""
    values: set[str] = set()
    for secret in secrets:
        values |= spellings(secret)
    pattern = compile_values(values)
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return scrub_patterns(text)


def cut(text: str, limit: int, ellipsis: str = "...") -> str:
    """``text`` within ``limit`` characters, ``ellipsis`` marking the cut. Callers scrub first."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(ellipsis))] + ellipsis
