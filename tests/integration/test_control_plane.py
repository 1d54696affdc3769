"""The real control plane and the process node, end to end (docs/testing-kubernetes.md).

Jobs, garbage collection and RBAC are the real kube-controller-manager and kube-apiserver; only
the kubelet is stood in for by the process node. Objects are read back as plain dicts (camelCase,
as the API serves them) so assertions read like manifests.

A note on ``$$$$`` in commands: Kubernetes expands ``$(VAR)`` in command/args and turns ``$$``
into ``$``, so the shell sees ``$$`` (its own pid) only when the manifest says ``$$$$``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client import ApiException

from taskhandler_devenv.kubecluster.bins import (
    REPO_ROOT,
    BinaryCacheError,
    K8sBins,
    K8sVersions,
    check_bins,
    ensure_bins,
    expected_versions,
)
from taskhandler_devenv.kubecluster.control_plane import (
    ControlPlaneError,
    ControlPlaneOptions,
    KubeCluster,
    node_venv_bin,
    start_cluster,
)
from taskhandler_devenv.kubecluster.procs import free_port, pid_alive, wait_until_gone
from taskhandler_devenv.kubecluster.waits import wait_for

pytestmark = pytest.mark.kube

Obj = dict[str, Any]
PID = re.compile(r"pid=(\d+)")


class Kube:
    """Thin dict-in/dict-out helpers over the official client for these tests."""

    def __init__(self, api: k8s_client.ApiClient, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.core = k8s_client.CoreV1Api(api)
        self.batch = k8s_client.BatchV1Api(api)

    def plain(self, obj: object) -> Obj:
        return cast(Obj, self.api.sanitize_for_serialization(obj))

    def create_pod(self, name: str, spec: Obj, **meta: Any) -> Obj:
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta}}
        body = k8s_client.V1Pod.model_validate({**manifest, "spec": spec})
        return self.plain(self.core.create_namespaced_pod(self.ns, body))

    def create_job(self, name: str, container: Obj, **spec: Any) -> None:
        pod_spec: Obj = {"restartPolicy": "Never", "containers": [{"name": "main", **container}]}
        manifest: Obj = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, **spec.pop("metadata", {})},
            "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}, **spec},
        }
        self.batch.create_namespaced_job(self.ns, k8s_client.V1Job.model_validate(manifest))

    def create_config_map(self, name: str, data: dict[str, str] | None = None) -> Obj:
        body = k8s_client.V1ConfigMap.model_validate({"metadata": {"name": name}, "data": data})
        return self.plain(self.core.create_namespaced_config_map(self.ns, body))

    def pod(self, name: str) -> Obj:
        return self.plain(self.core.read_namespaced_pod_status(name, self.ns))

    def status(self, name: str) -> Obj:
        return cast(Obj, self.pod(name).get("status") or {})

    def container(self, name: str, index: int = 0, init: bool = False) -> Obj:
        key = "initContainerStatuses" if init else "containerStatuses"
        return cast(Obj, self.status(name)[key][index])

    def log(self, pod: str, **params: Any) -> str:
        return str(self.core.read_namespaced_pod_log(pod, self.ns, **params))

    def logged_pid(self, pod: str) -> int | None:
        found = PID.search(self.log(pod))
        return int(found.group(1)) if found else None

    def job_pods(self, job: str) -> list[Obj]:
        listing = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}")
        return cast(list[Obj], self.plain(listing)["items"])

    def job_condition(self, job: str, kind: str) -> Obj | None:
        status = self.plain(self.batch.read_namespaced_job_status(job, self.ns)).get("status", {})
        for cond in status.get("conditions") or []:
            if cond["type"] == kind and cond["status"] == "True":
                return cast(Obj, cond)
        return None

    def job_exists(self, job: str) -> bool:
        try:
            self.batch.read_namespaced_job(job, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def wait_done(self, pod: str, timeout: float = 60) -> str:
        def finished() -> str | None:
            phase = self.status(pod).get("phase")
            return str(phase) if phase in ("Succeeded", "Failed") else None

        return wait_for(finished, f"pod {self.ns}/{pod} to finish", timeout)


@pytest.fixture
def kube(kube_api: k8s_client.ApiClient, kube_namespace: str) -> Kube:
    return Kube(kube_api, kube_namespace)


SLEEP_WITH_PID = {"image": "busybox", "command": ["sh", "-c", "echo pid=$$$$; exec sleep 3600"]}


# --- (1) a Job runs to Complete; log and termination message come back through the API -------
def test_job_completes_with_log_and_termination_message(kube: Kube) -> None:
    script = 'echo "hello from $(POD_NAME)"; printf summary-ok > /dev/termination-log'
    container = {
        "image": "busybox:1.36",
        "command": ["sh", "-c", script],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    }
    kube.create_job("hello", container)
    wait_for(lambda: kube.job_condition("hello", "Complete"), "Job Complete")
    (only,) = kube.job_pods("hello")
    name = only["metadata"]["name"]
    assert only["spec"]["nodeName"] == "thop-node"
    assert kube.log(name) == f"hello from {name}\n"
    terminated = kube.container(name)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert terminated["message"] == "summary-ok"


# --- (2) a failing pod drives the Job to Failed after backoffLimit ----------------------------
def test_failing_pod_fails_job_after_backoff_limit(kube: Kube) -> None:
    container = {
        "image": "debian:12",
        "command": ["sh", "-c", "echo boom >&2; exit 3"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    kube.create_job("fails", container, backoffLimit=1)
    failed = wait_for(lambda: kube.job_condition("fails", "Failed"), "Job Failed", timeout=90)
    assert failed["reason"] == "BackoffLimitExceeded"
    pods = kube.job_pods("fails")
    assert len(pods) == 2  # the first try plus one retry
    for item in pods:
        state = item["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (state["exitCode"], state["reason"], state["message"]) == (3, "Error", "boom\n")


# --- (3) activeDeadlineSeconds: the Job controller fails the Job, the process is killed --------
def test_job_deadline_kills_the_process(kube: Kube) -> None:
    kube.create_job("sleeper", SLEEP_WITH_PID, activeDeadlineSeconds=4)

    def logged_pid() -> int | None:
        pods = kube.job_pods("sleeper")
        return kube.logged_pid(pods[0]["metadata"]["name"]) if pods else None

    pid = wait_for(logged_pid, "the container to log its pid")
    assert pid_alive(pid)
    failed = wait_for(lambda: kube.job_condition("sleeper", "Failed"), "Job Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert wait_until_gone([pid], timeout=30) == []
    wait_for(lambda: not kube.job_pods("sleeper"), "the Job's pod to be deleted")


# --- (4) deleting the owner garbage-collects the Job and its pods -----------------------------
def test_owner_deletion_garbage_collects_job_and_pods(kube: Kube) -> None:
    owner = kube.create_config_map("owner")
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    kube.create_job("owned", SLEEP_WITH_PID, metadata={"ownerReferences": [ref]})

    def running_pid() -> int | None:
        pods = kube.job_pods("owned")
        if not pods or pods[0].get("status", {}).get("phase") != "Running":
            return None
        return kube.logged_pid(pods[0]["metadata"]["name"])

    pid = wait_for(running_pid, "the owned Job's pod to run")
    kube.core.delete_namespaced_config_map("owner", kube.ns)
    wait_for(lambda: not kube.job_exists("owned"), "the garbage collector to delete the Job")
    wait_for(lambda: not kube.job_pods("owned"), "the Job's pods to be deleted")
    assert wait_until_gone([pid], timeout=30) == []


# --- (5) RBAC: refused without a RoleBinding, allowed with one --------------------------------
def test_rbac_refuses_unbound_user_until_a_rolebinding_exists(
    kube_cluster: KubeCluster, kube: Kube
) -> None:
    user_config = kube_cluster.user_kubeconfig("alice", ["thop-testers"])
    user_api = k8s_config.new_client_from_config(config_file=str(user_config))
    try:
        as_alice = k8s_client.CoreV1Api(user_api)
        with pytest.raises(ApiException) as refused:
            as_alice.list_namespaced_config_map(kube.ns)
        assert refused.value.status == 403
        message = json.loads(refused.value.body or "{}")["message"]
        assert 'User "alice" cannot list resource "configmaps"' in message

        # A ConfigMap of the test's own: the namespace's kube-root-ca.crt is written by a
        # controller in its own time, so its absence would not say anything about RBAC.
        kube.create_config_map("for-alice")
        rbac = k8s_client.RbacAuthorizationV1Api(kube.api)
        rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}
        role = {"metadata": {"name": "cm-reader"}, "rules": [rule]}
        rbac.create_namespaced_role(kube.ns, k8s_client.V1Role.model_validate(role))
        group = "rbac.authorization.k8s.io"
        binding = {
            "metadata": {"name": "testers-read"},
            "roleRef": {"apiGroup": group, "kind": "Role", "name": "cm-reader"},
            "subjects": [{"apiGroup": group, "kind": "Group", "name": "thop-testers"}],
        }
        rbac.create_namespaced_role_binding(
            kube.ns, k8s_client.V1RoleBinding.model_validate(binding)
        )
        listed = wait_for(
            lambda: as_alice.list_namespaced_config_map(kube.ns), "RBAC to allow alice", timeout=30
        )
        names = [cm["metadata"]["name"] for cm in kube.plain(listed)["items"]]
        assert "for-alice" in names
        with pytest.raises(ApiException) as still_refused:
            as_alice.list_namespaced_secret(kube.ns)
        assert still_refused.value.status == 403
    finally:
        user_api.close()


# --- (6) an init container runs first and shares an emptyDir with the main container ----------
def test_init_container_runs_first_and_shares_empty_dir(kube: Kube) -> None:
    mount = [{"name": "shared", "mountPath": "/mnt/shared"}]
    init_script = "date +%s%N > /mnt/shared/init-done; echo prepared"
    spec = {
        "restartPolicy": "Never",
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "initContainers": [
            {
                "name": "prepare",
                "image": "busybox",
                "command": ["sh", "-c", init_script],
                "volumeMounts": mount,
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", "test -s /mnt/shared/init-done && echo saw-init-output"],
                "volumeMounts": mount,
            }
        ],
    }
    kube.create_pod("init-demo", spec)
    assert kube.wait_done("init-demo") == "Succeeded"
    init_state = kube.container("init-demo", init=True)["state"]["terminated"]
    main_state = kube.container("init-demo")["state"]["terminated"]
    assert init_state["exitCode"] == 0 and main_state["exitCode"] == 0
    assert init_state["finishedAt"] <= main_state["startedAt"]
    assert kube.log("init-demo", container="prepare") == "prepared\n"
    assert kube.log("init-demo", container="main") == "saw-init-output\n"


# --- (7) kubectl logs works through the apiserver's pods/log proxy ----------------------------
def test_kubectl_logs(kube_cluster: KubeCluster, kube: Kube) -> None:
    script = "for i in 1 2 3 4 5; do echo line-$i; done"
    container = {"name": "c", "image": "python:3.11", "command": ["sh", "-c", script]}
    kube.create_pod("talker", {"restartPolicy": "Never", "containers": [container]})
    kube.wait_done("talker")
    full = kube_cluster.kubectl("logs", "-n", kube.ns, "talker").stdout
    assert full.splitlines() == [f"line-{i}" for i in range(1, 6)]
    tail = kube_cluster.kubectl("logs", "-n", kube.ns, "talker", "--tail=2").stdout
    assert tail.splitlines() == ["line-4", "line-5"]
    assert kube.log("talker", tail_lines=1) == "line-5\n"
    assert kube.log("talker", limit_bytes=6) == "line-1"


def test_kubectl_reports_the_stamped_server_version(kube_cluster: KubeCluster) -> None:
    # The build stamps the real version: Helm charts with kubeVersion constraints depend on it.
    expected = f"v{expected_versions().kubernetes}"
    report = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    assert report["serverVersion"]["gitVersion"] == expected
    assert report["clientVersion"]["gitVersion"] == expected


def test_kubectl_logs_follow_streams_until_the_container_exits(
    kube_cluster: KubeCluster, kube: Kube
) -> None:
    script = "echo first; sleep 2; echo second"
    container = {"name": "c", "image": "busybox", "command": ["sh", "-c", script]}
    kube.create_pod("streamer", {"restartPolicy": "Never", "containers": [container]})
    wait_for(lambda: "first" in kube.log("streamer"), "the first line")
    followed = kube_cluster.kubectl("logs", "-f", "-n", kube.ns, "streamer", timeout=30)
    assert followed.stdout.splitlines() == ["first", "second"]
    assert kube.status("streamer")["phase"] in ("Running", "Succeeded")


# --- more of the process node -------------------------------------------------------------------
def test_pod_active_deadline_fails_pod_and_kills_process(kube: Kube) -> None:
    container = {"name": "c", **SLEEP_WITH_PID}
    spec = {"restartPolicy": "Never", "activeDeadlineSeconds": 2, "containers": [container]}
    kube.create_pod("bounded", spec)
    pid = wait_for(lambda: kube.logged_pid("bounded"), "the pid line")
    assert kube.wait_done("bounded") == "Failed"
    status = kube.status("bounded")
    assert status["reason"] == "DeadlineExceeded"
    assert status["message"] == "Pod was active on the node longer than the specified deadline"
    assert not pid_alive(pid)


def test_deleting_a_running_pod_kills_its_process_group(kube: Kube) -> None:
    # The child keeps running in the background: the whole group must go, not just the shell.
    script = "sleep 3600 & echo pid=$$$$ child=$!; wait"
    container = {"name": "c", "image": "busybox", "command": ["sh", "-c", script]}
    kube.create_pod("victim", {"terminationGracePeriodSeconds": 5, "containers": [container]})

    def pids_line() -> str | None:
        text = kube.log("victim")
        return text if "child=" in text else None

    line = wait_for(pids_line, "pids logged")
    pids = [int(x) for x in re.findall(r"=(\d+)", line)]
    assert all(pid_alive(p) for p in pids)
    kube.core.delete_namespaced_pod("victim", kube.ns)

    def gone() -> bool:
        try:
            kube.pod("victim")
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_for(gone, "the pod object to disappear", timeout=30)
    assert wait_until_gone(pids, timeout=15) == []


def test_environment_user_and_working_dir(kube: Kube) -> None:
    kube.create_config_map("settings", {"mode": "fast"})
    field = {
        "NAME": "metadata.name",
        "NS": "metadata.namespace",
        "UID": "metadata.uid",
        "IP": "status.podIP",
        "NODE": "spec.nodeName",
        "SA": "spec.serviceAccountName",
        "TEAM": "metadata.labels['team']",
        "NOTE": "metadata.annotations['note']",
    }
    env: list[Obj] = [
        {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field.items()
    ]
    env += [
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "GREETING", "value": "hi-$(NAME)"},
    ]
    script = (
        "echo $NAME $NS $UID $IP $NODE $SA $TEAM $NOTE $MODE $GREETING; id -u; id -g; pwd; "
        "ls /var/run/secrets/kubernetes.io/serviceaccount"
    )
    container = {
        "name": "c",
        "image": "alpine:3",
        "command": ["sh", "-c", script],
        "env": env,
        "workingDir": "/tmp",
    }
    spec = {
        "restartPolicy": "Never",
        "securityContext": {"runAsUser": 65534, "runAsGroup": 65534},
        "containers": [container],
    }
    created = kube.create_pod("envy", spec, labels={"team": "blue"}, annotations={"note": "n1"})
    assert kube.wait_done("envy") == "Succeeded"
    lines = kube.log("envy").splitlines()
    uid = created["metadata"]["uid"]
    expected = ["envy", kube.ns, uid, "127.0.0.1", "thop-node", "default", "blue", "n1", "fast"]
    assert lines[0].split() == [*expected, "hi-envy"]
    assert lines[1:4] == ["65534", "65534", "/tmp"]
    assert sorted(lines[4:]) == ["ca.crt", "namespace", "token"]


def test_run_as_non_root_without_user_is_a_config_error(kube: Kube) -> None:
    container = {"name": "c", "image": "busybox", "command": ["true"]}
    spec = {"securityContext": {"runAsNonRoot": True}, "containers": [container]}
    kube.create_pod("rootless", spec)

    def config_error() -> Obj | None:
        statuses = kube.status("rootless").get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting") if statuses else None
        return waiting if waiting and waiting["reason"] == "CreateContainerConfigError" else None

    waiting = wait_for(config_error, "CreateContainerConfigError")
    assert waiting["message"] == "container has runAsNonRoot and image will run as root"


def test_config_map_volume_read_only_and_sub_path(kube: Kube) -> None:
    kube.create_config_map("files", {"a.txt": "alpha", "b.txt": "beta"})
    script = (
        "cat /cfg/a.txt /single/b.txt; echo; "
        "if touch /cfg/new 2>/dev/null; then echo writable; else echo read-only; fi"
    )
    container = {
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "volumeMounts": [
            {"name": "files", "mountPath": "/cfg", "readOnly": True},
            {"name": "files", "mountPath": "/single/b.txt", "subPath": "b.txt"},
        ],
    }
    spec = {
        "restartPolicy": "Never",
        "volumes": [{"name": "files", "configMap": {"name": "files"}}],
        "containers": [container],
    }
    kube.create_pod("cfg", spec)
    assert kube.wait_done("cfg") == "Succeeded"
    assert kube.log("cfg").splitlines() == ["alphabeta", "read-only"]
    assert not Path("/cfg").exists() and not Path("/single").exists()


def test_on_failure_restarts_container_in_place(kube: Kube) -> None:
    script = "n=$(cat /data/n 2>/dev/null || echo 0); echo $((n+1)) > /data/n; test $n -ge 2"
    container = {
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "d", "mountPath": "/data"}],
    }
    spec = {
        "restartPolicy": "OnFailure",
        "volumes": [{"name": "d", "emptyDir": {}}],
        "containers": [container],
    }
    kube.create_pod("flaky", spec)
    assert kube.wait_done("flaky") == "Succeeded"
    status = kube.container("flaky")
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 1


def test_unknown_image_waits_with_image_pull_error(kube: Kube) -> None:
    container = {"name": "c", "image": "registry.invalid/nginx:1.27", "command": ["nginx"]}
    kube.create_pod("nopull", {"containers": [container]})

    def pull_error() -> Obj | None:
        statuses = kube.status("nopull").get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting") if statuses else None
        if waiting and waiting["reason"] in ("ErrImagePull", "ImagePullBackOff"):
            return cast(Obj, waiting)
        return None

    waiting = wait_for(pull_error, "the container to wait on its image")
    assert 'Failed to pull image "registry.invalid/nginx:1.27"' in waiting["message"]
    assert kube.status("nopull")["phase"] == "Pending"


def test_missing_command_is_a_start_error(kube: Kube) -> None:
    container = {"name": "c", "image": "busybox", "command": ["no-such-tool"]}
    kube.create_pod("nocmd", {"restartPolicy": "Never", "containers": [container]})
    assert kube.wait_done("nocmd") == "Failed"
    state = kube.container("nocmd")["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (128, "StartError")
    assert state["message"] == 'exec: "no-such-tool": executable file not found in $PATH'


def test_project_image_runs_the_project_cli(kube: Kube) -> None:
    container = {"name": "c", "image": "ghcr.io/x/taskhandler-operator:dev", "args": ["--version"]}
    kube.create_pod("cli", {"restartPolicy": "Never", "containers": [container]})
    assert kube.wait_done("cli") == "Succeeded"
    assert kube.log("cli").startswith("taskhandler-operator ")


def test_project_image_runs_a_copy_that_pod_volumes_cannot_hide(kube: Kube) -> None:
    # Pods mount volumes over host paths in their own mount namespace: a checkout under /tmp
    # vanished under the probe pods' /tmp emptyDir. The node venv runs a copy of the sources.
    container = {
        "name": "c",
        "image": "ghcr.io/x/taskhandler-operator:dev",
        "args": ["--version"],
        "volumeMounts": [{"name": "over", "mountPath": str(REPO_ROOT)}],
    }
    spec = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "over", "emptyDir": {}}],
    }
    kube.create_pod("hidden-checkout", spec)
    assert kube.wait_done("hidden-checkout") == "Succeeded", kube.log("hidden-checkout")
    assert kube.log("hidden-checkout").startswith("taskhandler-operator ")
    copied = node_venv_bin().parent / "src" / "operator" / "taskhandler_operator" / "cli.py"
    assert copied.read_bytes() == (REPO_ROOT / "operator/taskhandler_operator/cli.py").read_bytes()


@pytest.fixture
def rewrite_node(kube_cluster: KubeCluster) -> Iterator[str]:
    """A second process node forced into path-rewrite mode; runs only pods pinned to it."""
    name = "thop-node-rewrite"
    proc = kube_cluster.start_node(name, mount_mode="rewrite", schedule=False)
    try:
        yield name
    finally:
        proc.stop(grace=10)
        kube_cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def test_rewrite_mode_maps_mount_paths_to_pod_folders(rewrite_node: str, kube: Kube) -> None:
    script = (
        "echo data > /work/area/file; cat /work/area/file; echo $OUT; pwd; "
        'printf done > /dev/termination-log; test "$THOP_POD_ROOT" != ""'
    )
    container = {
        "name": "c",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "env": [{"name": "OUT", "value": "/work/area/out.txt"}],
        "workingDir": "/work/area",
        "volumeMounts": [{"name": "w", "mountPath": "/work/area"}],
    }
    spec = {
        "nodeName": rewrite_node,
        "restartPolicy": "Never",
        "volumes": [{"name": "w", "emptyDir": {}}],
        "containers": [container],
    }
    kube.create_pod("rewritten", spec)
    assert kube.wait_done("rewritten") == "Succeeded"
    lines = kube.log("rewritten").splitlines()
    assert lines[0] == "data"
    assert lines[1].endswith("/volumes/w/out.txt") and not lines[1].startswith("/work/area")
    assert lines[2].endswith("/volumes/w")
    assert not Path("/work/area").exists()
    assert kube.container("rewritten")["state"]["terminated"]["message"] == "done"


# --- bad input to the fixture's start functions ---------------------------------------------
def _fake_bins(tmp_path: Path, version: str, complete: bool = True) -> K8sVersions:
    bin_dir = tmp_path / "bins"
    bin_dir.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm"):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\necho 'Kubernetes {version}'\n")
        exe.chmod(0o755)
    if complete:
        (bin_dir / ".complete").write_text("k8s=x\n")
    env = {"K8S_TEST_BINS": str(bin_dir), "PATH": "/usr/bin:/bin"}
    return expected_versions(env)


def test_missing_binary_cache_fails_fast_naming_make_target(tmp_path: Path) -> None:
    env = {"K8S_TEST_BINS": str(tmp_path / "nothing-here"), "PATH": "/usr/bin:/bin"}
    with pytest.raises(BinaryCacheError) as missing:
        ensure_bins(env)
    message = str(missing.value)
    assert "\n" not in message
    assert "are missing or incomplete (no .complete marker): run `make k8s-bins`" in message


def test_incomplete_binary_cache_is_refused(tmp_path: Path) -> None:
    versions = _fake_bins(tmp_path, "v1.37.2", complete=False)
    with pytest.raises(BinaryCacheError, match=r"no \.complete marker\): run `make k8s-bins`"):
        check_bins(versions)


def test_stale_binary_cache_is_refused(tmp_path: Path) -> None:
    versions = _fake_bins(tmp_path, "v1.30.1")
    with pytest.raises(BinaryCacheError) as stale:
        check_bins(versions)
    want = f"want v{versions.kubernetes}): run `make k8s-bins`"
    assert f"are stale (kube-apiserver reports v1.30.1, {want}" in str(stale.value)


def test_apiserver_that_never_gets_ready_fails_fast_and_leaves_no_process() -> None:
    bins = ensure_bins()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    options = ControlPlaneOptions(etcd_url=f"http://127.0.0.1:{dead_port}", readiness_timeout=6)
    with pytest.raises(ControlPlaneError) as failed:
        start_cluster(bins, options)
    message = str(failed.value)
    assert "kube-apiserver did not become ready (GET /readyz) within 6s" in message
    assert "--- kube-apiserver log tail ---" in message
    assert str(dead_port) in message  # the tail shows the apiserver failing to reach etcd
    assert failed.value.pids
    assert wait_until_gone(failed.value.pids, timeout=15) == []
    assert failed.value.root is not None and (failed.value.root / "kube-apiserver.log").exists()
    shutil.rmtree(failed.value.root)


def test_taken_fixed_port_is_a_clear_error_and_stops_what_started() -> None:
    bins = ensure_bins()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(ControlPlaneError) as failed:
            start_cluster(
                bins,
                ControlPlaneOptions(
                    apiserver_port=taken, controller_manager=False, process_node=False
                ),
            )
    assert f"kube-apiserver cannot start: port {taken} on 127.0.0.1 is already in use" in str(
        failed.value
    )
    assert failed.value.pids  # etcd had started
    assert wait_until_gone(failed.value.pids, timeout=15) == []
    root = failed.value.root
    assert root is not None
    # The logs are kept for the post-mortem; etcd's 128 MB of preallocated WAL is not.
    assert (root / "etcd.log").is_file()
    assert not (root / "etcd-data").exists()
    shutil.rmtree(root)


def test_lost_port_race_is_retried_on_a_new_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from taskhandler_devenv.kubecluster import control_plane

    bins = ensure_bins()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        real_free_port = control_plane.free_port
        handed_out: list[int] = []

        def racy_free_port() -> int:
            # The first "free" port is taken by someone else by the time etcd binds it.
            port = taken if not handed_out else real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(control_plane, "free_port", racy_free_port)
        cluster = start_cluster(
            bins, ControlPlaneOptions(controller_manager=False, process_node=False)
        )
    try:
        assert handed_out[0] == taken
        assert "address already in use" in (cluster.root / "etcd.log").read_text()
        assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    finally:
        pids = cluster.pids
        cluster.stop()
        assert wait_until_gone(pids, timeout=15) == []


_LATE_BINDER = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
sock = socket.socket()
try:
    sock.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    print("listen tcp 127.0.0.1:" + sys.argv[1] + ": bind: address already in use", flush=True)
    sys.exit(1)
sock.listen()
time.sleep(120)
"""


