"""Chaos: a probe Job's pod is deleted while it probes.

What it proves: on the real operator (``taskhandler-operator run``, real control plane + process
node, PostgreSQL), a Go artifact whose runtime takes 15 s to answer (test runtime mode
``slow-answer``) is probed by a Job; its pod is deleted with ``kubectl delete pod`` while the
probe container runs. The operator reads that as a lost pod (``PodLost``), never as an answer
about the artifact (its container's exit 143 is not reported as a crash), and probes it again
exactly once: ``kubectl get --watch`` over the whole test sees two probe Jobs and two probe
pods for the artifact, the operator's log says it created two Jobs, the bundle ends Ready with
its binding row, and a later pass creates no Job.

Run: ``.venv/bin/pytest tests/chaos/test_probe_pod_lost.py`` (about a minute; in
the default suite, markers kube/integration/slow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.faulty_server import FaultyServer
from tests.chaos.input_faults import (
    ARTIFACT,
    DAG,
    TASK,
    Watch,
    archive,
    diagnose,
    handled,
    http_bundle,
    ready,
    request_pass,
    start_replica,
    wait_until,
)
from tests.chaos.input_faults import faulty_server as faulty_server
from tests.chaos.input_faults import replicas as replicas
from tests.e2e.conftest import migrated, namespace, thb_crd  # noqa: F401 - fixtures
from tests.e2e.faults_support import Replica, jobs_by_name, rows, wait_for
from tests.e2e.operator_env import apply, events, handler_spec
from tests.e2e.test_operator import database as database
from tests.fixtures.runtimes_plugin import RuntimeFactory

from taskhandler_operator.devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from taskhandler_operator.kube.probe_job import PROBE_CONTAINER

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

NAME = "orders-slow"
SELECTOR = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"


def probing(cluster: KubeCluster, ns: str) -> dict[str, Any] | None:
    """The probe pod whose probe container runs (the runtime is answering), if any."""
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", SELECTOR, "-o", "json")
    for pod in json.loads(out.stdout)["items"]:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if status.get("name") == PROBE_CONTAINER and "running" in (status.get("state") or {}):
                return dict(pod)
    return None


def test_a_probe_pod_deleted_mid_probe_is_probed_again_once(
    kube_cluster: KubeCluster,
    namespace: str,  # noqa: F811 - the fixture imported above
    database: str,
    faulty_server: FaultyServer,
    runtime_factory: RuntimeFactory,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    slow = Path(runtime_factory("go", "slow-answer", spec=handler_spec((DAG, TASK))))
    url, sha = faulty_server.put("slow.tar.gz", archive({ARTIFACT: slow.read_bytes()}))
    jobs = Watch(kube_cluster, namespace, "jobs", SELECTOR)
    pods = Watch(kube_cluster, namespace, "pods", SELECTOR)
    try:
        op = start_replica(replicas, kube_cluster, namespace, database, tmp_path / "operator")
        apply(kube_cluster, http_bundle(namespace, NAME, url, sha))

        def more() -> str:
            return diagnose(kube_cluster, namespace, NAME, op)

        pod = wait_for(
            "a probe container running", lambda: probing(kube_cluster, namespace), 240, more=more
        )
        first = pod["metadata"]["name"]
        kube_cluster.kubectl("delete", "pod", first, "-n", namespace, "--wait=false")

        good = ready(kube_cluster, namespace, NAME, op)
        assert good["status"]["revision"] == sha, more()
        state = rows(database)
        assert [b[:2] for b in state["bindings"]] == [(DAG, TASK)], (state, more())

        # Probed again, once: two Jobs (the same name, two uids) and two pods ever existed.
        seen_jobs = jobs.objects()
        seen_pods = pods.objects()
        detail = (
            f"jobs seen: {[(j['metadata']['name'], j['metadata']['uid']) for j in seen_jobs]}\n"
            f"pods seen: {[p['metadata']['name'] for p in seen_pods]}\n{more()}"
        )
        assert len(seen_jobs) == 2, detail
        assert len({j["metadata"]["name"] for j in seen_jobs}) == 1, detail
        assert len(seen_pods) == 2, detail
        assert first in [p["metadata"]["name"] for p in seen_pods], detail
        assert op.text().count("created for extract") == 2, detail
        # The loss was seen as one, never as an answer about the artifact (a crash, exit 143).
        notes = [e.get("note", "") for e in events(kube_cluster, namespace, NAME)]
        assert any(n.startswith("extract: ") for n in notes), (notes, detail)
        assert not [n for n in notes if "exited with code" in n], (notes, detail)

        # A later pass reuses the answer: no Job at all.
        before = jobs_by_name(kube_cluster, namespace)
        request_pass(kube_cluster, namespace, NAME, "after-loss")
        wait_until(
            kube_cluster, namespace, NAME, op, "handled the later pass", handled("after-loss")
        )
        assert len(jobs.objects()) == 2, detail
        assert jobs_by_name(kube_cluster, namespace) == before
        assert rows(database) == state
    finally:
        jobs.stop()
        pods.stop()
