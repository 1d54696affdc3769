"""The operator's RBAC rules as data, and the objects rendered from them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import taskhandler_operator.kube as kube_package
from taskhandler_operator.kube.rbac import (
    LEADER_ELECTION_RULES,
    WATCH_RULES,
    operator_rbac,
    probe_service_account,
    service_account_subject,
)

SUBJECT = service_account_subject("taskhandler-operator", "thop-system")


def grants(resource: str) -> set[str]:
    return {
        verb
        for rule in (*WATCH_RULES, *LEADER_ELECTION_RULES)
        if resource in rule.resources
        for verb in rule.verbs
    }


def test_secrets_are_readable_by_name_only() -> None:
    assert grants("secrets") == {"get"}


def test_nothing_dangerous_is_granted() -> None:
    resources = {r for rule in (*WATCH_RULES, *LEADER_ELECTION_RULES) for r in rule.resources}
    assert not resources & {
        "pods/exec",
        "pods/attach",
        "pods/portforward",
        "customresourcedefinitions",
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
        "nodes",
        "configmaps",
        "serviceaccounts",
        "serviceaccounts/token",
        "*",
    }
    assert all("*" not in rule.verbs and "*" not in rule.api_groups for rule in WATCH_RULES)
    assert "escalate" not in {v for rule in WATCH_RULES for v in rule.verbs}
    assert grants("pods") == {"get", "list", "watch"}
    assert grants("jobs") == {"create", "get", "list", "watch", "delete"}
    assert grants("taskhandlerbundles") == {"get", "list", "watch", "patch"}


def test_every_rule_says_why() -> None:
    assert all(rule.why for rule in (*WATCH_RULES, *LEADER_ELECTION_RULES))


def test_cluster_mode_renders_a_cluster_role_and_a_leader_role() -> None:
    objects = operator_rbac(namespace="thop-system", subject=SUBJECT)
    kinds = [(o["kind"], o["metadata"].get("namespace")) for o in objects]
    assert kinds == [
        ("Role", "thop-system"),
        ("RoleBinding", "thop-system"),
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
    ]
    cluster_role = objects[2]
    assert cluster_role["rules"] == [r.to_k8s() for r in WATCH_RULES]
    assert objects[3]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "taskhandler-operator",
    }
    assert objects[3]["subjects"] == [SUBJECT]
    assert objects[0]["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]


def test_namespaced_mode_renders_one_role_per_watched_namespace() -> None:
    objects = operator_rbac(
        namespace="thop-system",
        subject=SUBJECT,
        mode="namespaced",
        watch_namespaces=["team-a", "team-b", "team-a"],
    )
    roles = [(o["kind"], o["metadata"].get("namespace")) for o in objects[2:]]
    assert roles == [
        ("Role", "team-a"),
        ("RoleBinding", "team-a"),
        ("Role", "team-b"),
        ("RoleBinding", "team-b"),
    ]
    assert all(o["kind"] not in ("ClusterRole", "ClusterRoleBinding") for o in objects)


def test_namespaced_mode_without_namespaces_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one namespace"):
        operator_rbac(namespace="x", subject=SUBJECT, mode="namespaced")


def test_probe_service_account_mounts_no_token() -> None:
    account = probe_service_account("team-a")
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"] == {
        "name": "taskhandler-probe",
        "namespace": "team-a",
        "labels": {"app.kubernetes.io/name": "taskhandler-operator"},
    }


def test_kube_package_never_imports_kopf() -> None:
    # kube/ is pure: the controller is the one place kopf is imported (DESIGN §3.3).
    package = Path(kube_package.__file__).parent
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] not in {"kopf", "kubernetes"}, (source.name, module)
