"""The chart's RBAC, systematically: every verb on every resource the apiserver serves
(subresources included, from discovery), in the watched namespace, another namespace, the
operator's own namespace and cluster-wide, asked for the operator's service account.

``kube/rbac.py``'s rules are the one source of truth: what they grant must be allowed, and
everything else must be refused — beyond what any service account of the namespace already
gets from the cluster's defaults (discovery, self reviews), measured on an account with no
binding and shown to be only that. The probe account gets exactly that baseline: nothing.

The full matrix goes through SubjectAccessReview (what ``kubectl auth can-i`` sends), then
``kubectl auth can-i --as=...`` itself answers for every verb on every resource the operator
touches, and must agree with both the matrix and the rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.waits import wait_for
from taskhandler_operator.kube.rbac import LEADER_ELECTION_RULES, WATCH_RULES, Rule
from tests.integration.chart.test_rbac_install import (  # noqa: F401 - the fixture
    OPERATOR_SA,
    Identity,
    install_rbac,
)

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]

STANDARD_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Verbs RBAC knows beyond the resource's own, on the resources they apply to.
SPECIAL_VERBS = {
    ("rbac.authorization.k8s.io", "roles"): ("bind", "escalate"),
    ("rbac.authorization.k8s.io", "clusterroles"): ("bind", "escalate"),
    ("", "serviceaccounts"): ("impersonate",),
    ("", "users"): ("impersonate",),
    ("", "groups"): ("impersonate",),
    ("certificates.k8s.io", "signers"): ("approve", "sign"),
}
# What every authenticated identity may do by the cluster's default bindings (system:basic-user,
# system:cluster-trust-bundle-discovery): the self reviews and reading public CA bundles.
DEFAULT_BASELINE = {
    ("certificates.k8s.io", "clustertrustbundles"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
}


# A resource row of `kubectl auth can-i --list`: resource, [urls], [resource names], [verbs].
LIST_ROW = re.compile(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")


@dataclass(frozen=True)
class Ask:
    verb: str
    group: str
    resource: str  # "pods" or "pods/exec"
    namespace: str  # "" for cluster-wide (or a cluster-scoped resource)


@dataclass(frozen=True)
class Resource:
    group: str
    name: str
    namespaced: bool
    verbs: tuple[str, ...]


def discovered(cluster: KubeCluster) -> list[Resource]:
    """Every resource and subresource the apiserver serves (preferred versions)."""

    def get(path: str) -> Any:
        return json.loads(cluster.kubectl("get", "--raw", path).stdout)

    versions = [("", "v1")]
    for group in get("/apis")["groups"]:
        versions.append((group["name"], group["preferredVersion"]["version"]))
    found = []
    for group, version in versions:
        path = "/api/v1" if group == "" else f"/apis/{group}/{version}"
        for res in get(path)["resources"]:
            # The verbs the endpoint serves (every one for a subresource that lists none).
            verbs = set(res.get("verbs") or STANDARD_VERBS)
            verbs |= set(SPECIAL_VERBS.get((group, res["name"]), ()))
            found.append(Resource(group, res["name"], res["namespaced"], tuple(sorted(verbs))))
    # RBAC-only subresource the operator is granted (no endpoint serves it).
    found.append(Resource("langsdk.dev", "taskhandlerbundles/finalizers", True, STANDARD_VERBS))
    for (group, name), special in SPECIAL_VERBS.items():  # virtual resources (users, signers)
        if not any(r.group == group and r.name == name for r in found):
            found.append(Resource(group, name, False, special))
    return found


def asks(resources: Iterable[Resource], namespaces: Iterable[str]) -> list[Ask]:
    listed = list(namespaces)
    return [
        Ask(verb, r.group, r.name, ns)
        for r in resources
        for ns in ([*listed, ""] if r.namespaced else [""])
        for verb in r.verbs
    ]


def sa_user(namespace: str, name: str) -> tuple[str, list[str]]:
    groups = [
        "system:serviceaccounts",
        f"system:serviceaccounts:{namespace}",
        "system:authenticated",
    ]
    return f"system:serviceaccount:{namespace}:{name}", groups


def allowed_set(
    api: client.ApiClient, who: tuple[str, list[str]], questions: list[Ask]
) -> set[Ask]:
    authz = client.AuthorizationV1Api(api)
    user, groups = who

    def ask(q: Ask) -> bool:
        resource, _, sub = q.resource.partition("/")
        attrs = client.V1ResourceAttributes(
            verb=q.verb,
            group=q.group,
            resource=resource,
            subresource=sub or None,
            namespace=q.namespace or None,
        )
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user, groups=groups, resource_attributes=attrs
            )
        )
        status = authz.create_subject_access_review(review).status
        return bool(status is not None and status.allowed)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, questions))
    return {q for q, yes in zip(questions, answers, strict=True) if yes}


def granted(rules: Iterable[Rule], questions: Iterable[Ask], where: set[str]) -> set[Ask]:
    """The questions ``rules`` answer yes to, when bound in namespaces ``where`` ("" in
    ``where``: bound cluster-wide, which covers every namespace too)."""
    return {
        q
        for q in questions
        for rule in rules
        if q.group in rule.api_groups
        and q.resource in rule.resources
        and q.verb in rule.verbs
        and ("" in where or q.namespace in where)
    }


def rule_pairs(rules: Iterable[Rule]) -> set[tuple[str, str]]:
    """(resource as ``kubectl auth can-i --list`` prints it, verb) for each granted pair."""
    return {
        (
            f"{res.split('/')[0]}.{g}" + (f"/{res.split('/')[1]}" if "/" in res else "")
            if g
            else res,
            v,
        )
        for rule in rules
        for g in rule.api_groups
        for res in rule.resources
        for v in rule.verbs
    }


def listed(
    cluster: KubeCluster, who: tuple[str, list[str]], namespace: str
) -> set[tuple[str, str]]:
    """``kubectl auth can-i --list --as=<who>``'s resource rows as (resource, verb) pairs."""
    done = cluster.kubectl("auth", "can-i", "--list", f"--as={who[0]}", "-n", namespace)
    pairs = set()
    for line in done.stdout.splitlines()[1:]:
        row = LIST_ROW.match(line)
        if row is None:
            continue  # a non-resource URL row
        resource, _urls, names, verbs = row.groups()
        assert not names, f"a rule limited to resource names: {line}"
        pairs |= {(resource, verb) for verb in verbs.split()}
    return pairs


