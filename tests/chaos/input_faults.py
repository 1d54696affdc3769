"""What the input-fault chaos tests share (source server, revision store, probe pods): an
``http`` bundle over a Go archive, an operator replica with its own revision store, bounded
waits that fail with the bundle's status, the Jobs and the operator's log.

The fixtures are the e2e ones (``tests/e2e/conftest.py``), imported by the test modules.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.manifests import bundle_manifest
from taskhandler_devenv.operator_process import request_reconcile
from tests.chaos.faulty_server import FaultyServer
from tests.e2e.faults_support import Replica, condition, jobs_by_name, replica, rows, thb
from tests.e2e.operator_env import OPERATOR_USER, apply, handler_spec
from tests.fixtures.runtimes_plugin import RuntimeFactory

#: The Dag and stub the Go artifact declares (the e2e ``database`` fixture seeds it, queue go).
DAG, TASK = "orders_etl", "extract"
ARTIFACT = "extract"
READY_SECONDS = 300.0


@pytest.fixture
def faulty_server() -> Iterator[FaultyServer]:
    with FaultyServer() as server:
        yield server


@pytest.fixture
def go_artifact(runtime_factory: RuntimeFactory) -> bytes:
    """A Go test runtime declaring ``orders_etl.extract`` (the stub on queue ``go``)."""
    return Path(runtime_factory("go", spec=handler_spec((DAG, TASK)))).read_bytes()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for r in started:
        r.stop()


def start_replica(
    started: list[Replica],
    cluster: KubeCluster,
    namespace: str,
    database: str,
    workdir: Path,
    **extra: str,
) -> Replica:
    """``taskhandler-operator run`` on ``namespace``; ``extra`` sets ``THOP_*`` variables."""
    workdir.mkdir(parents=True, exist_ok=True)
    r = replica(cluster, OPERATOR_USER, namespace, database, workdir, "a", **extra)
    started.append(r)
    return r.start()


def archive(files: Mapping[str, bytes]) -> bytes:
    """A .tar.gz of ``files`` (executable, so the Go artifact runs), with fixed metadata."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def http_bundle(
    namespace: str, name: str, url: str, sha256: str, *, timeout: str = "2m"
) -> dict[str, Any]:
    """A Go TaskHandlerBundle over the archive at ``url`` (queue ``go``)."""
    source = {"http": {"url": url, "sha256": sha256}}
    return bundle_manifest(namespace, name, language="go", source=source, timeout=timeout)


def diagnose(cluster: KubeCluster, namespace: str, name: str, r: Replica) -> str:
    status = json.dumps(thb(cluster, namespace, name).get("status"), indent=1)[-3000:]
    jobs = cluster.kubectl("get", "jobs,pods", "-n", namespace, "-o", "wide", check=False)
    return f"status: {status}\n{jobs.stdout}\noperator log:\n{r.tail()}"


def wait_until(
    cluster: KubeCluster,
    namespace: str,
    name: str,
    r: Replica,
    what: str,
    check: Callable[[dict[str, Any]], bool],
    timeout: float = READY_SECONDS,
) -> dict[str, Any]:
    """Poll the bundle until ``check(obj)`` holds; fail with the diagnosis after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        obj = thb(cluster, namespace, name)
        if check(obj):
            return obj
        if time.monotonic() > deadline or (r.proc is not None and r.proc.poll() is not None):
            pytest.fail(
                f"{namespace}/{name}: never {what} (waited {timeout:.0f}s)\n"
                + diagnose(cluster, namespace, name, r)
            )
        time.sleep(0.5)


def ready(cluster: KubeCluster, namespace: str, name: str, r: Replica) -> dict[str, Any]:
    return wait_until(
        cluster,
        namespace,
        name,
        r,
        "Ready",
        lambda obj: (
            condition(obj, "Ready").get("status") == "True"
            and (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        ),
    )


def request_pass(cluster: KubeCluster, namespace: str, name: str, token: str) -> float:
    """Set the reconcile-now annotation to ``token``; the monotonic time it was set."""
    request_reconcile(cluster, namespace, name, token)
    return time.monotonic()


def handled(token: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status") or {}).get("lastHandledReconcileAt") == token


def store_entries(store: Path, namespace: str, name: str) -> list[str]:
    """The names in the bundle's folder of the revision store (revisions and hidden ones)."""
    folder = store / namespace / name
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


