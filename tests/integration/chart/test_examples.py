"""examples/: one TaskHandlerBundle per language and per source kind, each with its one-line
comment; every bundle validates against the operator's models and, with the Secrets it names,
passes a server-side dry run on the real apiserver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BUNDLES = [p for p in EXAMPLES if p.name != "secrets.yaml"]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def test_every_language_and_source_kind_has_an_example() -> None:
    specs = [documents(p)[0]["spec"] for p in BUNDLES]
    assert {s["language"] for s in specs} == {"go", "java", "typescript"}
    assert {next(iter(s["source"])) for s in specs} == {"git", "http", "s3", "volume"}


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_each_example_is_one_commented_valid_bundle(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# ") and len(first) > 20, "a one-line comment on what it shows"
    (bundle,) = documents(path)
    TaskHandlerBundleSpec.model_validate(bundle["spec"])
    secret = next(iter(bundle["spec"]["source"].values())).get("secretRef")
    if secret:
        names = {d["metadata"]["name"] for d in documents(REPO / "examples" / "secrets.yaml")}
        assert secret["name"] in names


@pytest.mark.kube
@pytest.mark.usefixtures("thb_crd")
def test_the_apiserver_accepts_every_example(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    items = [d for p in EXAMPLES for d in documents(p)]
    done = kube_cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        kube_namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(items) == len(BUNDLES) + 3
