"""The chart's alerts evaluated by Prometheus' own rule engine (``promtool test rules``) on the
operator's real ``/metrics`` output.

One operator watches two namespaces, each with a TaskHandlerBundle named ``orders``: in the first
a runtime that answers garbage fails its probe Job, in the second the git repository does not
exist. A second replica stands by. Both replicas' ``/metrics`` are scraped, and each sample is
stored as Prometheus stores a scrape through the chart's rendered ServiceMonitor (or PodMonitor):
the target's labels (``job``, ``namespace`` = the release namespace, ``pod``, ...) added, and a
sample's own label of the same name kept (``honorLabels: true``) or renamed ``exported_<name>``
(without it). The rendered PrometheusRule then has to fire ``TaskHandlerBundleNotReady`` once per
bundle namespace with that namespace's hint, the probe and source alerts for the right bundle
only, ``TaskHandlerBundleNotSynced`` once the last sync is old, and ``TaskHandlerOperatorNoLeader``
only when no scraped replica leads.

The scrape's values are real; time is not: the scrape is placed at test time 0, gauges hold their
value, counters repeat their scraped increase at every interval (the failures go on), and the
last-sync timestamp keeps its age.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    Operator,
    StartOperator,
    apply,
    commit_files,
    diagnose,
    git_bundle,
    handler_spec,
    seed_dags,
)
from tests.fixtures.promtool import promtool
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer
from tests.unit.chart.values_doc import CHART

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
    # A runtime build, a probe Job, two operators and four promtool runs, on a loaded machine.
    pytest.mark.timeout(900),
]

NAME = "orders"
RELEASE = "thop"
#: The operator's (release) namespace: neither bundle's.
RELEASE_NAMESPACE = "taskhandler-system"
PREFIX = "taskhandler_operator_"
#: How much time the series span (alerts wait up to 30 minutes, NotSynced an hour).
SPAN_SECONDS = 75 * 60
WAIT_SECONDS = 300

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass(frozen=True)
class Scrape:
    pod: str
    text: str
    at: float  # wall-clock time of the scrape


def scrape(op: Operator, pod: str) -> Scrape:
    url = f"http://127.0.0.1:{op.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return Scrape(pod, response.read().decode(), time.time())


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, metric: str, **labels: str) -> float | None:
    return next(
        (v for (n, ls), v in found.items() if n == metric and set(labels.items()) <= ls), None
    )


def wait_for(what: str, check: Callable[[], Scrape | None], ops: Iterable[Operator]) -> Scrape:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            found = check()
        except OSError:
            found = None
        if found is not None:
            return found
        time.sleep(2)
    pytest.fail(f"never {what}:\n" + "\n---\n".join(op.tail() for op in ops))


# -- What Prometheus stores -------------------------------------------------------------------


def target_labels(
    objects: list[dict[str, Any]], monitor: dict[str, Any], pod: str
) -> dict[str, str]:
    """The labels Prometheus Operator gives a target of ``monitor`` (its generated relabelings):
    ``job`` is the Service's name for a ServiceMonitor, ``<namespace>/<name>`` of the PodMonitor
    for a PodMonitor."""
    meta = monitor["metadata"]
    endpoint = endpoint_of(monitor)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == endpoint["port"])
    labels = {
        "namespace": meta["namespace"],
        "pod": pod,
        "container": container["name"],
        "endpoint": endpoint["port"],
        "instance": f"{pod}:{port}",  # the pod's IP in a cluster
    }
    if monitor["kind"] == "ServiceMonitor":
        service = next(o for o in objects if o["kind"] == "Service")["metadata"]["name"]
        labels |= {"job": service, "service": service}
    else:
        labels["job"] = f"{meta['namespace']}/{meta['name']}"
    return labels


def endpoint_of(monitor: dict[str, Any]) -> dict[str, Any]:
    key = "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    endpoint: dict[str, Any] = monitor["spec"][key][0]
    return endpoint


def stored_labels(own: Mapping[str, str], target: Mapping[str, str], honor: bool) -> dict[str, str]:
    """Prometheus' merge of a sample's labels with its target's (``scrape.mutateSampleLabels``,
    ``honor_labels``): with honor, the sample's own label wins; without, the target's does and
    the sample's is kept as ``exported_<name>``."""
    labels = {k: v for k, v in own.items() if v != ""}
    for key, target_value in target.items():
        if key in labels:
            if honor:
                continue
            exported = f"exported_{key}"
            while exported in labels:
                exported = f"exported_{exported}"
            labels[exported] = labels[key]
        labels[key] = target_value
    return labels


