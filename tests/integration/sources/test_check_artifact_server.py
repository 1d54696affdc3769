"""``check-artifact-server`` (what ``helm test`` runs) against the real artifact server.

The command runs as a subprocess, as in the test Pod, against an ``ArtifactServer`` on loopback:
it passes with the server's key, and fails with one line naming the cause for another key, a
closed port, and something that is not an artifact server. A server that accepted anything
would fail the check too (the forged request must be refused).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_operator.sources.server import ArtifactServer
from taskhandler_operator.sources.store import RevisionStore

pytestmark = pytest.mark.integration

KEY = b"k" * 40


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ArtifactServer]:
    served = ArtifactServer(RevisionStore(tmp_path / "store"), KEY, host="127.0.0.1", port=0)
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


async def check(url: str, key: bytes, tmp_path: Path, wait: str = "5") -> tuple[int, str, str]:
    key_file = tmp_path / "key"
    key_file.write_bytes(key + b"\n")  # a Secret file made with `echo` ends in a newline
    argv = [
        sys.executable, "-m", "taskhandler_operator.cli", "check-artifact-server",
        f"--url={url}", f"--signing-key-file={key_file}", f"--timeout={wait}",
    ]  # fmt: skip
    # The server runs in this event loop: the subprocess must not block it.
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout.strip(), done.stderr.strip()


async def test_the_servers_own_key_passes(server: ArtifactServer, tmp_path: Path) -> None:
    code, out, err = await check(server.url, KEY, tmp_path)
    assert (code, err) == (0, ""), err
    assert out == (
        f"artifact server {server.url}: a URL signed with the mounted key is accepted (404 "
        "missing: no revision holds the test file) and a forged signature is refused (403 "
        "tampered)"
    )
    assert server.counts["missing"] == 1 and server.counts["tampered"] == 1


async def test_another_key_is_named(server: ArtifactServer, tmp_path: Path) -> None:
    code, out, err = await check(server.url, b"x" * 40, tmp_path)
    assert (code, out) == (1, "")
    assert err.startswith(
        f"check-artifact-server: FAILED: the artifact server at {server.url} refused a URL "
        "signed with the mounted key (403 tampered): the operator signs with another key"
    )
    assert len(err.splitlines()) == 1


async def test_no_server_is_unreachable_after_the_timeout(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, _out, err = await check(url, KEY, tmp_path, wait="3")
    assert code == 1
    assert err.startswith(
        f"check-artifact-server: FAILED: cannot reach the artifact server at {url}"
    )
    assert "NetworkPolicy" in err


async def test_a_server_that_accepts_anything_fails(tmp_path: Path) -> None:
    async def anything(_request: web.Request) -> web.Response:
        return web.Response(status=404, text="missing\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        code, _out, err = await check(f"http://127.0.0.1:{port}", KEY, tmp_path)
    finally:
        await runner.cleanup()
    assert code == 1
    assert "answered HTTP 404 'missing' to a URL with a forged signature" in err


async def test_a_short_key_file_is_a_usage_error(tmp_path: Path) -> None:
    code, _out, err = await check("http://127.0.0.1:1", b"short", tmp_path)
    assert code == 2
    assert err == (
        f"check-artifact-server: the signing key file {tmp_path / 'key'} holds 5 bytes; the "
        "operator needs at least 32"
    )
