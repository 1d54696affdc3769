"""Hostile HTTP servers on 127.0.0.1 against the http source and ``fetch`` (issue 25, items 3-6).

The server here is a real socket server in a thread that writes raw bytes, so it can send what
a well-behaved framework never would: control characters in an ETag, a body trickled one byte a
second, a reason phrase echoing the request's ``Authorization``, a ``Location`` with port 99999.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from taskhandler_operator.sources.errors import (
    AuthenticationFailed,
    HttpFetchFailed,
    SourceError,
    SourceTimeout,
)
from taskhandler_operator.sources.http import valid_validator
from taskhandler_operator.sources.store import RevisionStore
from tests.integration.sources.conftest import NAMESPACE, sync_source

pytestmark = pytest.mark.integration

BODY = b"\x7fELF pretend handler\n"
SHA = hashlib.sha256(BODY).hexdigest()
USER = "deploy"
PASSWORD = "pa55-w0rd-Zq9"
TOKEN = "tok_" + "Q" * 40


@dataclass
class Request:
    line: str
    headers: dict[str, str]


Answer = Callable[[Request, socket.socket], None]


@dataclass
class RawServer:
    """Answers each request with ``answer(request, connection)``; records every request."""

    answer: Answer
    requests: list[Request] = field(default_factory=list)
    sock: socket.socket = field(default_factory=socket.socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            request = Request(head[0], headers)
            self.requests.append(request)
            with contextlib.suppress(OSError):  # the client went away
                self.answer(request, conn)


@pytest.fixture
def raw_server() -> Iterator[Callable[[Answer], RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        server = RawServer(answer)
        server.sock.bind(("127.0.0.1", 0))
        server.sock.listen(16)
        threading.Thread(target=server.serve, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.sock.close()


def respond(
    conn: socket.socket, status: str, headers: list[tuple[str, str | bytes]], body: bytes = b""
) -> None:
    out = f"HTTP/1.1 {status}\r\n".encode("latin-1")
    for key, value in [*headers, ("Content-Length", str(len(body))), ("Connection", "close")]:
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        out += key.encode() + b": " + raw + b"\r\n"
    conn.sendall(out + b"\r\n" + body)


def trickle(conn: socket.socket, body: bytes, every: float = 1.0) -> None:
    """Headers at once, then the body one byte every ``every`` seconds."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
    )
    for byte in body:
        time.sleep(every)
        conn.sendall(bytes([byte]))


# -- 3. a bad validator cannot poison later syncs ------------------------------------------------


LAST_MODIFIED = "Tue, 01 Dec 2026 10:00:00 GMT"


async def test_a_bad_etag_is_not_stored_and_later_syncs_work_once_the_server_is_fixed(
    raw_server: Callable[[Answer], RawServer],
    store: RevisionStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fixed = threading.Event()

    def answer(request: Request, conn: socket.socket) -> None:
        if not fixed.is_set():
            headers: list[tuple[str, str | bytes]] = [
                ("ETag", b'"a\x01b\x7f"'),
                ("Last-Modified", LAST_MODIFIED),
            ]
            respond(conn, "200 OK", headers, BODY)
        elif request.headers.get("if-none-match") == '"good"':
            respond(conn, "304 Not Modified", [("ETag", '"good"')])
        else:
            respond(conn, "200 OK", [("ETag", '"good"')], BODY)

    server = raw_server(answer)
    source = {"http": {"url": f"{server.url}/handler", "sha256": SHA}}
    first = await sync_source(store, source)
    record = await store.record(NAMESPACE, "bundle", first.id)
    assert record is not None and "etag" not in record.details
    assert record.details["lastModified"] == LAST_MODIFIED
    assert "ignoring the invalid ETag the server sent" in caplog.text
    fixed.set()
    second = await sync_source(store, source)  # main: ValueError, forbidden control character
    assert second.id == first.id
    assert "if-none-match" not in server.requests[1].headers
    assert server.requests[1].headers["if-modified-since"] == LAST_MODIFIED
    record = await store.record(NAMESPACE, "bundle", first.id)
    assert record is not None and record.details["etag"] == '"good"'
    third = await sync_source(store, source)
    assert third.id == first.id
    assert server.requests[2].headers["if-none-match"] == '"good"'


async def test_a_bad_validator_in_an_old_record_is_ignored(
    raw_server: Callable[[Answer], RawServer], store: RevisionStore
) -> None:
    server = raw_server(
        lambda request, conn: respond(conn, "200 OK", [("Last-Modified", LAST_MODIFIED)], BODY)
    )
    source = {"http": {"url": f"{server.url}/handler", "sha256": SHA}}
    revision = await sync_source(store, source)
    record = await store.record(NAMESPACE, "bundle", revision.id)
    assert record is not None
    # A record written before validators were checked.
    details = {**record.details, "etag": '"a\x01b\x7f"'}
    await store.update_details(NAMESPACE, "bundle", revision.id, details)
    again = await sync_source(store, source)  # main: ValueError, forbidden control character
    assert again.id == revision.id
    assert len(server.requests) == 2
    assert "if-none-match" not in server.requests[1].headers
    assert server.requests[1].headers["if-modified-since"] == LAST_MODIFIED


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [
        ("etag", '"abc"', True),
        ("etag", 'W/"abc"', True),
        ("etag", "abc", True),
        ("etag", '"a\x01b\x7f"', False),
        ("etag", '"a b"', False),
        ("etag", '"caf\u00e9"', False),
        ("etag", '"' + "a" * 300 + '"', False),
        ("etag", "abc\n", False),
        ("lastModified", LAST_MODIFIED, True),
        ("lastModified", "Tue,\r\n01 Dec", False),
        ("lastModified", LAST_MODIFIED + "\n", False),
        ("lastModified", " " + LAST_MODIFIED, False),
    ],
)
def test_validator_syntax(key: str, value: str, valid: bool) -> None:
    assert (valid_validator(key, value) == value) is valid


