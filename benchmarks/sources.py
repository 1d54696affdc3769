"""Sources benchmark: re-syncing unchanged sources, incremental S3, and the artifact server.

In one run, against real servers on loopback (the test fixtures' git http-backend/file server
and VersityGW):

* **re-sync of an unchanged source** with ``--files`` files of ``--file-kb`` KiB, for git,
  http (a .tar.gz) and s3: the first sync, then the same sync three more times. Reported: bytes
  the server sent and *object* bytes (git packfiles, http 200 bodies, S3 GetObject bodies) over
  all re-syncs, and the median re-sync's time as a fraction of the first (targets: 0 object
  bytes, at most 5 %). Imports and botocore's model are warmed first, as in a running operator;
* **one changed object out of ``--files``** in S3: objects downloaded by the next sync
  (target: 1);
* **artifact server**: ``--clients`` concurrent downloads of one ``--size-mb`` file from an
  :class:`ArtifactServer` running in its own process, against reading the same file from disk
  the same number of times in this process (the baseline), and that process's peak RSS before and
  after serving (target: growth bounded by a small constant, not by the file size);
* **fetch start-up**: exec-to-exit wall time of ``taskhandler-operator fetch`` for one small file,
  against ``python -c pass`` (what a probe pod's init container costs before any byte moves).

Run: ``python -m benchmarks.sources [--files 1000] [--size-mb 20] [--clients 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import print_table, ratio, write_json
from taskhandler_devenv.git_server import HttpServer, make_repo, start_http_server
from taskhandler_devenv.s3_server import S3Server, start_s3_server
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.models import Revision
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore
from taskhandler_operator.sources.sync import sync

MiB = 1 << 20
TARGET_RESYNC_FRACTION = 0.05
TARGET_RSS_GROWTH_MB = 64.0
NAMESPACE = "bench"


def _payloads(count: int, size: int) -> dict[str, bytes]:
    """Independent random files: nothing for git's delta compression or gzip to fold away."""
    return {f"lib/part{n // 100:02d}/dep{n:04d}.jar": os.urandom(size) for n in range(count)}


def _warm_up() -> None:
    """Import what a running operator has imported long before its first sync, and let
    botocore parse its S3 model once, so the first sync is timed as an operator sees it."""
    import aiohttp  # noqa: F401

    from taskhandler_operator.sources import git, http, s3, volume  # noqa: F401

    async def client() -> None:
        async with s3._botocore_session().create_client(
            "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
            aws_access_key_id="x", aws_secret_access_key="y",
        ):  # fmt: skip
            pass

    asyncio.run(client())


async def _sync(store: RevisionStore, source: dict[str, Any], creds: Any, bundle: str) -> Revision:
    # Volume folders are made next to the store: their common parent is the allowed root.
    volumes = VolumeAccess.for_operator([store.root.parent], store=store.root)
    return await sync(
        SourceSpec.model_validate(source), creds, store, namespace=NAMESPACE, bundle=bundle,
        timeout=600, volumes=volumes,
    )  # fmt: skip


def _timed_sync(
    store: RevisionStore, source: dict[str, Any], creds: Any, bundle: str
) -> tuple[float, Revision]:
    started = time.perf_counter()
    revision = asyncio.run(_sync(store, source, creds, bundle))
    return time.perf_counter() - started, revision


REPEAT = 3  # re-syncs are short: the median of a few


def _timed_resync(
    store: RevisionStore, source: dict[str, Any], creds: Any, bundle: str
) -> tuple[float, Revision]:
    """Median time of REPEAT syncs of an unchanged source (all must return one revision)."""
    runs = [_timed_sync(store, source, creds, bundle) for _ in range(REPEAT)]
    assert len({revision for _, revision in runs}) == 1
    return statistics.median(t for t, _ in runs), runs[0][1]


def _row(
    kind: str, first: tuple[float, int, int], again: tuple[float, int, int], same: bool
) -> dict[str, Any]:
    return {
        "source": kind,
        "first_s": first[0],
        "first_bytes": first[1],
        "first_object_bytes": first[2],
        "resync_s": again[0],
        "resync_bytes": again[1],
        "resync_object_bytes": again[2],
        "resync_fraction": again[0] / first[0] if first[0] else 0.0,
        "same_revision": same,
    }


# -- git and http ------------------------------------------------------------------------------


def bench_git(
    server: HttpServer, store: RevisionStore, files: dict[str, bytes], work: Path
) -> dict[str, Any]:
    repo = make_repo(server.root / "git", f"bench-{secrets.token_hex(3)}", work)
    repo.commit(files, "bundle")
    prefix = f"/git/{repo.name}.git"
    source = {"git": {"url": repo.http_url(server), "ref": "main"}}

    def traffic(start: int) -> tuple[int, int]:
        records = server.requests(prefix)[start:]
        return (
            sum(int(r["bytes"]) for r in records),
            sum(int(r["bytes"]) for r in records if r.get("pack")),
        )

    first_s, first = _timed_sync(store, source, None, "git")
    first_traffic = traffic(0)
    seen = len(server.requests(prefix))
    again_s, again = _timed_resync(store, source, None, "git")
    again_traffic = traffic(seen)
    return _row("git", (first_s, *first_traffic), (again_s, *again_traffic), first == again)


