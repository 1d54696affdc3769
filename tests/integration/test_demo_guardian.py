"""devenv/guardian.py on real processes: when its parent is SIGKILLed (no cleanup code runs),
the guardian kills the registered process groups and removes the registered folders; a
released guardian does nothing. PostgreSQL under the guardian: tests/e2e/test_demo_shutdown.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.procs import pid_alive, wait_until_gone

pytestmark = pytest.mark.integration

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from taskhandler_devenv.guardian import Guardian

    folder, release = Path(sys.argv[1]), sys.argv[2] == "release"
    guardian = Guardian()
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    guardian.process_group(server.pid)
    guardian.remove(folder)
    print(server.pid, guardian.proc.pid, flush=True)
    if release:
        guardian.release()
        print("released", flush=True)
    time.sleep(300)
    """
)


def start_parent(folder: Path, mode: str) -> tuple[subprocess.Popen[str], int, int]:
    folder.mkdir()
    (folder / "data").write_text("x")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(folder), mode], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    server, guardian = (int(word) for word in parent.stdout.readline().split())
    if mode == "release":
        assert parent.stdout.readline().strip() == "released"
    return parent, server, guardian


def test_a_killed_parent_leaves_nothing_behind(tmp_path: Path) -> None:
    parent, server, guardian = start_parent(tmp_path / "work", "keep")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    assert wait_until_gone([server, guardian], 20) == []
    deadline = time.monotonic() + 10
    while (tmp_path / "work").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (tmp_path / "work").exists()


def test_a_released_guardian_does_nothing(tmp_path: Path) -> None:
    parent, server, guardian = start_parent(tmp_path / "work", "release")
    try:
        assert wait_until_gone([guardian], 10) == []
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(0.5)
        assert pid_alive(server)
        assert (tmp_path / "work" / "data").exists()
    finally:
        os.killpg(server, signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_folder_held_by_a_mount_is_removed_once_unmounted(tmp_path: Path) -> None:
    # As under a real node's folder when the demo is killed: its watchdog unmounts the pods'
    # file systems while the guardian removes the control plane's folder.
    from taskhandler_devenv.guardian import remove_folders

    folder = tmp_path / "thop-kube-x"
    mount = folder / "realnode" / "pod-volume"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], check=True)
    unmount = threading.Timer(1.5, subprocess.run, (["umount", str(mount)],), {"check": True})
    unmount.start()
    try:
        started = time.monotonic()
        assert remove_folders([str(folder)], patience=30.0) == []
        assert time.monotonic() - started >= 1.0  # it waited for the unmount
        assert not folder.exists()
    finally:
        unmount.join()
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)
    # Patience runs out: the folder is reported, not waited for forever.
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], check=True)
    try:
        assert remove_folders([str(folder)], patience=0.5) == [str(folder)]
    finally:
        subprocess.run(["umount", str(mount)], check=True)
