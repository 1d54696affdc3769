"""Hostile archives over a real HTTP server: each refused with its reason, nothing written
outside, no revision created, the previous revision intact, memory bounded."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import TreeLimits
from tests.fixtures import hostile_archives as hostile
from tests.fixtures.sources import HttpServer
from tests.integration.sources.conftest import NAMESPACE, make_store, read_tree, sync_source

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Generous: a Python interpreter with the extraction modules imported uses about 25 MB here;
# the archives below claim 10 GB or 200,000 entries.
RSS_BOUND_KB = 150 * 1024
MAX_BYTES = 40 << 20  # store cap for these tests: the zip bomb's third 16 MiB entry crosses it
MAX_FILES = 20_000

GOOD = {"lib/app.jar": b"the previous, good revision", "README": b"hello"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def good_tgz() -> bytes:
    import io

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in GOOD.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


Case = tuple[str, Callable[[Path], bytes], str, str]

CASES: list[Case] = [
    ("zip-slip", lambda _: hostile.zip_slip(), "zip", r"escapes the revision folder \('\.\.'\)"),
    ("tar-slip", lambda _: hostile.tar_slip(), "tar.gz", r"escapes the revision folder"),
    (
        "absolute-tar",
        lambda out: hostile.absolute_tar(str(out / "absolute.txt")),
        "tar.gz",
        "is an absolute path",
    ),
    (
        "absolute-zip",
        lambda out: hostile.absolute_zip(str(out / "absolute.txt")),
        "zip",
        "is an absolute path",
    ),
    ("symlink-escape", lambda _: hostile.symlink_escape(), "tar.gz", "is a symlink or a file"),
    (
        "symlink-only-escape",
        lambda _: hostile.symlink_only_escape(),
        "tar.gz",
        "resolves outside the revision folder",
    ),
    ("hardlink-escape", lambda _: hostile.hardlink_escape(), "tar.gz", "escapes"),
    ("zip-bomb", lambda _: hostile.zip_bomb(), "zip", "more than the 41943040-byte cap"),
    (
        "sparse-tar-bomb",
        lambda _: hostile.sparse_tar_bomb(),
        "tar.gz",
        "declares 10737418240 bytes: more than the 41943040-byte cap",
    ),
    (
        "200k-entries-zip",
        lambda _: hostile.many_entries_zip(),
        "zip",
        "lists more than 20000 entries",
    ),
    (
        "200k-entries-tar",
        lambda _: hostile.many_entries_tar(),
        "tar.gz",
        "more than 20000 entries",
    ),
    ("char-device", lambda _: hostile.device_and_fifo(tarfile.CHRTYPE), "tar.gz", "device file"),
    ("block-device", lambda _: hostile.device_and_fifo(tarfile.BLKTYPE), "tar.gz", "device"),
    ("fifo", lambda _: hostile.device_and_fifo(tarfile.FIFOTYPE), "tar.gz", "is a FIFO"),
    ("device-zip", lambda _: hostile.device_zip(), "zip", "device file"),
    ("setuid", lambda _: hostile.setuid_tar(0o4755), "tar.gz", "setuid or setgid"),
    ("setgid", lambda _: hostile.setuid_tar(0o2755), "tar.gz", "setuid or setgid"),
]


@pytest.mark.parametrize(("name", "build", "kind", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_hostile_archive_is_refused(
    open_http: HttpServer,
    tmp_path: Path,
    name: str,
    build: Callable[[Path], bytes],
    kind: str,
    reason: str,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("must never be read into a revision")
    store = make_store(tmp_path / "store", max_bytes=MAX_BYTES, max_files=MAX_FILES)
    folder = secrets.token_hex(4)
    good = good_tgz()
    good_url = open_http.put_file(f"{folder}/good.tgz", good)
    previous = await sync_source(store, {"http": {"url": good_url, "sha256": sha(good)}})

    data = build(outside)
    url = open_http.put_file(f"{folder}/{name}.{kind}", data)
    with pytest.raises(ArchiveRefused) as info:
        await sync_source(store, {"http": {"url": url, "sha256": sha(data)}})

    error = info.value
    assert error.reason == "ArchiveRefused"
    assert __import__("re").search(reason, error.message), error.message
    assert f"{name}.{kind}" in error.message  # names the archive
    # nothing outside: only the planted secret is there
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    # no revision created, the previous one current and intact, no staging left
    assert await store.revisions(NAMESPACE, "bundle") == [previous]
    assert read_tree(previous.path) == GOOD
    bundle_dir = store.root / NAMESPACE / "bundle"
    assert sorted(p.name for p in bundle_dir.iterdir()) == sorted([".lock", ".meta", previous.id])


# VmHWM (the peak RSS of this process's own memory map), not getrusage's ru_maxrss: Linux
# carries the parent's high-water mark across fork and exec into ru_maxrss.
RSS_SCRIPT = """
import json, sys
from pathlib import Path
from taskhandler_operator.sources.archive import extract_archive
from taskhandler_operator.sources.errors import ArchiveRefused
from taskhandler_operator.sources.tree import TreeLimits, TreeWriter