def bench_http(server: HttpServer, store: RevisionStore, files: dict[str, bytes]) -> dict[str, Any]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = buffer.getvalue()
    rel = f"{secrets.token_hex(4)}/bundle.tar.gz"
    url = server.put_file(rel, archive)
    source = {"http": {"url": url, "sha256": hashlib.sha256(archive).hexdigest()}}

    def traffic(start: int) -> tuple[int, int]:
        records = server.requests(f"/files/{rel}")[start:]
        total = sum(int(r["bytes"]) for r in records)
        return total, sum(int(r["bytes"]) for r in records if r["status"] == 200)

    first_s, first = _timed_sync(store, source, None, "http")
    first_traffic = traffic(0)
    again_s, again = _timed_resync(store, source, None, "http")
    return _row("http", (first_s, *first_traffic), (again_s, *traffic(1)), first == again)


# -- s3 ------------------------------------------------------------------------------------------


def bench_s3(s3: S3Server, store: RevisionStore, files: dict[str, bytes]) -> list[dict[str, Any]]:
    bucket = f"bench-{secrets.token_hex(4)}"
    s3.put(bucket, {f"bundle/{k}": v for k, v in files.items()}, create=True)
    source = {"s3": {"bucket": bucket, "prefix": "bundle", "endpoint": s3.endpoint}}
    creds = s3.credentials

    def gets() -> int:
        s3.wait_for_log(bucket)
        return s3.calls("GetObject", bucket)

    first_s, first = _timed_sync(store, source, creds, "s3")
    first_gets = gets()
    again_s, again = _timed_resync(store, source, creds, "s3")
    again_gets = gets() - first_gets
    size = len(next(iter(files.values())))
    resync = _row(
        "s3",
        (first_s, first_gets * size, first_gets * size),
        (again_s, again_gets * size, again_gets * size),
        first == again,
    )
    changed_key = f"bundle/{next(iter(files))}"
    s3.put(bucket, {changed_key: os.urandom(size)})
    before = gets()
    change_s, changed = _timed_sync(store, source, creds, "s3")
    downloaded = gets() - before
    one_change = {
        "source": "s3 (1 of N changed)",
        "first_s": first_s,
        "resync_s": change_s,
        "resync_fraction": change_s / first_s if first_s else 0.0,
        "objects_downloaded": downloaded,
        "same_revision": changed == first,
    }
    return [resync, one_change]


# -- artifact server ------------------------------------------------------------------------------


SERVE_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from taskhandler_operator.sources.server import ArtifactServer
from taskhandler_operator.sources.store import RevisionStore

def hwm() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0

