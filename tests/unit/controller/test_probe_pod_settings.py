"""The chart's probe.imagePullPolicy (THOP_PROBE_IMAGE_PULL_POLICY) reaches the probe Jobs."""

from __future__ import annotations

import argparse

import pytest

from taskhandler_operator.controller.commands import probe_pod_settings, register
from taskhandler_operator.kube.probe_job import build_probe_job
from taskhandler_operator.settings import SettingsError, load_settings
from tests.unit.kube.test_probe_job import pod_spec, request


def _run_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


@pytest.mark.parametrize("policy", ["Always", "IfNotPresent", "Never"])
def test_the_pull_policy_variable_reaches_both_containers_of_the_probe_job(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    monkeypatch.setenv("THOP_PROBE_IMAGE_PULL_POLICY", policy)
    args = _run_args()
    settings = load_settings(args)
    job = build_probe_job(request(settings=probe_pod_settings(settings, "probes")))
    pod = pod_spec(job)
    containers = [*pod["initContainers"], *pod["containers"]]
    assert [c["imagePullPolicy"] for c in containers] == [policy, policy]
    assert pod["serviceAccountName"] == "probes"


def test_the_flag_wins_and_unset_leaves_kubernetes_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("THOP_PROBE_IMAGE_PULL_POLICY", raising=False)
    settings = load_settings(_run_args())
    pod = pod_spec(build_probe_job(request(settings=probe_pod_settings(settings, "p"))))
    assert "imagePullPolicy" not in pod["containers"][0]
    monkeypatch.setenv("THOP_PROBE_IMAGE_PULL_POLICY", "Never")
    settings = load_settings(_run_args("--probe-image-pull-policy", "Always"))
    assert probe_pod_settings(settings, "p").image_pull_policy == "Always"


def test_a_wrong_pull_policy_is_one_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THOP_PROBE_IMAGE_PULL_POLICY", "Sometimes")
    with pytest.raises(SettingsError) as caught:
        load_settings(_run_args())
    assert str(caught.value).startswith(
        "invalid setting THOP_PROBE_IMAGE_PULL_POLICY (--probe-image-pull-policy):"
    )
