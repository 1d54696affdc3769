"""Helpers for the real-node tests: a namespace with Pod Security ``restricted`` enforced, pods
that satisfy it, and waiting on what the kubelet reports."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster

Pod = dict[str, Any]


@pytest.fixture
def restricted_ns(real_node_cluster: KubeCluster) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }
    real_node_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    deadline = time.monotonic() + 30
    while real_node_cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
        time.sleep(0.2)
    yield name
    real_node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def restricted_pod(
    name: str,
    image: str,
    command: list[str],
    *,
    automount: bool = False,
    restart: str = "Never",
    container: dict[str, Any] | None = None,
    pod_security: dict[str, Any] | None = None,
) -> Pod:
    """A pod the ``restricted`` profile admits: non-root, no privilege escalation, all
    capabilities dropped, RuntimeDefault seccomp, read-only root, an emptyDir at /scratch."""
    spec_container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        **(container or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": automount,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
                **(pod_security or {}),
            },
            "containers": [spec_container],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def apply(cluster: KubeCluster, namespace: str, manifest: Pod) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def get_pod(cluster: KubeCluster, namespace: str, name: str) -> Pod:
    result: Pod = json.loads(
        cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
    )
    return result


def wait_pod(
    cluster: KubeCluster,
    namespace: str,
    name: str,
    until: Callable[[Pod], bool],
    what: str,
    timeout: float = 90.0,
) -> Pod:
    deadline = time.monotonic() + timeout
    while True:
        pod = get_pod(cluster, namespace, name)
        if until(pod):
            return pod
        if time.monotonic() > deadline:
            pytest.fail(
                f"pod {namespace}/{name}: not {what} in {timeout:g}s: {json.dumps(pod['status'])}"
            )
        time.sleep(0.5)


def main_status(pod: Pod) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def terminated(pod: Pod) -> dict[str, Any] | None:
    state = main_status(pod).get("state", {}).get("terminated")
    return dict(state) if state else None
