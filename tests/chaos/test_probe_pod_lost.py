"""Chaos: a probe Job's pod is deleted, or its node is gone, while it probes.

What it proves: on the real operator (``taskhandler-operator run``, real control plane + process
node, PostgreSQL), a Go artifact whose runtime takes 15 s to answer (test runtime mode
``slow-answer``) is probed by a Job, and while the probe container runs:

* its pod is deleted with ``kubectl delete pod`` (default suite, about a minute); or
* its node is gone (``chaos`` marker, about two minutes): the process node is SIGKILLed (its
  containers die with it) and its Node object deleted, as a cloud provider's node controller
  does; the pod garbage collector of kube-controller-manager deletes the lost pod after its 40 s
  quarantine, marking it ``DisruptionTarget``/``DeletionByPodGC``; the process node is then
  started again (a node joins), where the new probe runs.

Either way the operator reads the loss as ``PodLost``, never as an answer about the artifact
(the container's exit 143 is not reported as a crash), and probes it again exactly once:
``kubectl get --watch`` over the whole test sees two probe Jobs and two probe pods, the
operator's log says it created two Jobs, the bundle ends Ready with its binding row, and a later
pass creates no Job.

Run: ``.venv/bin/pytest tests/chaos/test_probe_pod_lost.py`` (the pod deletion), and
``.venv/bin/pytest -m chaos tests/chaos/test_probe_pod_lost.py`` (the lost node too).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from taskhandler_operator.kube.probe_job import PROBE_CONTAINER
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
from tests.e2e.faults_support import Replica, jobs_by_name, rows, wait_for
from tests.e2e.operator_env import apply, events, handler_spec
from tests.e2e.test_operator import database as database
from tests.fixtures.runtimes_plugin import RuntimeFactory

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


Disturb = Callable[[KubeCluster, dict[str, Any], Callable[[], str]], None]


def probed_again_once(
    cluster: KubeCluster,
    namespace: str,
    database: str,
    server: FaultyServer,
    runtime_factory: RuntimeFactory,
    started: list[Replica],
    workdir: Path,
    disturb: Disturb,
) -> list[dict[str, Any]]:
    """Start a slow probe, ``disturb`` its pod while the runtime answers, and check that the
    artifact was probed again exactly once and bound; the pods the watch saw, in order."""
    slow = Path(runtime_factory("go", "slow-answer", spec=handler_spec((DAG, TASK))))
    url, sha = server.put("slow.tar.gz", archive({ARTIFACT: slow.read_bytes()}))
    jobs = Watch(cluster, namespace, "jobs", SELECTOR)
    pods = Watch(cluster, namespace, "pods", SELECTOR)
    try:
        op = start_replica(started, cluster, namespace, database, workdir)
        apply(cluster, http_bundle(namespace, NAME, url, sha))

        def more() -> str:
            return diagnose(cluster, namespace, NAME, op)

        pod = wait_for(
            "a probe container running", lambda: probing(cluster, namespace), 240, more=more
        )
        disturb(cluster, pod, more)

        good = ready(cluster, namespace, NAME, op)
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
        assert seen_pods[0]["metadata"]["uid"] == pod["metadata"]["uid"], detail
        assert op.text().count("created for extract") == 2, detail
        # The loss was seen as one, never as an answer about the artifact (a crash, exit 143).
        notes = [e.get("note", "") for e in events(cluster, namespace, NAME)]
        assert any(n.startswith("extract: ") for n in notes), (notes, detail)
        assert not [n for n in notes if "exited with code" in n], (notes, detail)

        # A later pass reuses the answer: no Job at all.
        before = jobs_by_name(cluster, namespace)
        request_pass(cluster, namespace, NAME, "after-loss")
        wait_until(cluster, namespace, NAME, op, "handled the later pass", handled("after-loss"))
        assert len(jobs.objects()) == 2, detail
        assert jobs_by_name(cluster, namespace) == before
        assert rows(database) == state
        return seen_pods
    finally:
        jobs.stop()
        pods.stop()


def delete_pod(cluster: KubeCluster, pod: dict[str, Any], more: Callable[[], str]) -> None:
    meta = pod["metadata"]
    cluster.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--wait=false")


def test_a_probe_pod_deleted_mid_probe_is_probed_again_once(
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    faulty_server: FaultyServer,
    runtime_factory: RuntimeFactory,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    probed_again_once(
        kube_cluster,
        namespace,
        database,
        faulty_server,
        runtime_factory,
        replicas,
        tmp_path / "operator",
        delete_pod,
    )


def node_alive(cluster: KubeCluster) -> bool:
    proc = cluster.processes.get("node")
    return proc is not None and proc.alive()


@pytest.fixture
def node_restored(kube_cluster: KubeCluster) -> Iterator[None]:
    """Whatever the test does to the process node, it is running and Ready afterwards (the
    cluster is shared by the whole session)."""
    yield
    if not node_alive(kube_cluster):
        kube_cluster.start_node(kube_cluster.options.node_name, "node")


@pytest.mark.chaos
@pytest.mark.usefixtures("node_restored")
def test_a_probe_whose_node_is_gone_is_probed_again_once(
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    faulty_server: FaultyServer,
    runtime_factory: RuntimeFactory,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    node = kube_cluster.options.node_name

    def lose_the_node(cluster: KubeCluster, pod: dict[str, Any], more: Callable[[], str]) -> None:
        # The machine dies (SIGKILL: its containers die with it), then its Node is removed, as
        # a cloud provider's node controller does; the pod garbage collector deletes its pods.
        cluster.processes["node"].stop(grace=0)
        cluster.kubectl("delete", "node", node, "--wait=false")
        meta = pod["metadata"]

        def gone() -> bool:
            found = cluster.kubectl(
                "get", "pod", meta["name"], "-n", meta["namespace"], "-o", "name", check=False
            )
            return found.returncode != 0 and "NotFound" in found.stderr

        wait_for("the pod garbage collector removes the lost pod", gone, 180, more=more)
        # A new node joins (the same process node, started again): the probe runs there.
        cluster.start_node(node, "node")

    pods = probed_again_once(
        kube_cluster,
        namespace,
        database,
        faulty_server,
        runtime_factory,
        replicas,
        tmp_path / "operator",
        lose_the_node,
    )
    # It was the node's loss that ended the first pod: the garbage collector marked it so.
    last = pods[0].get("status") or {}
    reasons = [
        c.get("reason") for c in last.get("conditions") or () if c["type"] == "DisruptionTarget"
    ]
    assert reasons == ["DeletionByPodGC"], pods[0]
