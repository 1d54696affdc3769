"""The artifact server against hostile requests, beyond test_server_fetch.py's traversal,
unsigned, expired, tampered and pruned cases: every request below carries a signature that is
*valid* for what it names (or is forged in a way not covered there), so only the server's own
rules can refuse it. Nothing outside a kept revision's regular files is ever served, and no
method but GET and HEAD does anything.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from taskhandler_operator.sources import signing
from taskhandler_operator.sources.server import ArtifactServer
from taskhandler_operator.sources.store import RevisionStore
from tests.integration.sources.conftest import NAMESPACE, sync_source
from tests.integration.sources.test_server_fetch import APP, KEY, Served, raw_get

pytestmark = pytest.mark.integration

OUTSIDE = b"outside the revision: never served\n"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    volume = tmp_path / "vol"
    (volume / "lib").mkdir(parents=True)
    (volume / "lib" / "app.jar").write_bytes(APP)
    secret = tmp_path / "outside.txt"
    secret.write_bytes(OUTSIDE)
    store = RevisionStore(tmp_path / "store", keep=2)
    revision = await sync_source(store, {"volume": {"path": str(volume)}})
    # Links planted in the kept revision itself (as if the store were tampered with): one to a
    # file outside it, one to the folder above it.
    folder = store.revision_dir(NAMESPACE, "bundle", revision.id)
    (folder / "lib").chmod(0o755)
    (folder / "lib" / "leak").symlink_to(secret)
    (folder / "up").symlink_to("..")
    registry = CollectorRegistry()
    server = ArtifactServer(store, KEY, host="127.0.0.1", port=0, registry=registry)
    await server.start()
    try:
        yield Served(server, store, revision, registry, volume)
    finally:
        await server.stop()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def signed(key: bytes, namespace: str, revision: str, rel: str, *, bundle: str = "bundle") -> str:
    return signing.signed_path(key, signing.place(namespace, bundle, revision, rel), 300)


async def test_validly_signed_urls_reach_nothing_but_kept_regular_files(served: Served) -> None:
    port, rev = served.server.port, served.revision.id
    refused = {
        "a link to a file outside the revision": signed(KEY, NAMESPACE, rev, "lib/leak"),
        "a link to the folder above": signed(KEY, NAMESPACE, rev, "up/bundle/x"),
        "a folder": signed(KEY, NAMESPACE, rev, "lib"),
        "a revision never kept": signed(KEY, NAMESPACE, "a" * 40, "lib/app.jar"),
        "another namespace's copy": signed(KEY, "team-b", rev, "lib/app.jar"),
        "another bundle": signed(KEY, NAMESPACE, rev, "lib/app.jar", bundle="other"),
        "a double-encoded traversal": signed(KEY, NAMESPACE, rev, "%2e%2e/%2e%2e/outside.txt"),
    }
    for what, path in refused.items():
        status, body = await asyncio.to_thread(request, port, "GET", path)
        assert (status, body) == (404, b"missing\n"), what
        head, _ = await asyncio.to_thread(request, port, "HEAD", path)
        assert head == 404, what
    assert served.server.counts == {"missing": 2 * len(refused)}
    good = signed(KEY, NAMESPACE, rev, "lib/app.jar")
    assert await asyncio.to_thread(request, port, "GET", good) == (200, APP)


async def test_forged_signatures_and_expiries_are_refused(served: Served) -> None:
    port, rev = served.server.port, served.revision.id
    base = f"/v1/artifacts/{NAMESPACE}/bundle/{rev}/lib/app.jar"
    good = signed(KEY, NAMESPACE, rev, "lib/app.jar")
    expires, signature = (p.split("=", 1)[1] for p in good.split("?", 1)[1].split("&"))
    other_key = signed(os.urandom(32), NAMESPACE, rev, "lib/app.jar")
    far = str(int(time.time()) + 10**9)
    hmac_of_nothing = hashlib.sha256(b"").hexdigest()
    cases = {
        "another key's signature": (other_key, "tampered"),
        "a far expiry with the old signature": (
            f"{base}?expires={far}&signature={signature}",
            "tampered",
        ),
        "a 13-digit expiry": (f"{base}?expires={'9' * 13}&signature={signature}", "tampered"),
        "a negative expiry": (f"{base}?expires=-1&signature={signature}", "tampered"),
        "a truncated signature": (
            f"{base}?expires={expires}&signature={signature[:32]}",
            "tampered",
        ),
        "a plain hash": (f"{base}?expires={expires}&signature={hmac_of_nothing}", "tampered"),
        "an empty signature": (f"{base}?expires={expires}&signature=", "unsigned"),
        "an expired one, on HEAD": (
            signing.signed_path(
                KEY,
                signing.place(NAMESPACE, "bundle", rev, "lib/app.jar"),
                10,
                now=time.time() - 60,
            ),
            "expired",
        ),
    }
    for what, (path, outcome) in cases.items():
        method = "HEAD" if "HEAD" in what else "GET"
        status, body = await asyncio.to_thread(request, port, method, path)
        assert status == 403, what
        assert body == (b"" if method == "HEAD" else f"{outcome}\n".encode()), what
    head, body = await asyncio.to_thread(request, port, "HEAD", base)  # no signature at all
    assert (head, body) == (403, b"")
    assert served.server.counts["served"] == 0


async def test_no_method_but_get_and_head_does_anything(served: Served) -> None:
    port, rev = served.server.port, served.revision.id
    good = signed(KEY, NAMESPACE, rev, "lib/app.jar")
    target = served.store.revision_dir(NAMESPACE, "bundle", rev) / "lib" / "app.jar"
    before = target.stat()
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"):
        status, body = await asyncio.to_thread(request, port, method, good, b"overwritten")
        assert status == 405, method
        assert APP not in body, method
    after = target.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert served.server.counts == {}  # never reached the handler
    assert await asyncio.to_thread(raw_get, port, good) == (200, APP)


def raw_request(port: int, target: bytes) -> tuple[int, bytes]:
    """A GET whose request target is sent as these exact bytes (no client-side encoding)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_malformed_queries_are_refused_never_a_server_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Queries that pass a naive check and then break arithmetic or comparison: each is a 403
    and nothing in the log carries a traceback."""
    port, rev = served.server.port, served.revision.id
    base = f"/v1/artifacts/{NAMESPACE}/bundle/{rev}/lib/app.jar".encode()
    good = signed(KEY, NAMESPACE, rev, "lib/app.jar")
    expires, signature = (p.split("=", 1)[1] for p in good.split("?", 1)[1].split("&"))
    sig, exp = signature.encode(), expires.encode()
    queries = [
        b"expires=%C2%B2&signature=" + sig,  # '²': str.isdigit() is true, int() fails
        b"expires=%D9%A3%D9%A3&signature=" + sig,  # Arabic-Indic digits: int() accepts them
        b"expires=" + exp + b"&signature=%C3%A9" + sig[2:],  # a non-ASCII signature
        b"expires=" + exp + b"&signature=%FF%FE" + sig[2:],  # not UTF-8 at all
        b"expires=" + exp + b"&signature=" + sig + b"%00",
        b"expires=" + exp + b"&signature=" + b"f" * 4000,
        b"expires=" + exp + b"%20&signature=" + sig,
        b"expires=+" + exp + b"&signature=" + sig,
        b"expires=" + b"9" * 4000 + b"&signature=" + sig,
        b"expires=1e9&signature=" + sig,
        b"expires=%zz&signature=%zz",
        b"expires=1&expires=" + exp + b"&signature=" + sig,  # the first one counts
    ]
    caplog.set_level(logging.DEBUG)
    for query in queries:
        status, body = await asyncio.to_thread(raw_request, port, base + b"?" + query)
        assert (status, body) == (403, b"tampered\n"), query[:80]
    # Raw non-ASCII bytes in the request line are not HTTP: aiohttp's parser answers 400
    # before the handler runs, and that too is one line in the log, not a traceback.
    for query in (b"expires=\xc2\xb2&signature=" + sig, b"expires=" + exp + b"&signature=\xc3\xa9"):
        status, _ = await asyncio.to_thread(raw_request, port, base + b"?" + query)
        assert status == 400, query[:80]
    assert served.server.counts == {"tampered": len(queries)}
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text
    # The genuine URL still works, with its signature in either case.
    assert await asyncio.to_thread(raw_request, port, good.encode()) == (200, APP)
