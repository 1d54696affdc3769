"""The chart's RBAC and ServiceAccounts applied to the real apiserver, asked with
``kubectl auth can-i --as=system:serviceaccount:...``: in both modes the operator's account can
do what the operator does and nothing more (no Secret listing, no exec, no other namespace in
namespaced mode); the probe account can do nothing at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.waits import wait_for
from tests.integration.chart.conftest import Render
from tests.integration.kube.test_rbac_apiserver import FORBIDDEN, LEASE, NEEDED, THB

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]

RBAC_TEMPLATES = ("templates/rbac.yaml", "templates/serviceaccount.yaml", "templates/probe.yaml")
OPERATOR_SA = "thop-taskhandler-operator"


class Identity:
    def __init__(self, cluster: KubeCluster, namespace: str, account: str) -> None:
        self.cluster = cluster
        self.who = f"system:serviceaccount:{namespace}:{account}"

    def can(self, verb: str, resource: str, namespace: str, *extra: str) -> bool:
        done = self.cluster.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            "-n",
            namespace,
            f"--as={self.who}",
            *extra,
            check=False,
        )
        answer = done.stdout.strip()
        assert answer in ("yes", "no"), done.stderr
        return answer == "yes"


@pytest.fixture
def install_rbac(kube_cluster: KubeCluster, render: Render) -> Iterator[Any]:
    applied: list[dict[str, Any]] = []

    def install(*args: str) -> list[dict[str, Any]]:
        shown = [a for t in RBAC_TEMPLATES for a in ("--show-only", t)]
        # A release name per test: ClusterRoles are cluster-wide.
        objects = render(*shown, *args)
        kube_cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )
        applied.extend(objects)
        return objects

    yield install
    kube_cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": applied}),
        check=False,
    )


def denied(identity: Identity, namespace: str) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(v, r, e) for v, r, e in FORBIDDEN if identity.can(v, r, namespace, *e)]


def refused(identity: Identity, namespace: str) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(v, r, e) for v, r, e in NEEDED if not identity.can(v, r, namespace, *e)]


def test_cluster_mode(
    kube_cluster: KubeCluster, kube_namespace: str, install_rbac: Any, extra_namespaces: Any
) -> None:
    install_rbac("--set", "watch.mode=cluster")
    operator = Identity(kube_cluster, kube_namespace, OPERATOR_SA)
    wait_for(
        lambda: operator.can("get", THB, kube_namespace), "the ClusterRoleBinding to apply", 30
    )
    (other,) = extra_namespaces(1)
    for namespace in (kube_namespace, other):
        assert refused(operator, namespace) == [], f"needed but refused in {namespace}"
        assert denied(operator, namespace) == [], f"allowed but not needed in {namespace}"
    for verb in ("get", "create", "update"):
        assert operator.can(verb, LEASE, kube_namespace)
        assert not operator.can(verb, LEASE, other)
    probe = Identity(kube_cluster, kube_namespace, "taskhandler-probe")
    assert_can_do_nothing(probe, kube_namespace)


def test_namespaced_mode(
    kube_cluster: KubeCluster, kube_namespace: str, install_rbac: Any, extra_namespaces: Any
) -> None:
    watched, unwatched = extra_namespaces(2)
    install_rbac("--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}")
    operator = Identity(kube_cluster, kube_namespace, OPERATOR_SA)
    wait_for(lambda: operator.can("get", THB, watched), "the RoleBinding to apply", 30)
    assert refused(operator, watched) == []
    assert denied(operator, watched) == []
    for namespace in (unwatched, kube_namespace):  # not even its own: bundles live in `watched`
        allowed = [(v, r, e) for v, r, e in NEEDED if operator.can(v, r, namespace, *e)]
        assert allowed == [], f"allowed in the unwatched namespace {namespace}"
    assert not operator.can("list", THB, "", "--all-namespaces")
    assert operator.can("update", LEASE, kube_namespace)
    probe = Identity(kube_cluster, watched, "taskhandler-probe")
    assert_can_do_nothing(probe, watched)


def assert_can_do_nothing(probe: Identity, namespace: str) -> None:
    checks = [
        *NEEDED,
        *FORBIDDEN,
        ("get", LEASE, ()),
        ("list", "pods", ()),
        ("get", "configmaps", ()),
    ]
    allowed = [(v, r, e) for v, r, e in checks if probe.can(v, r, namespace, *e)]
    assert allowed == [], f"the probe account may {allowed}"
