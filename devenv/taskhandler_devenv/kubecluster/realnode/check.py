"""Can a real node (kubelet + containerd + runc) start here? ``real_node_unavailable`` names the
first reason it cannot, or returns None; the control plane falls back to the process node on a
reason (``ControlPlaneOptions.node="auto"``) and the tests that need the real node skip with it.

The binaries come from ``hack/build-node.sh``'s cache; its path comes from ``hack/k8s-env.sh``.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..bins import ENV_SCRIPT

NODE_BINARIES = (
    "kubelet",
    "kube-scheduler",
    "containerd",
    "ctr",
    "containerd-shim-runc-v2",
    "runc",
    "pause",
)
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
# One real node per machine: the kubelet and containerd write fixed host paths (/run/containerd,
# /var/lib/kubelet/device-plugins, the kubepods cgroups).
HOST_LOCK = Path("/run/thop-realnode.lock")
CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")


@dataclass(frozen=True)
class NodeBins:
    dir: Path

    def __getitem__(self, name: str) -> Path:
        if name not in NODE_BINARIES:
            raise KeyError(name)
        return self.dir / name


@functools.cache
def node_bins() -> NodeBins:
    """Where hack/build-node.sh puts the binaries (honours NODE_BINS and THOP_CACHE)."""
    out = subprocess.run(
        ["bash", str(ENV_SCRIPT), "--vars"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return NodeBins(Path(values["NODE_BINS"]))


def nft_binary() -> str | None:
    return shutil.which("nft") or ("/usr/sbin/nft" if os.access("/usr/sbin/nft", os.X_OK) else None)


def node_ip() -> str | None:
    """The first global IPv4 address (eth0 here): the kubelet cannot use loopback as node IP."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout
    except OSError:
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def _cgroup_problem() -> str | None:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").is_file():
        wanted = {"cpu", "memory", "pids"}
        have = set((base / "cgroup.controllers").read_text().split())
        missing = wanted - have
        return f"cgroup v2 lacks the controllers {sorted(missing)}" if missing else None
    missing_v1 = [c for c in CGROUP_V1_CONTROLLERS if not (base / c).is_dir()]
    if missing_v1:
        return f"no cgroup hierarchy for {missing_v1} under {base}"
    if not os.access(base / "memory", os.W_OK):
        return f"{base}/memory is not writable"
    return None


class _HostLock:
    """The machine-wide real-node lock as this process holds it: re-entrant, so a test session
    can hold it from its first host-state capture to its end while nodes start and stop inside
    (flock locks belong to an open file, so a second open in this process would block)."""

    fd: int | None = None
    depth = 0


def acquire_host_lock(wait: float = 0.0) -> bool:
    """Take the lock (waiting up to ``wait`` seconds for another holder); False if it stays
    taken."""
    if _HostLock.depth:
        _HostLock.depth += 1
        return True
    lent = _lent_fd()
    fd = os.dup(lent) if lent is not None else os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(0.5)
            continue
        _HostLock.fd, _HostLock.depth = fd, 1
        return True


# A process holding the lock lends it to a child it waits for (the demo test runs
# hack/demo.py while its session holds the lock): the child inherits the lock's open file, whose
# flock is the parent's, and finds its number here. A second open would block on that flock.
LOCK_FD_ENV = "THOP_REAL_NODE_LOCK_FD"


def _lent_fd() -> int | None:
    value = os.environ.get(LOCK_FD_ENV, "")
    if not value.isdigit():
        return None
    try:
        held, lock = os.fstat(int(value)), HOST_LOCK.stat()
    except OSError:
        return None
    return int(value) if (held.st_dev, held.st_ino) == (lock.st_dev, lock.st_ino) else None


def lend_host_lock() -> tuple[dict[str, str], tuple[int, ...]]:
    """The environment and ``pass_fds`` that lend this process's hold of the lock to a child
    (empty when it holds none). The caller must not use a node of its own meanwhile."""
    if _HostLock.fd is None:
        return {}, ()
    return {LOCK_FD_ENV: str(_HostLock.fd)}, (_HostLock.fd,)


def release_host_lock() -> None:
    if _HostLock.depth == 0:
        return
    _HostLock.depth -= 1
    if _HostLock.depth == 0 and _HostLock.fd is not None:
        os.close(_HostLock.fd)
        _HostLock.fd = None


LOCK_REASON = "another real node runs on this machine"


def _lock_holder() -> str | None:
    """Another process holds the host lock (a concurrent test run)."""
    if _HostLock.depth:
        return None
    if acquire_host_lock():
        release_host_lock()
        return None
    return f"{LOCK_REASON} (it holds {HOST_LOCK})"


def real_node_unavailable() -> str | None:
    """None when a real node can start here, else the first reason it cannot."""
    if os.uname().sysname != "Linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (the kubelet, containerd and runc need root)"
    problem = _cgroup_problem()
    if problem:
        return problem
    try:
        bins = node_bins()
    except (OSError, subprocess.SubprocessError, KeyError) as exc:
        return f"cannot read hack/k8s-env.sh: {exc}"
    if not (bins.dir / ".complete").is_file():
        return f"node binaries not built in {bins.dir}: run `make node-bins`"
    for name in NODE_BINARIES:
        if not os.access(bins[name], os.X_OK):
            return f"node binaries in {bins.dir} lack {name}: run `make node-bins`"
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            return f"CNI plugin {CNI_BIN_DIR / plugin} missing: run `make system-deps`"
    if nft_binary() is None:
        return "nft (nftables) not installed: run `make system-deps`"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay file system (containerd's snapshotter needs it)"
    if node_ip() is None:
        return "no global IPv4 address for the node (the kubelet cannot use loopback)"
    return _lock_holder()