def test_lost_port_race_is_retried_when_the_bind_comes_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded machine can take several seconds to reach the bind (the apiserver builds its API
    groups first); the retry must not depend on the loser dying within a fixed few seconds."""
    from taskhandler_devenv.kubecluster import control_plane

    versions = K8sVersions(kubernetes="0", etcd="0", helm="0", bin_dir=tmp_path)
    cluster = KubeCluster(K8sBins(versions), tmp_path, ControlPlaneOptions(readiness_timeout=30))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(control_plane, "free_port", lambda: next(ports, 0) or free_port())

        def accepts(port: int) -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        try:
            port = cluster._spawn(
                "late",
                lambda port: [sys.executable, "-c", _LATE_BINDER, str(port), "4"],
                None,
                # The holder accepts too: only a port other than the taken one counts as ready.
                lambda port: port != taken and accepts(port),
                "a listening socket",
            )
            assert port != taken
            assert "bind: address already in use" in (tmp_path / "late.log").read_text()
        finally:
            pids = cluster.pids
            cluster.stop(keep_files=True)
    assert wait_until_gone(pids, timeout=15) == []


# --- robustness ---------------------------------------------------------------------------------
_ORPHAN_SCRIPT = """
import json, sys, time
from taskhandler_devenv.kubecluster.bins import ensure_bins
from taskhandler_devenv.kubecluster.control_plane import start_cluster
cluster = start_cluster(ensure_bins())
print(json.dumps({"pids": cluster.pids, "root": str(cluster.root)}), flush=True)
time.sleep(600)
"""


def test_cluster_dies_with_a_killed_test_process(tmp_path: Path) -> None:
    """No teardown runs when the test process is SIGKILLed: the components and the node must
    still go (parent-death signals), so a crashed run leaves nothing behind."""
    runner = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert runner.stdout is not None
        started = json.loads(runner.stdout.readline())
    finally:
        runner.kill()
        runner.wait(timeout=30)
    pids = started["pids"]
    assert len(pids) == 4  # etcd, kube-apiserver, kube-controller-manager, node
    try:
        assert wait_until_gone(pids, timeout=45) == []
    finally:
        shutil.rmtree(started["root"], ignore_errors=True)


def test_node_survives_an_apiserver_restart(kube_cluster: KubeCluster, kube: Kube) -> None:
    across = {"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep 4; echo survived"]}
    kube.create_pod("across", {"restartPolicy": "Never", "containers": [across]})
    wait_for(lambda: kube.status("across").get("phase") == "Running", "pod running")
    kube_cluster.restart_apiserver(down_seconds=2.0)
    # Status written after the apiserver came back; the watch re-listed on its own.
    assert kube.wait_done("across") == "Succeeded"
    assert kube.log("across") == "survived\n"
    after = {"name": "c", "image": "busybox", "command": ["echo", "after"]}
    kube.create_pod("after", {"restartPolicy": "Never", "containers": [after]})
    assert kube.wait_done("after") == "Succeeded"


def test_helm_installs_a_chart(kube_cluster: KubeCluster, kube: Kube, tmp_path: Path) -> None:
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    kube_cluster.helm(
        "install", "demo", str(chart), "-n", kube.ns, "--set", "greeting=hi", "--wait"
    )
    cm = kube.plain(kube.core.read_namespaced_config_map("demo-cm", kube.ns))
    assert cm["data"] == {"greeting": "hi"}
    listed = kube_cluster.helm("list", "-n", kube.ns, "-o", "json").stdout
    assert [r["name"] for r in json.loads(listed)] == ["demo"]
