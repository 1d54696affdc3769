"""Pods on the real node reach servers that listen on the host's loopback only (as the tests'
PostgreSQL, git and S3 servers do) through ``RealNode.forward_to_loopback``."""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster

from .conftest import apply, restricted_pod, terminated, wait_pod

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def loopback_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    secret = uuid.uuid4().hex
    (tmp_path / "hello.txt").write_text(secret)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], secret
    finally:
        server.shutdown()
        server.server_close()


def test_a_pod_reaches_a_loopback_server_through_a_forward(
    real_node_cluster: KubeCluster,
    restricted_ns: str,
    real_node_images: dict[str, str],
    loopback_server: tuple[int, str],
) -> None:
    port, secret = loopback_server
    node = real_node_cluster.real_node
    assert node is not None
    node.forward_to_loopback("10.0.0.50", 80, port)
    command = ["/bin/apicheck", "get", "http://10.0.0.50/hello.txt"]
    apply(
        real_node_cluster,
        restricted_ns,
        restricted_pod("fetch", real_node_images["nonroot"], command),
    )
    done = wait_pod(
        real_node_cluster, restricted_ns, "fetch", lambda p: terminated(p) is not None, "terminated"
    )
    out = real_node_cluster.kubectl("logs", "-n", restricted_ns, "fetch").stdout
    assert (terminated(done) or {}).get("exitCode") == 0, out
    assert out.strip() == secret