archive, kind, dest = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
dest.mkdir()
writer = TreeWriter(dest, TreeLimits(max_files=int(sys.argv[4]), max_bytes=int(sys.argv[5])))
outcome = "extracted"
try:
    extract_archive(archive, kind, writer)
    writer.finish()
except ArchiveRefused as exc:
    outcome = str(exc)
finally:
    writer.close()
written = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
print(json.dumps({
    "outcome": outcome,
    "maxrss_kb": int(next(
        line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")
    )),
    "written": written,
    "entries": writer.entries,
}))
"""

BOMBS = [
    ("zip-bomb", hostile.zip_bomb, "zip", MAX_BYTES),
    ("sparse-tar-bomb", hostile.sparse_tar_bomb, "tar.gz", MAX_BYTES),
    ("200k-entries-zip", hostile.many_entries_zip, "zip", None),
    ("200k-entries-tar", hostile.many_entries_tar, "tar.gz", None),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "build", "kind", "max_bytes"), BOMBS, ids=[b[0] for b in BOMBS])
def test_extraction_memory_stays_bounded(
    tmp_path: Path,
    name: str,
    build: Callable[[], bytes],
    kind: str,
    max_bytes: int | None,
) -> None:
    """Peak RSS of an extraction process, with the default entry cap (50,000)."""
    archive = tmp_path / f"{name}.{kind}"
    archive.write_bytes(build())
    limits = TreeLimits()
    cap_bytes = max_bytes if max_bytes is not None else limits.max_bytes
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RSS_SCRIPT,
            str(archive),
            kind,
            str(tmp_path / "out"),
            str(limits.max_files),
            str(cap_bytes),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["outcome"] != "extracted"
    assert result["written"] <= cap_bytes
    assert result["entries"] <= limits.max_files + 1
    assert result["maxrss_kb"] < RSS_BOUND_KB, result


# The peak RSS of a child process as its parent sees it. The wrapper is a small interpreter
# started for this: Linux carries a process's high-water mark across fork and exec into
# ru_maxrss, so measuring from pytest (hundreds of MB) would report pytest's own peak.
RUSAGE_WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)
print(json.dumps({
    "returncode": proc.returncode,
    "stdout": proc.stdout[-2000:],
    "stderr": proc.stderr[-4000:],
    "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}))
"""
SYNC_RSS_BOUND_KB = 200 * 1024
CLAIMED_MIB = 768


def sync_peak_rss(tmp_path: Path, source: dict[str, object], *extra: str) -> dict[str, object]:
    """Run ``taskhandler-operator sync`` on ``source`` in a child; its outcome and peak RSS."""
    import yaml

    spec = tmp_path / "source.yaml"
    spec.write_text(yaml.safe_dump(source))
    cli = Path(sys.executable).with_name("taskhandler-operator")
    command = [str(cli), "sync", str(spec), "--store", str(tmp_path / "store"), *extra]
    proc = subprocess.run(
        [sys.executable, "-c", RUSAGE_WRAPPER, *command],
        capture_output=True,
        text=True,
        timeout=660,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout)
    print(f"\npeak RSS {int(str(result['maxrss_kb'])) // 1024} MiB: {result['stderr']}")
    return result


