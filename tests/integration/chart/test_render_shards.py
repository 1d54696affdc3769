"""The chart's ``shards`` value rendered by the real helm (issue 24): one more Deployment per
shard, with its own Service, artifact URL and revision claim; no selector of one shard matches
another shard's pods while the default Deployment keeps today's objects; the NetworkPolicies and
the monitors cover every shard; the schema and the template refuse bad shard lists.

The real install with a shard: test_install.py, ``test_a_shard_runs_beside_the_default_one``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.integration.chart.conftest import Render, render_text
from tests.integration.chart.test_render import dry_run, env_of, one
from tests.network_policy import Endpoint, allowed, selects

pytestmark = pytest.mark.kube

FULLNAME = "thop-taskhandler-operator"
TWO = ("--set", "shards[0].name=b", "--set", "shards[1].name=c")
PROBE_LABELS = {"app.kubernetes.io/name": names.PROBE_APP}


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def service_selects(service: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Service's selector: a plain map of labels (no expressions)."""
    return selects({"matchLabels": service["spec"]["selector"]}, labels)


def test_without_shards_the_objects_stay_todays_and_adding_shards_leaves_them_alone(
    render: Render,
) -> None:
    """The default Deployment's selector is immutable: a release that adds shards must not
    change it, nor roll the default pods (the settings checksum leaves `shards` out)."""
    before = render()
    deployments = of_kind(before, "Deployment")
    assert list(deployments) == [FULLNAME]
    default = deployments[FULLNAME]
    assert default["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "taskhandler-operator",
        "app.kubernetes.io/instance": "thop",
        "app.kubernetes.io/component": "operator",
    }
    assert "THOP_SHARD" not in env_of(default)
    assert list(of_kind(before, "Service")) == [FULLNAME]

    after = render(*TWO)
    assert of_kind(after, "Deployment")[FULLNAME] == default
    assert of_kind(after, "Service")[FULLNAME] == one(before, "Service")
    # An explicit empty list is the default.
    explicit = render("--set-json", "shards=[]")
    assert of_kind(explicit, "Deployment")[FULLNAME] == default


def test_two_shards_have_their_own_deployments_services_and_urls(
    kube_cluster: KubeCluster, kube_namespace: str, render: Render
) -> None:
    objects = render(*TWO, "--set", "revisionStore.type=persistentVolumeClaim")
    dry_run(kube_cluster, objects)
    deployments = of_kind(objects, "Deployment")
    services = of_kind(objects, "Service")
    expected = {FULLNAME: None, f"{FULLNAME}-b": "b", f"{FULLNAME}-c": "c"}
    assert set(deployments) == set(services) == set(expected)

    pods = {name: pod_labels(d) for name, d in deployments.items()}
    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]
        # A Deployment's selector matches its own pods and no other Deployment's.
        assert {other for other, labels in pods.items() if selects(selector, labels)} == {name}
        # Each Service selects exactly its own shard's pods, on its own artifact URL.
        service = services[name]
        chosen = {o for o, labels in pods.items() if service_selects(service, labels)}
        assert chosen == {name}, (name, service["spec"]["selector"])
        env = env_of(deployment)
        assert env.get("THOP_SHARD") == expected[name]
        url = urlsplit(env["THOP_ARTIFACT_SERVER_URL"])
        assert url.hostname == f"{name}.{kube_namespace}.svc"
        artifacts = next(p for p in service["spec"]["ports"] if p["name"] == "artifacts")
        assert url.port == artifacts["port"]
        # Its own revision claim.
        volume = next(
            v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "revisions"
        )
        assert volume["persistentVolumeClaim"]["claimName"] == f"{name}-revisions"
    assert set(of_kind(objects, "PersistentVolumeClaim")) == {f"{n}-revisions" for n in expected}

    # Neither the migration Job's pods nor helm test's Pod is any Service's endpoint.
    job_pod = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    test_pod = one(objects, "Pod")["metadata"]["labels"]
    for service in services.values():
        assert not service_selects(service, job_pod) and not service_selects(service, test_pod)