# -- 4. the sync timeout is a deadline ---------------------------------------------------------


async def test_a_trickling_server_cannot_hold_a_sync_past_its_timeout(
    raw_server: Callable[[Answer], RawServer], store: RevisionStore
) -> None:
    body = b"x" * 60
    server = raw_server(lambda request, conn: trickle(conn, body))
    source = {"http": {"url": f"{server.url}/slow", "sha256": hashlib.sha256(body).hexdigest()}}
    started = time.monotonic()
    with pytest.raises(SourceTimeout):
        await sync_source(store, source, within=3)
    assert time.monotonic() - started < 15


# -- 5. credentials never reach output --------------------------------------------------------


def _echo_authorization(request: Request, conn: socket.socket) -> None:
    respond(conn, f"401 You sent {request.headers.get('authorization', '')}", [])


@pytest.mark.parametrize(
    ("secret", "sent"),
    [
        (
            {"username": USER.encode(), "password": PASSWORD.encode()},
            base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
        ),
        ({"token": TOKEN.encode()}, TOKEN),
    ],
    ids=["basic", "bearer"],
)
async def test_a_server_echoing_authorization_in_its_reason_leaks_nothing(
    raw_server: Callable[[Answer], RawServer],
    store: RevisionStore,
    secret: dict[str, bytes],
    sent: str,
) -> None:
    server = raw_server(_echo_authorization)
    source = {"http": {"url": f"{server.url}/x", "sha256": SHA, "secretRef": {"name": "c"}}}
    with pytest.raises(AuthenticationFailed) as failed:
        await sync_source(store, source, secret)
    assert sent in server.requests[0].headers["authorization"]  # it was sent, and echoed
    message = failed.value.message
    assert "HTTP 401 You sent" in message
    for leaked in (sent, PASSWORD, TOKEN, sent[:8]):
        assert leaked not in message, message


async def test_a_token_across_the_message_cut_leaves_no_prefix(
    raw_server: Callable[[Answer], RawServer], store: RevisionStore
) -> None:
    # The reason phrase puts the token across the 1,000-character cut of a message.
    def answer(request: Request, conn: socket.socket) -> None:
        respond(conn, "500 " + "r" * 940 + " " + request.headers["authorization"], [])

    server = raw_server(answer)
    source = {"http": {"url": f"{server.url}/x", "sha256": SHA, "secretRef": {"name": "c"}}}
    with pytest.raises(HttpFetchFailed) as failed:
        await sync_source(store, source, {"token": TOKEN.encode()})
    message = failed.value.message
    assert len(message) <= 1000
    assert "tok_" not in message and "QQQQ" not in message, message[-120:]


def test_a_long_message_is_scrubbed_before_it_is_cut() -> None:
    token = "ghp_" + "A" * 36
    for offset in range(960, 1000, 3):
        error = SourceError("x" * offset + f" Bearer {token} and more")
        assert "ghp_" not in error.message and "AAAA" not in error.message
        error = HttpFetchFailed("y" * offset + f" https://user:{token}@host/x")
        assert token[:10] not in error.message


# -- 6. a redirect to a bad port is a typed error ----------------------------------------------


