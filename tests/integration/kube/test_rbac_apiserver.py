"""The operator's RBAC rules (kube/rbac.py) bound to a test identity on the real apiserver:
what it needs is allowed, everything else (pods/exec, listing Secrets, CRDs, ...) is refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.waits import wait_for
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.probe_job import (
    BundleIdentity,
    FetchFile,
    ProbeJobRequest,
    ProbeTarget,
    build_probe_job,
)
from taskhandler_operator.kube.rbac import operator_rbac, probe_service_account, user_subject
from tests.unit.kube.examples import bundle_body

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]

THB = "taskhandlerbundles.langsdk.dev"
# (verb, resource, extra kubectl auth can-i arguments)
NEEDED: list[tuple[str, str, tuple[str, ...]]] = [
    *((verb, THB, ()) for verb in ("get", "list", "watch", "patch")),
    ("get", THB, ("--subresource=status",)),
    ("patch", THB, ("--subresource=status",)),
    ("update", THB, ("--subresource=status",)),
    ("update", THB, ("--subresource=finalizers",)),
    *((verb, "jobs.batch", ()) for verb in ("create", "get", "list", "watch", "delete")),
    *((verb, "pods", ()) for verb in ("get", "list", "watch")),
    ("get", "pods", ("--subresource=log",)),
    ("create", "events", ()),
    ("patch", "events", ()),
    ("create", "events.events.k8s.io", ()),
    ("patch", "events.events.k8s.io", ()),
    ("get", "secrets", ()),
]
FORBIDDEN: list[tuple[str, str, tuple[str, ...]]] = [
    ("create", "pods", ("--subresource=exec",)),
    ("create", "pods", ("--subresource=attach",)),
    ("list", "secrets", ()),
    ("watch", "secrets", ()),
    ("create", "secrets", ()),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("update", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("create", "pods", ()),
    ("create", THB, ()),
    ("delete", THB, ()),
    ("update", "jobs.batch", ()),
    ("patch", "jobs.batch", ()),
    ("get", "configmaps", ()),
    ("create", "rolebindings.rbac.authorization.k8s.io", ()),
    ("create", "serviceaccounts", ("--subresource=token",)),
    ("get", "nodes", ()),
]
LEASE = "leases.coordination.k8s.io"


class Operator:
    """kubectl as the operator's identity (a user bound to the rendered rules)."""

    def __init__(self, cluster: KubeCluster, user: str, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.user = user
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        # The fixture passes the admin kubeconfig first; a later --kubeconfig wins.
        return self.cluster.kubectl(
            "--kubeconfig", str(self.kubeconfig), *args, input=input, check=False
        )

    def can(self, verb: str, resource: str, namespace: str, *extra: str) -> bool:
        done = self.kubectl("auth", "can-i", verb, resource, "-n", namespace, *extra)
        assert done.stdout.strip() in ("yes", "no"), done.stderr
        return bool(done.stdout.strip() == "yes")


def apply_all(cluster: KubeCluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def delete_all(cluster: KubeCluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        check=False,
    )


@pytest.fixture
def operator_identity(
    kube_cluster: KubeCluster, kube_namespace: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Operator, list[dict[str, Any]]]]:
    mode: Literal["cluster", "namespaced"] = getattr(request, "param", "cluster")
    user = f"thop-operator-{uuid.uuid4().hex[:8]}"
    objects = operator_rbac(
        namespace=kube_namespace,
        subject=user_subject(user),
        mode=mode,
        watch_namespaces=[kube_namespace] if mode == "namespaced" else (),
        name=user,  # cluster-scoped names must not collide between tests
    )
    apply_all(kube_cluster, objects)
    operator = Operator(kube_cluster, user, kube_cluster.user_kubeconfig(user, ["thop-operators"]))
    # RBAC reaches the authorizer through an informer: wait until the binding is seen.
    wait_for(lambda: operator.can("get", THB, kube_namespace), "the RBAC binding to apply", 30)
    try:
        yield operator, objects
    finally:
        delete_all(kube_cluster, objects)


def test_cluster_mode_allows_exactly_what_the_operator_needs(
    operator_identity: tuple[Operator, list[dict[str, Any]]], kube_namespace: str
) -> None:
    operator, _ = operator_identity
    for namespace in (kube_namespace, "default"):  # cluster-wide: every namespace
        allowed = [(v, r, e) for v, r, e in NEEDED if not operator.can(v, r, namespace, *e)]
        assert allowed == [], f"needed but refused in {namespace}"
        refused = [(v, r, e) for v, r, e in FORBIDDEN if operator.can(v, r, namespace, *e)]
        assert refused == [], f"allowed but not needed in {namespace}"
    for verb in ("get", "create", "update"):
        assert operator.can(verb, LEASE, kube_namespace)
        assert not operator.can(verb, LEASE, "default")  # the Lease lives in its own namespace
    assert not operator.can("delete", LEASE, kube_namespace)


def test_forbidden_actions_are_refused_for_real(
    kube_cluster: KubeCluster,
    operator_identity: tuple[Operator, list[dict[str, Any]]],
    kube_namespace: str,
) -> None:
    operator, _ = operator_identity
    kube_cluster.kubectl(
        "create", "secret", "generic", "git-creds", "-n", kube_namespace, "--from-literal=token=t"
    )
    named = operator.kubectl("get", "secret", "git-creds", "-n", kube_namespace, "-o", "name")
    assert named.returncode == 0 and named.stdout.strip() == "secret/git-creds"
    listing = operator.kubectl("get", "secrets", "-n", kube_namespace)
    assert listing.returncode != 0
    assert f'User "{operator.user}" cannot list resource "secrets"' in listing.stderr
    # A pod that never starts (its image cannot be pulled): kubectl reads it (allowed), then
    # the exec request itself is what RBAC refuses.
    pod = {
        "metadata": {"name": "target"},
        "spec": {"containers": [{"name": "c", "image": "thop-not-pullable:1"}]},
    }
    kube_cluster.kubectl(
        "create",
        "-n",
        kube_namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Pod", **pod}),
    )
    execed = operator.kubectl("exec", "target", "-n", kube_namespace, "--", "true")
    assert execed.returncode != 0
    assert 'cannot create resource "pods/exec"' in execed.stderr
    crd = operator.kubectl("delete", "crd", THB, "--dry-run=server")
    assert crd.returncode != 0
    assert 'cannot delete resource "customresourcedefinitions"' in crd.stderr


def test_the_rules_suffice_for_the_operators_own_writes(
    kube_cluster: KubeCluster,
    operator_identity: tuple[Operator, list[dict[str, Any]]],
    kube_namespace: str,
) -> None:
    operator, _ = operator_identity
    kube_cluster.kubectl(
        "create", "-f", "-", input=json.dumps(probe_service_account(kube_namespace))
    )
    kube_cluster.kubectl("create", "-f", "-", input=json.dumps(bundle_body("etl", kube_namespace)))
    stored = json.loads(
        operator.kubectl("get", "thb", "etl", "-n", kube_namespace, "-o", "json").stdout
    )
    bundle = BundleIdentity.from_body(stored)
    # A finalizer and an annotation (what kopf patches), then status.
    patched = operator.kubectl(
        "patch",
        "thb",
        "etl",
        "-n",
        kube_namespace,
        "--type=merge",
        "-p",
        json.dumps(
            {
                "metadata": {
                    "finalizers": ["langsdk.dev/finalizer"],
                    "annotations": {"langsdk.dev/test": "x"},
                }
            }
        ),
    )
    assert patched.returncode == 0, patched.stderr
    status = operator.kubectl(
        "patch",
        "thb",
        "etl",
        "-n",
        kube_namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"revision": "main@sha1:abc"}}),
    )
    assert status.returncode == 0, status.stderr
    job = build_probe_job(
        ProbeJobRequest(
            bundle=bundle,
            language=Language.GO,
            target=ProbeTarget("etl", 1, None),
            files=[FetchFile("etl", "http://127.0.0.1:1/etl", "d" * 64, 1)],
            operator_image="taskhandler-operator:test",
            runtime_image="taskhandler-operator:test",
        )
    )
    created = operator.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(job))
    assert created.returncode == 0, created.stderr
    deleted = operator.kubectl(
        "delete", "job", job["metadata"]["name"], "-n", kube_namespace, "--wait=false"
    )
    assert deleted.returncode == 0, deleted.stderr
    # Let the bundle go: the test's finalizer would otherwise hold the namespace.
    kube_cluster.kubectl(
        "patch",
        "thb",
        "etl",
        "-n",
        kube_namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )


@pytest.mark.parametrize("operator_identity", ["namespaced"], indirect=True)
def test_namespaced_mode_reaches_only_the_watched_namespaces(
    operator_identity: tuple[Operator, list[dict[str, Any]]], kube_namespace: str
) -> None:
    operator, objects = operator_identity
    assert {o["kind"] for o in objects} == {"Role", "RoleBinding"}
    for verb, resource, extra in NEEDED:
        assert operator.can(verb, resource, kube_namespace, *extra), (verb, resource, extra)
        assert not operator.can(verb, resource, "default", *extra), (verb, resource, extra)
    listing_all = operator.kubectl("get", "thb", "--all-namespaces")
    assert listing_all.returncode != 0
    assert "cannot list resource" in listing_all.stderr