@pytest.fixture
def chart_rbac(request: pytest.FixtureRequest) -> Any:
    """test_rbac_install's ``install_rbac``: applies the chart's RBAC, removed at teardown."""
    return request.getfixturevalue("install_rbac")


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[client.ApiClient]:
    with config.new_client_from_config(str(kube_cluster.kubeconfig)) as made:
        yield made


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_the_operator_may_do_exactly_what_kube_rbac_grants(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    chart_rbac: Any,
    extra_namespaces: Any,
    api: client.ApiClient,
    mode: str,
) -> None:
    watched, other = extra_namespaces(2)
    if mode == "cluster":
        chart_rbac("--set", "watch.mode=cluster", "--set", f"probe.namespaces={{{watched}}}")
        watch_scope = {""}
    else:
        chart_rbac("--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}")
        watch_scope = {watched}
    operator = Identity(kube_cluster, kube_namespace, OPERATOR_SA)
    wait_for(lambda: operator.can("get", "leases.coordination.k8s.io", kube_namespace), "RBAC", 30)
    resources = discovered(kube_cluster)
    assert len(resources) > 50 and any(r.name == "pods/exec" for r in resources)
    questions = asks(resources, [watched, other, kube_namespace])

    baseline = allowed_set(api, sa_user(kube_namespace, "thop-unbound"), questions)
    assert {(q.group, q.resource) for q in baseline} <= DEFAULT_BASELINE, baseline
    expected = (
        granted(WATCH_RULES, questions, watch_scope)
        | granted(LEADER_ELECTION_RULES, questions, {kube_namespace})
        | baseline
    )
    actual = allowed_set(api, sa_user(kube_namespace, OPERATOR_SA), questions)
    assert sorted(actual - expected, key=str) == [], "allowed but not granted by kube/rbac.py"
    assert sorted(expected - actual, key=str) == [], "granted by kube/rbac.py but refused"
    assert len(questions) > 1000 and len(actual - baseline) >= 20, (len(questions), len(actual))

    if mode == "namespaced":  # (the probe account has no binding in either mode: once is enough)
        probe = allowed_set(api, sa_user(watched, "taskhandler-probe"), questions)
        unbound = allowed_set(api, sa_user(watched, "thop-unbound"), questions)
        assert probe == unbound, "the probe account may do more than an unbound account"

    # `kubectl auth can-i --list` itself: the whole allowed set, per namespace, equals the
    # rules plus the unbound account's baseline.
    for namespace in (watched, other, kube_namespace):
        rules = [r for r in WATCH_RULES if "" in watch_scope or namespace in watch_scope]
        if namespace == kube_namespace:
            rules += LEADER_ELECTION_RULES
        want = rule_pairs(rules) | listed(
            kube_cluster, sa_user(namespace, "thop-unbound"), namespace
        )
        got = listed(kube_cluster, sa_user(kube_namespace, OPERATOR_SA), namespace)
        assert got == want, f"kubectl auth can-i --list in {namespace}: {sorted(got ^ want)}"

    if mode != "cluster":
        return
    # And `kubectl auth can-i <verb>` for every verb on everything the operator touches (and the
    # subresources it must not touch), agreeing with the rules and the matrix.
    touched = {
        (g, r)
        for rule in (*WATCH_RULES, *LEADER_ELECTION_RULES)
        for g in rule.api_groups
        for r in rule.resources
    }
    touched |= {
        ("", "pods/exec"),
        ("", "pods/attach"),
        ("", "pods/portforward"),
        ("", "serviceaccounts/token"),
        ("batch", "jobs/status"),
    }
    can_i = [
        Ask(verb, group, resource, watched)
        for group, resource in sorted(touched)
        for verb in STANDARD_VERBS
    ]

    def said(q: Ask) -> bool:
        name, _, sub = q.resource.partition("/")
        extra = (f"--subresource={sub}",) if sub else ()
        return operator.can(q.verb, f"{name}.{q.group}" if q.group else name, q.namespace, *extra)

    with ThreadPoolExecutor(2) as pool:
        answers = dict(zip(can_i, pool.map(said, can_i), strict=True))
    by_rules = granted(WATCH_RULES, can_i, watch_scope) | granted(
        LEADER_ELECTION_RULES, can_i, {kube_namespace}
    )
    assert sum(answers.values()) >= 20  # the granted verbs are among them
    wrong = [(q, yes) for q, yes in answers.items() if yes != (q in by_rules)]
    assert wrong == [], "kubectl auth can-i disagrees with kube/rbac.py"
    assert {q for q, yes in answers.items() if yes} <= actual, "can-i and the matrix disagree"


def test_the_rule_tables_are_what_the_chart_renders(
    kube_cluster: KubeCluster, chart_rbac: Any, extra_namespaces: Any
) -> None:
    """The chart's Roles carry kube/rbac.py's rules verbatim (no hand-written extra)."""
    (watched,) = extra_namespaces(1)
    objects = chart_rbac(
        "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}"
    )
    roles = {o["metadata"]["name"]: o["rules"] for o in objects if o["kind"] == "Role"}
    as_k8s = json.loads(json.dumps([r.to_k8s() for r in WATCH_RULES]))
    assert roles["thop-taskhandler-operator"] == as_k8s
    leader = json.loads(json.dumps([r.to_k8s() for r in LEADER_ELECTION_RULES]))
    assert roles["thop-taskhandler-operator-leader-election"] == leader
