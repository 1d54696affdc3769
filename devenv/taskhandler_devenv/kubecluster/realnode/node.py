"""A real node: containerd + kubelet (+ kube-scheduler) next to the test control plane.

``RealNode.start`` saves the host state and starts a watchdog before it changes anything, so
``stop`` (or the watchdog, if the test process dies) puts the host back: see hoststate and
teardown. The daemons run as ``ManagedProcess`` (parent-death signal); the control plane waits
for the Node to be Ready.

Pods reach the apiserver as in a cluster: an nftables DNAT sends the Service IP 10.0.0.1:443
to the loopback apiserver, which needs ``route_localnet`` on the pods' bridge (made here, before
the CNI plugin would, so the setting is in place for the first pod).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..certs import CertPair
from ..procs import ManagedProcess, start_ticks
from . import containerd, kubelet
from .check import (
    HOST_LOCK,
    NodeBins,
    acquire_host_lock,
    nft_binary,
    node_bins,
    node_ip,
    real_node_unavailable,
    release_host_lock,
)
from .hoststate import NFT_TABLE, HostState
from .teardown import Record, kill_node_processes, teardown
from .testimages import PAUSE_REF, pause_archive
from .watchdog import RELEASE

log = logging.getLogger(__name__)

SERVICE_IP = "10.0.0.1"


class RealNodeError(RuntimeError):
    """The real node could not start (the message names the component and its log tail)."""


class RealNode:
    """Start with ``start``; ``stop`` always (it is safe after a failed start)."""

    def __init__(self, root: Path, name: str, bins: NodeBins | None = None) -> None:
        self.root = root
        self.name = name
        self.bins = bins or node_bins()
        self.processes: dict[str, ManagedProcess] = {}
        self.socket = root / "containerd" / "containerd.sock"
        self.record_path = root / "realnode-record.json"
        self.containerd_root = root / "containerd" / "root"
        self.node_ip = ""
        self._record: Record | None = None
        self._locked = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: IO[str] | None = None

    # --- public --------------------------------------------------------------------------------
    def import_image(self, archive: Path) -> None:
        """Import an OCI image archive (named by its io.containerd.image.name annotation)."""
        containerd.import_image(self.bins, self.socket, archive)

    def images(self) -> list[str]:
        out = containerd.ctr(self.bins, self.socket, "images", "list", "--quiet")
        return out.split()

    def start(
        self,
        kubeconfig: Path,
        scheduler_kubeconfig: Path,
        serving: CertPair,
        client_ca: Path,
        apiserver_port: int,
        kubelet_port: int,
    ) -> None:
        reason = real_node_unavailable()
        if reason is not None:
            raise RealNodeError(f"real node unavailable: {reason}")
        self._take_lock()
        self.node_ip = node_ip() or ""
        self.root.mkdir(parents=True, exist_ok=True)
        # On disk even when the cluster folder is in /dev/shm: one real image unpacked is
        # hundreds of MB (the operator's: about 800 MB with its content).
        self.containerd_root = Path(
            tempfile.mkdtemp(prefix="thop-containerd-", dir=tempfile.gettempdir())
        )
        self._record = Record(
            root=str(self.root),
            extra_dirs=[str(self.containerd_root)],
            containerd_socket=str(self.socket),
            bridge=kubelet.BRIDGE,
            saved=HostState.capture(),
        )
        self._record.write(self.record_path)
        self._start_watchdog()
        self._start_containerd()
        self.import_image(pause_archive(self.bins["pause"], self.root / "images"))
        self._network(apiserver_port)
        self._start_kubelet(kubeconfig, serving, client_ca, kubelet_port)
        self._spawn("kube-scheduler", kubelet.scheduler_argv(self.bins, scheduler_kubeconfig))

    def stop(self, grace: float = 10.0) -> list[int]:
        """Stop kubelet and scheduler, kill every pod and shim, stop containerd, restore the
        host; returns pids that would not die (empty when all is well)."""
        for name in ("kubelet", "kube-scheduler"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop(grace=grace)
        survivors: list[int] = []
        if self._record is not None:
            # Pods and shims first: containerd must not restart what the kubelet left.
            kill_node_processes(self._record, timeout=5.0)
        proc = self.processes.get("containerd")
        if proc is not None:
            proc.stop(grace=grace)
        if self._record is not None:
            survivors = teardown(self._record)
        self._release_watchdog()
        if self._locked:
            release_host_lock()
            self._locked = False
        return survivors

    def alive(self) -> dict[str, bool]:
        return {name: proc.alive() for name, proc in self.processes.items()}

    # --- start steps ---------------------------------------------------------------------------
    def _take_lock(self) -> None:
        if not acquire_host_lock():
            raise RealNodeError(f"another real node holds {HOST_LOCK}")
        self._locked = True

    def _start_watchdog(self) -> None:
        # Both pipe ends are non-inheritable: the watchdog's stdin is its only other holder, so
        # the pipe closes exactly when this process ends.
        read, write = os.pipe()
        try:
            with open(self.root / "watchdog.log", "ab") as log_file:
                self._watchdog = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "taskhandler_devenv.kubecluster.realnode.watchdog",
                        str(self.record_path),
                    ],
                    stdin=read,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file,
                    # Its own session: a Ctrl-C for the test's process group does not reach it.
                    start_new_session=True,
                )
        finally:
            os.close(read)
        self._watchdog_pipe = os.fdopen(write, "w", buffering=1)

    def _release_watchdog(self) -> None:
        pipe, self._watchdog_pipe = self._watchdog_pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.write(RELEASE + "\n")
                pipe.close()
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(10)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        proc = ManagedProcess(name, argv, self.root / f"{name}.log", env=env, cwd=self.root)
        self.processes[name] = proc
        if self._record is not None:
            self._record.daemon_pids[name] = (proc.pid, start_ticks(proc.pid))
            self._record.write(self.record_path)

    def _wait(self, name: str, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        proc = self.processes[name]
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RealNodeError(f"{name} exited before {what}:\n{proc.tail()}")
            with contextlib.suppress(OSError, RuntimeError, subprocess.SubprocessError):
                if check():
                    return
            time.sleep(0.1)
        raise RealNodeError(f"{name}: no {what} within {timeout:g}s:\n{proc.tail()}")

    def _start_containerd(self) -> None:
        base = self.root / "containerd"
        cni_conf = self.root / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-thop.conflist").write_text(kubelet.cni_conflist(self.root / "cni" / "ipam"))
        config = base / "config.toml"
        base.mkdir(parents=True, exist_ok=True)
        config.write_text(
            containerd.config_text(
                self.containerd_root, base / "state", self.socket, self.bins, PAUSE_REF, cni_conf
            )
        )
        env = dict(os.environ)
        # containerd finds its shim on PATH.
        env["PATH"] = f"{self.bins.dir}:{env.get('PATH', '/usr/bin:/bin')}"
        self._spawn("containerd", containerd.argv(self.bins, config), env)
        self._wait(
            "containerd",
            lambda: bool(containerd.ctr(self.bins, self.socket, "version", timeout=5)),
            "answer on its socket",
        )

    def _network(self, apiserver_port: int) -> None:
        bridge = kubelet.BRIDGE
        for cmd in (
            ["ip", "link", "add", bridge, "type", "bridge"],
            ["ip", "link", "set", bridge, "up"],
        ):
            subprocess.run(cmd, capture_output=True, check=False)
        # DNAT to 127.0.0.1 only routes for packets arriving on an interface allowing it.
        Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1")
        rules = f"""
