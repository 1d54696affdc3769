"""What the operator's end-to-end tests share: starting ``taskhandler-operator run`` as a
subprocess under its own least-privilege identity, preparing a namespace for it, applying
TaskHandlerBundles, and reading back their status, probe Jobs, Events and database rows.

The fixtures built on these live in ``tests/e2e/conftest.py``. Every wait is bounded and fails
with the bundle's status, the Jobs and the operator's log, never on timing alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.manifests import bundle_manifest
from taskhandler_devenv.operator_process import (
    prepare_operator_namespace,
    request_reconcile,
)
from taskhandler_operator.kube import names
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD

OPERATOR_USER = "taskhandler-operator-e2e"
IMAGE = "registry.local/taskhandler-operator:e2e"
#: Seconds a bundle may take to reach a state (a pass with probe Jobs on the process node).
WAIT_SECONDS = 240


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


StartOperator = Callable[[Sequence[str]], "Operator"]


def apply(cluster: KubeCluster, obj: Mapping[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def prepare_namespace(cluster: KubeCluster, namespace: str) -> None:
    """Restricted Pod Security, the probe account, the operator's RBAC and the git Secret."""
    prepare_operator_namespace(cluster, namespace, OPERATOR_USER)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "git-auth", "namespace": namespace},
        "stringData": {"username": HTTP_USER, "password": PLANTED_PASSWORD},
    }
    apply(cluster, secret)


@dataclass(frozen=True)
class RunCommand:
    """How to start ``taskhandler-operator run``: argv, environment and the health port."""

    argv: list[str]
    env: dict[str, str]
    health_port: int


def run_command(
    cluster: KubeCluster,
    user: str,
    namespaces: Sequence[str],
    database: str,
    workdir: Path,
    **extra: str,
) -> RunCommand:
    """``taskhandler-operator run`` under ``user``'s identity, watching ``namespaces`` (the Lease
    in the first); ``extra`` adds or overrides ``THOP_*`` variables."""
    kubeconfig = cluster.user_kubeconfig(user)
    artifact_port, health_port, metrics_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "THOP_DATABASE_URL": database,
        "THOP_CLUSTER_ID": "e2e",
        "THOP_NAMESPACES": ",".join(namespaces),
        "THOP_REVISION_STORE": str(workdir / "revisions"),
        "THOP_ARTIFACT_SERVER_BIND": f"127.0.0.1:{artifact_port}",
        # No cluster DNS on the process node: pods reach the operator on loopback.
        "THOP_ARTIFACT_SERVER_URL": f"http://127.0.0.1:{artifact_port}",
        "THOP_RUNTIME_IMAGES__JAVA": "registry.local/taskhandler-operator-java:e2e",
        "THOP_RUNTIME_IMAGES__TYPESCRIPT": "registry.local/taskhandler-operator-node:e2e",
        "THOP_HEALTH_PORT": str(health_port),
        "THOP_METRICS_PORT": str(metrics_port),
        "THOP_LOG_FORMAT": "text",
        "THOP_OPERATOR_IMAGE": IMAGE,
        **extra,
    }
    script = Path(sys.executable).parent / "taskhandler-operator"
    argv = [
        str(script),
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--lease-namespace={namespaces[0]}",
        "--health-host=127.0.0.1",
    ]
    return RunCommand(argv, env, health_port)


def start_operator(
    cluster: KubeCluster, namespaces: Sequence[str], database: str, workdir: Path, **extra: str
) -> Operator:
    """``taskhandler-operator run`` watching ``namespaces`` (the Lease in the first); ``extra``
    adds or overrides ``THOP_*`` variables."""
    command = run_command(cluster, OPERATOR_USER, namespaces, database, workdir, **extra)
    log = workdir / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command.argv, env=command.env, stdout=out, stderr=subprocess.STDOUT)
    return Operator(proc, log, command.health_port)


