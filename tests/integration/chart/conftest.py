"""Rendering the chart with the real helm, and extra namespaces for the namespaced RBAC mode."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.integration.kube.conftest import thb_crd  # noqa: F401 - can-i resolves the CRD
from tests.unit.chart.values_doc import CHART

# Values every render needs: helm template cannot look up kube-system's uid.
BASE = ("--set", "clusterId=test-cluster", "--set", "database.existingSecret=airflow-db")

Render = Callable[..., list[dict[str, Any]]]


def render_text(
    cluster: KubeCluster, namespace: str, *args: str, release: str = "thop", check: bool = True
) -> Any:
    return cluster.helm("template", release, str(CHART), "-n", namespace, *BASE, *args, check=check)


@pytest.fixture
def render(kube_cluster: KubeCluster, kube_namespace: str) -> Render:
    """``render(*helm_args)``: the chart's objects, rendered into the test's namespace."""

    def _render(*args: str, release: str = "thop") -> list[dict[str, Any]]:
        done = render_text(kube_cluster, kube_namespace, *args, release=release)
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    return _render


@pytest.fixture
def extra_namespaces(kube_cluster: KubeCluster) -> Iterator[Callable[[int], list[str]]]:
    made: list[str] = []

    def make(count: int) -> list[str]:
        names = [f"thop-watched-{uuid.uuid4().hex[:8]}" for _ in range(count)]
        for name in names:
            kube_cluster.kubectl("create", "namespace", name)
        made.extend(names)
        return names

    yield make
    for name in made:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
