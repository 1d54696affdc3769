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
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.kube import names
from taskhandler_operator.records import TaskHandlerArtifactRef
from taskhandler_operator.scheduler import resolve_task_handlers
from tests.e2e.operator_env import (
    Operator,
    StartOperator,
    apply,
    git_bundle,
    probe_jobs,
    wait_ready,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

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


@pytest.fixture
def database(migrated: str) -> str:
    engine = sa.create_engine(migrated)
    document = dag_document(
        "orders_etl", [stub_task(task, queue=lang) for lang, task in TASKS.items()]
    )
    with engine.begin() as conn:
        insert_dag(conn, document)
    engine.dispose()
    return migrated


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
def operator(start: StartOperator, namespace: str, database: str) -> Operator:
    return start([namespace])


def bundle(namespace: str, language: str, url: str) -> dict[str, Any]:
    return git_bundle(
        namespace,
        f"orders-{language}",
        language=language,
        url=url,
        path=ARTIFACTS[language].split("/")[0],
    )


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

    # The metrics the chart's alerts read: Ready, finished probes, no Job still counted running.
    samples = scrape(operator)
    for language in ARTIFACTS:
        b = (namespace, f"orders-{language}")
        assert samples[("taskhandler_operator_bundle_ready", *b, "")] == 1.0, samples
        assert samples[("taskhandler_operator_probes_total", *b, "accepted")] == 1.0, samples
        assert samples[("taskhandler_operator_probe_jobs_running", *b, "")] == 0.0, samples

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
    # revisions here), however many passes ran, and one BindingsChanged for the publication
    # that changed the bindings (the first; the second revision changes none).
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
    assert reasons == [
        "BindingsChanged",
        "BindingsPublished",
        "BindingsPublished",
        "NewRevision",
        "NewRevision",
    ]


def scrape(operator: Operator) -> dict[tuple[str, str, str, str], float]:
    """The operator's per-bundle samples: (name, namespace, bundle, outcome) -> value."""
    url = f"http://127.0.0.1:{operator.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, s.labels["namespace"], s.labels["name"], s.labels.get("outcome", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "namespace" in s.labels and "name" in s.labels
    }