async def main() -> None:
    store = RevisionStore(Path(sys.argv[1]))
    server = ArtifactServer(store, bytes.fromhex(sys.argv[2]))
    await server.start()
    urls = [
        await server.manifest_entry(sys.argv[3], sys.argv[4], sys.argv[5], rel, 3600)
        for rel in sys.argv[6:]
    ]
    print(json.dumps({"items": urls, "rss_before_mb": hwm()}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps({"rss_after_mb": hwm(), "counts": dict(server.counts)}), flush=True)
    await server.stop()

asyncio.run(main())
"""


async def _download_all(url: str, clients: int) -> tuple[float, int]:
    import aiohttp

    async def one(session: aiohttp.ClientSession) -> int:
        size = 0
        async with session.get(url) as response:
            response.raise_for_status()
            async for chunk in response.content.iter_chunked(1 << 20):
                size += len(chunk)
        return size

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        sizes = await asyncio.gather(*(one(session) for _ in range(clients)))
        return time.perf_counter() - started, sum(sizes)


def _read_from_disk(path: Path, times: int) -> tuple[float, int]:
    started = time.perf_counter()
    total = 0
    for _ in range(times):
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return time.perf_counter() - started, total


def bench_server(work: Path, size_mb: int, clients: int, fetch_repeat: int) -> dict[str, Any]:
    volume = work / "volume"
    volume.mkdir()
    big = volume / "big.bin"
    with big.open("wb") as out:
        for _ in range(size_mb):
            out.write(os.urandom(MiB))
    (volume / "small.jar").write_bytes(os.urandom(4096))
    store = RevisionStore(work / "served-store")
    revision = asyncio.run(_sync(store, {"volume": {"path": str(volume)}}, None, "served"))
    key = secrets.token_bytes(32)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(store.root), key.hex(), NAMESPACE, "served",
         revision.id, "big.bin", "small.jar"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        started = json.loads(proc.stdout.readline())
        big_item, small_item = started["items"]
        served_s, served_bytes = asyncio.run(_download_all(big_item["url"], clients))
        disk_s, disk_bytes = _read_from_disk(revision.path / "big.bin", clients)
        fetch_ms = _fetch_startup(small_item, work, fetch_repeat)
        proc.stdin.close()
        finished = json.loads(proc.stdout.readline())
    finally:
        proc.wait(timeout=60)
    assert served_bytes == disk_bytes == clients * size_mb * MiB
    served_mbps = served_bytes / MiB / served_s
    disk_mbps = disk_bytes / MiB / disk_s
    return {
        "file_mb": size_mb,
        "clients": clients,
        "served_mb_per_s": served_mbps,
        "disk_mb_per_s": disk_mbps,
        "served_over_disk": served_mbps / disk_mbps if disk_mbps else 0.0,
        "server_rss_before_mb": started["rss_before_mb"],
        "server_rss_after_mb": finished["rss_after_mb"],
        "server_rss_growth_mb": finished["rss_after_mb"] - started["rss_before_mb"],
        "requests_served": finished["counts"].get("served", 0),
        **fetch_ms,
    }


def _fetch_startup(item: dict[str, Any], work: Path, repeat: int) -> dict[str, float]:
    """Median exec-to-exit of ``fetch`` for one small file, and of a bare interpreter."""
    command = shutil.which("taskhandler-operator") or str(
        Path(sys.executable).parent / "taskhandler-operator"
    )
    fetch_times = []
    for n in range(repeat):
        dest = work / f"fetched-{n}"
        started = time.perf_counter()
        subprocess.run(
            [command, "fetch", "--dest", str(dest), "--manifest", json.dumps([item])],
            check=True, capture_output=True,
        )  # fmt: skip
        fetch_times.append(time.perf_counter() - started)
    python_times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        python_times.append(time.perf_counter() - started)
    fetch_ms = statistics.median(fetch_times) * 1000
    python_ms = statistics.median(python_times) * 1000
    return {"fetch_exec_to_exit_ms": fetch_ms, "python_start_ms": python_ms}


# -- run ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=1000, help="files per source (default 1000)")
    parser.add_argument(
        "--file-kb", type=int, default=64, help="size of each file in KiB (default 64)"
    )
    parser.add_argument("--size-mb", type=int, default=20, help="served file size (default 20)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent downloads")
    parser.add_argument("--fetch-repeat", type=int, default=5, help="fetch start-up runs")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--check-targets", action="store_true", help="exit 1 on a missed target")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="thop-sources-bench-", dir=args.workdir))
    http = start_http_server(base / "http", None)
    s3 = start_s3_server(base / "s3")
    try:
        _warm_up()
        files = _payloads(args.files, args.file_kb * 1024)
        rows = [
            bench_git(http, RevisionStore(base / "store-git"), files, base),
            bench_http(http, RevisionStore(base / "store-http"), files),
            *bench_s3(s3, RevisionStore(base / "store-s3"), files),
        ]
        server = bench_server(base, args.size_mb, args.clients, args.fetch_repeat)
    finally:
        http.proc.stop(2)
        s3.proc.stop(5)
        shutil.rmtree(base, ignore_errors=True)

    print_table(
        rows,
        ["source", "first_s", "first_object_bytes", "resync_s", "resync_bytes",
         "resync_object_bytes", "resync_fraction", "objects_downloaded", "same_revision"],
        title=f"re-sync benchmark ({args.files} files of {args.file_kb} KiB)",
    )  # fmt: skip
    print()
    print_table(
        [server],
        ["file_mb", "clients", "served_mb_per_s", "disk_mb_per_s", "served_over_disk",
         "server_rss_before_mb", "server_rss_after_mb", "server_rss_growth_mb"],
        title="artifact server",
    )  # fmt: skip
    print()
    print_table(
        [
            {
                "command": "fetch (1 small file)",
                "exec_to_exit_ms": server["fetch_exec_to_exit_ms"],
                "python_start_ms": server["python_start_ms"],
                "over_python": ratio(server["python_start_ms"], server["fetch_exec_to_exit_ms"]),
            }
        ],
        title="probe init container start-up",
    )
    resyncs = [r for r in rows if "resync_object_bytes" in r]
    targets = {
        "resync_transfers_no_object_bytes": all(r["resync_object_bytes"] == 0 for r in resyncs),
        "resync_at_most_5pct_of_first_sync": all(
            r["resync_fraction"] <= TARGET_RESYNC_FRACTION for r in resyncs
        ),
        "resync_returns_the_same_revision": all(r["same_revision"] for r in resyncs),
        "one_changed_s3_object_downloads_one": rows[-1]["objects_downloaded"] == 1,
        "server_rss_growth_under_64MB": server["server_rss_growth_mb"] < TARGET_RSS_GROWTH_MB,
    }
    print()
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    path = write_json(
        "sources",
        {
            "files": args.files,
            "file_kb": args.file_kb,
            "rows": rows,
            "server": server,
            "targets": targets,
        },
    )
    print(f"\nwrote {path}")
    return 1 if args.check_targets and not all(targets.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