@pytest.mark.parametrize("port", ["99999", "abc", "-1"])
async def test_a_redirect_to_an_invalid_port_is_a_typed_source_error(
    raw_server: Callable[[Answer], RawServer], store: RevisionStore, port: str
) -> None:
    server = raw_server(
        lambda request, conn: respond(
            conn, "302 Found", [("Location", f"http://127.0.0.1:{port}/x")]
        )
    )
    source = {"http": {"url": f"{server.url}/x", "sha256": SHA}}
    with pytest.raises(HttpFetchFailed, match="redirected to an invalid URL"):
        await sync_source(store, source)


# -- 4. fetch --timeout is a deadline -------------------------------------------------------------


def _fetch(dest: Path, manifest: object, *extra: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskhandler_operator",
            "fetch",
            "--dest",
            str(dest),
            "--manifest",
            json.dumps(manifest),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr, time.monotonic() - started


async def test_fetch_timeout_is_a_deadline_against_a_trickling_server(
    raw_server: Callable[[Answer], RawServer], tmp_path: Path
) -> None:
    body = b"z" * 200
    server = raw_server(lambda request, conn: trickle(conn, body))
    item = {
        "path": "slow.bin",
        "url": f"{server.url}/slow.bin",
        "sha256": hashlib.sha256(body).hexdigest(),
        "size": len(body),
    }
    code, err, seconds = await asyncio.to_thread(_fetch, tmp_path, [item], "--timeout", "3")
    assert code == 1, err
    assert "slow.bin: not done within the 3s timeout" in err
    assert len(err.strip().splitlines()) == 1, err
    assert seconds < 15  # main: the body's 200 s


async def test_fetch_timeout_holds_while_headers_trickle(
    raw_server: Callable[[Answer], RawServer], tmp_path: Path
) -> None:
    def answer(request: Request, conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"s" * 100:
            conn.sendall(bytes([byte]))
            time.sleep(0.5)

    server = raw_server(answer)
    item = {"path": "h.bin", "url": f"{server.url}/h.bin", "sha256": SHA, "size": len(BODY)}
    code, err, seconds = await asyncio.to_thread(_fetch, tmp_path, [item], "--timeout", "3")
    assert code == 1 and "not done within the 3s timeout" in err, err
    assert seconds < 15


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_fetch_and_sync_refuse_a_timeout_that_is_no_deadline(tmp_path: Path, value: str) -> None:
    item = {"path": "a", "url": "http://127.0.0.1:9/a", "sha256": SHA, "size": 1}
    code, err, _ = _fetch(tmp_path, [item], "--timeout", value)
    assert code == 2 and "must be a positive number of seconds" in err, err
    bundle = tmp_path / "source.yaml"
    bundle.write_text(json.dumps({"volume": {"path": str(tmp_path)}}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskhandler_operator",
            "sync",
            str(bundle),
            "--store",
            str(tmp_path / "store"),
            "--timeout",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "must be a positive number of seconds" in done.stderr
    assert "Traceback" not in done.stderr


def _s3_trickling(body: bytes) -> Answer:
    """An S3 endpoint listing one object, then sending it a byte a second."""
    listing = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Name>bkt</Name><Prefix></Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>"
        "<IsTruncated>false</IsTruncated><Contents><Key>slow.bin</Key>"
        "<LastModified>2026-12-01T10:00:00.000Z</LastModified>"
        f'<ETag>"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"</ETag>'
        f"<Size>{len(body)}</Size><StorageClass>STANDARD</StorageClass></Contents>"
        "</ListBucketResult>"
    ).encode()

    def answer(request: Request, conn: socket.socket) -> None:
        if "list-type=2" in request.line:
            respond(conn, "200 OK", [("Content-Type", "application/xml")], listing)
        else:
            trickle(conn, body)

    return answer


async def test_a_trickling_s3_object_cannot_hold_a_sync_past_its_timeout(
    raw_server: Callable[[Answer], RawServer], store: RevisionStore
) -> None:
    server = raw_server(_s3_trickling(b"s" * 60))
    source = {"s3": {"bucket": "bkt", "endpoint": server.url, "secretRef": {"name": "k"}}}
    keys = {"accessKeyID": b"AKIAEXAMPLEKEY123456", "secretAccessKey": b"secret-example-key"}
    started = time.monotonic()
    with pytest.raises(SourceTimeout):
        await sync_source(store, source, keys, within=3)
    assert time.monotonic() - started < 15
    assert any("slow.bin" in r.line for r in server.requests)  # it got as far as the download
