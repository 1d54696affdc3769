"""What a real node changes on the host outside its own folder, saved before it starts and put
back after it stops (also from the watchdog when the test process died).

The kubelet rewrites six sysctls (protectKernelDefaults is off), the bridge plugin turns on IP
forwarding; the kubelet, containerd and libcni create fixed folders whatever their root dirs are;
the node adds an nftables table, the kubelet its iptables-nft chains (KUBE-FIREWALL hooked into
INPUT and OUTPUT, canaries), and there are a bridge, network namespaces under /run/netns, mounts
and the ``kubepods`` cgroups. ``HostState`` is JSON so the watchdog can restore it from a file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .check import nft_binary

SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
# Created by the kubelet (device-plugins, pod logs and their /var/log/containers links),
# libcni's cache (results), the shim and runc (/run/containerd/{s,fifo,runc}) and the CNI
# network namespaces, whatever we configure. Not /run/runc: runc's default root, which other
# runc users on the machine (BuildKit) share; our shim always passes its own --root.
HOST_DIRS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    "/run/nri",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
NFT_TABLE = "thop_realnode"


def _sysctl(name: str) -> Path:
    return Path("/proc/sys") / name


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = _sysctl(name).read_text().strip()
    return values


def mountpoints() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            # Field 5 is the mount point, octal-escaped (\040 for a space).
            points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


def nft_ruleset() -> str:
    """The ruleset without counters (``-s``), which change with any traffic."""
    nft = nft_binary()
    if nft is None:
        return ""
    done = subprocess.run(
        [nft, "-s", "list", "ruleset"], capture_output=True, text=True, check=False
    )
    return done.stdout


def _nft_json() -> list[dict[str, Any]]:
    nft = nft_binary()
    if nft is None:
        return []
    done = subprocess.run([nft, "-j", "list", "ruleset"], capture_output=True, text=True)
    with contextlib.suppress(ValueError):
        return list(json.loads(done.stdout).get("nftables", []))
    return []


def nft_objects() -> list[str]:
    """Tables and chains as "family table" and "family table chain"."""
    keys = []
    for item in _nft_json():
        if "table" in item:
            keys.append(f"{item['table']['family']} {item['table']['name']}")
        elif "chain" in item:
            c = item["chain"]
            keys.append(f"{c['family']} {c['table']} {c['name']}")
    return keys


def restore_nft(saved: list[str]) -> None:
    """Remove the tables and chains made since ``saved``, and the rules of older chains that
    jump to them: the node's own table, and the kubelet's iptables-nft chains (KUBE-FIREWALL
    hooked into INPUT and OUTPUT, the KUBE-KUBELET-CANARY chains)."""
    nft = nft_binary()
    if nft is None:
        return
    items = _nft_json()
    old = set(saved)
    new_chains = []
    for item in items:
        if "chain" in item:
            c = item["chain"]
            if f"{c['family']} {c['table']} {c['name']}" not in old:
                new_chains.append((c["family"], c["table"], c["name"]))
    targets = {name for _, _, name in new_chains}
    commands = []
    for item in items:
        rule = item.get("rule")
        if rule is None or f"{rule['family']} {rule['table']} {rule['chain']}" not in old:
            continue
        jumps = {
            verdict["target"]
            for expr in rule["expr"]
            for kind, verdict in expr.items()
            if kind in ("jump", "goto")
        }
        if jumps & targets:
            commands.append(
                f"delete rule {rule['family']} {rule['table']} {rule['chain']} "
                f"handle {rule['handle']}"
            )
    for family, table, name in new_chains:
        if f"{family} {table}" in old:
            commands.append(f"flush chain {family} {table} {name}")
    for family, table, name in new_chains:
        if f"{family} {table}" in old:
            commands.append(f"delete chain {family} {table} {name}")
    for item in items:
        if "table" in item:
            key = f"{item['table']['family']} {item['table']['name']}"
            if key not in old:
                commands.append(f"delete table {key}")
    for command in commands:
        subprocess.run([nft, *command.split()], capture_output=True, check=False)


def links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    return sorted(line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines())


def kubepods_cgroups() -> list[str]:
    return sorted(str(p) for p in CGROUP_ROOT.glob(f"*/{KUBEPODS}") if p.is_dir())


@dataclass
class HostState:
    sysctls: dict[str, str] = field(default_factory=dict)
    existing_dirs: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    nft: str = ""
    nft_objects: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    @classmethod
    def capture(cls) -> HostState:
        return cls(
            sysctls=read_sysctls(),
            existing_dirs=[d for d in HOST_DIRS if os.path.lexists(d)],
            mounts=mountpoints(),
            nft=nft_ruleset(),
            nft_objects=nft_objects(),
            links=links(),
            cgroups=kubepods_cgroups(),
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def differences(self, other: HostState, roots: list[str], bridge: str) -> list[str]:
        """What differs in ``other`` (a later capture), in words. Only what a node touches is
        compared (mounts under ``roots`` and the fixed folders, the bridge and veth links), so
        other work on the machine does not count."""
        diffs = []
        for name, value in self.sysctls.items():
            if other.sysctls.get(name) != value:
                diffs.append(f"sysctl {name}: {value} -> {other.sysctls.get(name)}")
        watched = [*roots, *HOST_DIRS]

        def ours_link(name: str) -> bool:
            return name == bridge or name.startswith("veth")

        for label, before, after in (
            ("dir", self.existing_dirs, other.existing_dirs),
            (
                "mount",
                [m for m in self.mounts if _under(m, watched)],
                [m for m in other.mounts if _under(m, watched)],
            ),
            (
                "link",
                [n for n in self.links if ours_link(n)],
                [n for n in other.links if ours_link(n)],
            ),
            ("cgroup", self.cgroups, other.cgroups),
        ):
            diffs += [f"new {label} {item}" for item in sorted(set(after) - set(before))]
            diffs += [f"lost {label} {item}" for item in sorted(set(before) - set(after))]
        if self.nft != other.nft:
            diffs.append(f"nft ruleset changed:\n{other.nft}")
        return diffs


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def unmount_new(saved: HostState, roots: list[str]) -> None:
    """Lazily unmount every mount made since ``saved`` under ``roots``, deepest first."""
    for _ in range(3):
        new = [m for m in mountpoints() if m not in saved.mounts and _under(m, roots)]
        if not new:
            return
        for point in sorted(set(new), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _rmdir_tree(top: Path) -> None:
    """Remove a cgroup tree: cgroup folders go with rmdir, deepest first (EBUSY while a
    killed process is still exiting, so a few tries)."""
    for _ in range(50):
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        busy = False
        for d in [*dirs, top]:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                busy = busy or exc.errno == errno.EBUSY
        if not top.exists() or not busy:
            return
        time.sleep(0.1)


def restore(saved: HostState, roots: list[str], bridge: str) -> None:
    """Put back what the node changed: mounts, nft table, bridge, cgroups, folders, sysctls.
    Processes must be gone first (``teardown.kill_node_processes``)."""
    unmount_new(saved, [*roots, *HOST_DIRS])
    restore_nft(saved.nft_objects)
    if bridge not in saved.links:
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
    for cgroup in kubepods_cgroups():
        if cgroup not in saved.cgroups:
            _rmdir_tree(Path(cgroup))
    for d in HOST_DIRS:
        if d not in saved.existing_dirs and os.path.lexists(d):
            shutil.rmtree(d, ignore_errors=True)
    for name, value in saved.sysctls.items():
        with contextlib.suppress(OSError):
            if _sysctl(name).read_text().strip() != value:
                _sysctl(name).write_text(value)
