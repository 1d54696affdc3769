"""Probe Jobs, end to end (issue 20, items 5 and 6), on the real control plane and process node:

* a probe that fails for its spec (an answer timeout too short for the runtime), then the user
  raises ``spec.probe.timeout``: the next pass creates a new Job (another name: the name hashes
  the pod template) and binds, instead of adopting the failed Job and repeating its error;
* the probe's log cannot be read because the node's log endpoint is down (``pods/log`` answers
  500): the artifact is not blamed (``TransientApiError``, retried after the probe back-off,
  never ``ResultRejected``), and once the endpoint is back the finished Job is adopted and read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    bindings,
    commit_files,
    git_bundle,
    handler_spec,
    probe_jobs,
    seed_dags,
    wait_ready,
    wait_status,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

DAG, TASK = "dag_probe_jobs", "extract"


def _artifact(status: dict[str, object], path: str) -> dict[str, str]:
    items = status.get("artifacts") or []
    assert isinstance(items, list)
    return next((a for a in items if a.get("path") == path), {})


def _template_hash(cluster: KubeCluster, namespace: str, job: str) -> str:
    out = cluster.kubectl("get", "job", job, "-n", namespace, "-o", "json")
    labels: dict[str, str] = json.loads(out.stdout)["metadata"]["labels"]
    return labels[names.LABEL_TEMPLATE_HASH]


def test_a_fixed_probe_spec_gets_a_new_job_not_the_old_failure(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {DAG: [(TASK, "go")]})
    # Answers after 15 s: a 5 s answer timeout fails the probe, a minute passes it.
    slow = Path(runtime_factory("go", "slow-answer", spec=handler_spec((DAG, TASK)))).read_bytes()
    commit_files(git_repo, {"go/extract": slow}, "a slow artifact")
    op = start([namespace])
    url = git_repo.http_url(source_http)
    short = git_bundle(
        namespace, "slow", language="go", url=url, path="go", probe={"timeout": "5s"}
    )
    apply(kube_cluster, short)
    failed = wait_status(
        kube_cluster,
        namespace,
        "slow",
        op,
        "extract failed its probe",
        lambda s: _artifact(s, "extract").get("reason") == "RuntimeFailed",
    )
    assert "answer_timeout" in _artifact(failed, "extract").get("message", "")
    (first,) = probe_jobs(kube_cluster, namespace, "slow")

    # The operator's advice followed: a longer timeout. The failed Job stays for its TTL.
    longer = git_bundle(
        namespace, "slow", language="go", url=url, path="go", probe={"timeout": "1m"}
    )
    apply(kube_cluster, longer)
    wait_ready(kube_cluster, namespace, "slow", op)
    jobs = probe_jobs(kube_cluster, namespace, "slow")
    assert first in jobs and len(jobs) == 2, jobs
    (second,) = [j for j in jobs if j != first]
    assert _template_hash(kube_cluster, namespace, second) != _template_hash(
        kube_cluster, namespace, first
    )
    assert bindings(migrated, "slow") == {(DAG, TASK): "extract"}


def test_a_log_that_cannot_be_read_is_transient_not_the_artifacts_fault(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {DAG: [(TASK, "go")]})
    good = Path(runtime_factory("go", spec=handler_spec((DAG, TASK)))).read_bytes()
    commit_files(git_repo, {"go/extract": good}, "a good artifact")
    op = start([namespace])
    url = git_repo.http_url(source_http)
    # The node's log server goes down: pods run and finish, but pods/log answers 500.
    kube_cluster.node_logs(serving=False)
    try:
        apply(kube_cluster, git_bundle(namespace, "unread", language="go", url=url, path="go"))
        waiting = wait_status(
            kube_cluster,
            namespace,
            "unread",
            op,
            "a transient failure reading the probe's log",
            lambda s: (
                _artifact(s, "extract").get("reason") in ("TransientApiError", "ResultRejected")
            ),
        )
        item = _artifact(waiting, "extract")
        assert item["reason"] == "TransientApiError", item
        assert "transient" in item["message"] and "next attempt after" in item["message"]
        assert "not at fault" in item["message"]
    finally:
        kube_cluster.node_logs(serving=True)
    # Back: the next attempt (after the back-off) adopts the finished Job and reads its log.
    wait_ready(kube_cluster, namespace, "unread", op)
    assert bindings(migrated, "unread") == {(DAG, TASK): "extract"}
    assert len(probe_jobs(kube_cluster, namespace, "unread")) == 1
