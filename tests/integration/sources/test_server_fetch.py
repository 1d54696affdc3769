"""The artifact server (signed, expiring URLs over loopback) and the ``fetch`` command."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_operator.sources import signing
from taskhandler_operator.sources.models import Revision
from taskhandler_operator.sources.paths import UnsafePath
from taskhandler_operator.sources.server import DIGEST_HEADER, EXECUTABLE_HEADER, ArtifactServer
from taskhandler_operator.sources.store import RevisionStore
from tests.fixtures.sources import HttpServer
from tests.integration.sources.conftest import NAMESPACE, sync_source

pytestmark = pytest.mark.integration

KEY = b"s" * 32
APP = os.urandom(100_000)


@dataclass
class Served:
    server: ArtifactServer
    store: RevisionStore
    revision: Revision
    registry: CollectorRegistry
    volume: Path

    def url(self, rel: str, expires_in: float = 300) -> str:
        return self.server.sign_url(NAMESPACE, "bundle", self.revision.id, rel, expires_in)

    async def manifest(self, *rels: str) -> list[dict[str, object]]:
        return [
            await self.server.manifest_entry(NAMESPACE, "bundle", self.revision.id, rel, 300)
            for rel in rels
        ]

    def metric(self, outcome: str) -> float:
        value = self.registry.get_sample_value("thop_artifact_requests_total", {"outcome": outcome})
        return value or 0.0


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    volume = tmp_path / "vol"
    (volume / "lib").mkdir(parents=True)
    (volume / "lib" / "app.jar").write_bytes(APP)
    (volume / "bin").mkdir()
    (volume / "bin" / "handler").write_bytes(b"\x7fELF go handler")
    (volume / "bin" / "handler").chmod(0o755)
    (volume / "current.jar").symlink_to("lib/app.jar")
    store = RevisionStore(tmp_path / "store", keep=1)
    revision = await sync_source(store, {"volume": {"path": str(volume)}})
    registry = CollectorRegistry()
    server = ArtifactServer(store, KEY, host="127.0.0.1", port=0, registry=registry)
    await server.start()
    try:
        yield Served(server, store, revision, registry, volume)
    finally:
        await server.stop()


def raw_get(port: int, path: str) -> tuple[int, bytes]:
    """A request sent byte for byte as given (no client-side normalisation of the path)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def test_signed_download_carries_the_digest(served: Served) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(served.url("lib/app.jar")) as response:
            assert response.status == 200
            body = await response.read()
            assert body == APP
            assert response.headers[DIGEST_HEADER] == hashlib.sha256(APP).hexdigest()
            assert response.headers[EXECUTABLE_HEADER] == "0"
        async with session.get(served.url("bin/handler")) as response:
            assert response.headers[EXECUTABLE_HEADER] == "1"
        async with session.head(served.url("current.jar")) as response:  # a link inside
            assert response.status == 200 and response.content_length == len(APP)
    assert served.server.counts["served"] == 3
    assert served.metric("served") == 3


@pytest.mark.parametrize(
    "path",
    [
        "/v1/artifacts/team-a/bundle/{rev}/../../../../etc/passwd",
        "/v1/artifacts/team-a/bundle/{rev}/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/v1/artifacts/team-a/bundle/{rev}/%2E%2E/secret",
        "/v1/artifacts/team-a/bundle/{rev}//etc/passwd",
        "/v1/artifacts/team-a/bundle/{rev}/lib\\..\\..\\x",
        "/v1/artifacts/team-a/bundle/{rev}/lib%2Fapp.jar",
        "/v1/artifacts/team-a/../../store/x/y",
        "/v1/artifacts/team-a/bundle/.meta/{rev}.json",
    ],
)
async def test_path_traversal_is_refused_and_counted(served: Served, path: str) -> None:
    target = path.format(rev=served.revision.id)
    # Sign what the path would decode to, so a valid signature cannot be the reason.
    status, body = await asyncio.to_thread(raw_get, served.server.port, target + "?expires=1")
    assert status == 404 and body == b"escaping\n"
    assert served.server.counts["escaping"] == 1
    assert served.metric("escaping") == 1


async def test_unsigned_expired_and_tampered_urls(served: Served) -> None:
    port = served.server.port
    where = signing.place(NAMESPACE, "bundle", served.revision.id, "lib/app.jar")
    base = f"/v1/artifacts/{NAMESPACE}/bundle/{served.revision.id}/lib/app.jar"
    good = signing.signed_path(KEY, where, 300)
    expires, signature = (part.split("=")[1] for part in good.split("?")[1].split("&"))
    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    expired = signing.signed_path(KEY, where, 10, now=time.time() - 100)
    other = f"/v1/artifacts/{NAMESPACE}/bundle/{served.revision.id}/bin/handler"
    cases = {
        base: "unsigned",
        f"{base}?expires={expires}": "unsigned",
        expired: "expired",
        f"{base}?expires={expires}&signature={flipped}": "tampered",
        f"{base}?expires={int(expires) + 1}&signature={signature}": "tampered",
        f"{other}?expires={expires}&signature={signature}": "tampered",
        f"{base}?expires=abc&signature={signature}": "tampered",
    }
    for path, outcome in cases.items():
        status, body = await asyncio.to_thread(raw_get, port, path)
        assert (status, body.decode().strip()) == (403, outcome), path
    assert served.server.counts == {"unsigned": 2, "expired": 1, "tampered": 4}
    assert served.metric("tampered") == 4
    assert await asyncio.to_thread(raw_get, port, good) == (200, APP)


