"""Run a command in an image's root file system with runc, as a restricted pod would run it.

For the image tests: the archive's layers unpacked into a folder, a generated OCI runtime
config (non-root user, read-only root, no capabilities, no privilege escalation, fresh
namespaces) and BuildKit's own runc (hack/build-buildkit.sh). ``tmp=True`` mounts a tmpfs at
/tmp as the chart's emptyDir does; HOME defaults to ``/`` as containerd sets it for a user the
image's /etc/passwd does not know.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskhandler_devenv.images.oci import Archive

_MASKED = (
    "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)  # fmt: skip
_READONLY = (
    "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
)  # fmt: skip


@dataclass(frozen=True)
class Bind:
    """A host path mounted into the container (a pod's volume, the termination log)."""

    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


def runtime_spec(
    rootfs: Path,
    argv: Sequence[str],
    *,
    env: Sequence[str],
    cwd: str,
    uid: int,
    gid: int,
    tmp: bool,
    binds: Sequence[Bind] = (),
) -> dict[str, Any]:
    """A minimal OCI runtime config as a restricted-PSS pod gets it (no caps, read-only root)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",  # noqa: S108 - inside the container
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
    ]
    if tmp:
        mounts.append(
            {
                "destination": "/tmp",  # noqa: S108 - inside the container: the chart's emptyDir
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", "size=262144k"],
            }
        )
    for bind in binds:
        options = ["rbind", "nosuid", "nodev", "ro" if bind.read_only else "rw"]
        mounts.append(
            {
                "destination": bind.target,
                "type": "bind",
                "source": str(bind.source),
                "options": options,
            }
        )
    no_caps: dict[str, list[str]] = {
        k: [] for k in ("bounding", "effective", "permitted", "inheritable", "ambient")
    }
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(argv),
            "env": list(env),
            "cwd": cwd or "/",
            "capabilities": no_caps,
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "image-test",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": list(_MASKED),
            "readonlyPaths": list(_READONLY),
        },
    }


def image_env(archive: Archive, extra: Mapping[str, str] | None = None) -> list[str]:
    """The image's Env plus HOME=/ (containerd's default for an unknown user) and ``extra``."""
    env = {"HOME": "/"}
    for item in archive.runtime.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    env.update(extra or {})
    return [f"{k}={v}" for k, v in env.items()]


def run(
    runc: Path,
    rootfs: Path,
    work: Path,
    argv: Sequence[str],
    *,
    env: Sequence[str],
    cwd: str = "/",
    uid: int = 65532,
    gid: int = 65532,
    tmp: bool = True,
    binds: Sequence[Bind] = (),
    timeout: float = 60.0,
) -> RunResult:
    """``runc run`` the command in ``rootfs`` (unpacked image) and return what it printed."""
    bundle = work / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir(parents=True)
    spec = runtime_spec(rootfs, argv, env=env, cwd=cwd, uid=uid, gid=gid, tmp=tmp, binds=binds)
    (bundle / "config.json").write_text(json.dumps(spec))
    state = work / "runc-state"
    state.mkdir(exist_ok=True)
    done = subprocess.run(
        [str(runc), "--root", str(state), "run", "--bundle", str(bundle), bundle.name],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return RunResult(done.returncode, done.stdout, done.stderr)
