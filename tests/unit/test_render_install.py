"""hack/render_install.py's rewrite of helm's output (the real helm: the integration drift test)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "render_install.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_install", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_install", module)
    spec.loader.exec_module(module)
    return module


render = load()


def deployment(env: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "op",
            "namespace": "ns",
            "labels": {"helm.sh/chart": "c-1", "app.kubernetes.io/managed-by": "Helm", "a": "b"},
        },
        "spec": {"template": {"metadata": {"labels": {"helm.sh/chart": "c-1"}},
                              "spec": {"containers": [{"name": "op", "env": env}]}}},
    }  # fmt: skip


CLUSTER = {"name": "THOP_CLUSTER_ID", "value": render._CLUSTER_PLACEHOLDER}


def dump(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(docs)


def test_helm_labels_hooks_and_cluster_id_are_rewritten() -> None:
    test_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "t", "annotations": {"helm.sh/hook": "test"}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "annotations": {"helm.sh/hook": "pre-install,pre-upgrade"}},
    }
    out = render.rewrite(dump(test_pod, deployment([CLUSTER]), job))
    assert [o["kind"] for o in out] == ["Namespace", "Job", "Deployment"]
    _, rewritten_job, dep = out
    assert rewritten_job["metadata"]["annotations"] == {
        "argocd.argoproj.io/hook": "PreSync",
        "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation,HookSucceeded",
    }
    assert dep["metadata"]["labels"] == {"a": "b"}
    assert dep["spec"]["template"]["metadata"]["labels"] == {}
    (env,) = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env["valueFrom"]["configMapKeyRef"]["name"] == render.CLUSTER_CONFIGMAP
    assert "value" not in env


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        ([deployment([])], "expected one THOP_CLUSTER_ID in the Deployment, found 0"),
        (
            [{"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "x", "annotations": {"helm.sh/hook": "post-install"}}}],
            "ConfigMap x: unhandled hook post-install",
        ),
        (
            [{"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "x"}}],
            "LimitRange: add it to KIND_ORDER",
        ),
    ],
)  # fmt: skip
def test_unexpected_chart_output_is_a_named_error(docs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(render.RenderError, match=message):
        render.rewrite(dump(*docs))


def test_a_helm_failure_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["--out", str(tmp_path), "--helm", str(tmp_path / "no-helm")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("render_install: ") and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())
