"""What the kubelet enforces and the process node only imitates: Pod Security admission,
non-root, read-only root, dropped capabilities, no token, memory limits, liveness probes, grace
periods, and the scheduler binding pods (docs/testing-kubernetes.md, "Real node")."""

from __future__ import annotations

import json
import time

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster, ToolError
from tests.fixtures.realnode import report

from .conftest import apply, get_pod, main_status, restricted_pod, terminated, wait_pod

pytestmark = pytest.mark.timeout(300)

PROBE_SCRIPT = (
    "echo uid=$(id -u); "
    "if touch /written 2>/dev/null; then echo root=writable; else echo root=readonly; fi; "
    "if echo ok > /scratch/f && cat /scratch/f >/dev/null; then echo scratch=ok; fi; "
    "if test -e /var/run/secrets/kubernetes.io/serviceaccount/token; "
    "then echo token=present; else echo token=absent; fi; "
    "grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status; "
    "echo done; sleep 3600"
)


def _logs(cluster: KubeCluster, ns: str, name: str) -> str:
    return cluster.kubectl("logs", "-n", ns, name).stdout


def test_the_cluster_runs_a_real_kubelet(real_node_cluster: KubeCluster) -> None:
    assert real_node_cluster.node_kind == "real"
    node = json.loads(
        real_node_cluster.kubectl("get", "node", "thop-real-node", "-o", "json").stdout
    )
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"] == f"v{real_node_cluster.bins.versions.kubernetes}"
    taints = [t["key"] for t in node["spec"].get("taints") or []]
    assert "node.kubernetes.io/not-ready" not in taints


def test_restricted_namespace_refuses_a_privileged_pod(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    pod = restricted_pod("privileged", real_node_images["nonroot"], ["sleep", "1"])
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ToolError, match="violates PodSecurity"):
        apply(real_node_cluster, restricted_ns, pod)


