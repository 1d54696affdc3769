"""The chart's monitoring objects rendered by the real helm: the ServiceMonitor or the PodMonitor
(exclusive) keep each bundle's own ``namespace`` label (``honorLabels``) and take a scrape
timeout; every alert of the PrometheusRule names its runbook, a section of docs/operations.md
that exists, and ``promtool check rules`` (Prometheus' own checker) accepts the rule groups.

The alerts' behaviour on the operator's real metrics: tests/e2e/test_operator_alerts.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.fixtures.promtool import promtool
from tests.integration.chart.conftest import Render, render_text
from tests.integration.chart.test_render import one

pytestmark = pytest.mark.kube

REPO = Path(__file__).resolve().parents[3]
OPERATIONS = REPO / "docs" / "operations.md"
DEFAULT_RUNBOOKS = "https://github.com/langsdk/taskhandler-operator/blob/main/docs/operations.md"
HINT = "`kubectl -n {{ $labels.namespace }} describe thb {{ $labels.name }}`"


def alerts_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rule = one(objects, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def endpoint_of(monitor: dict[str, Any]) -> dict[str, Any]:
    key = "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    endpoints = monitor["spec"][key]
    assert len(endpoints) == 1, endpoints
    found: dict[str, Any] = endpoints[0]
    return found


def test_the_service_monitor_honours_the_bundles_namespace_label(render: Render) -> None:
    objects = render("--set", "serviceMonitor.enabled=true")
    assert not [o for o in objects if o["kind"] == "PodMonitor"]
    endpoint = endpoint_of(one(objects, "ServiceMonitor"))
    # Prometheus' default timeout (10 s, or the interval when shorter) unless one is set.
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "30s",
        "honorLabels": True,
    }

    objects = render(
        "--set", "serviceMonitor.enabled=true",
        "--set", "serviceMonitor.interval=1m",
        "--set", "serviceMonitor.scrapeTimeout=45s",
    )  # fmt: skip
    endpoint = endpoint_of(one(objects, "ServiceMonitor"))
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m", "45s")
    assert endpoint["honorLabels"] is True


def test_the_pod_monitor_scrapes_the_operator_pods_instead(render: Render) -> None:
    objects = render(
        "--set", "podMonitor.enabled=true",
        "--set", "podMonitor.scrapeTimeout=15s",
        "--set", "podMonitor.labels.release=kube-prometheus",
    )  # fmt: skip
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]
    monitor = one(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert endpoint_of(monitor) == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "15s",
        "honorLabels": True,
    }
    # It selects the operator's pods (by the Deployment's own template labels, so not the
    # migration Job's pods), whose container names the port.
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    job = one(objects, "Job")
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert "metrics" in {p["name"] for p in ports}
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [monitor["metadata"]["namespace"]]
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true"),
            "serviceMonitor.enabled and podMonitor.enabled are exclusive",
        ),
        (
            ("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.scrapeTimeout=31s"),
            "serviceMonitor.scrapeTimeout (31s) must not exceed serviceMonitor.interval (30s)",
        ),
        (
            (
                "--set",
                "podMonitor.enabled=true",
                "--set",
                "podMonitor.interval=1m30s",
                "--set",
                "podMonitor.scrapeTimeout=1m30500ms",
            ),
            "podMonitor.scrapeTimeout (1m30500ms) must not exceed podMonitor.interval (1m30s)",
        ),
    ],
    ids=["both-monitors", "service-timeout", "pod-timeout"],
)
def test_monitor_checks_fail_with_one_clear_line(
    kube_cluster: KubeCluster, kube_namespace: str, args: tuple[str, ...], message: str
) -> None:
    done = render_text(kube_cluster, kube_namespace, *args, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_a_timeout_equal_to_the_interval_is_accepted(render: Render) -> None:
    objects = render(
        "--set", "podMonitor.enabled=true",
        "--set", "podMonitor.interval=1m",
        "--set", "podMonitor.scrapeTimeout=60000ms",
    )  # fmt: skip
    assert endpoint_of(one(objects, "PodMonitor"))["scrapeTimeout"] == "60000ms"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "serviceMonitor.scrapeTimeout=10 seconds"), "/serviceMonitor/scrapeTimeout"),
        (("--set", "podMonitor.interval=often"), "/podMonitor/interval"),
        (("--set", "podMonitor.enabled=yes"), "/podMonitor/enabled"),
        (("--set", "podMonitor.honorLabels=false"), "additional properties 'honorLabels'"),
        (
            ("--set", "prometheusRule.runbookBaseUrl=https://example.org/ops.md#alerts"),
            "/prometheusRule/runbookBaseUrl",
        ),
        (("--set", "prometheusRule.runbookBaseUrl=docs/operations.md"), "/prometheusRule/"),
    ],
)
def test_the_schema_refuses_wrong_monitoring_values(
    kube_cluster: KubeCluster, kube_namespace: str, args: tuple[str, ...], message: str
) -> None:
    done = render_text(kube_cluster, kube_namespace, *args, check=False)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert message in done.stderr, done.stderr


def runbook_anchors() -> set[str]:
    """The anchors GitHub gives the "#### <AlertName>" sections of docs/operations.md."""
    page = OPERATIONS.read_text(encoding="utf-8")
    return {m.lower() for m in re.findall(r"^#### (\w+)$", page, re.M)}


def test_every_alert_names_its_runbook_and_the_bundles_namespace(render: Render) -> None:
    alerts = alerts_of(render("--set", "prometheusRule.enabled=true"))
    anchors = runbook_anchors()
    for name, alert in alerts.items():
        url = alert["annotations"]["runbook_url"]
        assert url == f"{DEFAULT_RUNBOOKS}#{name.lower()}", url
        assert name.lower() in anchors, f"docs/operations.md has no '#### {name}' section"
        if name.startswith("TaskHandlerBundle"):
            # The hint names the bundle's own namespace, the alert's namespace label.
            assert HINT in alert["annotations"]["description"], (name, alert["annotations"])
            assert "by (namespace, name" in alert["expr"], (name, alert["expr"])

    custom = "https://docs.example.org/thop/v0.1.0/operations.html"
    alerts = alerts_of(
        render(
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            f"prometheusRule.runbookBaseUrl={custom}",
        )
    )
    assert {a["annotations"]["runbook_url"] for a in alerts.values()} == {
        f"{custom}#{name.lower()}" for name in alerts
    }


def test_promtool_accepts_the_rendered_rule_groups(render: Render, tmp_path: Path) -> None:
    objects = render(
        "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.notReadyFor=1h"
    )
    groups = one(objects, "PrometheusRule")["spec"]["groups"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    done = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout

    # The checker is not a no-op: a broken expression in the same file is refused.
    groups[0]["rules"][0]["expr"] = "max by (namespace, name) (taskhandler_operator_bundle_ready"
    rules.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    done = promtool("check", "rules", str(rules))
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


def expand(template: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus expands it, for templates that use only ``$labels``."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], template)


def test_no_leader_fires_per_shard(render: Render, tmp_path: Path) -> None:
    """Each shard holds its own Lease, so TaskHandlerOperatorNoLeader fires per (namespace,
    shard): for a shard whose replicas all stand by, and (the absent() guard of every rendered
    shard) for one with no series at all, never for a shard that leads. promtool evaluates the
    rendered rule on series as the operator exports them (``shard`` label, ``default`` for the
    default shard; docs/install.md, "Shards")."""
    objects = render(
        "--set", "prometheusRule.enabled=true",
        "--set", "shards[0].name=b", "--set", "shards[1].name=c",
    )  # fmt: skip
    ns = one(objects, "PrometheusRule")["metadata"]["namespace"]
    rules = alerts_of(objects)
    rule = rules["TaskHandlerOperatorNoLeader"]
    groups = one(objects, "PrometheusRule")["spec"]["groups"]

    def series(shard: str, pod: str, leading: int) -> dict[str, str]:
        labels = f'namespace="{ns}",pod="{pod}",shard="{shard}"'
        return {"series": f"taskhandler_operator_leader{{{labels}}}", "values": f"{leading}x30"}

    def fired(*shards: str) -> list[dict[str, Any]]:
        out = []
        for shard in shards:
            labels = {**rule["labels"], "namespace": ns, "shard": shard}
            annotations = {k: expand(v, labels) for k, v in rule["annotations"].items()}
            out.append({"exp_labels": labels, "exp_annotations": annotations})
        return out

    def check(name: str, input_series: list[dict[str, str]], *shards: str) -> dict[str, Any]:
        return {
            "name": name,
            "interval": "1m",
            "input_series": input_series,
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": rule["alert"], "exp_alerts": []},
                {"eval_time": "11m", "alertname": rule["alert"], "exp_alerts": fired(*shards)},
            ],
        }

    leading = [series("default", "a-1", 1), series("b", "b-1", 1), series("c", "c-1", 1)]
    tests = [
        check("every shard leads", leading),
        check(
            "shard b's replicas all stand by",
            [leading[0], series("b", "b-1", 0), series("b", "b-2", 0), leading[2]],
            "b",
        ),
        check("shard c exports nothing", leading[:2], "c"),
        check("nothing at all", [{"series": 'up{job="x"}', "values": "1x30"}], "b", "c", "default"),
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, width=1000), encoding="utf-8")
    done = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout
