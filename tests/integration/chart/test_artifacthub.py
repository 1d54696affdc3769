"""Chart.yaml's `artifacthub.io/images` is what the chart runs: every image of every pod the
real helm renders with the default values (hooks and `helm test` pods included) plus the images
the operator starts probe Jobs with (THOP_OPERATOR_IMAGE, THOP_RUNTIME_IMAGES__*), no more.
Artifact Hub scans the listed images for vulnerabilities, so one missing is one unscanned."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.integration.chart.conftest import Render
from tests.unit.chart.values_doc import CHART

pytestmark = pytest.mark.kube

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Pod":
        yield spec
    elif obj["kind"] == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
    elif obj["kind"] in POD_KINDS:
        yield spec["template"]["spec"]


def images_run(objects: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for obj in objects:
        for spec in pod_specs(obj):
            for key in ("initContainers", "containers", "ephemeralContainers"):
                for container in spec.get(key) or []:
                    found.add(container["image"])
                    found.update(
                        env["value"]
                        for env in container.get("env") or []
                        if env["name"] == "THOP_OPERATOR_IMAGE"
                        or env["name"].startswith("THOP_RUNTIME_IMAGES__")
                    )
    return found


def test_artifacthub_images_are_the_images_the_chart_runs(render: Render) -> None:
    listed = yaml.safe_load(CHART_META["annotations"]["artifacthub.io/images"])
    objects = render()
    assert {o["kind"] for o in objects} & {"Deployment", "Job"} == {"Deployment", "Job"}
    run = images_run(objects)
    # The Go runtime is the operator image itself, which the probe Jobs get by THOP_OPERATOR_IMAGE.
    assert len(run) == 3, run
    assert sorted(entry["image"] for entry in listed) == sorted(run)


def test_an_image_the_chart_runs_is_found(render: Render) -> None:
    """The collector sees a runtime image as soon as the values add one (so the equality above
    would fail if a template started running an image the annotation does not list)."""
    run = images_run(render("--set", "probe.runtimeImages.go.repository=registry.local/go"))
    assert f"registry.local/go:{CHART_META['appVersion']}" in run
