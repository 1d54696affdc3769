"""The operator's least-privilege RBAC, as data, in one place (the chart renders the same rules).

Two sets of rules:

* :data:`WATCH_RULES`, needed in every namespace whose TaskHandlerBundles the operator serves:
  the bundles (and their status and finalizers), probe Jobs, their pods and logs, events, and
  ``get`` on Secrets. Rendered as a **ClusterRole** + ClusterRoleBinding when the operator
  watches all namespaces, or as a **Role** + RoleBinding in each watched namespace when it
  watches a list (``mode="namespaced"``).
* :data:`LEADER_ELECTION_RULES`: the coordination Lease, always a Role in the operator's own
  namespace.

Choices, and why:

* **Secrets: ``get`` only, never ``list``/``watch``.** A bundle names its Secret
  (``spec.source.*.secretRef``); the operator reads exactly that one, by name, in the bundle's
  namespace, when it syncs. Without ``list``/``watch`` it cannot enumerate Secrets or cache them.
  In cluster-wide mode that ``get`` reaches every namespace: a cluster that wants Secrets
  readable only in some namespaces runs the operator in namespaced mode, where ``get`` exists
  only in the watched namespaces.
* **Bundles: no ``create``/``delete``/``update``.** Users own them; the operator patches
  metadata (finalizer, annotations) and writes ``status``. ``update`` on
  ``taskhandlerbundles/finalizers`` is what the OwnerReferencesPermissionEnforcement admission
  plugin asks of anyone setting ``blockOwnerDeletion`` on a child (the probe Jobs).
* **Jobs: no ``update``/``patch``.** A probe Job is created whole and never changed; it is
  deleted when it is no longer wanted (the garbage collector and ``ttlSecondsAfterFinished`` do
  the rest). Pods are only read: their status and the probe's log are the result.
* **Nothing else**: no ``pods/exec``, no Secrets ``list``, nothing on CRDs, namespaces, RBAC or
  nodes. The controller therefore runs kopf with namespace and resource scanning off (it would
  otherwise list namespaces and watch CRDs).

Probe pods run under :func:`probe_service_account`: no token mounted and no role bound to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from taskhandler_operator.kube import names

__all__ = [
    "LEADER_ELECTION_RULES",
    "WATCH_RULES",
    "Rule",
    "binding",
    "cluster_role",
    "operator_rbac",
    "probe_service_account",
    "role",
    "service_account_subject",
    "user_subject",
]

Manifest = dict[str, Any]
RBAC_API = "rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule, with the reason the operator needs it."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def to_k8s(self) -> Manifest:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


WATCH_RULES: tuple[Rule, ...] = (
    Rule(
        (names.GROUP,),
        (names.PLURAL,),
        ("get", "list", "watch", "patch"),
        "watch the bundles; patch their finalizer and annotations",
    ),
    Rule(
        (names.GROUP,),
        (f"{names.PLURAL}/status",),
        ("get", "patch", "update"),
        "write status",
    ),
    Rule(
        (names.GROUP,),
        (f"{names.PLURAL}/finalizers",),
        ("update",),
        "set blockOwnerDeletion on the probe Jobs a bundle owns",
    ),
    Rule(
        ("batch",),
        ("jobs",),
        ("create", "get", "list", "watch", "delete"),
        "run, adopt and remove probe Jobs",
    ),
    Rule(("",), ("pods",), ("get", "list", "watch"), "read probe pods' termination messages"),
    Rule(("",), ("pods/log",), ("get",), "read the probe's result from its log"),
    Rule(("",), ("events",), ("create", "patch"), "report transitions as Events"),
    Rule(("",), ("secrets",), ("get",), "read the Secret a bundle's source names, by name only"),
)

LEADER_ELECTION_RULES: tuple[Rule, ...] = (
    Rule(
        ("coordination.k8s.io",),
        ("leases",),
        ("get", "create", "update"),
        "hold the leader Lease in the operator's namespace",
    ),
)


def _labels(extra: Mapping[str, str] | None) -> dict[str, str]:
    return {names.LABEL_NAME: names.MANAGER, **(extra or {})}


def cluster_role(
    name: str, rules: Iterable[Rule] = WATCH_RULES, labels: Mapping[str, str] | None = None
) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": _labels(labels)},
        "rules": [r.to_k8s() for r in rules],
    }


def role(
    name: str,
    namespace: str,
    rules: Iterable[Rule] = WATCH_RULES,
    labels: Mapping[str, str] | None = None,
) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(labels)},
        "rules": [r.to_k8s() for r in rules],
    }


def service_account_subject(name: str, namespace: str) -> Manifest:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def user_subject(name: str) -> Manifest:
    return {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}


def binding(
    name: str,
    role_kind: Literal["Role", "ClusterRole"],
    role_name: str,
    subjects: Sequence[Manifest],
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Manifest:
    """A RoleBinding (``namespace`` given) or a ClusterRoleBinding (``namespace`` None)."""
    meta: Manifest = {"name": name, "labels": _labels(labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding" if namespace is not None else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": list(subjects),
    }


def operator_rbac(
    *,
    namespace: str,
    subject: Manifest,
    mode: Literal["cluster", "namespaced"] = "cluster",
    watch_namespaces: Sequence[str] = (),
    name: str = names.MANAGER,
) -> list[Manifest]:
    """Every RBAC object the operator needs.

    ``namespace`` is where it runs (the Lease lives there); ``subject`` is its identity
    (:func:`service_account_subject` in a cluster). ``mode="cluster"`` serves all namespaces;
    ``"namespaced"`` only ``watch_namespaces`` (at least one).
    """
    objects: list[Manifest] = [
        role(f"{name}-leader-election", namespace, LEADER_ELECTION_RULES),
        binding(f"{name}-leader-election", "Role", f"{name}-leader-election", [subject], namespace),
    ]
    if mode == "cluster":
        objects += [cluster_role(name), binding(name, "ClusterRole", name, [subject])]
        return objects
    if not watch_namespaces:
        raise ValueError("namespaced RBAC needs at least one namespace to watch")
    for watched in dict.fromkeys(watch_namespaces):
        objects += [role(name, watched), binding(name, "Role", name, [subject], watched)]
    return objects


def probe_service_account(namespace: str, name: str = "taskhandler-probe") -> Manifest:
    """The identity of probe pods: no token is mounted and no role is ever bound to it."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(None)},
        "automountServiceAccountToken": False,
    }
