"""HTTP sources against a real HTTP server process on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import secrets
import tarfile
import time
import traceback
import zipfile
from pathlib import Path

import pytest

from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    ChecksumMismatch,
    HttpFetchFailed,
    InvalidSource,
    NotFound,
    SourceError,
    SourceTimeout,
)
from taskhandler_operator.sources.store import RevisionStore
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD, PLANTED_TOKEN, HttpServer
from tests.integration.sources.conftest import (
    NAMESPACE,
    fingerprint,
    make_store,
    read_tree,
    sync_source,
)

pytestmark = pytest.mark.integration


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def unique(name: str) -> str:
    return f"{secrets.token_hex(4)}/{name}"


def http(url: str, data: bytes, secret: bool = False) -> dict[str, object]:
    source: dict[str, object] = {"url": url, "sha256": sha(data)}
    if secret:
        source["secretRef"] = {"name": "creds"}
    return {"http": source}


async def test_single_file_is_stored_under_its_name_and_executable(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = b"\x7fELF pretend go binary"
    url = open_http.put_file(unique("handler"), data)
    revision = await sync_source(store, http(url, data))
    assert read_tree(revision.path) == {"handler": data}
    assert os.access(revision.path / "handler", os.X_OK)
    assert revision.source == f"sha256:{sha(data)}"
    assert revision.id.startswith(sha(data)) and revision.kind == "http"


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
async def test_archives_are_extracted(
    open_http: HttpServer, store: RevisionStore, kind: str
) -> None:
    files = {"lib/a.jar": b"jar bytes", "bin/run.sh": b"#!/bin/sh\n", "README": b"hi"}
    data = tar_gz(files) if kind == "tar.gz" else zip_bytes(files)
    url = open_http.put_file(unique(f"bundle.{kind}"), data)
    revision = await sync_source(store, http(url, data))
    assert read_tree(revision.path) == files
    assert revision.id == sha(data)
    assert (revision.file_count, revision.bytes) == (3, sum(len(v) for v in files.values()))


async def test_a_wrong_pin_is_refused_naming_both_digests(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = b"the real content"
    url = open_http.put_file(unique("file.bin"), data)
    pinned = "0" * 64
    with pytest.raises(ChecksumMismatch) as info:
        await sync_source(store, {"http": {"url": url, "sha256": pinned}})
    assert sha(data) in info.value.message and pinned in info.value.message
    assert info.value.reason == "ChecksumMismatch"
    assert await store.revisions(NAMESPACE, "bundle") == []


async def test_an_unchanged_url_is_answered_304_and_not_downloaded(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = tar_gz({"a.txt": b"a" * 5000})
    rel = unique("bundle.tgz")
    url = open_http.put_file(rel, data)
    first = await sync_source(store, http(url, data))
    before = fingerprint(store.root)
    again = await sync_source(store, http(url, data))
    assert again == first
    requests = open_http.requests(f"/files/{rel}")
    assert [r["status"] for r in requests] == [200, 304]
    assert requests[1]["bytes"] == 0
    assert fingerprint(store.root) == before


async def test_without_validators_a_kept_pin_is_not_asked_again(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = b"content"
    rel = unique("plain.bin")
    url = open_http.put_file(rel, data)
    open_http.control(rel, no_validators=True)
    first = await sync_source(store, http(url, data))
    assert await sync_source(store, http(url, data)) == first
    assert len(open_http.requests(f"/files/{rel}")) == 1


async def test_changed_content_under_the_same_pin_is_refused(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = b"version one"
    rel = unique("moving.bin")
    url = open_http.put_file(rel, data)
    first = await sync_source(store, http(url, data))
    open_http.put_file(rel, b"version two")
    with pytest.raises(ChecksumMismatch, match="update the pin"):
        await sync_source(store, http(url, data))
    assert await store.revisions(NAMESPACE, "bundle") == [first]


@pytest.mark.parametrize(
    "credentials",
    [
        {"token": PLANTED_TOKEN.encode() + b"\n"},
        {"username": HTTP_USER.encode(), "password": PLANTED_PASSWORD.encode()},
    ],
)
async def test_token_and_basic_auth(
    source_http: HttpServer, store: RevisionStore, credentials: dict[str, bytes]
) -> None:
    data = b"protected"
    rel = unique("secret.bin")
    url = source_http.put_file(rel, data)
    revision = await sync_source(store, http(url, data, secret=True), credentials)
    assert read_tree(revision.path) == {"secret.bin": data}
    assert source_http.requests(f"/files/{rel}")[-1]["auth"] is True


async def test_auth_failures_name_what_to_check_and_leak_nothing(
    source_http: HttpServer, store: RevisionStore
) -> None:
    data = b"protected"
    url = source_http.put_file(unique("secret.bin"), data)
    with pytest.raises(AuthenticationFailed, match="set secretRef") as missing:
        await sync_source(store, http(url, data))
    wrong = {"token": b"thop-wrong-token-value-0000"}
    with pytest.raises(AuthenticationFailed, match="check the token") as refused:
        await sync_source(store, http(url, data, secret=True), wrong)
    for error in (missing.value, refused.value):
        text = "".join(traceback.format_exception(error))
        assert "thop-wrong-token-value-0000" not in text and PLANTED_TOKEN not in text
    with pytest.raises(InvalidSource, match="token, or username and password"):
        await sync_source(store, http(url, data, secret=True), {"user": b"x"})


async def test_credentials_are_not_sent_after_a_redirect_to_another_origin(
    source_http: HttpServer, open_http: HttpServer, store: RevisionStore
) -> None:
    data = b"moved elsewhere"
    target_rel = unique("target.bin")
    target = open_http.put_file(target_rel, data)
    rel = unique("target.bin")
    url = source_http.file_url(rel)
    source_http.control(rel, redirect=target)
    revision = await sync_source(
        store, http(url, data, secret=True), {"token": PLANTED_TOKEN.encode()}
    )
    assert read_tree(revision.path) == {"target.bin": data}
    assert source_http.requests(f"/files/{rel}")[0]["auth"] is True
    assert open_http.requests(f"/files/{target_rel}")[0]["auth"] is False


@pytest.mark.parametrize(
    ("status", "error", "text"),
    [(404, NotFound, "HTTP 404"), (500, HttpFetchFailed, "HTTP 500"), (410, NotFound, "410")],
)
async def test_http_errors(
    open_http: HttpServer,
    store: RevisionStore,
    status: int,
    error: type[SourceError],
    text: str,
) -> None:
    rel = unique("broken.bin")
    open_http.control(rel, status=status)
    with pytest.raises(error, match=text):
        await sync_source(store, {"http": {"url": open_http.file_url(rel), "sha256": "1" * 64}})


async def test_the_query_string_never_shows_in_an_error(
    open_http: HttpServer, store: RevisionStore
) -> None:
    rel = unique("signed.bin")
    url = open_http.file_url(rel) + "?X-Signature=very-secret-signature"
    with pytest.raises(NotFound) as info:
        await sync_source(store, {"http": {"url": url, "sha256": "1" * 64}})
    assert "very-secret-signature" not in str(info.value)


async def test_the_size_cap_refuses_a_large_download(open_http: HttpServer, tmp_path: Path) -> None:
    data = os.urandom(200_000)
    url = open_http.put_file(unique("big.bin"), data)
    store = make_store(tmp_path / "store", max_bytes=100_000)
    with pytest.raises(ArchiveRefused, match="more than the store's cap of 100000"):
        await sync_source(store, http(url, data))
    assert await store.revisions(NAMESPACE, "bundle") == []


async def test_a_hanging_server_is_bounded_by_the_timeout(
    open_http: HttpServer, store: RevisionStore
) -> None:
    rel = unique("hang.bin")
    open_http.put_file(rel, b"late")
    open_http.control(rel, hang=60)
    started = time.monotonic()
    with pytest.raises(SourceTimeout, match="did not finish within 1s"):
        await sync_source(store, http(open_http.file_url(rel), b"late"), within=1.0)
    assert time.monotonic() - started < 30  # bounded, not a speed claim
    base = store.root / NAMESPACE / "bundle"
    assert [p.name for p in base.iterdir() if p.name.startswith(".tmp-")] == []


async def test_cancelling_a_sync_mid_download_leaves_nothing(
    open_http: HttpServer, store: RevisionStore
) -> None:
    data = os.urandom(2 << 20)
    rel = unique("slow.bin")
    url = open_http.put_file(rel, data)
    open_http.control(rel, slow=0.05)
    task = asyncio.ensure_future(sync_source(store, http(url, data)))
    base = store.root / NAMESPACE / "bundle"
    deadline = time.monotonic() + 30
    while not any(base.glob(".tmp-*/scratch/download")):
        assert not task.done() and time.monotonic() < deadline
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(p.name for p in base.iterdir()) == [".lock"]
    open_http.control(rel)
    assert (await sync_source(store, http(url, data))).file_count == 1