async def test_files_outside_kept_revisions_are_missing(served: Served) -> None:
    port = served.server.port
    url = served.url("lib/app.jar")
    path = url[len(served.server.url) :]
    missing = served.url("lib/absent.jar")[len(served.server.url) :]
    assert (await asyncio.to_thread(raw_get, port, missing))[0] == 404
    # A new revision with keep=1 prunes the old one: its signed URLs stop working.
    (served.volume / "new.txt").write_text("new")
    newer = await sync_source(served.store, {"volume": {"path": str(served.volume)}})
    assert newer.id != served.revision.id
    assert await asyncio.to_thread(raw_get, port, path) == (404, b"missing\n")
    assert served.server.counts["missing"] == 2


def test_signing_refuses_what_it_could_never_serve() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        ArtifactServer(RevisionStore(Path("/nonexistent")), b"short")
    server = ArtifactServer(RevisionStore(Path("/nonexistent")), KEY, public_url="http://a.b:1/")
    with pytest.raises(UnsafePath):
        server.sign_url(NAMESPACE, "bundle", "abc", "../../etc/passwd", 60)
    with pytest.raises(ValueError, match="revision id"):
        server.sign_url(NAMESPACE, "bundle", "../x", "a", 60)
    assert server.sign_url(NAMESPACE, "bundle", "abc", "a.jar", 60).startswith(
        "http://a.b:1/v1/artifacts/team-a/bundle/abc/a.jar?expires="
    )


# -- fetch -----------------------------------------------------------------------------------


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float


async def fetch(dest: Path, manifest: object, *extra: str) -> Run:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "taskhandler_operator",
        "fetch",
        "--dest",
        str(dest),
        "--manifest",
        json.dumps(manifest),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return Run(proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


async def test_fetch_downloads_verifies_and_keeps_modes(served: Served, tmp_path: Path) -> None:
    manifest = await served.manifest("lib/app.jar", "bin/handler")
    dest = tmp_path / "probe"
    run = await fetch(dest, manifest)
    assert run.code == 0, run.stderr
    assert "fetched 2 file(s)" in one_line(run.stdout) and "2 downloaded" in run.stdout
    assert (dest / "lib" / "app.jar").read_bytes() == APP
    assert stat.S_IMODE((dest / "bin" / "handler").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "lib" / "app.jar").stat().st_mode) == 0o644
    assert not [p for p in dest.rglob(".*")]  # no temporary files left
    again = await fetch(dest, manifest)  # an init container restarted in the same pod
    assert again.code == 0 and "0 downloaded" in again.stdout


async def test_fetch_refuses_an_expired_url_at_once(served: Served, tmp_path: Path) -> None:
    (item,) = await served.manifest("lib/app.jar")
    where = signing.place(NAMESPACE, "bundle", served.revision.id, "lib/app.jar")
    item["url"] = served.server.url + signing.signed_path(KEY, where, 5, now=time.time() - 60)
    run = await fetch(tmp_path / "probe", [item])
    assert run.code == 1
    line = one_line(run.stderr)
    assert "lib/app.jar: HTTP 403" in line and "expired or was altered" in line
    assert "signature=" not in line
    assert served.server.counts["expired"] == 1  # 4xx is not retried


async def test_fetch_detects_corruption_and_retries(open_http: HttpServer, tmp_path: Path) -> None:
    data = os.urandom(50_000)
    rel = f"{secrets.token_hex(4)}/artifact.jar"
    url = open_http.put_file(rel, data)
    item: dict[str, object] = {"path": "artifact.jar", "url": url, "size": len(data)}
    item["sha256"] = hashlib.sha256(data).hexdigest()
    open_http.control(rel, corrupt=2)
    run = await fetch(tmp_path / "ok", [item], "--attempts", "5")
    assert run.code == 0, run.stderr
    assert (tmp_path / "ok" / "artifact.jar").read_bytes() == data
    assert "3 attempt(s)" in run.stdout
    assert [r["status"] for r in open_http.requests(f"/files/{rel}")] == [200, 200, 200]

    open_http.control(rel, corrupt=10)
    run = await fetch(tmp_path / "bad", [item], "--attempts", "3")
    assert run.code == 1
    line = one_line(run.stderr)
    assert "artifact.jar: failed after 3 attempts: sha256 mismatch" in line
    assert not (tmp_path / "bad" / "artifact.jar").exists()


