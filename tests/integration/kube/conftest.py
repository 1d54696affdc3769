"""The TaskHandlerBundle CRD installed on the session's control plane."""

from __future__ import annotations

import time

import pytest

from taskhandler_devenv.kubecluster.bins import REPO_ROOT
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names


@pytest.fixture(scope="session")
def thb_crd(kube_cluster: KubeCluster) -> str:
    """Apply the committed CRD (server-side, as a user would) and wait until it is Established."""
    kube_cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / names.CRD_FILE))
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{names.CRD_NAME}", "--timeout=60s"
    )
    # Established is not yet served by discovery/OpenAPI: the first `kubectl explain thb` can
    # still answer "doesn't have a resource type". Wait (bounded) until the short name resolves.
    deadline = time.monotonic() + 60
    while kube_cluster.kubectl("explain", "thb", check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail("kubectl explain thb: the CRD was not served within 60s")
        time.sleep(0.5)
    return names.CRD_NAME