class Baseline(NamedTuple):
    """An ``http`` bundle Ready on its first revision, and what a later fault must leave as it
    is: its status, the operator's rows, its folder of the revision store, the probe Jobs."""

    op: Replica
    sha: str
    status: dict[str, Any]
    rows: dict[str, list[tuple[Any, ...]]]
    store: list[str]
    jobs: dict[str, str]


def ready_http_bundle(
    started: list[Replica],
    cluster: KubeCluster,
    namespace: str,
    database: str,
    server: FaultyServer,
    name: str,
    files: Mapping[str, bytes],
    *,
    archive_name: str,
    store: Path,
    workdir: Path,
    timeout: str = "2m",
    **extra: str,
) -> Baseline:
    """Start a replica (``extra`` sets ``THOP_*`` variables), serve ``files`` as
    ``archive_name`` from ``server``, apply bundle ``name`` over it and wait until it is Ready
    with one binding and the revision in ``store``."""
    op = start_replica(started, cluster, namespace, database, workdir, **extra)
    url, sha = server.put(archive_name, archive(files))
    apply(cluster, http_bundle(namespace, name, url, sha, timeout=timeout))
    good = ready(cluster, namespace, name, op)["status"]
    assert good["revision"] == sha, good
    state = rows(database)
    assert len(state["bindings"]) == 1, state
    kept = store_entries(store, namespace, name)
    assert sha in kept, kept
    return Baseline(op, sha, good, state, kept, jobs_by_name(cluster, namespace))


def assert_source_failed_and_kept(
    failed: dict[str, Any],
    reason: str,
    words: Sequence[str],
    good: Mapping[str, Any],
    state: Mapping[str, Any],
    database: str,
    more: str,
) -> None:
    """The pass ``failed`` on its source (``SourceReady=False`` with ``reason`` and ``words`` in
    its message) and kept the last revision (``good`` status) in status and in the rows."""
    source = condition(failed, "SourceReady")
    assert source.get("status") == "False", more
    assert source.get("reason") == reason, more
    for word in words:
        assert word in source.get("message", ""), more
    status = failed["status"]
    assert status["revision"] == good["revision"], more
    assert status["publishedRevision"] == good["publishedRevision"], more
    assert rows(database) == state, more


class Watch:
    """``kubectl get <kind> --watch`` in the namespace for the whole test: every object of the
    kind that ever existed there, by uid (a Job made again under its name has a new uid)."""

    def __init__(self, cluster: KubeCluster, namespace: str, kind: str, selector: str) -> None:
        argv = [
            str(cluster.bins["kubectl"]),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "get",
            kind,
            "-n",
            namespace,
            "-l",
            selector,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ]
        self.kind = kind
        self.seen: dict[str, dict[str, Any]] = {}  # uid -> the latest object
        self.order: list[str] = []  # uids in the order they first appeared
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._thread = threading.Thread(target=self._read, name=f"watch-{kind}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._proc.stdout:
            buffer += line
            while True:
                text = buffer.lstrip()
                if not text:
                    buffer = ""
                    break
                try:
                    event, end = decoder.raw_decode(text)
                except json.JSONDecodeError:
                    buffer = text
                    break
                buffer = text[end:]
                obj = event.get("object") or {}
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    with self._lock:
                        if uid not in self.seen:
                            self.order.append(uid)
                        self.seen[uid] = obj

    def objects(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self.seen[uid] for uid in self.order]

    def names(self) -> list[str]:
        return [o["metadata"]["name"] for o in self.objects()]

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(10)
