"""``make demo`` leaves nothing behind however it is stopped (issue 22, item 11).

Each test runs ``hack/demo.py --until 3 --node process`` (the control plane with its process
node, and PostgreSQL with Airflow's schema; then it waits as after its last step) exactly as a
person does, ``python hack/demo.py 2>&1 | tee demo.log``, in a process group of its own, and
stops it once the servers are up:

* Ctrl-C: SIGINT to the whole group, as a terminal sends it, so ``tee`` dies too and every
  later write to stdout fails with EPIPE. The shutdown must finish anyway: exit status 130, no
  process of the demo left, the PostgreSQL and control-plane folders (in ``/dev/shm``) gone;
* SIGKILL of the demo alone: no shutdown runs at all. Its direct children die by their
  parent-death signal, and its guardian (``devenv/guardian.py``) stops PostgreSQL, which
  ``pg_ctl`` daemonized out of reach of that signal, and removes the folders.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.procs import pid_alive, wait_until_gone
from taskhandler_devenv.postgres import default_base_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "hack" / "demo.py"
TOOLCHAINS = ("go", "javac", "java", "node")
READY_LINE = "--until 3: the control plane and PostgreSQL run until Ctrl-C"
START_TIMEOUT = 600.0  # a first run may build the node venv and the runtimes
GONE_TIMEOUT = 60.0

pytestmark = [pytest.mark.kube, pytest.mark.integration, pytest.mark.timeout(900)]


def children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class PipedDemo:
    """``demo.py --until 3 2>&1 | tee LOG`` under bash, the group's leader."""

    shell: subprocess.Popen[bytes]
    log: Path
    status: Path
    tmp: Path
    demo_pid: int = 0

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while READY_LINE not in self.output():
            assert self.shell.poll() is None, f"the demo ended early:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"not up in time:\n{self.output()[-4000:]}"
            time.sleep(0.5)
        pids = [p for p in descendants(self.shell.pid) if "hack/demo.py" in cmdline(p)]
        # The python running demo.py (not the subshell whose command line names it too).
        self.demo_pid = next(p for p in pids if cmdline(p).startswith(sys.executable))

    def servers(self) -> tuple[list[int], list[Path]]:
        """Every process the demo started that still runs, and the folders it made."""
        out = self.output()
        kubeconfig = re.search(r"^kubeconfig: (\S+)$", out, re.M)
        work = re.search(r"^work folder \$DEMO = (\S+)$", out, re.M)
        assert kubeconfig is not None and work is not None, out[-3000:]
        pg_dirs = list(default_base_dir().glob(f"thop-pg-{self.demo_pid}-*"))
        assert len(pg_dirs) == 1, pg_dirs
        postmaster = int((pg_dirs[0] / "data" / "postmaster.pid").read_text().split()[0])
        # pg_ctl daemonized the postmaster: it is not the demo's descendant.
        pids = [*descendants(self.demo_pid), postmaster, *descendants(postmaster)]
        folders = [Path(kubeconfig.group(1)).parent, Path(work.group(1)), pg_dirs[0]]
        for folder in folders:
            assert folder.is_dir(), folder
        return [p for p in pids if pid_alive(p)], folders


@pytest.fixture
def piped_demo(tmp_path: Path) -> Iterator[PipedDemo]:
    missing = [tool for tool in TOOLCHAINS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH; the demo builds runtimes with them")
    log, status = tmp_path / "demo.log", tmp_path / "status"
    # The process node: these test the guardian's path. The real node's own (its watchdog,
    # after a SIGKILL) is tests/integration/realnode/test_host_restored.py.
    demo = f"{shlex.quote(sys.executable)} {shlex.quote(str(DEMO))} --until 3 --node process"
    # The braces' subshell writes the demo's own exit status (tee's is the pipeline's).
    script = (
        f"{{ {demo}; echo $? > {shlex.quote(str(status))}; }} 2>&1 | tee {shlex.quote(str(log))}"
    )
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    run = PipedDemo(shell, log, status, tmp_path)
    try:
        yield run
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(30)


def assert_all_gone(run: PipedDemo, pids: list[int], folders: list[Path]) -> None:
    left = wait_until_gone(pids, GONE_TIMEOUT)
    assert left == [], [f"{pid}: {cmdline(pid)}" for pid in left]
    deadline = time.monotonic() + GONE_TIMEOUT
    while any(folder.exists() for folder in folders) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [folder for folder in folders if folder.exists()] == []
    assert list(run.tmp.glob("thop-demo-*")) == []


def test_ctrl_c_with_tee_stopped_too_still_shuts_everything_down(piped_demo: PipedDemo) -> None:
    piped_demo.wait_ready()
    pids, folders = piped_demo.servers()
    assert len(pids) >= 6, pids  # etcd, apiserver, kcm, node, guardian, postgres and backends
    os.killpg(piped_demo.shell.pid, signal.SIGINT)  # the terminal's Ctrl-C: tee dies too
    piped_demo.shell.wait(180)
    assert piped_demo.status.read_text().strip() == "130", piped_demo.output()[-3000:]
    assert_all_gone(piped_demo, pids, folders)


def test_a_killed_demo_takes_its_servers_with_it(piped_demo: PipedDemo) -> None:
    piped_demo.wait_ready()
    pids, folders = piped_demo.servers()
    os.kill(piped_demo.demo_pid, signal.SIGKILL)  # no shutdown code runs at all
    piped_demo.shell.wait(60)
    assert piped_demo.status.read_text().strip() == "137"
    assert_all_gone(piped_demo, pids, folders)