def test_one_shard_takes_its_overrides_and_only_its_pods_roll(
    kube_namespace: str, render: Render
) -> None:
    objects = render(
        "--set", "shards[0].name=b",
        "--set", "shards[0].replicaCount=2",
        "--set", "shards[0].probe.parallelism=9",
        "--set", "shards[0].ports.artifactServer=9090",
        "--set", "shards[0].resources.requests.memory=512Mi",
    )  # fmt: skip
    deployments = of_kind(objects, "Deployment")
    default, shard = deployments[FULLNAME], deployments[f"{FULLNAME}-b"]
    assert (default["spec"]["replicas"], shard["spec"]["replicas"]) == (1, 2)
    assert shard["spec"]["strategy"]["type"] == "RollingUpdate"
    assert (env_of(default)["THOP_PROBE_PARALLELISM"], env_of(shard)["THOP_PROBE_PARALLELISM"]) == (
        "4",
        "9",
    )
    assert env_of(shard)["THOP_ARTIFACT_SERVER_BIND"] == "0.0.0.0:9090"
    assert env_of(shard)["THOP_ARTIFACT_SERVER_URL"] == (
        f"http://{FULLNAME}-b.{kube_namespace}.svc:9090"
    )
    container = shard["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"memory": "512Mi"}}  # replaced as a whole
    assert {"name": "artifacts", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    service = of_kind(objects, "Service")[f"{FULLNAME}-b"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "artifacts": 9090,
        "metrics": 8080,
    }
    # The default shard's values rest untouched; its pods' checksum too.
    assert env_of(default)["THOP_ARTIFACT_SERVER_BIND"] == "0.0.0.0:8090"

    def checksum(deployment: dict[str, Any]) -> str:
        annotations: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/settings"]

    more = of_kind(
        render(
            "--set",
            "shards[0].name=b",
            "--set",
            "shards[0].replicaCount=2",
            "--set",
            "shards[0].probe.parallelism=9",
            "--set",
            "shards[0].ports.artifactServer=9090",
            "--set",
            "shards[0].resources.requests.memory=512Mi",
            "--set",
            "shards[1].name=c",
        ),
        "Deployment",
    )
    assert checksum(more[f"{FULLNAME}-b"]) == checksum(shard)  # adding c rolls only c
    assert checksum(more[FULLNAME]) == checksum(default)
    changed = of_kind(
        render("--set", "shards[0].name=b", "--set", "logging.level=debug"), "Deployment"
    )
    assert checksum(changed[f"{FULLNAME}-b"]) != checksum(shard)


def test_network_policies_admit_probes_scrapes_and_helm_test_to_every_shard(
    kube_namespace: str, render: Render
) -> None:
    objects = render(*TWO, "--set", "shards[1].ports.artifactServer=9090")
    policies = list(of_kind(objects, "NetworkPolicy").values())
    probe = Endpoint.pod(kube_namespace, PROBE_LABELS, ip="10.244.1.7")
    helm_test = Endpoint.pod(kube_namespace, one(objects, "Pod")["metadata"]["labels"])
    prometheus = Endpoint.pod("monitoring", {"app": "prometheus"}, ip="10.244.2.2")
    for name, deployment in of_kind(objects, "Deployment").items():
        ops = Endpoint.pod(kube_namespace, pod_labels(deployment), ip="10.244.0.5")
        artifact_port = 9090 if name.endswith("-c") else 8090
        assert allowed(policies, probe, ops, artifact_port, "TCP"), name
        assert allowed(policies, helm_test, ops, artifact_port, "TCP"), name
        assert allowed(policies, prometheus, ops, 8080, "TCP"), name
        # The policy still isolates every shard: nothing else is open.
        assert not allowed(policies, probe, ops, 8080, "TCP"), name
        assert not allowed(policies, prometheus, ops, 5432, "TCP"), name
    # The other shard's port is not opened on a pod that does not listen there by accident:
    # the lists are the ports of every shard, and nothing beyond them.
    ingress = of_kind(objects, "NetworkPolicy")[FULLNAME]["spec"]["ingress"][0]
    assert sorted(p["port"] for p in ingress["ports"]) == [8090, 9090]


def test_monitors_scrape_every_shard(render: Render) -> None:
    objects = render(*TWO, "--set", "podMonitor.enabled=true")
    monitor = one(objects, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    job_pod = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]
    assert all(selects(selector, pod_labels(d)) for d in of_kind(objects, "Deployment").values())
    assert not selects(selector, job_pod)

    objects = render(*TWO, "--set", "serviceMonitor.enabled=true")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    services = of_kind(objects, "Service").values()
    assert len(services) == 3
    assert all(selects(monitor["spec"]["selector"], s["metadata"]["labels"]) for s in services)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "shards[0].name=B"), "/shards/0/name"),
        (("--set", "shards[0].name=-b"), "/shards/0/name"),
        (("--set", f"shards[0].name={'b' * 41}"), "/shards/0/name"),
        (("--set", "shards[0].name=default"), "/shards/0/name"),
        (("--set", "shards[0].replicaCount=2"), "missing property 'name'"),
        (("--set", "shards[0].name=b", "--set", "shards[0].image=x"), "'image' not allowed"),
        (("--set", "shards[0].name=b", "--set", "shards[0].replicaCount=0"), "/replicaCount"),
        (("--set", "shards[0].name=b", "--set", "shards[1].name=b"), "are equal"),
    ],
    ids=[
        "upper-case",
        "leading-dash",
        "too-long",
        "default",
        "no-name",
        "unknown-key",
        "replicas",
        "equal",
    ],
)
def test_the_schema_refuses_bad_shards(
    kube_cluster: KubeCluster, kube_namespace: str, args: tuple[str, ...], message: str
) -> None:
    done = render_text(kube_cluster, kube_namespace, *args, check=False)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            # Equal entries are the schema's (uniqueItems); the same name in two others, this.
            (
                "--set",
                "shards[0].name=b",
                "--set",
                "shards[1].name=b",
                "--set",
                "shards[1].replicaCount=2",
            ),
            "shards: the name b is listed twice",
        ),
        (
            ("--set", f"shards[0].name={'b' * 40}"),
            f"shards: {FULLNAME}-{'b' * 40}, the Service of shard {'b' * 40}, is longer than 63",
        ),
        (
            ("--set", "artifactServer.url=http://127.0.0.1:8090", "--set", "shards[0].name=b"),
            "shards: b has no artifactServer.url while artifactServer.url is set",
        ),
        (
            (
                "--set",
                "shards[0].name=b",
                "--set",
                "revisionStore.type=persistentVolumeClaim",
                "--set",
                "revisionStore.persistentVolumeClaim.existingClaim=mine",
            ),
            "shards need a revision store each",
        ),
        (
            (
                "--set",
                "shards[0].name=b",
                "--set",
                "shards[0].replicaCount=2",
                "--set",
                "revisionStore.type=persistentVolumeClaim",
            ),
            "only one replica can mount: use replicaCount=1 (shard b)",
        ),
    ],
    ids=["duplicate", "service-name-too-long", "url-without-shard-url", "shared-claim", "rwo"],
)
def test_template_refuses_bad_shard_lists_with_one_clear_line(
    kube_cluster: KubeCluster, kube_namespace: str, args: tuple[str, ...], message: str
) -> None:
    done = render_text(kube_cluster, kube_namespace, *args, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
