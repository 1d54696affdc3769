"""The real node leaves the host as it found it: after a stop, and after the process that
started it was SIGKILLed (the watchdog's teardown)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.bins import ensure_bins
from taskhandler_devenv.kubecluster.control_plane import (
    ControlPlaneError,
    ControlPlaneOptions,
    start_cluster,
)
from taskhandler_devenv.kubecluster.procs import pid_alive
from taskhandler_devenv.kubecluster.realnode import check
from taskhandler_devenv.kubecluster.realnode.hoststate import HostState
from taskhandler_devenv.kubecluster.realnode.kubelet import BRIDGE
from taskhandler_devenv.kubecluster.realnode.teardown import pod_pids, shim_pids
from tests.fixtures.realnode import NONROOT_IMAGE, RealNodeWorld

from .conftest import apply, main_status, restricted_pod, wait_pod

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[3]

# Started in a child that the test SIGKILLs once a pod runs: nothing of the node may survive it.
CHILD = """
import json, sys
from pathlib import Path
from taskhandler_devenv.kubecluster.bins import ensure_bins
from taskhandler_devenv.kubecluster.control_plane import ControlPlaneOptions, start_cluster
cluster = start_cluster(ensure_bins(), ControlPlaneOptions(node="real", node_name="thop-orphan"))
cluster.real_node.import_image(Path(sys.argv[1]))
info = {"root": str(cluster.root), "kubeconfig": str(cluster.kubeconfig),
        "containerd_root": str(cluster.real_node.containerd_root),
        "socket": str(cluster.real_node.socket), "kubectl": str(cluster.bins["kubectl"])}
print(json.dumps(info), flush=True)
sys.stdin.read()
"""


def _run_pod(kubectl: list[str], namespace: str) -> None:
    pod = restricted_pod("sleeper", NONROOT_IMAGE, ["sleep", "3600"])
    subprocess.run(
        [*kubectl, "apply", "-n", namespace, "-f", "-"],
        input=json.dumps(pod),
        text=True,
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 90
    while True:
        out = subprocess.run(
            [*kubectl, "get", "pod", "sleeper", "-n", namespace, "-o", "json"],
            text=True,
            capture_output=True,
            check=False,
        ).stdout
        if out and main_status(json.loads(out)).get("state", {}).get("running"):
            return
        assert time.monotonic() < deadline, f"pod never ran: {out}"
        time.sleep(0.5)


def _assert_restored(world: RealNodeWorld, roots: list[str], socket: str, pids: set[int]) -> None:
    after = HostState.capture()
    assert world.before.differences(after, roots, BRIDGE) == []
    assert [r for r in roots if Path(r).exists()] == []
    assert [p for p in pids if pid_alive(p)] == []
    assert shim_pids(socket) == set()
    assert pod_pids() == set()


def test_stop_restores_the_host(real_node_world: RealNodeWorld) -> None:
    cluster = real_node_world.ensure_started()
    node = cluster.real_node
    assert node is not None
    cluster.kubectl("create", "namespace", "hoststate")
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "sa", "default", "-n", "hoststate", check=False).returncode:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    apply(cluster, "hoststate", restricted_pod("sleeper", NONROOT_IMAGE, ["sleep", "3600"]))
    wait_pod(
        cluster,
        "hoststate",
        "sleeper",
        lambda p: bool(main_status(p).get("state", {}).get("running")),
        "Running",
    )
    socket = str(node.socket)
    shims, pods = shim_pids(socket), pod_pids()
    assert shims and pods, "a running pod must show a shim and processes in kubepods"
    daemons = {p.pid for p in node.processes.values()}
    roots = [str(cluster.root), str(node.containerd_root)]
    assert real_node_world.stop() == []
    _assert_restored(real_node_world, roots, socket, shims | pods | daemons)


def test_a_killed_parent_leaves_nothing_behind(real_node_world: RealNodeWorld) -> None:
    real_node_world.stop()  # one real node per machine: the session's must make way
    # The child takes the host lock itself: this session's hold makes way until it is gone.
    check.release_host_lock()
    try:
        _killed_parent(real_node_world)
    finally:
        assert check.acquire_host_lock(wait=120), "the host lock did not come back"


def _killed_parent(real_node_world: RealNodeWorld) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(real_node_world.archives[0])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline() or "{}")
        assert info, "the child did not start its cluster"
        kubectl = [info["kubectl"], "--kubeconfig", info["kubeconfig"]]
        subprocess.run([*kubectl, "create", "namespace", "orphan"], check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while subprocess.run(
            [*kubectl, "get", "sa", "default", "-n", "orphan"], capture_output=True, check=False
        ).returncode:
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.2)
        _run_pod(kubectl, "orphan")
        pids = shim_pids(info["socket"]) | pod_pids()
        assert pids
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    node_root = Path(info["root"]) / "realnode"
    deadline = time.monotonic() + 60
    while node_root.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not node_root.exists(), "the watchdog did not tear the node down"
    try:
        roots = [str(node_root), info["containerd_root"]]
        _assert_restored(real_node_world, roots, info["socket"], pids)
    finally:
        # The control plane's own files (etcd's data) are not the watchdog's job.
        shutil.rmtree(info["root"], ignore_errors=True)


def test_a_failed_start_names_the_daemon_and_restores_the_host(
    real_node_world: RealNodeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_node_world.stop()  # one real node per machine
    real = check.node_bins()
    broken = tmp_path / "bins"
    broken.mkdir()
    for name in check.NODE_BINARIES:
        (broken / name).symlink_to(real[name])
    (broken / ".complete").write_text("broken kubelet\n")
    (broken / "kubelet").unlink()
    (broken / "kubelet").write_text(
        "#!/bin/sh\necho 'kubelet: simulated start failure' >&2\nexit 3\n"
    )
    (broken / "kubelet").chmod(0o755)
    monkeypatch.setenv("NODE_BINS", str(broken))
    check.node_bins.cache_clear()
    try:
        with pytest.raises(ControlPlaneError) as failed:
            start_cluster(ensure_bins(), ControlPlaneOptions(node="real", node_name="thop-broken"))
    finally:
        check.node_bins.cache_clear()
    message = str(failed.value)
    assert "kubelet exited" in message and "simulated start failure" in message
    root = failed.value.root
    assert root is not None
    try:
        _assert_restored(real_node_world, [], "/nonexistent.sock", set())
    finally:
        shutil.rmtree(root, ignore_errors=True)
