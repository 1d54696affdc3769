"""The in-cluster git server of ``hack/kind/examples/git-server.yaml`` (``make kind-examples``
and ``make demo``), its script run on this host exactly as the manifest's container runs it:
the example bundles pushed with basic auth, then synced by the operator's real git source
(shallow fetch, credentials from the Secret) as the bundles of ``bundles.yaml`` name it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from taskhandler_devenv import orders_cluster
from taskhandler_devenv.git_server import GitCommandError
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.packers import write_typescript_bundle
from taskhandler_operator.cli import main

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-for-the-test"


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[int]:
    (config_map, deployment, _service) = orders_cluster.load("git-server")
    script = tmp_path / "git_server.py"
    script.write_text(config_map["data"]["git_server.py"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port = free_port()
    (moved,) = orders_cluster.on_process_node([deployment], port)
    args = moved["spec"]["template"]["spec"]["containers"][0]["args"]
    root = tmp_path / "srv"
    root.mkdir()
    args = [str(root) if a == "/srv/git" else a for a in args]
    assert container["command"][-1] == "/opt/git-server/git_server.py"
    env = {**os.environ, "GIT_USERNAME": orders_cluster.GIT_USER, "GIT_PASSWORD": PASSWORD}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_bundles_are_pushed_and_synced_by_the_operators_git_source(
    git_server: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{git_server}/{orders_cluster.REPOSITORY}.git"
    artifact = tmp_path / "publish.min.mjs"
    write_typescript_bundle(artifact, code=b"export const publish = 1;\n")
    files = orders_cluster.bundle_files(
        {"orders-go": b"\x7fELF", "orders-java": b"PK", "orders-typescript": artifact.read_bytes()}
    )
    with pytest.raises(GitCommandError, match="failed"):
        orders_cluster.push_bundles(url, "demo", "wrong", files, tmp_path / "refused")
    commit = orders_cluster.push_bundles(url, "demo", PASSWORD, files, tmp_path)

    bundles = orders_cluster.on_process_node(orders_cluster.load("bundles"), git_server)
    typescript = next(b for b in bundles if b["metadata"]["name"] == "orders-typescript")
    spec = tmp_path / "bundle.yaml"
    spec.write_text(yaml.safe_dump(typescript))
    secret = tmp_path / "secret.yaml"
    secret.write_text(yaml.safe_dump(orders_cluster.git_secret(PASSWORD)))
    store = tmp_path / "store"
    argv = ["sync", str(spec), "--store", str(store), "--secret-file", str(secret), "--list"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"main@sha1:{commit}" in out, out
    assert "publish.min.mjs" in out and "1 candidate(s) (typescript)" in out, out

    # Without the Secret's password the server refuses the operator too.
    secret.write_text(yaml.safe_dump(orders_cluster.git_secret("wrong")))
    assert main([*argv[:3], str(tmp_path / "store2"), *argv[4:]]) == 1
    assert "sync: AuthenticationFailed:" in capsys.readouterr().err
