"""Runtimes that answer only the Dags they are asked about bind through the operator.

Some released Go, Java and TypeScript SDK runtimes answer only the ``dag_ids`` a parse request
names, and one TypeScript runtime gives no result at all when it names none. The test runtimes'
``filter-dag-ids-strict`` mode does both. Per language, on the real control plane: a bundle of
such an artifact binds (its probe Job asked about the stub Dags of the bundle's queue), and a
new stub Dag on that queue, added to Airflow's serialized Dags, causes exactly one new probe
Job, after which both Dags are bound (docs/protocol.md, "dag_ids").
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    Operator,
    StartOperator,
    apply,
    bindings,
    commit_files,
    git_bundle,
    probe_jobs,
    seed_dags,
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

ARTIFACT = {"go": "etl", "java": "etl.jar", "typescript": "etl.min.mjs"}
DAGS = ("orders_etl", "late_etl")


def _spec() -> dict[str, list[dict[str, Any]]]:
    return {dag: [{"task_id": "run", "binding": "named", "params": []}] for dag in DAGS}


@pytest.mark.timeout(900)  # a runtime build, a probe Job and a re-probe, on a loaded machine
@pytest.mark.parametrize("language", ["go", "java", "typescript"])
def test_a_filtering_runtime_binds_and_a_new_dag_reprobes_once(
    language: str,
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders_etl": [("run", language)], "unrelated": [("x", "other")]})
    artifact = Path(runtime_factory(language, "filter-dag-ids-strict", spec=_spec()))
    commit_files(git_repo, {f"b/{ARTIFACT[language]}": artifact.read_bytes()}, "one artifact")
    operator: Operator = start([namespace])
    name = f"filtering-{language}"
    apply(
        kube_cluster,
        git_bundle(
            namespace, name, language=language, url=git_repo.http_url(source_http), path="b"
        ),
    )
    wait_ready(kube_cluster, namespace, name, operator)
    first = probe_jobs(kube_cluster, namespace, name)
    assert len(first) == 1, first
    job = json.loads(
        kube_cluster.kubectl("get", "job", first[0], "-n", namespace, "-o", "json").stdout
    )
    [probe] = job["spec"]["template"]["spec"]["containers"]
    command = probe["command"]
    # Asked about the stub Dags of its queue only.
    assert command[-2:] == ["--dag-id", "orders_etl"], command
    assert bindings(migrated, name) == {("orders_etl", "run"): ARTIFACT[language]}

    # A new stub Dag on the bundle's queue: the stored answer was not asked about it.
    seed_dags(migrated, {"late_etl": [("run", language)]})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if ("late_etl", "run") in bindings(migrated, name):
            break
        time.sleep(2)
    else:
        pytest.fail(f"late_etl never bound:\n{operator.tail()}")
    assert bindings(migrated, name) == {
        ("orders_etl", "run"): ARTIFACT[language],
        ("late_etl", "run"): ARTIFACT[language],
    }
    second = probe_jobs(kube_cluster, namespace, name)
    assert len(second) == 2 and set(first) < set(second), second
    # Exactly one: later passes reuse the answer that was asked about both Dags.
    time.sleep(10)
    assert probe_jobs(kube_cluster, namespace, name) == second
    assert operator.proc.poll() is None, operator.tail()
