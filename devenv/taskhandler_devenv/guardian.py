"""A watchdog that cleans up after a parent that died without doing so (development only).

``make demo`` stops what it started itself, in order. When it cannot (SIGKILL, an OOM kill, a
crash in its shutdown), two mechanisms keep its servers from outliving it:

* its direct children die with it by a parent-death signal: ``ManagedProcess`` (etcd, the
  apiserver, the controller manager, the process node, the git/HTTP/S3 servers) runs each under
  ``setpriv --pdeathsig KILL``, and the process node's pod processes get the same from the
  node. The signal fires when the parent *thread* ends, so they are spawned from the main
  thread;
* what a parent-death signal cannot reach is this guardian's: PostgreSQL (``pg_ctl``
  daemonizes the postmaster, whose parent is then init) and the folders in ``/dev/shm`` and
  ``$TMPDIR``. The guardian is a child in its own session (a Ctrl-C for the terminal's
  process group does not reach it) that reads instructions, one JSON object a line, from a pipe
  whose only writer is the parent. End of file without ``release`` means the parent is gone,
  however it ended (the kernel closes a dead process's descriptors): the guardian then stops
  each registered postmaster (SIGQUIT, PostgreSQL's immediate shutdown, then SIGKILL), kills
  each registered process group whose leader is still the registered process, and removes each
  registered folder, the latest registered first, retrying for a while what a mount still
  holds (the real node's watchdog unmounts its pods' file systems meanwhile).

Stdlib only; run as ``python -I guardian.py`` (:class:`Guardian` starts it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from taskhandler_devenv.kubecluster.procs import start_ticks

RELEASE = "release"
POSTMASTER_GRACE = 10.0
REMOVE_PATIENCE = 60.0


class Guardian:
    """The parent's side: start the guardian, register what it must clean up, ``release`` it
    once the parent has cleaned up itself."""

    def __init__(self) -> None:
        read, self._write = os.pipe()  # both ends non-inheritable: no other child holds them
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).resolve())],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)
        self._pipe: IO[str] | None = os.fdopen(self._write, "w", buffering=1)

    def _send(self, item: dict[str, Any] | str) -> None:
        if self._pipe is None:
            return
        self._pipe.write(json.dumps(item) + "\n")
        self._pipe.flush()

    def postmaster(self, data_dir: Path) -> None:
        """Stop the PostgreSQL server of ``data_dir`` (its ``postmaster.pid``)."""
        self._send({"postmaster": str(data_dir)})

    def process_group(self, pid: int) -> None:
        """SIGKILL the process group led by ``pid`` (a ``start_new_session`` child)."""
        self._send({"group": pid, "ticks": start_ticks(pid)})

    def remove(self, path: Path) -> None:
        self._send({"remove": str(path)})

    def release(self, timeout: float = 10.0) -> None:
        """The parent cleaned up: the guardian exits without doing anything."""
        self._close(RELEASE, timeout)

    def abandon(self, timeout: float = 30.0) -> None:
        """The parent's cleanup went wrong: the guardian does its own now, and is waited for."""
        self._close(None, timeout)

    def _close(self, last: str | None, timeout: float) -> None:
        if self._pipe is None:
            return
        pipe, self._pipe = self._pipe, None
        with contextlib.suppress(OSError):
            if last is not None:
                pipe.write(json.dumps(last) + "\n")
            pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)


# -- the guardian's side ---------------------------------------------------------------------


def _stop_postmaster(data_dir: Path) -> None:
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
            return
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + POSTMASTER_GRACE
    while start_ticks(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def clean_up(items: list[dict[str, Any]]) -> None:
    """Postmasters first (their folders go after), then groups, then folders, latest first."""
    for item in reversed(items):
        if "postmaster" in item:
            with contextlib.suppress(Exception):
                _stop_postmaster(Path(item["postmaster"]))
    for item in reversed(items):
        if "group" in item and start_ticks(int(item["group"])) == item.get("ticks"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(item["group"]), signal.SIGKILL)
    remove_folders([item["remove"] for item in reversed(items) if "remove" in item])


def remove_folders(folders: list[str], patience: float = REMOVE_PATIENCE) -> list[str]:
    """Remove each folder, again every half second while one stays (up to ``patience`` s);
    returns those left. A real node's watchdog, woken by the same death, may still be killing
    pods and unmounting their file systems under the control plane's folder: a mount point
    cannot be removed until then (without the retry an empty folder stayed behind)."""
    deadline = time.monotonic() + patience
    while True:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        folders = [folder for folder in folders if os.path.lexists(folder)]
        if not folders or time.monotonic() >= deadline:
            return folders
        time.sleep(0.5)


def main() -> int:
    # Only the pipe's end of file may end the guardian: not the terminal's signals.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    items: list[dict[str, Any]] = []
    for line in sys.stdin:
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if item == RELEASE:
                return 0
            if isinstance(item, dict):
                items.append(item)
    clean_up(items)
    return 0


if __name__ == "__main__":
    sys.exit(main())
