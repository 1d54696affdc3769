"""Container probes on the process node, through the real control plane
(docs/testing-kubernetes.md).

The node runs ``startupProbe``, ``livenessProbe`` and ``readinessProbe`` as a kubelet does: a
failing liveness (or startup) probe kills and restarts the container, counting ``restartCount``
with the CrashLoopBackOff delay, and readiness drives the container's ``ready`` and the Pod's
``Ready`` condition. Everything here is read back from the apiserver.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes import client as k8s_client

from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.kubecluster.waits import wait_for

pytestmark = pytest.mark.kube

Obj = dict[str, Any]


class Pods:
    def __init__(self, api: k8s_client.ApiClient, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.core = k8s_client.CoreV1Api(api)

    def create(self, name: str, spec: Obj) -> None:
        body = k8s_client.V1Pod.model_validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        )
        self.core.create_namespaced_pod(self.ns, body)

    def status(self, name: str) -> Obj:
        pod = self.core.read_namespaced_pod_status(name, self.ns)
        pod = self.api.sanitize_for_serialization(pod)
        return cast(Obj, pod.get("status") or {})

    def container(self, name: str) -> Obj:
        statuses = self.status(name).get("containerStatuses") or [{}]
        return cast(Obj, statuses[0])

    def condition(self, name: str, kind: str) -> str | None:
        for cond in self.status(name).get("conditions") or []:
            if cond["type"] == kind:
                return str(cond["status"])
        return None

    def events(self, name: str) -> list[tuple[str, str]]:
        listing = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name}"
        )
        return [(e.reason or "", e.message or "") for e in listing.items]


@pytest.fixture
def pods(kube_api: k8s_client.ApiClient, kube_namespace: str) -> Pods:
    return Pods(kube_api, kube_namespace)


SLEEPER = ["sh", "-c", "exec sleep 3600"]


def test_failing_liveness_probe_restarts_the_container_with_back_off(pods: Pods) -> None:
    nobody = free_port()
    container = {
        "name": "c",
        "image": "busybox",
        "command": SLEEPER,
        "livenessProbe": {
            "tcpSocket": {"port": nobody},
            "periodSeconds": 1,
            "failureThreshold": 2,
            "terminationGracePeriodSeconds": 1,
        },
    }
    pods.create("unhealthy", {"containers": [container], "terminationGracePeriodSeconds": 5})

    first = wait_for(
        lambda: (s := pods.container("unhealthy")).get("restartCount", 0) >= 1 and s,
        "the first restart after failed liveness probes",
        60,
    )
    assert first["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM'd sleep
    # The second failure waits out the back-off (the kubelet's 10 s): CrashLoopBackOff.
    waiting = wait_for(
        lambda: (pods.container("unhealthy").get("state") or {}).get("waiting"),
        "CrashLoopBackOff",
        60,
    )
    assert waiting["reason"] == "CrashLoopBackOff" and "back-off 10s" in waiting["message"]
    wait_for(
        lambda: pods.container("unhealthy").get("restartCount", 0) >= 2,
        "the second restart after the back-off",
        60,
    )
    events = pods.events("unhealthy")
    assert any(
        reason == "Unhealthy"
        and message.startswith(f"Liveness probe failed: dial tcp 127.0.0.1:{nobody}")
        for reason, message in events
    ), events
    assert ("Killing", "Container c failed liveness probe, will be restarted") in events


def test_readiness_probe_makes_the_pod_ready_only_once_it_passes(pods: Pods) -> None:
    # exec runs in the container's mounts: /data is its emptyDir.
    script = "sleep 4; touch /data/ready; exec sleep 3600"
    container = {
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "d", "mountPath": "/data"}],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/data/ready"]}, "periodSeconds": 1},
        "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
    }
    pods.create("warming", {"containers": [container], "volumes": [{"name": "d", "emptyDir": {}}]})
    running = wait_for(
        lambda: (s := pods.container("warming")).get("state", {}).get("running") and s,
        "the container to run",
        60,
    )
    assert running["ready"] is False and running["started"] is True
    assert pods.condition("warming", "Ready") == "False"
    assert pods.condition("warming", "ContainersReady") == "False"
    wait_for(lambda: pods.condition("warming", "Ready") == "True", "Ready", 60)
    assert pods.condition("warming", "ContainersReady") == "True"
    status = pods.container("warming")
    assert status["ready"] is True and status["restartCount"] == 0


def test_http_readiness_probe_on_a_named_port(pods: Pods) -> None:
    port = free_port()
    container = {
        "name": "web",
        "image": "python:3",
        "command": ["sh", "-c", f"sleep 2; exec python3 -m http.server {port} --bind 127.0.0.1"],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    pods.create("web", {"containers": [container]})
    wait_for(lambda: pods.condition("web", "Ready") == "True", "Ready over HTTP", 60)
    events = pods.events("web")
    # It was probed before it listened: those failures are Events, never a restart.
    assert any(
        reason == "Unhealthy" and "connection refused" in message for reason, message in events
    ), events
    assert pods.container("web")["restartCount"] == 0


def test_startup_probe_gates_liveness_and_kills_a_container_that_never_starts(
    pods: Pods,
) -> None:
    container = {
        "name": "c",
        "image": "busybox",
        "command": SLEEPER,
        "startupProbe": {
            "exec": {"command": ["test", "-f", "/never"]},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        # Would kill at once if it ran before the startup probe passed.
        "livenessProbe": {"exec": {"command": ["false"]}, "failureThreshold": 1},
    }
    pods.create("slowstart", {"containers": [container], "terminationGracePeriodSeconds": 1})
    running = wait_for(
        lambda: (s := pods.container("slowstart")).get("state", {}).get("running") and s,
        "the container to run",
        60,
    )
    assert running["started"] is False and running["ready"] is False
    wait_for(
        lambda: pods.container("slowstart").get("restartCount", 0) >= 1,
        "a restart after the startup probe's failures",
        60,
    )
    events = pods.events("slowstart")
    assert ("Killing", "Container c failed startup probe, will be restarted") in events
    assert not any(m.startswith("Liveness probe failed") for _, m in events), events
