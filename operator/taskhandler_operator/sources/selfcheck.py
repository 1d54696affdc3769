"""Does the artifact server accept URLs signed with this key? (``helm test``'s second check.)

A probe pod can download only when three things hold: the URL the operator hands out reaches
the serving replica (Service, DNS, NetworkPolicy), and the key the operator signs with is the
one the server checks with. Nothing in a fresh install has a revision to download, so the check
signs a URL for a place no revision holds: a server that accepts the signature answers 404
``missing`` (it looks for the file only after the signature matched), a server with another key
403 ``tampered``. The same URL with its signature altered must then be refused with 403
``tampered``, so a server that checks nothing cannot pass.

:func:`judge` is pure; :func:`check_artifact_server` does the two requests (standard library
only: it runs in a short-lived pod).
"""

from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from taskhandler_operator.inputfiles import InputError, read_bounded
from taskhandler_operator.sources import signing

__all__ = [
    "CHECK_BUNDLE",
    "CHECK_NAMESPACE",
    "Answer",
    "ArtifactServerCheckFailed",
    "check_artifact_server",
    "judge",
    "read_key",
]

# Names the revision store never holds (a namespace cannot start with "thop-check-" and be
# watched by accident: the revision id below is random as well).
CHECK_NAMESPACE = "thop-check"
CHECK_BUNDLE = "signing-check"
CHECK_FILE = "absent"
URL_VALID_SECONDS = 300.0
MAX_BODY = 4096


class ArtifactServerCheckFailed(Exception):
    """The check failed; the message says what and what to look at."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status and the first line of its body (the server's verdict)."""

    status: int
    verdict: str


def read_key(path: Path) -> bytes:
    """The signing key as the operator reads it (``THOP_SIGNING_KEY_FILE``): the file's bytes
    without surrounding whitespace, at least :data:`signing.MIN_KEY_BYTES` of them."""
    try:
        key = read_bounded(path, "the signing key file", max_bytes=64 << 10).strip()
    except InputError as exc:
        raise ArtifactServerCheckFailed(str(exc)) from None
    if len(key) < signing.MIN_KEY_BYTES:
        raise ArtifactServerCheckFailed(
            f"the signing key file {path} holds {len(key)} bytes; the operator needs at least "
            f"{signing.MIN_KEY_BYTES}"
        )
    return key


def judge(base_url: str, signed: Answer, forged: Answer) -> str:
    """The success line, or :class:`ArtifactServerCheckFailed` saying what went wrong."""
    if signed.status == 403 and signed.verdict == signing.Verdict.TAMPERED:
        raise ArtifactServerCheckFailed(
            f"the artifact server at {base_url} refused a URL signed with the mounted key "
            "(403 tampered): the operator signs with another key; check that the operator and "
            "this check mount the same Secret (signingKey.existingSecret, signingKey.secretKey) "
            "and that the operator was restarted after the key changed"
        )
    if signed.status == 403 and signed.verdict == signing.Verdict.EXPIRED:
        raise ArtifactServerCheckFailed(
            f"the artifact server at {base_url} found a fresh signed URL expired (403 expired): "
            f"this pod's clock and the operator's differ by more than {URL_VALID_SECONDS:.0f} s"
        )
    if (signed.status, signed.verdict) != (404, signing.Verdict.MISSING):
        raise ArtifactServerCheckFailed(
            f"unexpected answer from {base_url} to a signed URL for a file no revision holds: "
            f"HTTP {signed.status} {signed.verdict!r} (expected 404 missing); is that URL the "
            "operator's artifact server?"
        )
    if (forged.status, forged.verdict) != (403, signing.Verdict.TAMPERED):
        raise ArtifactServerCheckFailed(
            f"the artifact server at {base_url} answered HTTP {forged.status} "
            f"{forged.verdict!r} to a URL with a forged signature (expected 403 tampered)"
        )
    return (
        f"artifact server {base_url}: a URL signed with the mounted key is accepted (404 "
        "missing: no revision holds the test file) and a forged signature is refused "
        "(403 tampered)"
    )


def _get(url: str, timeout: float) -> Answer:
    request = urllib.request.Request(url, method="GET")  # noqa: S310 - an http(s) URL we built
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            body = response.read(MAX_BODY)
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_BODY)
        status = exc.code
    text = body.decode("utf-8", "replace").strip()
    return Answer(status, text.splitlines()[0] if text else "")


def check_artifact_server(
    base_url: str, key: bytes, *, timeout: float = 60.0, retry_every: float = 2.0
) -> str:
    """Sign, fetch, forge, fetch; the success line. Connection failures are retried until
    ``timeout`` (the operator may still be starting); wrong answers are not."""
    if not base_url.startswith(("http://", "https://")):
        raise ArtifactServerCheckFailed(f"--url {base_url!r} is not an http(s) URL")
    base = base_url.rstrip("/")
    where = signing.place(
        CHECK_NAMESPACE, CHECK_BUNDLE, f"check-{secrets.token_hex(8)}", CHECK_FILE
    )
    deadline = time.monotonic() + timeout
    while True:
        path = signing.signed_path(key, where, URL_VALID_SECONDS)
        try:
            signed = _get(base + path, max(1.0, min(10.0, deadline - time.monotonic())))
            head, _, signature = path.rpartition("signature=")
            flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
            forged = _get(base + head + "signature=" + flipped, 10.0)
            return judge(base, signed, forged)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if time.monotonic() + retry_every >= deadline:
                raise ArtifactServerCheckFailed(
                    f"cannot reach the artifact server at {base}: {reason}; is an operator "
                    "pod Ready (only the leader serves), and does the NetworkPolicy admit this "
                    "pod?"
                ) from None
            time.sleep(retry_every)
