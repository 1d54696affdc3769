"""What probe pods can reach, and what the apiserver admits, for the chart as helm renders it.

The process node enforces no NetworkPolicy, so the chart's rendered policies go through the
pure evaluator in ``tests/network_policy.py``: a probe pod (labels from the real probe Job
builder) reaches the operator's artifact server port and DNS, and nothing else — not the
apiserver, not PostgreSQL wherever it runs, not the operator's other ports, not other pods —
and nothing reaches it. Without the policies the same questions answer "allowed", so the check
can fail. The apiserver accepts the rendered policies, and admits under Pod Security
``restricted`` every pod spec the chart and the operator produce (operator, migration Job, a
probe Job for each language).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube import names
from taskhandler_operator.kube.probe_job import (
    BundleIdentity,
    FetchFile,
    ProbeJobRequest,
    ProbeTarget,
    build_probe_job,
)
from tests.e2e.security_support import as_pod, psa_dry_run, restriction_problems
from tests.integration.chart.conftest import Render
from tests.network_policy import Endpoint, allowed

pytestmark = [pytest.mark.kube]

ARTIFACT_PORT, METRICS_PORT, HEALTH_PORT = 8090, 8080, 8081
APISERVER_SERVICE = Endpoint.host("10.96.0.1")  # the kubernetes Service's cluster IP
APISERVER_HOST = Endpoint.host("172.18.0.2")  # a control-plane node (hostNetwork apiserver)
APISERVER_POD = Endpoint.pod("kube-system", {"component": "kube-apiserver"})
EXTERNAL_DB = Endpoint.host("10.20.30.40")


def probe_job(namespace: str, language: Language = Language.GO) -> dict[str, Any]:
    bundle = BundleIdentity(namespace, "etl", "0000-uid", "etl")
    return build_probe_job(
        ProbeJobRequest(
            bundle=bundle,
            language=language,
            target=ProbeTarget("etl", 1, None),
            files=[FetchFile("etl", "http://thop.ops.svc:8090/v1/artifacts/x", "d" * 64, 1)],
            operator_image="registry.local/taskhandler-operator:test",
            runtime_image="registry.local/runtime:test",
        )
    )


def probe_pod(namespace: str) -> Endpoint:
    labels = probe_job(namespace)["spec"]["template"]["metadata"]["labels"]
    return Endpoint.pod(namespace, labels, ip="10.244.1.7")


def operator_pod(objects: list[dict[str, Any]], namespace: str) -> Endpoint:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return Endpoint.pod(namespace, labels, ip="10.244.0.5")


def reachable(policies: list[dict[str, Any]], source: Endpoint, ops: Endpoint) -> dict[str, bool]:
    """Which destinations ``source`` may open connections to."""
    postgres = {"app.kubernetes.io/name": "postgresql"}
    checks = {
        "artifact server": (ops, ARTIFACT_PORT, "TCP"),
        "operator metrics": (ops, METRICS_PORT, "TCP"),
        "operator health": (ops, HEALTH_PORT, "TCP"),
        "apiserver service": (APISERVER_SERVICE, 443, "TCP"),
        "apiserver host": (APISERVER_HOST, 6443, "TCP"),
        "apiserver pod": (APISERVER_POD, 6443, "TCP"),
        "postgres pod (airflow ns)": (Endpoint.pod("airflow", postgres), 5432, "TCP"),
        "postgres pod (operator ns)": (Endpoint.pod(ops.namespace or "", postgres), 5432, "TCP"),
        "postgres outside": (EXTERNAL_DB, 5432, "TCP"),
        "another probe pod": (
            Endpoint.pod(source.namespace or "", dict(source.pod_labels or {})),
            ARTIFACT_PORT,
            "TCP",
        ),
        "the internet": (Endpoint.host("93.184.216.34"), 443, "TCP"),
        "cluster DNS": (Endpoint.pod("kube-system", {"k8s-app": "kube-dns"}), 53, "UDP"),
    }
    return {
        what: allowed(policies, source, dest, port, proto)
        for what, (dest, port, proto) in checks.items()
    }


ONLY_ARTIFACTS_AND_DNS = {
    "artifact server": True,
    "operator metrics": False,
    "operator health": False,
    "apiserver service": False,
    "apiserver host": False,
    "apiserver pod": False,
    "postgres pod (airflow ns)": False,
    "postgres pod (operator ns)": False,
    "postgres outside": False,
    "another probe pod": False,
    "the internet": False,
    "cluster DNS": True,
}


def inbound(policies: list[dict[str, Any]], probe: Endpoint, ops: Endpoint) -> list[str]:
    """Who may connect to a probe pod (it serves nothing: nobody may)."""
    sources = {
        "operator": ops,
        "same-namespace pod": Endpoint.pod(probe.namespace or "", {"app": "x"}),
        "another probe": Endpoint.pod(probe.namespace or "", dict(probe.pod_labels or {})),
        "a node": Endpoint.host("172.18.0.3"),
    }
    return [
        f"{who}:{port}"
        for who, source in sources.items()
        for port in (22, 80, 8080, 8090, 40000)
        if allowed(policies, source, probe, port)
    ]


def test_probe_pods_reach_only_the_artifact_server_and_dns(
    render: Render, kube_namespace: str
) -> None:
    objects = render()
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    ops = operator_pod(objects, kube_namespace)
    probe = probe_pod(kube_namespace)  # cluster mode: probes run in the release namespace
    assert reachable(policies, probe, ops) == ONLY_ARTIFACTS_AND_DNS
    assert inbound(policies, probe, ops) == []
    # DNS is the one exception, and only on port 53.
    dns = Endpoint.pod("kube-system", {"k8s-app": "kube-dns"})
    assert not allowed(policies, probe, dns, 8080)
    # The operator's side admits probe pods from any namespace, on the artifact port only.
    elsewhere = Endpoint.pod("team-z", dict(probe.pod_labels or {}))
    assert allowed(
        [p for p in policies if p["metadata"]["name"] == "thop-taskhandler-operator"],
        elsewhere,
        ops,
        ARTIFACT_PORT,
    )
    assert not allowed(policies, Endpoint.pod("team-z", {"app": "x"}), ops, ARTIFACT_PORT)


def test_dns_is_port_53_to_the_peers_the_values_name(
    render: Render, kube_namespace: str, tmp_path: Path
) -> None:
    kube_dns = {"k8s-app": "kube-dns"}
    elsewhere = Endpoint.pod("team-z", {"app": "dns-lookalike"})
    default = [o for o in render() if o["kind"] == "NetworkPolicy"]
    probe = probe_pod(kube_namespace)
    # The default: port 53 to any pod (the documented exception), never to an address outside.
    assert allowed(default, probe, elsewhere, 53, "UDP")
    assert not allowed(default, probe, Endpoint.host("8.8.8.8"), 53, "UDP")
    values = tmp_path / "dns.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "networkPolicy": {
                    "dnsTo": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": kube_dns},
                        }
                    ]
                }
            }
        )
    )
    objects = render("-f", str(values))
    tight = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for proto in ("UDP", "TCP"):
        assert allowed(tight, probe, Endpoint.pod("kube-system", kube_dns), 53, proto)
        assert not allowed(tight, probe, elsewhere, 53, proto)
        assert not allowed(tight, probe, Endpoint.pod("kube-system", {"app": "x"}), 53, proto)
    assert reachable(tight, probe, operator_pod(objects, kube_namespace)) == ONLY_ARTIFACTS_AND_DNS


def test_namespaced_mode_puts_the_policy_in_every_watched_namespace(
    render: Render, kube_namespace: str
) -> None:
    objects = render("--set", "watch.mode=namespaced", "--set", "watch.namespaces={team-a,team-b}")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    ops = operator_pod(objects, kube_namespace)
    for namespace in ("team-a", "team-b"):
        probe = probe_pod(namespace)
        assert reachable(policies, probe, ops) == ONLY_ARTIFACTS_AND_DNS, namespace
        assert inbound(policies, probe, ops) == [], namespace


def test_without_the_policies_everything_is_reachable(render: Render, kube_namespace: str) -> None:
    """The control: the evaluator does answer "allowed" when nothing isolates the pod."""
    objects = render("--set", "networkPolicy.enabled=false")
    assert [o for o in objects if o["kind"] == "NetworkPolicy"] == []
    ops = operator_pod(objects, kube_namespace)
    probe = probe_pod(kube_namespace)
    assert all(reachable([], probe, ops).values())


def test_the_apiserver_accepts_the_policies_and_admits_every_pod_under_restricted(
    kube_cluster: KubeCluster, render: Render, kube_namespace: str
) -> None:
    kube_cluster.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    objects = render("--set", "migration.enabled=true")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]  # pods need theirs
    kube_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": accounts}),
    )
    created = kube_cluster.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": policies}),
    )
    assert created.stdout.count("created (server dry run)") == len(policies) == 2
    templates = {
        f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]
        for o in objects
        if o["kind"] in ("Deployment", "Job")
    }
    assert len(templates) == 2, sorted(templates)  # the operator and the migration Job
    # helm test's Pod, as the chart renders it.
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    templates["helm test"] = {"spec": test_pod["spec"]}
    for language in Language:
        job = probe_job(kube_namespace, language)
        templates[f"probe/{language.value}"] = job["spec"]["template"]
        assert restriction_problems(job["spec"]["template"]["spec"], names.PROBE_APP) == []
    for what, template in templates.items():
        done = psa_dry_run(kube_cluster, as_pod(kube_namespace, "psa-check", template))
        assert done.returncode == 0, f"{what}: {done.stderr}"
        assert "Warning" not in done.stderr, f"{what}: {done.stderr}"
        # The database URL reaches the operator as a mounted file, never in argv or env.
        for container in [
            *template["spec"].get("initContainers", ()),
            *template["spec"]["containers"],
        ]:
            shown = json.dumps(
                [container.get("command"), container.get("args"), container.get("env")]
            )
            assert "postgresql" not in shown, f"{what}: {shown}"


def test_the_helm_test_pod_reaches_the_artifact_port_of_its_own_release_only(
    render: Render, kube_namespace: str
) -> None:
    """``helm test`` fetches a signed URL from the artifact server, as a probe pod does: the
    operator's policy admits this release's test Pod there, and on no other port it closes."""
    objects = render()
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    ops = operator_pod(objects, kube_namespace)
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    labels = test_pod["metadata"]["labels"]
    tester = Endpoint.pod(kube_namespace, labels, ip="10.244.1.9")
    assert allowed(policies, tester, ops, ARTIFACT_PORT)
    assert not allowed(policies, tester, ops, 9999)
    # Another release's test Pod, or the same labels in another namespace: refused.
    other_release = {**labels, "app.kubernetes.io/instance": "other"}
    assert not allowed(policies, Endpoint.pod(kube_namespace, other_release), ops, ARTIFACT_PORT)
    assert not allowed(policies, Endpoint.pod("team-z", labels), ops, ARTIFACT_PORT)
    # The control: without the helm-test rule the same Pod is refused.
    without = [
        {
            **p,
            "spec": {
                **p["spec"],
                "ingress": [
                    rule
                    for rule in p["spec"].get("ingress", [])
                    if "helm-test" not in json.dumps(rule)
                ],
            },
        }
        for p in policies
    ]
    assert not allowed(without, tester, ops, ARTIFACT_PORT)
