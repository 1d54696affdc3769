"""Signed artifact URLs: HMAC-SHA256 over the method, the file's place and the expiry.

URL shape (``docs/sources.md``)::

    <base>/v1/artifacts/<namespace>/<bundle>/<revision>/<rel/path>?expires=<unix>&signature=<hex>

The signature covers ``GET\\n<namespace>/<bundle>/<revision>/<rel/path>\\n<expires>`` (the
decoded path), so changing any part of the place or the expiry invalidates it. Pure functions,
no I/O: the server and the operator share them.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote

from taskhandler_operator.sources.paths import check_name, check_revision_id, safe_rel_path

__all__ = [
    "MIN_KEY_BYTES",
    "PATH_PREFIX",
    "SignedPlace",
    "Verdict",
    "generate_key",
    "sign",
    "signed_path",
    "verify",
]

MIN_KEY_BYTES = 32
PATH_PREFIX = "/v1/artifacts/"
# What sign() produces, checked before any arithmetic or comparison: str.isdigit() accepts
# '²' and other digits int() refuses, and hmac.compare_digest raises on non-ASCII text.
_EXPIRES = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")


class Verdict(StrEnum):
    """The outcome of checking one request; also the label of the request counter."""

    SERVED = "served"
    UNSIGNED = "unsigned"
    EXPIRED = "expired"
    TAMPERED = "tampered"
    ESCAPING = "escaping"
    MISSING = "missing"


@dataclass(frozen=True)
class SignedPlace:
    namespace: str
    bundle: str
    revision: str
    rel_path: str

    def canonical(self) -> str:
        return f"{self.namespace}/{self.bundle}/{self.revision}/{self.rel_path}"


def generate_key() -> bytes:
    return secrets.token_bytes(MIN_KEY_BYTES)


def _check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the signing key must be at least {MIN_KEY_BYTES} bytes")
    return key


def place(namespace: str, bundle: str, revision: str, rel_path: str) -> SignedPlace:
    """A validated place; ValueError (or UnsafePath) when any part is not allowed."""
    return SignedPlace(
        check_name(namespace, "namespace"),
        check_name(bundle, "bundle"),
        check_revision_id(revision),
        safe_rel_path(rel_path),
    )


def sign(key: bytes, where: SignedPlace, expires: int) -> str:
    message = f"GET\n{where.canonical()}\n{expires}".encode("utf-8", "surrogateescape")
    return hmac.new(_check_key(key), message, hashlib.sha256).hexdigest()


def signed_path(key: bytes, where: SignedPlace, expires_in: float, now: float | None = None) -> str:
    """The path and query of a URL for ``where``, valid for ``expires_in`` seconds."""
    if expires_in <= 0:
        raise ValueError("expires_in must be positive")
    expires = math.ceil((time.time() if now is None else now) + expires_in)
    quoted = "/".join(
        quote(part, safe="")
        for part in (where.namespace, where.bundle, where.revision, *where.rel_path.split("/"))
    )
    return f"{PATH_PREFIX}{quoted}?expires={expires}&signature={sign(key, where, expires)}"


def verify(
    key: bytes,
    where: SignedPlace,
    expires: str | None,
    signature: str | None,
    now: float | None = None,
) -> Verdict:
    """SERVED when the signature matches and has not expired, else why not."""
    if not expires or not signature:
        return Verdict.UNSIGNED
    if not _EXPIRES.fullmatch(expires) or not _SIGNATURE.fullmatch(signature):
        return Verdict.TAMPERED
    expected = sign(key, where, int(expires))
    if not hmac.compare_digest(expected.encode("ascii"), signature.lower().encode("ascii")):
        return Verdict.TAMPERED
    if int(expires) < (time.time() if now is None else now):
        return Verdict.EXPIRED
    return Verdict.SERVED