HEADERS = [
    ("gnu-long-name", lambda: hostile.huge_header_tgz(tarfile.GNUTYPE_LONGNAME, CLAIMED_MIB),
     "tar.gz", f"a GNU long-name header of {CLAIMED_MIB << 20} bytes"),
    ("gnu-long-link", lambda: hostile.huge_header_tgz(tarfile.GNUTYPE_LONGLINK, CLAIMED_MIB),
     "tar.gz", f"a GNU long-link header of {CLAIMED_MIB << 20} bytes"),
    ("pax", lambda: hostile.huge_header_tgz(tarfile.XHDTYPE, CLAIMED_MIB),
     "tar.gz", f"a pax header of {CLAIMED_MIB << 20} bytes"),
    ("pax-global", lambda: hostile.huge_header_tgz(tarfile.XGLTYPE, CLAIMED_MIB),
     "tar.gz", f"a pax global header of {CLAIMED_MIB << 20} bytes"),
    ("lying-zip", lambda: hostile.lying_zip(1_000_000),
     "zip", "lists more than 50000 entries"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("name", "build", "kind", "reason"), HEADERS, ids=[h[0] for h in HEADERS])
def test_hostile_headers_are_refused_with_flat_memory(
    open_http: HttpServer,
    tmp_path: Path,
    name: str,
    build: Callable[[], bytes],
    kind: str,
    reason: str,
) -> None:
    """A header claiming 768 MiB (in a 0.8 MB .tar.gz), or a zip whose central directory holds
    1,000,000 entries where its end record claims 1: the ``sync`` command refuses it as
    ArchiveRefused, and its peak RSS stays far below what the archive claims (before the caps
    tarfile read such a header whole: 1.6 GB for the long name; the zip cost 546 MB)."""
    data = build()
    url = open_http.put_file(f"{secrets.token_hex(4)}/{name}.{kind}", data)
    result = sync_peak_rss(tmp_path, {"http": {"url": url, "sha256": sha(data)}})
    stderr = str(result["stderr"])
    assert result["returncode"] == 1, result
    assert stderr.startswith("sync: ArchiveRefused: ") and reason in stderr, stderr
    assert "Traceback" not in stderr
    assert int(str(result["maxrss_kb"])) < SYNC_RSS_BOUND_KB, result


async def test_a_refused_header_reaches_the_condition_as_a_permanent_refusal(
    open_http: HttpServer, tmp_path: Path
) -> None:
    """Through the operator's syncer: the condition reason is ArchiveRefused and the failure
    is not retried as transient (the revision can never sync)."""
    from typing import Any, cast

    from taskhandler_operator.controller.syncing import KubeSyncer, SourceSyncFailed
    from taskhandler_operator.reconcile.models import BundleSpec
    from taskhandler_operator.sources.spec import SourceSpec

    data = hostile.huge_header_tgz(tarfile.XHDTYPE, mib=2)
    url = open_http.put_file(f"{secrets.token_hex(4)}/pax.tar.gz", data)
    syncer = KubeSyncer(
        kube=cast(Any, None),  # no secretRef: the API is never asked
        store=make_store(tmp_path / "store"),
        namespace=NAMESPACE,
        name="bundle",
        source=SourceSpec.model_validate({"http": {"url": url, "sha256": sha(data)}}),
        timeout=60,
    )
    with pytest.raises(SourceSyncFailed) as info:
        await syncer(cast(BundleSpec, None))
    assert info.value.reason == "ArchiveRefused" and not info.value.retryable
    assert f"a pax header of {2 << 20} bytes" in info.value.message