def series_name(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(
    scrapes: Iterable[Scrape],
    objects: list[dict[str, Any]],
    monitor: dict[str, Any],
    steps: int,
) -> list[dict[str, str]]:
    honor = bool(endpoint_of(monitor).get("honorLabels", False))
    out = []
    for one in scrapes:
        target = target_labels(objects, monitor, one.pod)
        for family in text_string_to_metric_families(one.text):
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue  # the counters' creation times: no alert reads them
                if s.name == f"{PREFIX}last_successful_sync_timestamp_seconds":
                    # A timestamp: the same age at test time 0 as at the scrape.
                    values = f"{s.value - one.at:.3f}+0x{steps}"
                elif family.type in ("counter", "histogram"):
                    values = f"0+{s.value}x{steps}"
                else:
                    values = f"{s.value}+0x{steps}"
                labels = stored_labels({**s.labels}, target, honor)
                out.append({"series": series_name(s.name, labels), "values": values})
    return out


# -- What must fire ---------------------------------------------------------------------------

_LABEL = re.compile(r"\{\{ \$labels\.(\w+) \}\}")


def expand(template: str, labels: Mapping[str, str]) -> str:
    text = _LABEL.sub(lambda m: labels.get(m[1], ""), template)
    assert "{{" not in text, f"an annotation uses more than $labels: {template}"
    return text


def firing(rule: Mapping[str, Any], *label_sets: Mapping[str, str]) -> list[dict[str, Any]]:
    """promtool's expectation: one alert per label set, with the rule's labels and its
    annotations expanded for those labels."""
    out = []
    for own in label_sets:
        labels = {**rule.get("labels", {}), **own}
        annotations = {k: expand(v, labels) for k, v in rule["annotations"].items()}
        out.append({"exp_labels": labels, "exp_annotations": annotations})
    return out


def expect(
    rules: Mapping[str, Mapping[str, Any]],
    at: str,
    fire: Mapping[str, Sequence[Mapping[str, str]]],
) -> list[dict[str, Any]]:
    """At ``at``, exactly the alerts of ``fire`` (alert -> label sets) fire, of every rule."""
    return [
        {"eval_time": at, "alertname": name, "exp_alerts": firing(rule, *fire.get(name, []))}
        for name, rule in rules.items()
    ]


def promtool_rule_test(
    tmp_path: Path,
    rules: list[dict[str, Any]],
    interval: str,
    tests: list[dict[str, Any]],
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}), encoding="utf-8")
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": interval, "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, width=1000), encoding="utf-8")
    done = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert done.returncode == 0, f"promtool test rules failed:\n{done.stdout}\n{done.stderr}"[
        -12000:
    ]
    assert "SUCCESS" in done.stdout, done.stdout


def test_alerts_fire_per_bundle_namespace_on_the_operators_real_metrics(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
    tmp_path: Path,
) -> None:
    probed, unsynced = namespace, second_namespace
    seed_dags(migrated, {"orders_etl": [("extract", "go"), ("load", "go-b")]})
    garbage = runtime_factory("go", mode="garbage", spec=handler_spec(("orders_etl", "extract")))
    commit_files(git_repo, {"go/extract": Path(garbage).read_bytes()}, "a garbage runtime")
    url = git_repo.http_url(source_http)
    missing = url.rsplit("/", 1)[0] + "/no-such-repository.git"

    leader = start([probed, unsynced])
    leader_pod, standby_pod = (f"{RELEASE}-taskhandler-operator-5f7b9-{s}" for s in ("a1", "b2"))
    # Same name in both namespaces; its own queue and bundleName so that the two do not claim
    # the same ones (they would stall as a conflict, not fail as wanted here).
    apply(kube_cluster, git_bundle(probed, NAME, language="go", url=url, path="go"))
    apply(
        kube_cluster,
        git_bundle(
            unsynced,
            NAME,
            language="go",
            url=missing,
            path="go",
            queues=["go-b"],
            bundle_name=f"{NAME}-b",
        ),
    )

    def failing() -> Scrape | None:
        got = scrape(leader, leader_pod)
        found = samples(got.text)
        ready = f"{PREFIX}bundle_ready"
        done = (
            value(found, ready, namespace=probed, name=NAME) == 0
            and value(found, ready, namespace=unsynced, name=NAME) == 0
            and (value(found, f"{PREFIX}probes_total", namespace=probed, outcome="failed") or 0)
            >= 1
            and (value(found, f"{PREFIX}source_errors_total", namespace=unsynced) or 0) >= 1
            and value(found, f"{PREFIX}last_successful_sync_timestamp_seconds", namespace=probed)
            is not None
        )
        return got if done else None

    try:
        leading = wait_for("failed a probe and a source sync", failing, [leader])
    except pytest.fail.Exception:
        print(diagnose(kube_cluster, probed, NAME, leader))
        print(diagnose(kube_cluster, unsynced, NAME, leader))
        raise
    found = samples(leading.text)
    # The scenario as the metrics tell it: the source error is git's "not found", and the
    # bundle whose source never synced has no last-sync series at all.
    kinds = {dict(ls)["kind"] for (n, ls) in found if n == f"{PREFIX}source_errors_total"}
    assert kinds == {"not_found"}, leading.text
    assert value(found, f"{PREFIX}leader") == 1.0, leading.text
    assert (
        value(found, f"{PREFIX}last_successful_sync_timestamp_seconds", namespace=unsynced) is None
    )

    standby = start([probed, unsynced])

    def standing() -> Scrape | None:
        got = scrape(standby, standby_pod)
        return got if value(samples(got.text), f"{PREFIX}leader") == 0.0 else None

    standing_by = wait_for("served a standby's metrics", standing, [standby])
    assert not [n for (n, ls) in samples(standing_by.text) if ("namespace", probed) in ls]

    scenario = Scenario(probed, unsynced, frozenset(kinds), leading, standing_by)
    # Kept beside promtool's files for a failure's diagnosis (and to replay against a chart).
    (tmp_path / "scenario.json").write_text(json.dumps(asdict(scenario), default=sorted))
    for kind in ("ServiceMonitor", "PodMonitor"):
        evaluate_alerts(kube_cluster.helm, CHART, kind, scenario, tmp_path / kind)