def git_bundle(
    namespace: str,
    name: str,
    *,
    language: str,
    url: str,
    path: str,
    queues: Sequence[str] | None = None,
    bundle_name: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A TaskHandlerBundle reading ``path`` of the git repository at ``url`` (branch main)."""
    source = {"git": {"url": url, "ref": "main", "path": path, "secretRef": {"name": "git-auth"}}}
    return bundle_manifest(
        namespace,
        name,
        language=language,
        source=source,
        queues=queues,
        bundle_name=bundle_name,
        **spec,
    )


def get_bundle(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "thb", name, "-n", namespace, "-o", "json")
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def get_status(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_bundle(cluster, namespace, name).get("status") or {}
    return status


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or () if c["type"] == type_), None)


def diagnose(cluster: KubeCluster, namespace: str, name: str, op: Operator) -> str:
    status = cluster.kubectl("get", "thb", name, "-n", namespace, "-o", "json", check=False)
    jobs = cluster.kubectl("get", "jobs,pods", "-n", namespace, "-o", "wide", check=False)
    return f"status: {status.stdout[-3000:]}\n{jobs.stdout}\noperator log:\n{op.tail()}"


def wait_ready(cluster: KubeCluster, namespace: str, name: str, op: Operator) -> None:
    done = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"thb/{name}",
        "-n",
        namespace,
        f"--timeout={WAIT_SECONDS}s",
        check=False,
        timeout=WAIT_SECONDS + 20,
    )
    if done.returncode != 0:
        pytest.fail(f"{name} not Ready: {done.stderr}\n{diagnose(cluster, namespace, name, op)}")


def wait_status(
    cluster: KubeCluster,
    namespace: str,
    name: str,
    op: Operator,
    what: str,
    check: Callable[[dict[str, Any]], bool],
) -> dict[str, Any]:
    """Poll the bundle's status until ``check`` holds (bounded); return that status."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        status = get_status(cluster, namespace, name)
        if check(status):
            return status
        if op.proc.poll() is not None:
            break
        time.sleep(1)
    pytest.fail(f"{name}: never {what}\n{diagnose(cluster, namespace, name, op)}")


def reconcile_now(cluster: KubeCluster, namespace: str, name: str, op: Operator) -> dict[str, Any]:
    """Ask for a pass now (the reconcile-requested-at annotation) and wait until a pass has
    handled it; return the status that pass wrote."""
    token = f"e2e-{uuid.uuid4().hex[:8]}"
    request_reconcile(cluster, namespace, name, token)
    return wait_status(
        cluster,
        namespace,
        name,
        op,
        f"handled reconcile request {token}",
        lambda s: s.get("lastHandledReconcileAt") == token,
    )


def stalled(status: Mapping[str, Any]) -> dict[str, Any]:
    """The bundle's Stalled condition ({} when it is not stalled)."""
    return condition(status, "Stalled") or {}


def wait_stalled(
    cluster: KubeCluster, namespace: str, name: str, op: Operator, reason: str
) -> dict[str, Any]:
    """Wait until the bundle is Stalled with ``reason`` (a claim conflict); that status."""
    return wait_status(
        cluster,
        namespace,
        name,
        op,
        reason,
        lambda s: stalled(s).get("status") == "True" and stalled(s).get("reason") == reason,
    )


def probe_jobs(cluster: KubeCluster, namespace: str, bundle: str | None = None) -> list[str]:
    selector = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
    if bundle is not None:
        selector += f",{names.LABEL_BUNDLE}={bundle}"
    out = cluster.kubectl(
        "get",
        "jobs",
        "-n",
        namespace,
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    )
    return sorted(out.stdout.split())


def job_artifacts(cluster: KubeCluster, namespace: str, jobs: Sequence[str]) -> list[str]:
    """The artifact path each named Job probed (its annotation)."""
    paths = []
    for job in jobs:
        out = cluster.kubectl("get", "job", job, "-n", namespace, "-o", "json")
        meta = json.loads(out.stdout)["metadata"]
        paths.append(meta["annotations"][names.ANNOTATION_ARTIFACT_PATH])
    return sorted(paths)


def events(cluster: KubeCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found = json.loads(
        cluster.kubectl(
            "get",
            "events.events.k8s.io",
            "-n",
            namespace,
            "--field-selector",
            f"regarding.name={name}",
            "-o",
            "json",
        ).stdout
    )["items"]
    return [e for e in found if e.get("reportingController") == names.MANAGER]


def bindings(database: str, bundle_name: str | None = None) -> dict[tuple[str, str], str]:
    """``(dag_id, task_id) -> relative_fileloc`` of the bound artifact, from the database."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT b.dag_id, b.task_id, a.relative_fileloc, a.bundle_name "
                    "FROM lang_sdk_task_handler b "
                    "JOIN lang_sdk_task_handler_artifact a ON a.id = b.artifact_id"
                )
            ).all()
    finally:
        engine.dispose()
    return {
        (r.dag_id, r.task_id): r.relative_fileloc
        for r in rows
        if bundle_name is None or r.bundle_name == bundle_name
    }


def row_counts(database: str, bundle_name: str) -> dict[str, int]:
    """How many artifact, binding and problem rows ``bundle_name`` has."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            one = {"b": bundle_name}
            artifacts = conn.execute(
                sa.text(
                    "SELECT count(*) FROM lang_sdk_task_handler_artifact WHERE bundle_name = :b"
                ),
                one,
            ).scalar_one()
            bound = conn.execute(
                sa.text(
                    "SELECT count(*) FROM lang_sdk_task_handler b JOIN "
                    "lang_sdk_task_handler_artifact a ON a.id = b.artifact_id "
                    "WHERE a.bundle_name = :b"
                ),
                one,
            ).scalar_one()
            problems = conn.execute(
                sa.text("SELECT count(*) FROM thop_bundle_problem WHERE bundle_name = :b"), one
            ).scalar_one()
    finally:
        engine.dispose()
    return {"artifacts": artifacts, "bindings": bound, "problems": problems}


def seed_dags(database: str, dags: Mapping[str, Sequence[tuple[str, str]]]) -> None:
    """Serialized Dags as Airflow writes them: ``dag_id -> [(task_id, queue), ...]`` stubs."""
    from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task

    engine = sa.create_engine(database)
    try:
        with engine.begin() as conn:
            for dag_id, stubs in dags.items():
                tasks = [stub_task(task, queue=queue) for task, queue in stubs]
                insert_dag(conn, dag_document(dag_id, tasks))
    finally:
        engine.dispose()


def handler_spec(*keys: tuple[str, str]) -> dict[str, list[dict[str, Any]]]:
    """A test runtime's declarations: argless named handlers for ``(dag_id, task_id)`` keys."""
    spec: dict[str, list[dict[str, Any]]] = {}
    for dag_id, task_id in keys:
        spec.setdefault(dag_id, []).append({"task_id": task_id, "binding": "named", "params": []})
    return spec


def go_handlers(runtime_factory: RuntimeFactory, *keys: tuple[str, str]) -> bytes:
    """A Go test runtime declaring argless named handlers for ``(dag_id, task_id)`` keys."""
    return Path(runtime_factory("go", spec=handler_spec(*keys))).read_bytes()


def commit_files(
    repo: Any, files: Mapping[str, bytes | None], message: str, *, executable: bool = True
) -> str:
    """Commit ``files`` (None deletes) in one commit; Go executables keep their mode because
    they are written with it before git adds them (a pass never sees a non-executable one)."""
    for rel, data in files.items():
        if data is None:
            continue
        path: Path = repo.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if executable:
            path.chmod(0o755)
    commit: str = repo.commit(dict(files), message)
    return commit
