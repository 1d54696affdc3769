"""A local git (and file) server over HTTP, and repositories to commit to (development only).

``start_http_server`` runs :mod:`.http_server` (``git http-backend`` under ``/git/``, static
files under ``/files/``) as its own process on a free loopback port; ``make_repo`` creates a
bare repository under the server's git root plus a work tree, and ``GitRepo.commit`` writes,
commits and pushes in one call. The source tests' fixtures (``tests/fixtures/sources.py``)
and the benchmarks are built on these functions (``make demo`` serves its bundles from a git
server pod instead: :mod:`.orders_cluster`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from taskhandler_devenv.kubecluster.procs import ManagedProcess

START_TIMEOUT: Final = 20.0
GIT: Final = "/usr/bin/git"

# Commits in the work trees never read the developer's git configuration.
GIT_IDENTITY: Final = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


class SourceServerError(RuntimeError):
    """A server could not start; the message is one line with the log's tail."""


def wait_for_port(port: int, proc: ManagedProcess, timeout: float = START_TIMEOUT) -> None:
    """Wait until ``proc`` accepts connections on loopback ``port``; stop it if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise SourceServerError(f"{proc.name} exited at start: {proc.tail(5)}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    proc.stop(1)
    raise SourceServerError(f"{proc.name} did not listen on {port} in {timeout}s: {proc.tail(5)}")


class HttpServer:
    """A running :mod:`.http_server`: its folder, process and port."""

    def __init__(self, root: Path, proc: ManagedProcess, port: int) -> None:
        self.root = root
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def file_url(self, rel: str) -> str:
        return f"{self.base}/files/{rel}"

    def put_file(self, rel: str, data: bytes) -> str:
        path = self.root / "files" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.file_url(rel)

    def control(self, rel: str, **options: Any) -> None:
        path = self.root / "control.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[rel] = options
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(data))
        partial.replace(path)

    def requests(self, prefix: str = "") -> list[dict[str, Any]]:
        log = self.root / "requests.log"
        if not log.exists():
            return []
        lines = [json.loads(line) for line in log.read_text().splitlines() if line]
        return [line for line in lines if str(line["path"]).startswith(prefix)]

    def stop(self, grace: float = 2.0) -> None:
        self.proc.stop(grace)


def start_http_server(root: Path, auth: Mapping[str, str] | None) -> HttpServer:
    """Start the server on a free port with its data in ``root``; ``auth`` is
    ``{"user", "password", "token"}`` (written to a 0600 file, never put in argv) or None."""
    root.mkdir(parents=True, exist_ok=True)
    port_file = root / "port"
    argv = [
        sys.executable,
        "-m",
        "taskhandler_devenv.http_server",
        "--root",
        str(root),
        "--port-file",
        str(port_file),
    ]
    if auth:
        auth_file = root / "auth.json"
        auth_file.write_text(json.dumps(dict(auth)))
        auth_file.chmod(0o600)
        argv += ["--auth-file", str(auth_file)]
    proc = ManagedProcess("test-http-server", argv, root / "server.log")
    deadline = time.monotonic() + START_TIMEOUT
    while not port_file.exists():
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop(1)
            raise SourceServerError(f"test HTTP server did not start: {proc.tail(5)}")
        time.sleep(0.02)
    port = int(port_file.read_text())
    wait_for_port(port, proc)
    return HttpServer(root, proc, port)


# -- git repositories --------------------------------------------------------------------------


class GitCommandError(AssertionError):
    """A git command failed. An AssertionError, so a test using a repository fails plainly."""


class SshEndpoint(Protocol):
    """Where an sshd serving the repositories listens (the tests' ``SshServer``)."""

    @property
    def port(self) -> int: ...

    @property
    def user(self) -> str: ...


def run_git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **GIT_IDENTITY}
    proc = subprocess.run(
        [GIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise GitCommandError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


@dataclass
class GitRepo:
    name: str
    bare: Path
    work: Path

    def commit(
        self, files: Mapping[str, bytes | str | None], message: str = "change", branch: str = "main"
    ) -> str:
        """Write (or, for None, delete) files, commit on ``branch``, push; the new commit id."""
        run_git("checkout", "-q", "-B", branch, cwd=self.work)
        for rel, content in files.items():
            path = self.work / rel
            if content is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        run_git("add", "-A", cwd=self.work)
        run_git("commit", "-q", "--allow-empty", "-m", message, cwd=self.work)
        run_git(
            "push", "-q", "--force", str(self.bare), f"{branch}:refs/heads/{branch}", cwd=self.work
        )
        return run_git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str, *, annotated: bool = True, ref: str = "HEAD") -> str:
        if annotated:
            run_git("tag", "-f", "-a", name, "-m", name, ref, cwd=self.work)
        else:
            run_git("tag", "-f", name, ref, cwd=self.work)
        run_git("push", "-q", "--force", str(self.bare), f"refs/tags/{name}", cwd=self.work)
        return run_git("rev-parse", f"{name}^{{commit}}", cwd=self.work)

    def http_url(self, server: HttpServer) -> str:
        return f"{server.base}/git/{self.name}.git"

    def ssh_url(self, server: SshEndpoint) -> str:
        return f"ssh://{server.user}@127.0.0.1:{server.port}{self.bare}"


def make_repo(git_root: Path, name: str, scratch: Path) -> GitRepo:
    """A bare repository ``<git_root>/<name>.git`` (served by the server whose git root it is)
    and a work tree ``<scratch>/<name>-work`` to commit in."""
    bare = git_root / f"{name}.git"
    run_git("init", "-q", "--bare", "-b", "main", str(bare))
    work = scratch / f"{name}-work"
    run_git("init", "-q", "-b", "main", str(work))
    return GitRepo(name, bare, work)
