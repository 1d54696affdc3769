"""containerd for the real node: its config (version 4) and the ``ctr`` calls.

Settings each of which a pod sandbox failed without (shared/reference/real-node.md):
``restrict_oom_score_adj`` (the machine's processes lack CAP_SYS_RESOURCE, so runc cannot lower
an oom_score_adj), and the sandbox image pinned to the locally imported pause image (there is
no registry to pull registry.k8s.io/pause from). Root (content, snapshots) lives in a folder on
disk, state in the node's folder; the shims still use /run/containerd/{s,fifo,runc} (hoststate
removes them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .check import CNI_BIN_DIR, NodeBins

NAMESPACE = "k8s.io"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(
    root: Path, state: Path, socket: Path, bins: NodeBins, sandbox_image: str, cni_conf: Path
) -> str:
    """``root`` holds content and snapshots (hundreds of MB per real image: on disk, not in
    the cluster folder's tmpfs); ``state`` the runtime state (small, in the cluster folder)."""
    sections: dict[str, dict[str, object]] = {
        'plugins."io.containerd.server.v1.grpc"': {"address": str(socket)},
        'plugins."io.containerd.server.v1.ttrpc"': {"address": f"{socket}.ttrpc"},
        'plugins."io.containerd.server.v1.debug"': {"address": ""},
        'plugins."io.containerd.cri.v1.images"': {"snapshotter": "overlayfs"},
        'plugins."io.containerd.cri.v1.images".pinned_images': {"sandbox": sandbox_image},
        'plugins."io.containerd.cri.v1.runtime"': {
            "restrict_oom_score_adj": True,
            "enable_selinux": False,
        },
        'plugins."io.containerd.cri.v1.runtime".containerd': {"default_runtime_name": "runc"},
        'plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc': {
            "runtime_type": "io.containerd.runc.v2",
        },
        'plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options': {
            "BinaryName": str(bins["runc"]),
            "SystemdCgroup": False,
        },
        'plugins."io.containerd.cri.v1.runtime".cni': {
            "bin_dirs": [str(CNI_BIN_DIR)],
            "conf_dir": str(cni_conf),
            "max_conf_num": 1,
        },
    }
    lines = [
        "version = 4",
        f"root = {_toml(str(root))}",
        f"state = {_toml(str(state))}",
        # The host's /etc/containerd must not change the test node.
        "imports = []",
        # btrfs/zfs/devmapper/tracing would only log errors on this machine; opt, NRI and the
        # image verifier would create /opt/containerd and /run/nri and are not needed.
        "disabled_plugins = "
        + _toml(
            [
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.blockfile",
                "io.containerd.snapshotter.v1.erofs",
                "io.containerd.tracing.processor.v1.otlp",
                "io.containerd.internal.v1.tracing",
                "io.containerd.internal.v1.opt",
                "io.containerd.nri.v1.nri",
                "io.containerd.image-verifier.v1.bindir",
            ]
        ),
    ]
    for name, values in sections.items():
        lines.append(f"\n[{name}]")
        lines += [f"  {key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def argv(bins: NodeBins, config: Path) -> list[str]:
    return [str(bins["containerd"]), "--config", str(config), "--log-level", "warn"]


def ctr(bins: NodeBins, socket: Path, *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(bins["ctr"]), "--address", str(socket), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def import_image(bins: NodeBins, socket: Path, archive: Path) -> None:
    """Import an OCI archive into the CRI namespace (named by its io.containerd.image.name)."""
    ctr(bins, socket, "images", "import", "--local", str(archive))
