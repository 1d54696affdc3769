"""S3 listings from a hostile endpoint (``tests/fixtures/hostile_s3.py``, a real HTTP server
on 127.0.0.1): each is a typed S3FetchFailed naming what is wrong, read with a byte cap per
page and a page cap per listing, and a 512 MiB page costs the ``sync`` command no more memory
than a small one. The well-behaved path is ``test_s3.py`` against VersityGW."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskhandler_operator.sources import s3
from taskhandler_operator.sources.errors import S3FetchFailed
from tests.fixtures.hostile_s3 import HUGE_BYTES, HostileS3
from tests.integration.sources.conftest import make_store, sync_source
from tests.integration.sources.test_hostile_archives import SYNC_RSS_BOUND_KB, sync_peak_rss

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEYS = {"accessKeyID": b"AKIAHOSTILETEST", "secretAccessKey": b"hostile-test-secret-key"}
CAP = f"over the {s3.MAX_ANSWER_BYTES}-byte cap"


@pytest.fixture(scope="module")
def hostile_s3() -> Iterator[HostileS3]:
    server = HostileS3().start()
    yield server
    server.stop()


def source(endpoint: str) -> dict[str, object]:
    return {
        "s3": {
            "bucket": "hostile",
            "prefix": "bundle",
            "endpoint": endpoint,
            "region": "us-east-1",
            "secretRef": {"name": "keys"},
        }
    }


CASES = [
    ("huge", CAP),
    ("huge-declared", f"answered {HUGE_BYTES} bytes \\(its Content-Length\\) .*{CAP}"),
    ("huge-error", CAP),
    ("size-abc", r"not a valid ListObjectsV2 page \(ValueError: invalid literal for int"),
    ("size-negative", r"key 'bundle/b.jar' has the size '-5'"),
    ("no-key", "an entry has no Key"),
    ("no-size", r"key 'bundle/a.jar' has the size 'None'"),
    # botocore turns an unparsable 200 into a 500 (retried, then a typed error).
    ("broken-xml", r"list s3://hostile/bundle/ at http://127.0.0.1:\d+: 500"),
]


@pytest.mark.parametrize(("mode", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_a_hostile_listing_is_a_typed_error(
    hostile_s3: HostileS3, tmp_path: Path, mode: str, reason: str
) -> None:
    hostile_s3.mode = mode
    store = make_store(tmp_path / "store")
    with pytest.raises(S3FetchFailed) as info:
        await sync_source(store, source(hostile_s3.endpoint), KEYS)
    assert re.search(reason, info.value.message), info.value.message
    assert info.value.reason == "S3FetchFailed"
    assert KEYS["secretAccessKey"].decode() not in info.value.message


async def test_an_endless_listing_stops_at_the_page_cap(
    hostile_s3: HostileS3, tmp_path: Path
) -> None:
    hostile_s3.mode = "endless"
    before = hostile_s3.counts["endless"]
    store = make_store(tmp_path / "store", max_files=1000)
    pages = 1000 // s3.MIN_KEYS_PER_PAGE + 10
    with pytest.raises(S3FetchFailed, match=f"did not end within {pages} pages"):
        await sync_source(store, source(hostile_s3.endpoint), KEYS)
    assert hostile_s3.counts["endless"] - before == pages + 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["huge", "huge-error"])
def test_a_512_mib_listing_costs_no_memory(
    hostile_s3: HostileS3, tmp_path: Path, mode: str
) -> None:
    """The ``sync`` command (in a child, its peak RSS measured) against a 512 MiB page or
    error document: refused at the cap (before: read whole, then parsed: over 4.4 GB)."""
    import yaml

    hostile_s3.mode = mode
    secret = tmp_path / "keys.yaml"
    secret.write_text(yaml.safe_dump({k: v.decode() for k, v in KEYS.items()}))
    result = sync_peak_rss(tmp_path, source(hostile_s3.endpoint), "--secret-file", str(secret))
    stderr = str(result["stderr"])
    assert result["returncode"] == 1, result
    assert stderr.startswith("sync: S3FetchFailed: ") and CAP in stderr, stderr
    assert "Traceback" not in stderr
    assert int(str(result["maxrss_kb"])) < SYNC_RSS_BOUND_KB, result
