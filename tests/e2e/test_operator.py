"""The operator end to end: ``taskhandler-operator run`` as a subprocess under its own least-
privilege identity, on the real control plane + process node, PostgreSQL with Airflow's schema
and a git repository served over HTTP (basic auth, read from the bundle's Secret).

A Go, a Java and a TypeScript bundle applied with kubectl become Ready; their probe Jobs pass Pod
Security ``restricted``; ``kubectl get thb`` shows the columns; the scheduler's read path
resolves every stub to its artifact. Then a commit that changes nothing creates no Job.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.devenv.kubecluster.bins import REPO_ROOT
from taskhandler_operator.devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.devenv.kubecluster.procs import free_port
from taskhandler_operator.devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.kube import names
from taskhandler_operator.kube.rbac import operator_rbac, probe_service_account, user_subject
from taskhandler_operator.records import TaskHandlerArtifactRef
from taskhandler_operator.scheduler import resolve_task_handlers
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD, GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

ARTIFACTS = {
    "go": "go/extract",
    "java": "java/orders-transform.jar",
    "typescript": "ts/publish.min.mjs",
}
TASKS = {"go": "extract", "java": "transform", "typescript": "publish"}
OPERATOR_USER = "taskhandler-operator-e2e"
IMAGE = "registry.local/taskhandler-operator:e2e"


@pytest.fixture(scope="module")
def thb_crd(kube_cluster: KubeCluster) -> str:
    kube_cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / names.CRD_FILE))
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{names.CRD_NAME}", "--timeout=60s"
    )
    return names.CRD_NAME


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def apply(cluster: KubeCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


@pytest.fixture
def database(pg_url: str) -> str:
    upgrade(pg_url)
    engine = sa.create_engine(pg_url)
    document = dag_document(
        "orders_etl", [stub_task(task, queue=lang) for lang, task in TASKS.items()]
    )
    with engine.begin() as conn:
        insert_dag(conn, document)
    engine.dispose()
    return pg_url


@pytest.fixture
def namespace(kube_cluster: KubeCluster, kube_namespace: str) -> str:
    """Restricted Pod Security, the probe account, the operator's RBAC and the git Secret."""
    kube_cluster.kubectl(
        "label",
        "namespace",
        kube_namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    apply(kube_cluster, probe_service_account(kube_namespace))
    for obj in operator_rbac(
        namespace=kube_namespace,
        subject=user_subject(OPERATOR_USER),
        mode="namespaced",
        watch_namespaces=[kube_namespace],
        name=f"thop-{kube_namespace}",
    ):
        apply(kube_cluster, obj)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "git-auth", "namespace": kube_namespace},
        "stringData": {"username": HTTP_USER, "password": PLANTED_PASSWORD},
    }
    apply(kube_cluster, secret)
    return kube_namespace


@pytest.fixture
def repo(git_repo: GitRepo, runtime_factory: RuntimeFactory, tmp_path: Path) -> GitRepo:
    files: dict[str, bytes | str | None] = {}
    for language, rel in ARTIFACTS.items():
        spec = {"orders_etl": [{"task_id": TASKS[language], "binding": "named", "params": []}]}
        files[rel] = Path(runtime_factory(language, spec=spec)).read_bytes()
    git_repo.commit(files, "three bundles")
    # git keeps the Go executable's mode only when the work tree has it.
    (git_repo.work / ARTIFACTS["go"]).chmod(0o755)
    git_repo.commit({}, "executable")
    return git_repo


