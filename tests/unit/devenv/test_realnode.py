"""Pure logic of the real node (devenv/taskhandler_devenv/kubecluster/realnode): the OCI archive
writer, the configs each of which a real node failed without, the host-state comparison and
the availability check's reasons. The node itself runs in tests/integration/realnode."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Literal

import pytest
import yaml

from taskhandler_devenv.kubecluster import control_plane
from taskhandler_devenv.kubecluster.bins import K8sBins, K8sVersions
from taskhandler_devenv.kubecluster.certs import CertPair
from taskhandler_devenv.kubecluster.control_plane import (
    ControlPlaneError,
    ControlPlaneOptions,
    KubeCluster,
)
from taskhandler_devenv.kubecluster.realnode import check, containerd, kubelet
from taskhandler_devenv.kubecluster.realnode.hoststate import HostState
from taskhandler_devenv.kubecluster.realnode.ociarchive import ImageConfig, write_oci_archive


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        out = {}
        for m in tar.getmembers():
            handle = tar.extractfile(m)
            assert handle is not None
            out[m.name] = handle.read()
        return out


def test_oci_archive_is_a_named_image_layout(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("#!/bin/sh\n")
    ref = "localhost/example:1"
    archive = write_oci_archive(rootfs, ref, tmp_path / "a.tar", ImageConfig(user="65532"))
    blobs = _members(archive)
    index = json.loads(blobs["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == ref
    manifest_bytes = blobs["blobs/sha256/" + entry["digest"].split(":")[1]]
    assert hashlib.sha256(manifest_bytes).hexdigest() == entry["digest"].split(":")[1]
    manifest = json.loads(manifest_bytes)
    config = json.loads(blobs["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["User"] == "65532"
    layer = blobs["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    assert len(layer) == manifest["layers"][0]["size"]
    plain = gzip.decompress(layer)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(plain).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert set(names) == {"bin", "bin/tool"}
    assert {(m.uid, m.gid) for m in names.values()} == {(0, 0)}
    # Same folder, same bytes: content caching can rely on the digests.
    again = write_oci_archive(rootfs, ref, tmp_path / "b.tar", ImageConfig(user="65532"))
    assert again.read_bytes() == archive.read_bytes()


def test_containerd_config_has_the_settings_pods_need(tmp_path: Path) -> None:
    bins = check.NodeBins(tmp_path / "bins")
    text = containerd.config_text(
        tmp_path / "root",
        tmp_path / "state",
        tmp_path / "c.sock",
        bins,
        "localhost/pause:1",
        tmp_path / "net.d",
    )
    config = tomllib.loads(text)
    assert config["version"] == 4
    assert (config["root"], config["state"]) == (str(tmp_path / "root"), str(tmp_path / "state"))
    plugins = config["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == str(tmp_path / "c.sock")
    assert plugins["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"] is True
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/pause:1"
    runc = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["BinaryName"] == str(bins["runc"])


def test_kubelet_config_has_the_settings_this_machine_needs(tmp_path: Path) -> None:
    pair = CertPair(tmp_path / "s.crt", tmp_path / "s.key")
    config = yaml.safe_load(
        kubelet.kubelet_config(tmp_path, "192.0.2.2", 10250, pair, tmp_path / "ca", tmp_path / "s")
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failSwapOn"] is False
    assert config["oomScoreAdj"] == 0
    assert config["address"] == "192.0.2.2"
    assert config["podLogsDir"].startswith(str(tmp_path))
    conflist = json.loads(kubelet.cni_conflist(tmp_path / "ipam"))
    assert conflist["plugins"][0]["isDefaultGateway"] is True


def test_the_process_node_stays_the_default() -> None:
    assert ControlPlaneOptions().node == "process"


def test_host_state_differences_name_what_changed() -> None:
    before = HostState(
        sysctls={"kernel/panic": "0"},
        existing_dirs=["/run/netns"],
        mounts=["/", "/proc"],
        nft="",
        links=["eth0", "lo"],
    )
    after = HostState(
        sysctls={"kernel/panic": "10"},
        existing_dirs=["/run/netns", "/var/lib/kubelet"],
        mounts=["/", "/proc", "/run/netns/cni-1", "/elsewhere"],
        nft="table ip thop_realnode {}",
        links=["eth0", "lo", "thop0", "veth1", "docker0"],
        cgroups=["/sys/fs/cgroup/pids/kubepods"],
    )
    diffs = before.differences(after, [], "thop0")
    assert diffs[0] == "sysctl kernel/panic: 0 -> 10"
    assert "new dir /var/lib/kubelet" in diffs
    assert "new mount /run/netns/cni-1" in diffs
    assert "new link thop0" in diffs and "new link veth1" in diffs
    assert "new cgroup /sys/fs/cgroup/pids/kubepods" in diffs
    assert any(d.startswith("nft ruleset changed") for d in diffs)
    # What other work on the machine did is not the node's.
    assert not any("elsewhere" in d or "docker0" in d for d in diffs)
    assert before.differences(before, [], "thop0") == []


def test_unavailable_names_the_missing_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_BINS", str(tmp_path / "no-bins"))
    check.node_bins.cache_clear()
    try:
        reason = check.real_node_unavailable()
    finally:
        check.node_bins.cache_clear()
    assert reason is not None
    if check.os.geteuid() == 0 and check._cgroup_problem() is None:
        assert reason == f"node binaries not built in {tmp_path / 'no-bins'}: run `make node-bins`"


def _cluster(tmp_path: Path, node: Literal["process", "real", "auto"]) -> KubeCluster:
    bins = K8sBins(K8sVersions("1.37.2", "3.7.3", "3.22.0", tmp_path / "bins"))
    root = tmp_path / node
    root.mkdir()
    return KubeCluster(bins, root, ControlPlaneOptions(node=node))


def test_auto_falls_back_to_the_process_node_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane, "real_node_unavailable", lambda: "not root (reason)")
    auto = _cluster(tmp_path, "auto")
    assert auto._choose_node() == "process"
    assert auto.node_fallback == "not root (reason)"
    with pytest.raises(ControlPlaneError, match=r"real node unavailable: not root \(reason\)"):
        _cluster(tmp_path, "real")._choose_node()
    monkeypatch.setattr(control_plane, "real_node_unavailable", lambda: None)
    process = _cluster(tmp_path, "process")
    process.node_kind = process._choose_node()
    assert process.node_kind == "process"
    assert "node-lifecycle-controller" not in process._controllers()
    (tmp_path / "again").mkdir()
    real = _cluster(tmp_path / "again", "auto")
    real.node_kind = real._choose_node()
    assert real.node_kind == "real" and real.node_fallback is None
    assert "node-lifecycle-controller" in real._controllers()


def _other_process_can_lock(path: Path) -> bool:
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n"
        "    sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", probe, str(path)], check=False).returncode == 0


@pytest.fixture
def own_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock file of the test's own, and this process's hold of it empty: in a whole run the
    session's real-node fixture may hold the machine's lock already (restored after the test)."""
    lock = tmp_path / "realnode.lock"
    monkeypatch.setattr(check, "HOST_LOCK", lock)
    monkeypatch.setattr(check._HostLock, "fd", None)
    monkeypatch.setattr(check._HostLock, "depth", 0)
    return lock