@dataclass(frozen=True)
class Scenario:
    """What the operator's run produced: the two bundles' namespaces, the source error kinds
    seen, and both replicas' scrapes."""

    probed: str
    unsynced: str
    kinds: frozenset[str]
    leading: Scrape
    standing_by: Scrape


def evaluate_alerts(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    chart: Path,
    kind: str,
    scenario: Scenario,
    work: Path,
) -> None:
    """Render ``chart`` with the ``kind`` monitor and the PrometheusRule, store the scrapes as
    Prometheus would through that monitor, and have promtool check which alerts fire when."""
    key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    done = helm(
        "template", RELEASE, str(chart), "-n", RELEASE_NAMESPACE,
        "--set", "clusterId=e2e", "--set", "database.existingSecret=airflow-db",
        "--set", f"{key}.enabled=true", "--set", "prometheusRule.enabled=true",
    )  # fmt: skip
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    monitor = next(o for o in objects if o["kind"] == kind)
    groups = next(o for o in objects if o["kind"] == "PrometheusRule")["spec"]["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    interval = endpoint_of(monitor)["interval"]
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    seconds = sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h)", interval))
    steps = int(SPAN_SECONDS // seconds)

    alerts = functools.partial(expect, rules)
    bundle_a = {"namespace": scenario.probed, "name": NAME}
    bundle_b = {"namespace": scenario.unsynced, "name": NAME}
    source_b = [{**bundle_b, "source": "git", "kind": k} for k in sorted(scenario.kinds)]
    # One per shard (by (namespace, shard)); this release has the default shard only.
    no_leader = {
        "TaskHandlerOperatorNoLeader": [{"namespace": RELEASE_NAMESPACE, "shard": "default"}]
    }
    both = input_series([scenario.leading, scenario.standing_by], objects, monitor, steps)
    tests = [
        {
            "name": f"{kind}: both replicas scraped",
            "interval": interval,
            "input_series": both,
            "alert_rule_test": [
                *alerts("10m", {}),
                *alerts(
                    "45m",
                    {
                        "TaskHandlerBundleNotReady": [bundle_a, bundle_b],
                        "TaskHandlerBundleProbeFailures": [bundle_a],
                        "TaskHandlerBundleSourceErrors": source_b,
                    },
                ),
                *alerts(
                    "70m",
                    {
                        "TaskHandlerBundleNotReady": [bundle_a, bundle_b],
                        "TaskHandlerBundleProbeFailures": [bundle_a],
                        "TaskHandlerBundleSourceErrors": source_b,
                        "TaskHandlerBundleNotSynced": [bundle_a],
                    },
                ),
            ],
        },
        {
            "name": f"{kind}: only the standby scraped (the leader's pod gone)",
            "interval": interval,
            "input_series": input_series([scenario.standing_by], objects, monitor, steps),
            "alert_rule_test": [*alerts("5m", {}), *alerts("11m", no_leader)],
        },
        {
            "name": f"{kind}: nothing scraped",
            "interval": interval,
            "input_series": [{"series": 'up{job="other"}', "values": f"1+0x{steps}"}],
            "alert_rule_test": [*alerts("11m", no_leader)],
        },
    ]
    work.mkdir(parents=True)
    promtool_rule_test(work, groups, interval, tests)
    # The hints name each bundle's own namespace (promtool compares its expansion to these).
    hints = {
        a["exp_labels"]["namespace"]: a["exp_annotations"]["description"]
        for a in firing(rules["TaskHandlerBundleNotReady"], bundle_a, bundle_b)
    }
    for ns, description in hints.items():
        assert f"kubectl -n {ns} describe thb {NAME}" in description, description
