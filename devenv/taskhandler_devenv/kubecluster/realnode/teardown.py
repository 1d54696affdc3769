"""Stop everything a real node left running and restore the host, from a record file.

Used by ``RealNode.stop`` after its graceful part, and by the watchdog when the test process
died: kill what runs in the ``kubepods`` cgroups (every pod's processes), the containerd shims of
our socket (they daemonize, so no parent-death signal reaches them), our daemons if still
alive, then ``hoststate.restore``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..procs import start_ticks
from .hoststate import CGROUP_ROOT, KUBEPODS, HostState, restore


@dataclass
class Record:
    """What teardown needs, written next to the node's files before anything starts."""

    root: str
    containerd_socket: str
    bridge: str
    saved: HostState
    extra_dirs: list[str] = field(default_factory=list)
    """Folders outside ``root`` the node owns (containerd's content and snapshots)."""
    daemon_pids: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        data = {
            "root": self.root,
            "containerd_socket": self.containerd_socket,
            "bridge": self.bridge,
            "saved": self.saved.to_json(),
            "extra_dirs": self.extra_dirs,
            "daemon_pids": self.daemon_pids,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        return cls(
            root=data["root"],
            containerd_socket=data["containerd_socket"],
            bridge=data["bridge"],
            saved=HostState(**data["saved"]),
            extra_dirs=list(data.get("extra_dirs", [])),
            daemon_pids={k: (v[0], v[1]) for k, v in data["daemon_pids"].items()},
        )


def pod_pids() -> set[int]:
    pids: set[int] = set()
    for top in CGROUP_ROOT.glob(f"*/{KUBEPODS}"):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def shim_pids(socket: str) -> set[int]:
    """The containerd-shim-runc-v2 processes serving our containerd (``-address <socket>``)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket.encode() in argv:
            found.add(int(proc.name))
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_node_processes(record: Record, timeout: float = 10.0) -> list[int]:
    """SIGKILL pods, shims and our daemons until none is left; returns the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        daemons = {pid for pid, ticks in record.daemon_pids.values() if start_ticks(pid) == ticks}
        alive = {p for p in pod_pids() | shim_pids(record.containerd_socket) | daemons}
        alive = {p for p in alive if start_ticks(p) is not None}
        if not alive or time.monotonic() > deadline:
            return sorted(alive)
        _kill(alive)
        time.sleep(0.1)


def teardown(record: Record) -> list[int]:
    """Kill, then restore the host; returns pids that would not die (restore runs anyway)."""
    survivors = kill_node_processes(record)
    restore(record.saved, [record.root, *record.extra_dirs], record.bridge)
    for folder in record.extra_dirs:
        shutil.rmtree(folder, ignore_errors=True)
    return survivors