table ip {NFT_TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority -100; policy accept;
  }}
  chain output {{
    type nat hook output priority -100; policy accept;
  }}
}}
"""
        self._nft(rules)
        self.forward_to_loopback(SERVICE_IP, 443, apiserver_port)

    def forward_to_loopback(self, address: str, port: int, loopback_port: int) -> None:
        """Let pods reach a server that listens on the host's loopback only (PostgreSQL, the
        git and S3 servers of the tests) at ``address:port``: a DNAT like the apiserver's.
        Removed with the node's nftables table at stop."""
        for chain in ("prerouting", "output"):
            self._nft(
                f"add rule ip {NFT_TABLE} {chain} ip daddr {address} tcp dport {port} "
                f"dnat to 127.0.0.1:{loopback_port}\n"
            )

    @staticmethod
    def _nft(script: str) -> None:
        nft = nft_binary() or "nft"
        done = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True)
        if done.returncode != 0:
            raise RealNodeError(f"nft: {done.stderr.strip()}")

    def _start_kubelet(
        self, kubeconfig: Path, serving: CertPair, client_ca: Path, port: int
    ) -> None:
        config = self.root / "kubelet-config.yaml"
        config.write_text(
            kubelet.kubelet_config(self.root, self.node_ip, port, serving, client_ca, self.socket)
        )
        self._spawn(
            "kubelet",
            kubelet.kubelet_argv(self.bins, config, kubeconfig, self.root, self.name, self.node_ip),
        )