async def test_fetch_is_bounded_by_its_timeout(open_http: HttpServer, tmp_path: Path) -> None:
    rel = f"{secrets.token_hex(4)}/slow.bin"
    url = open_http.put_file(rel, b"late")
    open_http.control(rel, hang=60)
    item = {"path": "slow.bin", "url": url, "sha256": hashlib.sha256(b"late").hexdigest()}
    run = await fetch(tmp_path / "probe", [{**item, "size": 4}], "--timeout", "2")
    assert run.code == 1
    assert "slow.bin: not done within the 2s timeout" in one_line(run.stderr)
    assert run.seconds < 40  # bounded by the timeout plus one read timeout, not by the server


async def test_fetch_retries_until_the_server_is_up(tmp_path: Path) -> None:
    """Connection refused, then a server appears on the port: fetch backs off and succeeds."""
    port = free_port()
    (tmp_path / "www").mkdir()
    data = b"eventually served"
    (tmp_path / "www" / "late.bin").write_bytes(data)
    item = {
        "path": "late.bin",
        "url": f"http://127.0.0.1:{port}/late.bin",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    fetching = asyncio.ensure_future(fetch(tmp_path / "probe", [item], "--attempts", "8"))
    await asyncio.sleep(0.6)
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
        "--directory", str(tmp_path / "www"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        run = await fetching
    finally:
        server.terminate()
        await server.wait()
    assert run.code == 0, run.stderr
    assert (tmp_path / "probe" / "late.bin").read_bytes() == data
    attempts = int(run.stdout.split(" attempt(s)")[0].rsplit(" ", 1)[-1])
    assert attempts >= 2


@pytest.mark.parametrize(
    ("manifest", "text"),
    [
        ("not json", "manifest: is not JSON"),
        ({"path": "a"}, "must be a JSON list"),
        ([{"path": "../escape", "url": "http://x/", "sha256": "0" * 64, "size": 1}], "escapes"),
        ([{"path": "/abs", "url": "http://x/", "sha256": "0" * 64, "size": 1}], "absolute"),
        ([{"path": "a", "url": "file:///etc/passwd", "sha256": "0" * 64, "size": 1}], "http://"),
        ([{"path": "a", "url": "http://x/", "sha256": "XYZ", "size": 1}], "64 lowercase hex"),
        ([{"path": "a", "url": "http://x/", "sha256": "0" * 64, "size": -1}], "non-negative"),
        ([{"path": "a", "url": "http://x/", "sha256": "0" * 64}], "missing keys ['size']"),
        (
            [{"path": "a", "url": "http://x/", "sha256": "0" * 64, "size": 1, "mode": 7}],
            "unknown keys ['mode']",
        ),
        (
            [
                {"path": "a", "url": "http://x/", "sha256": "0" * 64, "size": 1},
                {"path": "./a", "url": "http://x/", "sha256": "0" * 64, "size": 1},
            ],
            "appears twice",
        ),
    ],
)
async def test_fetch_refuses_bad_manifests(tmp_path: Path, manifest: object, text: str) -> None:
    if isinstance(manifest, str):  # sent verbatim, not as JSON
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "taskhandler_operator", "fetch", "--dest", str(tmp_path / "d"),
            "--manifest", manifest,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        run = Run(proc.returncode or 0, "", err.decode(), 0)
    else:
        run = await fetch(tmp_path / "d", manifest)
    assert run.code == 2
    assert text in one_line(run.stderr)
    assert not (tmp_path / "escape").exists()


async def test_fetch_bounds_total_size(served: Served, tmp_path: Path) -> None:
    manifest = await served.manifest("lib/app.jar")
    run = await fetch(tmp_path / "probe", manifest, "--max-bytes", "1000")
    assert run.code == 1
    assert "more than --max-bytes 1000" in one_line(run.stderr)
    assert served.server.counts["served"] == 0


async def test_the_probe_jobs_init_container_command_fetches_from_the_server(
    served: Served, tmp_path: Path
) -> None:
    """The contract with kube/probe_job.py: its ``fetch`` argv, run as given (binary and
    destination swapped for this machine), downloads a revision's files from the server."""
    from taskhandler_operator.artifacts.models import Language
    from taskhandler_operator.kube.probe_job import (
        BUNDLE_MOUNT,
        BundleIdentity,
        FetchFile,
        ProbeJobRequest,
        ProbeTarget,
        fetch_command,
    )

    entries = await served.manifest("bin/handler", "lib/app.jar")
    request = ProbeJobRequest(
        bundle=BundleIdentity(NAMESPACE, "bundle", "uid-1", "bundle"),
        language=Language.GO,
        target=ProbeTarget("bin/handler", int(entries[0]["size"]), None),  # type: ignore[call-overload]
        files=[FetchFile(**e) for e in entries],  # type: ignore[arg-type]
        operator_image="operator:test",
        runtime_image="operator:test",
    )
    argv = fetch_command(request)
    assert argv[:2] == ["taskhandler-operator", "fetch"]
    dest = tmp_path / "bundle"
    argv = [sys.executable, "-m", "taskhandler_operator", *argv[1:]]
    argv[argv.index(BUNDLE_MOUNT)] = str(dest)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert (dest / "lib" / "app.jar").read_bytes() == APP
    assert os.access(dest / "bin" / "handler", os.X_OK)  # the Go artifact stays executable
