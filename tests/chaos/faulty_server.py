"""A small HTTP server for the chaos tests whose misbehaviour is switched at runtime.

It serves files held in memory (the archives an ``http`` source fetches, pinned by sha256) on
127.0.0.1 from a thread per request, with an ``ETag`` so the operator asks again on every sync
(a kept revision is re-validated with ``If-None-Match``; a match answers ``304``). The mode
applies to every request from the moment it is set:

* ``ok``: answers normally;
* ``error``: ``500 Internal Server Error``;
* ``truncate``: announces the whole length, sends half of the body, then cuts the connection;
* ``hang``: reads the request and never answers, until the mode changes or the server stops
  (the request's thread then closes the connection without a word).

:class:`FaultyProxy` does the same at the TCP level in front of another server (git's smart
HTTP), with the modes ``ok``, ``error``, ``cut`` (an answer's body cut in half) and ``hang``.

Kept apart from ``tests/fixtures/sources.py`` (a subprocess steered through files): here the
test flips the mode in-process and counts the requests each mode saw.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, Literal, Self, TypeVar

Mode = Literal["ok", "error", "truncate", "hang"]
MODES: tuple[Mode, ...] = ("ok", "error", "truncate", "hang")
#: Longest a hanging request is held, so a forgotten server never keeps a thread forever.
MAX_HANG_SECONDS = 600.0


M = TypeVar("M", bound=str)


class _Switched(Generic[M]):
    """What both fakes share: a mode switched at runtime under a lock, counted each time it is
    used, and a release that holds ``hang`` until the mode changes or the fake stops."""

    def __init__(self, modes: tuple[M, ...]) -> None:
        self._modes = modes
        self._mode: M = modes[0]
        self._released = threading.Event()  # set: hanging requests may go
        self._released.set()
        self._lock = threading.Lock()
        self.counts: Counter[M] = Counter()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def mode(self) -> M:
        return self._mode

    def set_mode(self, mode: M) -> None:
        if mode not in self._modes:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(self._modes)}")
        with self._lock:
            self._mode = mode
            if mode == "hang":
                self._released.clear()
            else:
                self._released.set()

    def stop(self) -> None:
        self._released.set()

    def _use(self) -> M:
        """The mode now, counted once."""
        with self._lock:
            mode = self._mode
            self.counts[mode] += 1
            return mode

    def _hold(self) -> None:
        self._released.wait(MAX_HANG_SECONDS)


class FaultyServer(_Switched[Mode]):
    """``put`` a file, ``set_mode`` to misbehave, ``stop`` at the end (also a context manager)."""

    def __init__(self) -> None:
        super().__init__(MODES)
        self._files: dict[str, bytes] = {}
        self.requests = self.counts
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="faulty-http", daemon=True
        )
        self._thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def put(self, name: str, data: bytes) -> tuple[str, str]:
        """Serve ``data`` at ``/name``; its URL and sha256 (what the source pins)."""
        with self._lock:
            self._files[name] = data
        return self.url(name), hashlib.sha256(data).hexdigest()

    def stop(self) -> None:
        super().stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    # --- called from the request threads ---------------------------------------------------------

    def _take(self, name: str) -> tuple[Mode, bytes | None]:
        mode = self._use()
        with self._lock:
            return mode, self._files.get(name)


def _handler(server: FaultyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test reads the counters, not a log

        def do_GET(self) -> None:
            mode, data = server._take(self.path.lstrip("/"))
            if mode == "hang":
                server._hold()
                self.close_connection = True
                return
            if mode == "error":
                self._answer(500, b"fault injected\n")
                return
            if data is None:
                self._answer(404, b"no such file\n")
                return
            etag = f'"{hashlib.sha256(data).hexdigest()[:32]}"'
            if mode == "ok" and self.headers.get("If-None-Match") == etag:
                self._answer(304, b"", etag=etag)
                return
            if mode == "truncate":
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", etag)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self._answer(200, data, etag=etag)

        def _answer(self, status: int, body: bytes, etag: str | None = None) -> None:
            self.send_response(status)
            if status != 304:
                self.send_header("Content-Length", str(len(body)))
            if etag is not None:
                self.send_header("ETag", etag)
            self.end_headers()
            if body:
                self.wfile.write(body)

    return Handler


ProxyMode = Literal["ok", "error", "cut", "hang"]
PROXY_MODES: tuple[ProxyMode, ...] = ("ok", "error", "cut", "hang")
#: How much of a body without a Content-Length a ``cut`` connection relays.
CUT_BODY_BYTES = 64


class FaultyProxy(_Switched[ProxyMode]):
    """A TCP proxy on 127.0.0.1 in front of an HTTP server (e.g. git's smart HTTP), with a mode
    switched at runtime, applied to each new connection:

    * ``ok``: relays both ways;
    * ``error``: answers ``500`` itself after the request's first bytes;
    * ``cut``: relays the request, then the answer's headers and half its body, then closes;
    * ``hang``: accepts and reads, never answers, until the mode changes or the proxy stops.
    """

    def __init__(self, upstream_port: int) -> None:
        super().__init__(PROXY_MODES)
        self.upstream = ("127.0.0.1", upstream_port)
        self._stopped = threading.Event()
        self.connections = self.counts
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.5)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="faulty-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        super().stop()
        self._thread.join(10)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            mode = self._use()
            threading.Thread(target=self._serve, args=(client, mode), daemon=True).start()

    def _serve(self, client: socket.socket, mode: ProxyMode) -> None:
        with client:
            if mode == "hang":
                self._hold()
                return
            if mode == "error":
                client.recv(65536)
                client.sendall(
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 15\r\n"
                    b"Connection: close\r\n\r\nfault injected\n"
                )
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=30)
            except OSError:
                return
            with upstream:
                up = threading.Thread(target=_pump, args=(client, upstream, None), daemon=True)
                up.start()
                if mode == "cut":
                    _cut(upstream, client)
                else:
                    _pump(upstream, client, None)
                # Closing both ends also ends the other direction's pump.
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_RDWR)
                up.join(10)


def _cut(upstream: socket.socket, client: socket.socket) -> None:
    """Relay the answer's status line and headers whole, then half of its body (at most
    CUT_BODY_BYTES when its length is not announced), then stop: a body cut short."""
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            data = upstream.recv(65536)
            if not data:
                break
            head += data
    except OSError:
        return
    headers, _, body = head.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", headers)
    keep = int(length.group(1)) // 2 if length else CUT_BODY_BYTES
    with contextlib.suppress(OSError):
        client.sendall(headers + b"\r\n\r\n" + body[:keep])
        if len(body) < keep:
            _pump(upstream, client, keep - len(body))


def _pump(source: socket.socket, target: socket.socket, limit: int | None) -> None:
    """Copy ``source`` to ``target`` until EOF, an error, or ``limit`` bytes."""
    sent = 0
    try:
        while limit is None or sent < limit:
            data = source.recv(65536 if limit is None else min(65536, limit - sent))
            if not data:
                break
            target.sendall(data)
            sent += len(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