def test_the_host_lock_is_reentrant_within_a_process(own_lock: Path) -> None:
    lock = own_lock
    assert check.acquire_host_lock()
    try:
        assert check._lock_holder() is None  # held by us: no reason to fall back
        assert check.acquire_host_lock()  # a node starting inside a session's hold
        assert not _other_process_can_lock(lock)
        check.release_host_lock()
        assert not _other_process_can_lock(lock)  # the session still holds it
    finally:
        check.release_host_lock()
    assert _other_process_can_lock(lock)


def _child_takes_lock(lock: Path, env: dict[str, str], fds: tuple[int, ...]) -> str:
    """A child process asks check.acquire_host_lock (no wait) and check._lock_holder."""
    probe = (
        "import sys\nfrom pathlib import Path\n"
        "from taskhandler_devenv.kubecluster.realnode import check\n"
        "check.HOST_LOCK = Path(sys.argv[1])\n"
        "print(check._lock_holder() is None, check.acquire_host_lock())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != check.LOCK_FD_ENV} | env
    done = subprocess.run(
        [sys.executable, "-c", probe, str(lock)],
        env=env, pass_fds=fds, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_held_host_lock_is_lent_to_a_child_and_to_no_one_else(own_lock: Path) -> None:
    # The demo test runs hack/demo.py while its session holds the lock: lent, the child takes
    # it at once; not lent, the child finds another holder (and would wait or fall back).
    lock = own_lock
    assert check.lend_host_lock() == ({}, ())  # nothing held, nothing lent
    assert check.acquire_host_lock()
    try:
        env, fds = check.lend_host_lock()
        assert env == {check.LOCK_FD_ENV: str(fds[0])}
        assert _child_takes_lock(lock, env, fds) == "True True"
        assert _child_takes_lock(lock, {}, ()) == "False False"
        # A number that is not the lock's open file lends nothing.
        other = os.open(lock.parent / "other", os.O_RDWR | os.O_CREAT)
        try:
            assert _child_takes_lock(lock, {check.LOCK_FD_ENV: str(other)}, (other,)) == (
                "False False"
            )
        finally:
            os.close(other)
        assert not _other_process_can_lock(lock)  # the child's exit released nothing
    finally:
        check.release_host_lock()
    assert _other_process_can_lock(lock)
