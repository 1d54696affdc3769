"""Fixtures of the operator's end-to-end tests (helpers in ``tests/e2e/operator_env.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.bins import REPO_ROOT
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.kube import names
from tests.e2e.operator_env import Operator, StartOperator, prepare_namespace, start_operator


@pytest.fixture(scope="module")
def thb_crd(kube_cluster: KubeCluster) -> str:
    kube_cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / names.CRD_FILE))
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{names.CRD_NAME}", "--timeout=60s"
    )
    return names.CRD_NAME


@pytest.fixture
def migrated(pg_url: str) -> str:
    """A fresh database with Airflow's schema and ours, no Dags yet."""
    upgrade(pg_url)
    return pg_url


@pytest.fixture
def namespace(kube_cluster: KubeCluster, kube_namespace: str) -> str:
    """Restricted Pod Security, the probe account, the operator's RBAC and the git Secret."""
    prepare_namespace(kube_cluster, kube_namespace)
    return kube_namespace


@pytest.fixture
def start(kube_cluster: KubeCluster, migrated: str, tmp_path: Path) -> Iterator[StartOperator]:
    """Starts ``taskhandler-operator run`` on the given namespaces; stopped at teardown."""
    started: list[Operator] = []

    def launch(namespaces: Sequence[str]) -> Operator:
        workdir = tmp_path / f"operator-{len(started)}"
        workdir.mkdir()
        op = start_operator(kube_cluster, namespaces, migrated, workdir)
        started.append(op)
        return op

    try:
        yield launch
    finally:
        for op in started:
            op.stop()


@pytest.fixture
def second_namespace(kube_cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """Another prepared namespace (for claims across namespaces); deleted at teardown."""
    name = f"{namespace[:50]}-b"
    kube_cluster.kubectl("create", "namespace", name)
    # Pods are refused until the serviceaccount controller has made the default account.
    kube_cluster.kubectl(
        "wait",
        "--for=jsonpath={.metadata.name}=default",
        "serviceaccount/default",
        "-n",
        name,
        "--timeout=60s",
        check=False,
    )
    try:
        prepare_namespace(kube_cluster, name)
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
