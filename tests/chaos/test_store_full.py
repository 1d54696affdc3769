"""Chaos: the revision store's disk is full when a changed source arrives.

What it proves: the operator (``taskhandler-operator run``, real control plane + process node,
PostgreSQL) keeps its revision store on a small tmpfs mounted for the test. An ``http`` bundle
is Ready at revision 1; the tmpfs is then filled to the last byte and the bundle's source is
changed to a new archive. The pass fails with ``SourceReady=False`` (reason
``StorageOperationFailed``) and an Event whose message says "No space left on device"; status
keeps revision 1, the binding rows are unchanged, and the store holds revision 1 and nothing
else: no staging folder, no half-written record. Once space returns, the bundle syncs revision
2 and is Ready again (the artifact is unchanged, so no probe Job runs again).

Needs root (mount -t tmpfs); skipped with the reason when mounting is not permitted.

Run: ``.venv/bin/pytest tests/chaos/test_store_full.py`` (about a minute; in the default suite,
markers kube/integration/slow).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.chaos.faulty_server import FaultyServer
from tests.chaos.input_faults import (
    ARTIFACT,
    archive,
    assert_source_failed_and_kept,
    diagnose,
    handled,
    http_bundle,
    ready_http_bundle,
    request_pass,
    store_entries,
    wait_until,
)
from tests.chaos.input_faults import faulty_server as faulty_server
from tests.chaos.input_faults import go_artifact as go_artifact
from tests.chaos.input_faults import replicas as replicas
from tests.e2e.faults_support import Replica, condition, jobs_by_name, rows
from tests.e2e.operator_env import apply, events
from tests.e2e.test_operator import database as database

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

NAME = "orders-full"
TMPFS_SIZE = "24m"  # the Go artifact is about 2 MiB; revision 1 fits, the filler takes the rest
FILLER = ".chaos-filler"  # a hidden name: the store skips it as it skips .cache


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of TMPFS_SIZE mounted for the test (requested before the operator, so it is
    unmounted after the operator stopped)."""
    mount = tmp_path / "store"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the revision store: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its file system has no byte left."""
    path = folder / FILLER
    chunk = b"\0" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return path


def test_a_full_revision_store_says_so_leaves_no_half_revision_and_recovers(
    small_store: Path,
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    faulty_server: FaultyServer,
    go_artifact: bytes,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    op, sha1, good, state, kept, jobs = ready_http_bundle(
        replicas,
        kube_cluster,
        namespace,
        database,
        faulty_server,
        NAME,
        {ARTIFACT: go_artifact},
        archive_name="orders-1.tar.gz",
        store=small_store,
        workdir=tmp_path / "operator",
        THOP_REVISION_STORE=str(small_store),
    )
    assert not [e for e in kept if e.startswith(".tmp-")], kept
    records = sorted(p.name for p in (small_store / namespace / NAME / ".meta").iterdir())

    filler = fill(small_store)
    # Revision 2: the same artifact and a README, so only the store's space is in the way.
    url2, sha2 = faulty_server.put(
        "orders-2.tar.gz", archive({ARTIFACT: go_artifact, "README.md": b"revision 2\n" * 4096})
    )
    apply(kube_cluster, http_bundle(namespace, NAME, url2, sha2))
    failed = wait_until(
        kube_cluster,
        namespace,
        NAME,
        op,
        "SourceReady=False on the full store",
        lambda obj: (
            (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
            and condition(obj, "SourceReady").get("status") == "False"
        ),
    )
    more = diagnose(kube_cluster, namespace, NAME, op)
    # Revision 1 stays: in status, in the database, and alone in the store.
    words = ("No space left on device",)
    assert_source_failed_and_kept(
        failed, "StorageOperationFailed", words, good, state, database, more
    )
    assert condition(failed, "Ready").get("status") == "False", more
    notes = [
        e.get("note", "")
        for e in events(kube_cluster, namespace, NAME)
        if e.get("reason") == "StorageOperationFailed"
    ]
    assert any("No space left on device" in n for n in notes), (notes, more)
    assert failed["status"]["revision"] == sha1, more
    assert store_entries(small_store, namespace, NAME) == kept, more
    meta = sorted(p.name for p in (small_store / namespace / NAME / ".meta").iterdir())
    assert meta == records, more  # no half-written record either

    # Space returns: the next pass (asked for now, not left to the back-off) syncs revision 2.
    filler.unlink()
    request_pass(kube_cluster, namespace, NAME, "space-returned")
    healed = wait_until(
        kube_cluster,
        namespace,
        NAME,
        op,
        "Ready on revision 2",
        lambda obj: (
            handled("space-returned")(obj)
            and condition(obj, "Ready").get("status") == "True"
            and (obj.get("status") or {}).get("revision") == sha2
        ),
    )
    more = diagnose(kube_cluster, namespace, NAME, op)
    assert healed["status"]["publishedRevision"] == sha2, more
    assert (small_store / namespace / NAME / sha2 / "README.md").is_file(), more
    assert rows(database) == state, more  # the same artifact, bound as before
    assert jobs_by_name(kube_cluster, namespace) == jobs, more  # its answer was reused
