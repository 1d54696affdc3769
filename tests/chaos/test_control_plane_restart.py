"""kube-apiserver or etcd killed and restarted in the middle of a pass.

What it proves: with probe Jobs of a bundle's first pass in flight, a crash of the apiserver
(SIGKILL, restarted on the same port) or of etcd (SIGKILL, restarted on the same data dir and
ports) does not lose or repeat work: the pending probes complete, the bundle becomes Ready with
all its bindings, no artifact gets a second Job (a watch on the apiserver, itself resumed across
the restart, records every Job ADDED), and the operator's watches resume: a reconcile-now
annotation set after the restart is handled. A short outage (1 s) is ridden out without a
restart of the operator. An outage longer than the Lease's renew deadline (10 s) makes the
operator give up leading and exit 1 (by design: no two replicas may reconcile); it is started
again, as the kubelet would, and finishes the work.

The session's cluster is healthy afterwards (the restart waits for /readyz, and the remaining
probe Jobs ran on the restarted control plane), so later tests reuse it.

Run: the 1 s outages are part of the default suite; the 15 s ones are marked ``chaos``::

    make chaos
    .venv/bin/pytest -m chaos tests/chaos/test_control_plane_restart.py
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.operator_process import request_reconcile
from tests.chaos.conftest import StartBundleRun
from tests.chaos.harness import READY_SECONDS, many_artifacts_repo
from tests.e2e.faults_support import Replica, condition, rows, thb, wait_for
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

ARTIFACTS = 4
PARALLELISM = 2
BUNDLE = "chaos-cp"
#: The operator's Lease renew deadline: a longer outage ends its leadership (and the process).
RENEW_DEADLINE = 10.0


def supervised(op: Replica, exits: list[int]) -> None:
    """Start ``op`` again if it exited, as the kubelet restarts a pod; note the exit code."""
    assert op.proc is not None
    code = op.proc.poll()
    if code is not None:
        exits.append(code)
        op.start()


@pytest.mark.parametrize(
    ("component", "down"),
    [
        pytest.param("kube-apiserver", 1.0, id="apiserver-1s"),
        pytest.param("etcd", 1.0, id="etcd-1s"),
        pytest.param("kube-apiserver", 15.0, id="apiserver-15s", marks=pytest.mark.chaos),
        pytest.param("etcd", 15.0, id="etcd-15s", marks=pytest.mark.chaos),
    ],
)
def test_a_control_plane_restart_mid_pass_loses_and_repeats_nothing(
    component: str,
    down: float,
    kube_cluster: KubeCluster,
    namespace: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    bundle_run: StartBundleRun,
) -> None:
    url = many_artifacts_repo(git_repo, runtime_factory, ARTIFACTS).http_url(source_http)
    exits: list[int] = []
    database, recorder, op, more = bundle_run(
        namespace,
        url,
        bundle=BUNDLE,
        artifacts=ARTIFACTS,
        parallelism=PARALLELISM,
        note=lambda: f"operator exits: {exits}\n",
    )
    # The hook: the first wave of probe Jobs exists, the second is still to come.
    wait_for("the first probe Job", lambda: recorder.jobs(), 240, more=more)
    before = len(recorder.jobs())

    crashed = kube_cluster.processes[component].pid
    began = time.monotonic()
    # From this (the main) thread: the restarted process dies with the thread that starts it.
    if component == "etcd":
        kube_cluster.restart_etcd(down_seconds=down)
    else:
        kube_cluster.restart_apiserver(down_seconds=down)
    print(f"{component} back after {time.monotonic() - began:.1f}s ({before} Jobs before)")

    def ready() -> dict[str, Any] | None:
        supervised(op, exits)
        obj = thb(kube_cluster, namespace, BUNDLE)
        return obj if condition(obj, "Ready").get("status") == "True" else None

    healed = wait_for(f"{BUNDLE} Ready after the restart", ready, READY_SECONDS, more=more)
    status = healed["status"]
    assert status["counts"]["bindings"] == ARTIFACTS, more()
    state = rows(database)
    assert len(state["bindings"]) == ARTIFACTS and state["problems"] == [], (state, more())
    assert not recorder.duplicates(), more()
    assert len(recorder.jobs()) == ARTIFACTS, more()
    assert kube_cluster.processes[component].pid != crashed, more()
    if component == "kube-apiserver":  # the outage was real: our own watch broke too
        assert recorder.reconnects + recorder.relists >= 1, more()

    # A crash is only acceptable as the designed exit on a lost Lease (an outage past the
    # renew deadline), never for a short outage.
    if down < RENEW_DEADLINE / 2:
        assert exits == [], more()
    for code in exits:
        assert code == 1, more()
    if exits:
        assert "leadership lost" in op.text(), more()
    print(f"operator exits: {exits or 'none'}")

    # The watches resumed: a request made after the restart is seen and handled.
    token = f"after-{component}-{uuid.uuid4().hex[:6]}"
    request_reconcile(kube_cluster, namespace, BUNDLE, token)

    def handled() -> bool:
        supervised(op, exits)
        status = thb(kube_cluster, namespace, BUNDLE).get("status") or {}
        return bool(status.get("lastHandledReconcileAt") == token)

    wait_for(f"the reconcile request {token}", handled, 120, more=more)
    assert rows(database) == state, more()  # the pass reused every answer
    assert len(recorder.jobs()) == ARTIFACTS, more()
    # The cluster is whole again for the tests after this one.
    node = kube_cluster.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}"
    )
    assert set(node.stdout.split()) == {"True"}, node.stdout
