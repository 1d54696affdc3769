"""A sync killed with SIGKILL mid-download leaves no visible revision; the next one succeeds."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from taskhandler_operator.sources.store import RevisionStore
from tests.fixtures.sources import HttpServer
from tests.integration.sources.conftest import NAMESPACE, read_tree, sync_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SYNC_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from taskhandler_operator.sources.spec import SourceSpec
    from taskhandler_operator.sources.store import RevisionStore
    from taskhandler_operator.sources.sync import sync

    async def main() -> None:
        store = RevisionStore(Path(sys.argv[1]))
        await store.open()
        spec = SourceSpec.model_validate({"http": {"url": sys.argv[2], "sha256": sys.argv[3]}})
        await sync(spec, None, store, namespace=sys.argv[4], bundle="bundle", timeout=600)

    asyncio.run(main())
    """
)


def staged_bytes(bundle_dir: Path) -> int:
    total = 0
    for staging in bundle_dir.glob(".tmp-*"):
        for path in staging.rglob("*"):
            if path.is_file():
                total += path.stat().st_size
    return total


async def test_sigkill_mid_download(open_http: HttpServer, tmp_path: Path) -> None:
    data = os.urandom(4 << 20)
    digest = hashlib.sha256(data).hexdigest()
    rel = f"{secrets.token_hex(4)}/artifact"
    url = open_http.put_file(rel, data)
    open_http.control(rel, slow=0.05)  # 64 KiB every 50 ms: about 3 s for the whole file
    root = tmp_path / "store"
    bundle_dir = root / NAMESPACE / "bundle"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SYNC_SCRIPT,
        str(root),
        url,
        digest,
        NAMESPACE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        deadline = time.monotonic() + 60
        while staged_bytes(bundle_dir) < (256 << 10):
            assert child.returncode is None, "the sync ended before it could be killed"
            assert time.monotonic() < deadline, "the download never started"
            await asyncio.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        await asyncio.wait_for(child.wait(), 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == -signal.SIGKILL
    leftovers = [p.name for p in bundle_dir.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the kill should have left a half-written staging folder"

    store = RevisionStore(root)
    assert await store.revisions(NAMESPACE, "bundle") == []  # nothing half-written is visible
    await store.open()
    assert not any(p.name.startswith(".tmp-") for p in bundle_dir.iterdir())

    open_http.control(rel)  # full speed again
    revision = await sync_source(store, {"http": {"url": url, "sha256": digest}})
    assert read_tree(revision.path) == {"artifact": data}
    assert await store.revisions(NAMESPACE, "bundle") == [revision]