@pytest.fixture
def operator(
    kube_cluster: KubeCluster, namespace: str, database: str, tmp_path: Path
) -> Iterator[Operator]:
    kubeconfig = kube_cluster.user_kubeconfig(OPERATOR_USER)
    artifact_port, health_port, metrics_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "THOP_DATABASE_URL": database,
        "THOP_CLUSTER_ID": "e2e",
        "THOP_NAMESPACES": namespace,
        "THOP_REVISION_STORE": str(tmp_path / "revisions"),
        "THOP_ARTIFACT_SERVER_BIND": f"127.0.0.1:{artifact_port}",
        # No cluster DNS on the process node: pods reach the operator on loopback.
        "THOP_ARTIFACT_SERVER_URL": f"http://127.0.0.1:{artifact_port}",
        "THOP_RUNTIME_IMAGES__JAVA": "registry.local/taskhandler-operator-java:e2e",
        "THOP_RUNTIME_IMAGES__TYPESCRIPT": "registry.local/taskhandler-operator-node:e2e",
        "THOP_HEALTH_PORT": str(health_port),
        "THOP_METRICS_PORT": str(metrics_port),
        "THOP_LOG_FORMAT": "text",
        "THOP_OPERATOR_IMAGE": IMAGE,
    }
    log = tmp_path / "operator.log"
    script = Path(sys.executable).parent / "taskhandler-operator"
    argv = [
        str(script),
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--lease-namespace={namespace}",
        "--health-host=127.0.0.1",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Operator(proc, log, health_port)
    try:
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bundle(namespace: str, language: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": f"orders-{language}", "namespace": namespace},
        "spec": {
            "bundleName": f"orders-{language}",
            "language": language,
            "queues": [language],
            "source": {
                "git": {
                    "url": url,
                    "ref": "main",
                    "path": ARTIFACTS[language].split("/")[0],
                    "secretRef": {"name": "git-auth"},
                }
            },
            "interval": "1h",
            "probe": {"timeout": "1m"},
        },
    }


def wait_ready(cluster: KubeCluster, namespace: str, name: str, op: Operator) -> None:
    done = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"thb/{name}",
        "-n",
        namespace,
        "--timeout=240s",
        check=False,
        timeout=260,
    )
    if done.returncode != 0:
        status = cluster.kubectl("get", "thb", name, "-n", namespace, "-o", "json", check=False)
        jobs = cluster.kubectl("get", "jobs,pods", "-n", namespace, "-o", "wide", check=False)
        pytest.fail(
            f"{name} not Ready: {done.stderr}\nstatus: {status.stdout[-3000:]}\n"
            f"{jobs.stdout}\noperator log:\n{op.tail()}"
        )


def probe_jobs(cluster: KubeCluster, namespace: str) -> list[str]:
    out = cluster.kubectl(
        "get",
        "jobs",
        "-n",
        namespace,
        "-l",
        f"{names.LABEL_MANAGED_BY}={names.MANAGER}",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    )
    return sorted(out.stdout.split())


def test_three_languages_become_ready_and_resolve(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    operator: Operator,
    database: str,
) -> None:
    url = repo.http_url(source_http)
    for language in ARTIFACTS:
        apply(kube_cluster, bundle(namespace, language, url))
    for language in ARTIFACTS:
        wait_ready(kube_cluster, namespace, f"orders-{language}", operator)

    table = kube_cluster.kubectl("get", "thb", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    for column in ("LANGUAGE", "QUEUES", "READY", "REVISION", "HANDLERS", "BINDINGS", "AGE"):
        assert column in header, table
    jobs = probe_jobs(kube_cluster, namespace)
    assert len(jobs) == 3, jobs  # one per artifact, each admitted under restricted

    async def resolve() -> dict[Any, TaskHandlerArtifactRef | None]:
        engine = create_engine(database)
        try:
            keys = [("orders_etl", task) for task in TASKS.values()]
            return dict(await resolve_task_handlers(engine, keys))
        finally:
            await engine.dispose()

    refs = asyncio.run(resolve())
    for language, task in TASKS.items():
        ref = refs[("orders_etl", task)]
        assert ref is not None, refs
        assert ref.bundle_info is not None, ref
        assert ref.bundle_info.name == f"orders-{language}"
        assert ref.rel_path == ARTIFACTS[language].split("/", 1)[1]

    status = json.loads(
        kube_cluster.kubectl("get", "thb", "orders-go", "-n", namespace, "-o", "json").stdout
    )["status"]
    assert status["counts"]["bindings"] == 1
    assert status["publishedRevision"] == status["revision"]
    assert status["observedGeneration"] == 1

    # A commit that changes nothing under the bundles' paths: a pass reuses every answer.
    repo.commit({"README.md": "docs only"}, "docs")
    kube_cluster.kubectl(
        "annotate",
        "thb",
        "orders-go",
        "-n",
        namespace,
        "--overwrite",
        f"{names.ANNOTATION_RECONCILE_REQUESTED_AT}=now-1",
    )
    for _ in range(120):
        current = json.loads(
            kube_cluster.kubectl("get", "thb", "orders-go", "-n", namespace, "-o", "json").stdout
        )["status"]
        if current.get("lastHandledReconcileAt") == "now-1":
            break
        time.sleep(1)
    else:
        pytest.fail(f"reconcile-now not handled:\n{operator.tail()}")
    assert probe_jobs(kube_cluster, namespace) == jobs
    assert operator.proc.poll() is None, operator.tail()
    # Events on transitions only: one NewRevision and one BindingsPublished per revision (two
    # revisions here), however many passes ran.
    events = json.loads(
        kube_cluster.kubectl(
            "get",
            "events.events.k8s.io",
            "-n",
            namespace,
            "--field-selector",
            "regarding.name=orders-go",
            "-o",
            "json",
        ).stdout
    )["items"]
    reasons = sorted(e["reason"] for e in events if e.get("reportingController") == names.MANAGER)
    assert reasons == ["BindingsPublished", "BindingsPublished", "NewRevision", "NewRevision"]
