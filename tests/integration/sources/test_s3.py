"""S3 sources against a real S3-compatible server (VersityGW, built from its Go module)."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest

from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    InvalidSource,
    NotFound,
    S3FetchFailed,
)
from taskhandler_operator.sources.s3 import S3Object, listing_digest
from taskhandler_operator.sources.store import RevisionStore
from tests.fixtures.sources import S3_SECRET_KEY, S3Server, bucket_name
from tests.integration.sources.conftest import NAMESPACE, fingerprint, read_tree, sync_source

pytestmark = pytest.mark.integration


def s3(server: S3Server, bucket: str, prefix: str = "bundle") -> dict[str, object]:
    return {
        "s3": {
            "bucket": bucket,
            "prefix": prefix,
            "endpoint": server.endpoint,
            "secretRef": {"name": "s3-creds"},
        }
    }


def objects(count: int, prefix: str = "bundle/") -> dict[str, bytes | None]:
    return {f"{prefix}lib/dep{n:03d}.jar": f"jar number {n}".encode() for n in range(count)}


async def put(server: S3Server, bucket: str, items: dict[str, bytes | None], create: bool) -> None:
    await asyncio.to_thread(server.put, bucket, items, create)


async def listing(server: S3Server, bucket: str, prefix: str) -> list[dict[str, Any]]:
    async with server.client() as client:
        found: list[dict[str, Any]] = []
        async for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix
        ):
            found.extend(page.get("Contents", []))
        return found


async def test_listing_digest_and_contents(s3_server: S3Server, store: RevisionStore) -> None:
    bucket = bucket_name()
    await put(s3_server, bucket, {**objects(5), "elsewhere/x": b"not in the prefix"}, True)
    revision = await sync_source(store, s3(s3_server, bucket), s3_server.credentials)
    listed = await listing(s3_server, bucket, "bundle/")
    expected = listing_digest(
        [S3Object(o["Key"][len("bundle/") :], o["Key"], o["Size"], o["ETag"]) for o in listed]
    )
    assert (revision.id, revision.source) == (expected, f"sha256:{expected}")
    assert read_tree(revision.path) == {
        k[len("bundle/") :]: v for k, v in objects(5).items() if v is not None
    }
    assert (revision.kind, revision.file_count) == ("s3", 5)


async def test_unchanged_bucket_lists_only(s3_server: S3Server, store: RevisionStore) -> None:
    bucket = bucket_name()
    await put(s3_server, bucket, objects(20), True)
    first = await sync_source(store, s3(s3_server, bucket), s3_server.credentials)
    await asyncio.to_thread(s3_server.wait_for_log, bucket)
    gets = s3_server.calls("GetObject", bucket)
    assert gets == 20
    before = fingerprint(store.root)
    assert await sync_source(store, s3(s3_server, bucket), s3_server.credentials) == first
    await asyncio.to_thread(s3_server.wait_for_log, bucket)
    assert s3_server.calls("GetObject", bucket) == gets  # no download at all
    assert fingerprint(store.root) == before


async def test_only_changed_objects_are_downloaded(
    s3_server: S3Server, store: RevisionStore
) -> None:
    bucket = bucket_name()
    await put(s3_server, bucket, objects(30), True)
    first = await sync_source(store, s3(s3_server, bucket), s3_server.credentials)
    await asyncio.to_thread(s3_server.wait_for_log, bucket)
    gets = s3_server.calls("GetObject", bucket)
    await put(
        s3_server, bucket, {"bundle/lib/dep007.jar": b"changed!", "bundle/new.txt": b"n"}, False
    )
    second = await sync_source(store, s3(s3_server, bucket), s3_server.credentials)
    await asyncio.to_thread(s3_server.wait_for_log, bucket)
    assert s3_server.calls("GetObject", bucket) - gets == 2
    assert second.id != first.id and second.file_count == 31
    assert (second.path / "lib/dep007.jar").read_bytes() == b"changed!"
    assert (first.path / "lib/dep007.jar").read_bytes() == b"jar number 7"
    unchanged = "lib/dep008.jar"
    assert (second.path / unchanged).stat().st_ino == (first.path / unchanged).stat().st_ino
    await put(s3_server, bucket, {"bundle/new.txt": None}, False)
    third = await sync_source(store, s3(s3_server, bucket), s3_server.credentials)
    assert not (third.path / "new.txt").exists() and third.file_count == 30


async def test_missing_bucket_is_not_found(s3_server: S3Server, store: RevisionStore) -> None:
    with pytest.raises(NotFound, match="bucket thop-no-such-bucket does not exist at"):
        await sync_source(store, s3(s3_server, "thop-no-such-bucket"), s3_server.credentials)


async def test_empty_prefix_is_not_found(s3_server: S3Server, store: RevisionStore) -> None:
    bucket = bucket_name()
    await put(s3_server, bucket, objects(1), True)
    with pytest.raises(NotFound, match="no objects under"):
        await sync_source(store, s3(s3_server, bucket, "typo"), s3_server.credentials)


async def test_wrong_keys_are_an_authentication_failure_without_the_secret(
    s3_server: S3Server, store: RevisionStore
) -> None:
    bucket = bucket_name()
    await put(s3_server, bucket, objects(1), True)
    wrong_secret = {"accessKeyID": b"thopaccess", "secretAccessKey": b"thop-wrong-secret-991"}
    with pytest.raises(AuthenticationFailed, match="check accessKeyID and secretAccessKey") as a:
        await sync_source(store, s3(s3_server, bucket), wrong_secret)
    unknown_key = {"accessKeyID": b"nobody-key", "secretAccessKey": S3_SECRET_KEY.encode()}
    with pytest.raises(AuthenticationFailed) as b:
        await sync_source(store, s3(s3_server, bucket), unknown_key)
    for error in (a.value, b.value):
        text = "".join(traceback.format_exception(error))
        assert "thop-wrong-secret-991" not in text and S3_SECRET_KEY not in text
    with pytest.raises(InvalidSource, match="accessKeyID and secretAccessKey"):
        await sync_source(store, s3(s3_server, bucket), {"accessKeyID": b"only-this"})


async def test_unreachable_endpoint(store: RevisionStore) -> None:
    spec = {"s3": {"bucket": "abc", "endpoint": "http://127.0.0.1:9", "secretRef": {"name": "x"}}}
    with pytest.raises(S3FetchFailed, match=r"127\.0\.0\.1:9"):
        await sync_source(store, spec, {"accessKeyID": b"a", "secretAccessKey": b"b"}, within=60)


async def test_caps_refuse_before_any_download(s3_server: S3Server, tmp_path: Any) -> None:
    from tests.integration.sources.conftest import make_store

    bucket = bucket_name()
    await put(s3_server, bucket, objects(12), True)
    capped = make_store(tmp_path / "capped", max_files=10)
    with pytest.raises(ArchiveRefused, match="more than 10 objects"):
        await sync_source(capped, s3(s3_server, bucket), s3_server.credentials)
    small = make_store(tmp_path / "small", max_bytes=50)
    with pytest.raises(ArchiveRefused, match="more than the store's cap of 50"):
        await sync_source(small, s3(s3_server, bucket), s3_server.credentials)
    await asyncio.to_thread(s3_server.wait_for_log, bucket)
    assert s3_server.calls("GetObject", bucket) == 0
    assert await capped.revisions(NAMESPACE, "bundle") == []


async def test_without_a_secret_the_default_credential_chain_is_used(
    s3_server: S3Server, store: RevisionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No secretRef: botocore's chain (here its environment variables, as IRSA or instance
    metadata would be in a cluster) supplies the keys."""
    from taskhandler_operator.sources import s3 as s3_source

    bucket = bucket_name()
    await put(s3_server, bucket, objects(2), True)
    monkeypatch.setattr(s3_source, "_session", None)  # a session that has cached nothing
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    source = {"s3": {"bucket": bucket, "prefix": "bundle", "endpoint": s3_server.endpoint}}
    revision = await sync_source(store, source, None)
    assert revision.file_count == 2
