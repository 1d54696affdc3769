"""The generated CRD on the real kube-apiserver: applied with kubectl, it accepts what the models
accept and refuses what they refuse, with the CRD's own messages; explain and get read well."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube.conditions import set_condition, summarize
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec
from taskhandler_operator.kube.status import (
    MAX_ARTIFACTS,
    MAX_PROBLEMS,
    ArtifactState,
    ArtifactStatus,
    ConditionStatus,
    ConditionType,
    Counts,
    Problem,
    TaskHandlerBundleStatus,
)
from tests.unit.kube.examples import INVALID_SPECS, bundle_body

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]


def apply(cluster: KubeCluster, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)


def get(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "thb", name, "-n", namespace, "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_empty(v) for k, v in value.items() if v not in ({}, [])}
    return value


def test_crd_is_established_and_found_by_short_name_and_category(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    crd = json.loads(
        kube_cluster.kubectl("get", "crd", "taskhandlerbundles.langsdk.dev", "-o", "json").stdout
    )
    established = [c for c in crd["status"]["conditions"] if c["type"] == "Established"]
    assert established[0]["status"] == "True"
    resources = kube_cluster.kubectl("api-resources", "--api-group=langsdk.dev").stdout
    assert "thb" in resources and "TaskHandlerBundle" in resources
    assert apply(kube_cluster, bundle_body("by-category", kube_namespace)).returncode == 0
    listed = kube_cluster.kubectl("get", "langsdk", "-n", kube_namespace, "-o", "name").stdout
    assert listed.strip() == "taskhandlerbundle.langsdk.dev/by-category"


def test_valid_bundle_is_accepted_defaulted_and_reads_back_through_the_model(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    body = bundle_body("etl", kube_namespace)
    body["spec"]["source"]["git"]["secretRef"] = None  # null means "not set"
    body["spec"]["probe"] = {"resources": {"limits": {"cpu": 1, "memory": "512Mi"}}}
    done = apply(kube_cluster, body)
    assert done.returncode == 0, done.stderr
    spec = get(kube_cluster, kube_namespace, "etl")["spec"]
    assert spec["interval"] == "5m" and spec["timeout"] == "2m" and spec["suspend"] is False
    assert spec["deletionPolicy"] == "Delete"
    assert spec["probe"]["parallelism"] == 4 and spec["probe"]["timeout"] == "1m"
    assert spec["source"]["git"] == {
        "url": "https://git.example/etl.git",
        "ref": "main",
        "path": "",
    }
    model = TaskHandlerBundleSpec.model_validate(spec)
    assert model.probe.resources.limits == {"cpu": 1, "memory": "512Mi"}
    # The apiserver's defaults are the model's: what it stored is what the model would write
    # (the model also spells out empty maps and lists the apiserver leaves out).
    assert without_empty(model.model_dump(by_alias=True, exclude_none=True, mode="json")) == spec


@pytest.mark.parametrize(
    ("what", "changes", "message"), INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS]
)
def test_invalid_spec_is_refused_by_the_apiserver_with_the_crd_message(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    what: str,
    changes: dict[str, Any],
    message: str,
) -> None:
    done = apply(kube_cluster, bundle_body("bad", kube_namespace, **changes))
    assert done.returncode != 0, f"{what} was accepted"
    assert 'The TaskHandlerBundle "bad" is invalid' in done.stderr
    assert message in done.stderr, done.stderr
    # One mistake, one message: no second OpenAPI error for the same field.
    assert done.stderr.count("Invalid value") == 1, done.stderr


def test_unknown_field_is_refused(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    done = apply(kube_cluster, bundle_body("typo", kube_namespace, intervall="5m"))
    assert done.returncode != 0
    assert 'unknown field "spec.intervall"' in done.stderr


def test_a_name_longer_than_a_label_value_is_refused(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    done = apply(kube_cluster, bundle_body("n" * 64, kube_namespace))
    assert done.returncode != 0
    assert "a TaskHandlerBundle name must be at most 63 characters" in done.stderr


def test_bundle_name_is_immutable_but_other_fields_change(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    assert apply(kube_cluster, bundle_body("etl", kube_namespace)).returncode == 0
    renamed = apply(kube_cluster, bundle_body("etl", kube_namespace, bundleName="other"))
    assert renamed.returncode != 0
    assert (
        'spec.bundleName: Invalid value: "other": bundleName is immutable: create a new '
        "TaskHandlerBundle to serve another bundle name"
    ) in renamed.stderr
    retimed = apply(kube_cluster, bundle_body("etl", kube_namespace, interval="1h30m"))
    assert retimed.returncode == 0, retimed.stderr
    stored = get(kube_cluster, kube_namespace, "etl")
    assert stored["spec"]["bundleName"] == "etl-bundle" and stored["spec"]["interval"] == "1h30m"


def test_explain_shows_field_descriptions(kube_cluster: KubeCluster) -> None:
    out = kube_cluster.kubectl("explain", "thb.spec.source.git").stdout
    assert "A git repository." in out
    # kubectl wraps long descriptions: compare with whitespace folded.
    assert "Branch, tag or full 40-hex commit to check out" in " ".join(out.split())
    assert "url\t<string> -required-" in out
    assert "Repository URL" in out
    probe = kube_cluster.kubectl("explain", "thb.spec.probe.parallelism").stdout
    assert "Most probe Jobs of this bundle running at once (1 to 32)" in probe


def full_status(now: datetime) -> TaskHandlerBundleStatus:
    conditions: list[Any] = []
    for type_, reason in (
        (ConditionType.SOURCE_READY, "Synced"),
        (ConditionType.ARTIFACTS_PROBED, "Probed"),
        (ConditionType.BINDINGS_PUBLISHED, "Published"),
    ):
        conditions = set_condition(
            conditions, type_, ConditionStatus.TRUE, reason, "ok", generation=1, now=now
        )
    conditions = summarize(
        conditions, generation=1, now=now, ready_message="4 stubs bound to 5 handlers"
    )
    # Full lists at their bounds: the model's limits must fit the CRD's.
    artifacts = [
        ArtifactStatus(
            path=f"bin/a{i}", state=ArtifactState.FAILED, reason="OutOfMemory", message="x" * 600
        )
        for i in range(MAX_ARTIFACTS)
    ]
    problems = [
        Problem(severity="error", kind="unbound", dag_id="d", task_id=f"t{i}", message="m" * 600)
        for i in range(MAX_PROBLEMS)
    ]
    return TaskHandlerBundleStatus(
        observed_generation=1,
        conditions=conditions,
        revision="0123456789abcdef0123456789abcdef01234567-0a1b2c3d4e5f",
        short_revision="main@sha1:01234567",
        queues="go,go-fast",
        published_revision="0123456789abcdef0123456789abcdef01234567-0a1b2c3d4e5f",
        counts=Counts(candidates=3, probed=3, handlers=5, bindings=4),
        artifacts=artifacts,
        artifacts_omitted=7,
        problems=problems,
        problems_omitted=2,
    )


def test_status_subresource_and_printer_columns(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    assert apply(kube_cluster, bundle_body("etl", kube_namespace)).returncode == 0
    status = full_status(datetime.now(UTC))
    kube_cluster.kubectl(
        "patch",
        "thb",
        "etl",
        "-n",
        kube_namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status.to_body()}),
    )
    stored = get(kube_cluster, kube_namespace, "etl")
    assert stored["metadata"]["generation"] == 1  # a status write is not a spec change
    assert TaskHandlerBundleStatus.model_validate(stored["status"]) == status

    table = kube_cluster.kubectl("get", "thb", "-n", kube_namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "LANGUAGE",
        "QUEUES",
        "READY",
        "REVISION",
        "HANDLERS",
        "BINDINGS",
        "AGE",
    ]
    row = table[1].split()
    # Status strings: no JSON brackets, a short revision (the full one at -o wide).
    assert row[:7] == ["etl", "go", "go,go-fast", "True", "main@sha1:01234567", "5", "4"]
    wide = kube_cluster.kubectl("get", "thb", "-n", kube_namespace, "-o", "wide").stdout
    header, line = wide.splitlines()[:2]
    assert re.search(r"\bAGE\s+SUSPENDED\s+FULL REVISION\s+REASON\s+MESSAGE$", header), header
    assert re.search(
        r"\sfalse\s+0123456789abcdef0123456789abcdef01234567-0a1b2c3d4e5f\s+Succeeded\s+"
        r"4 stubs bound to 5 handlers$",
        line,
    ), line
    kube_cluster.kubectl(
        "wait", "--for=condition=Ready", "thb/etl", "-n", kube_namespace, "--timeout=10s"
    )


def test_status_is_not_writable_through_the_main_resource(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    body = bundle_body("etl", kube_namespace)
    body["status"] = {"revision": "forged"}
    assert apply(kube_cluster, body).returncode == 0
    assert "status" not in get(kube_cluster, kube_namespace, "etl")


def test_a_queue_listed_twice_is_refused(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    done = apply(kube_cluster, bundle_body("dup", kube_namespace, queues=["go", "go"]))
    assert done.returncode != 0
    assert 'spec.queues[1]: Duplicate value: "go"' in done.stderr


def test_two_source_kinds_message_names_the_field(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    both = {"git": {"url": "https://g/x.git"}, "volume": {"path": "/data"}}
    done = apply(kube_cluster, bundle_body("two", kube_namespace, source=both))
    assert done.returncode != 0
    assert (
        "spec.source: Invalid value: source must name exactly one of git, http, s3, volume"
    ) in done.stderr
