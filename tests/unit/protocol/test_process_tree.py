"""Ownership and cleanup against real processes and real loopback sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from taskhandler_operator.protocol.process_tree import (
    ChildSubreaper,
    ProcessTracker,
    canonical_host,
    find_connection_owner,
    get_child_subreaper,
)

# A child that connects to the port given as argv[1] (optionally from a grandchild that has
# left the session), prints the connecting pid, then sleeps.
CONNECTOR = """
import os, socket, sys, time
port, via_grandchild = int(sys.argv[1]), sys.argv[2] == "1"
if via_grandchild and os.fork() != 0:
    time.sleep(60)
    sys.exit(0)
if via_grandchild:
    os.setsid()
s = socket.create_connection(("127.0.0.1", port))
print(os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("::", "::"),
        ("fe80::1%eth0", "fe80::1"),
        ("not-an-ip", "not-an-ip"),
    ],
)
def test_canonical_host(host: str, expected: str) -> None:
    assert canonical_host(host) == expected


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(10)
    yield server
    server.close()


def start_connector(port: int, *, via_grandchild: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CONNECTOR, str(port), "1" if via_grandchild else "0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_tree(proc: subprocess.Popen[str]) -> None:
    tracker = ProcessTracker(proc.pid)
    tracker.kill_all()
    proc.wait(10)


@pytest.mark.parametrize("via_grandchild", [False, True])
def test_owner_is_found_in_the_tree(listener: socket.socket, via_grandchild: bool) -> None:
    proc = start_connector(listener.getsockname()[1], via_grandchild=via_grandchild)
    try:
        conn, peer = listener.accept()
        assert proc.stdout is not None
        connecting_pid = int(proc.stdout.readline())
        owner = find_connection_owner(proc.pid, peer, conn.getsockname())
        assert owner == connecting_pid
        assert (owner != proc.pid) is via_grandchild
        conn.close()
    finally:
        kill_tree(proc)


def test_connection_from_outside_the_tree_has_no_owner(listener: socket.socket) -> None:
    stranger = start_connector(listener.getsockname()[1], via_grandchild=False)
    runtime = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        conn, peer = listener.accept()
        assert stranger.stdout is not None
        stranger.stdout.readline()
        assert find_connection_owner(runtime.pid, peer, conn.getsockname()) is None
        assert find_connection_owner(stranger.pid, peer, conn.getsockname()) == stranger.pid
        conn.close()
    finally:
        runtime.kill()
        runtime.wait(10)
        kill_tree(stranger)


def test_own_connection_over_a_dual_stack_socket() -> None:
    server = socket.socket(socket.AF_INET6)
    server.bind(("::", 0))
    server.listen()
    client = socket.socket(socket.AF_INET6)
    try:
        client.connect(("::ffff:127.0.0.1", server.getsockname()[1]))
        conn, peer = server.accept()
        assert peer[0] == "::ffff:127.0.0.1"
        assert find_connection_owner(os.getpid(), peer[:2], conn.getsockname()[:2]) == os.getpid()
        conn.close()
    finally:
        client.close()
        server.close()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def test_tracker_finds_and_kills_a_child_that_left_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "escaped"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    tracker = ProcessTracker(proc.pid)
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child was not started"
        time.sleep(0.02)
    escaped = int(pid_file.read_text())
    tracker.snapshot()  # seen while its parent still lives
    proc.kill()  # the parent dies: the escaped child is re-parented and out of the group
    proc.wait(10)
    assert os.getsid(escaped) != proc.pid
    assert tracker.survivors() == [escaped]
    report = tracker.kill_all()
    assert escaped in report.signalled
    assert report.unkillable == []
    assert wait_gone([escaped]) == []
    assert tracker.survivors() == []


def test_tracker_finds_group_members_it_never_saw() -> None:
    # The grandchild is started and the parent exits between snapshots: only the session
    # sweep can find it.
    code = "import subprocess; subprocess.Popen(['sleep', '300'])"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    tracker = ProcessTracker(proc.pid)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while not (left := tracker.survivors()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert all(os.getsid(pid) == proc.pid for pid in left)
    tracker.kill_all()
    assert wait_gone(left) == []


# A double fork out of the session: the child starts a grandchild in a session of its own that
# ignores SIGTERM, prints its pid and exits at once, so no snapshot of the tree ever sees it.
DOUBLE_FORK = "setsid sh -c 'trap \"\" TERM; echo $$; exec sleep 300 </dev/null >/dev/null 2>&1' &"


def test_subreaper_flag_is_set_and_restored() -> None:
    before = get_child_subreaper()
    if before is None:
        pytest.skip("prctl(PR_GET_CHILD_SUBREAPER) is not available")
    with ChildSubreaper() as reaper:
        assert reaper.active
        assert get_child_subreaper() is True
    assert get_child_subreaper() is before


def test_a_double_forked_grandchild_is_adopted_found_killed_and_reaped() -> None:
    if get_child_subreaper() is None:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")
    with ChildSubreaper():
        baseline = ProcessTracker.baseline_of(os.getpid())
        proc = subprocess.Popen(
            ["sh", "-c", DOUBLE_FORK], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        tracker = ProcessTracker(proc.pid, adopter=os.getpid(), baseline=baseline)
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        proc.wait(10)
        # It left the session and the group, and its parent is gone: only adoption finds it.
        assert os.getsid(grandchild) == grandchild
        assert psutil.Process(grandchild).ppid() == os.getpid()
        assert tracker.survivors() == [grandchild]
        report = tracker.kill_all()
        assert grandchild in report.signalled
        assert report.unkillable == []
        # Reaped by the tracker, not left as a zombie of this process.
        assert not psutil.pid_exists(grandchild) or gone(grandchild)
        with pytest.raises(ChildProcessError):
            os.waitpid(grandchild, os.WNOHANG)


def test_without_adoption_the_double_forked_grandchild_is_missed() -> None:
    # What the driver saw before it became a subreaper: the escape goes unnoticed. The tracker
    # first looks once the shell is gone; a look while the grandchild was still the shell's
    # child would have seen it, and a member once seen is followed (a race under load).
    proc = subprocess.Popen(
        ["sh", "-c", DOUBLE_FORK], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    proc.wait(10)
    tracker = ProcessTracker(proc.pid)
    try:
        assert tracker.survivors() == []
    finally:
        os.kill(grandchild, 9)


def test_children_started_before_the_runtime_are_not_adopted() -> None:
    with ChildSubreaper():
        unrelated = subprocess.Popen(["sleep", "60"])
        try:
            baseline = ProcessTracker.baseline_of(os.getpid())
            runtime = subprocess.Popen(["sleep", "60"], start_new_session=True)
            tracker = ProcessTracker(runtime.pid, adopter=os.getpid(), baseline=baseline)
            report = tracker.kill_all()
            runtime.wait(10)
            assert unrelated.poll() is None
            assert unrelated.pid not in report.signalled
        finally:
            unrelated.kill()
            unrelated.wait(10)


class _Unkillable:
    """A process SIGKILL cannot end (uninterruptible sleep, another user's setuid program)."""

    pid = 999_999

    def is_running(self) -> bool:
        return True

    def status(self) -> str:
        return psutil.STATUS_DISK_SLEEP

    def kill(self) -> None:
        raise psutil.AccessDenied(self.pid)


def test_a_process_that_survives_sigkill_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = subprocess.Popen(["sleep", "60"], start_new_session=True)
    tracker = ProcessTracker(runtime.pid)
    stuck = _Unkillable()
    real_members = tracker._members
    monkeypatch.setattr(tracker, "_members", lambda: [*real_members(), stuck])
    report = tracker.kill_all(timeout=0.2)
    runtime.wait(10)
    assert report.unkillable == [stuck.pid]
    assert stuck.pid in report.signalled