def test_non_root_read_only_no_capabilities_no_token(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    started = time.monotonic()
    apply(
        real_node_cluster,
        restricted_ns,
        restricted_pod("locked", real_node_images["nonroot"], ["sh", "-c", PROBE_SCRIPT]),
    )
    pod = wait_pod(
        real_node_cluster,
        restricted_ns,
        "locked",
        lambda p: bool(main_status(p).get("state", {}).get("running")),
        "Running",
    )
    report(f"real_node_cluster: first pod Running {time.monotonic() - started:.1f}s after apply")
    # The scheduler bound it: the manifest names no node.
    assert pod["spec"]["nodeName"] == "thop-real-node"
    for _ in range(60):
        out = _logs(real_node_cluster, restricted_ns, "locked")
        if "done" in out:
            break
    lines = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert lines["uid"] == "65532"
    assert lines["root"] == "readonly"
    assert lines["scratch"] == "ok"
    assert lines["token"] == "absent"
    caps = dict(line.split(":\t") for line in out.splitlines() if line.startswith("Cap"))
    assert caps == {
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
    }


def test_run_as_non_root_refuses_a_root_image(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    apply(
        real_node_cluster,
        restricted_ns,
        restricted_pod("rootimage", real_node_images["root"], ["sleep", "3600"]),
    )
    pod = wait_pod(
        real_node_cluster,
        restricted_ns,
        "rootimage",
        lambda p: (
            main_status(p).get("state", {}).get("waiting", {}).get("reason")
            == "CreateContainerConfigError"
        ),
        "refused",
    )
    message = main_status(pod)["state"]["waiting"]["message"]
    assert "runAsNonRoot and image will run as root" in message


def test_memory_limit_ends_in_oomkilled(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    # dd fills a 64 MiB block buffer: twice the limit.
    pod = restricted_pod(
        "hungry",
        real_node_images["nonroot"],
        ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4"],
        container={"resources": {"limits": {"memory": "32Mi", "cpu": "500m"}}},
    )
    apply(real_node_cluster, restricted_ns, pod)
    done = wait_pod(
        real_node_cluster,
        restricted_ns,
        "hungry",
        lambda p: terminated(p) is not None,
        "terminated",
    )
    state = terminated(done)
    assert state is not None
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)


def test_exec_liveness_probe_restarts_the_container(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    pod = restricted_pod(
        "unhealthy",
        real_node_images["nonroot"],
        ["sleep", "3600"],
        restart="Always",
        container={
            "livenessProbe": {
                "exec": {"command": ["test", "-e", "/scratch/alive"]},
                "periodSeconds": 1,
                "failureThreshold": 1,
            }
        },
    )
    apply(real_node_cluster, restricted_ns, pod)
    restarted = wait_pod(
        real_node_cluster,
        restricted_ns,
        "unhealthy",
        lambda p: int(main_status(p).get("restartCount", 0)) >= 1,
        "restarted by its liveness probe",
    )
    last = main_status(restarted)["lastState"]["terminated"]
    # PID 1 gets no default SIGTERM action: the kubelet SIGKILLs it after the grace period.
    assert last["exitCode"] == 137
    events = real_node_cluster.kubectl(
        "get",
        "events",
        "-n",
        restricted_ns,
        "--field-selector",
        "involvedObject.name=unhealthy,reason=Unhealthy",
        "-o",
        "json",
    ).stdout
    assert "Liveness probe failed" in events


def test_pod_reaches_the_apiserver_at_the_service_ip(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    apply(
        real_node_cluster,
        restricted_ns,
        restricted_pod("incluster", real_node_images["nonroot"], ["/bin/apicheck"], automount=True),
    )
    done = wait_pod(
        real_node_cluster,
        restricted_ns,
        "incluster",
        lambda p: terminated(p) is not None,
        "terminated",
    )
    out = _logs(real_node_cluster, restricted_ns, "incluster")
    assert f"status=201 user=system:serviceaccount:{restricted_ns}:default" in out, out
    assert terminated(done) == {**(terminated(done) or {}), "exitCode": 0}


def test_grace_period_holds_a_pod_whose_pid_1_ignores_sigterm(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    pod = restricted_pod("stubborn", real_node_images["nonroot"], ["sleep", "3600"])
    pod["spec"]["terminationGracePeriodSeconds"] = 4
    apply(real_node_cluster, restricted_ns, pod)
    wait_pod(
        real_node_cluster,
        restricted_ns,
        "stubborn",
        lambda p: bool(main_status(p).get("state", {}).get("running")),
        "Running",
    )
    started = time.monotonic()
    real_node_cluster.kubectl(
        "delete", "pod", "stubborn", "-n", restricted_ns, "--wait=true", "--timeout=60s"
    )
    took = time.monotonic() - started
    # PID 1 has no default SIGTERM action: only the SIGKILL at the end of the grace period ends it.
    assert 3.5 <= took < 30, f"deleted after {took:.1f}s"


def test_http_readiness_probe_gates_ready_and_exec_reaches_the_container(
    real_node_cluster: KubeCluster, restricted_ns: str, real_node_images: dict[str, str]
) -> None:
    pod = restricted_pod(
        "gated",
        real_node_images["nonroot"],
        ["/bin/apicheck", "serve", ":8080", "/scratch/ready"],
        restart="Always",
        container={
            "readinessProbe": {
                "httpGet": {"path": "/", "port": 8080},
                "periodSeconds": 1,
                "failureThreshold": 1,
            }
        },
    )
    apply(real_node_cluster, restricted_ns, pod)

    def ready(p: dict[str, object]) -> bool:
        return bool(main_status(p).get("ready"))

    wait_pod(
        real_node_cluster,
        restricted_ns,
        "gated",
        lambda p: bool(main_status(p).get("state", {}).get("running")),
        "Running",
    )
    # The kubelet probes the pod IP on the bridge; 503 keeps it unready (three probe periods).
    time.sleep(3)
    assert not ready(get_pod(real_node_cluster, restricted_ns, "gated"))
    real_node_cluster.kubectl("exec", "-n", restricted_ns, "gated", "--", "touch", "/scratch/ready")
    wait_pod(real_node_cluster, restricted_ns, "gated", ready, "Ready after the flag file")
