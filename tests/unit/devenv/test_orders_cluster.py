"""hack/kind/examples/: the manifests the kind path and ``make demo`` share (issue 22, item 7).

The bundles are the example's (``orders_example.BUNDLES``) and valid; the git server runs the
image the chart's defaults name; the demo's process-node copy differs in the server's address
and the bundles' URL only, its real-node copy in the server's image and the bundles' URL.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from taskhandler_devenv import orders_cluster
from taskhandler_devenv.orders_example import BUNDLES
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "taskhandler-operator"
IMAGE = "localhost/taskhandler-operator:9.9.9"
POD_URL = "http://10.244.0.7:8080/orders-bundles.git"


def leaves(obj: Any, path: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in leaves(val, f"{path}/{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in leaves(val, f"{path}/{i}").items()}
    return {path: obj}


def test_the_bundles_are_the_examples_and_valid() -> None:
    bundles = orders_cluster.load("bundles")
    assert [b["metadata"]["name"] for b in bundles] == [b.name for b in BUNDLES]
    for manifest, example in zip(bundles, BUNDLES, strict=True):
        spec = TaskHandlerBundleSpec.model_validate(manifest["spec"])
        assert manifest["metadata"]["namespace"] == orders_cluster.NAMESPACE
        assert spec.language.value == example.language.value
        assert manifest["spec"]["queues"] == [example.queue]
        git = manifest["spec"]["source"]["git"]
        assert git["url"] == orders_cluster.SERVICE_URL
        assert git["path"] == example.language.value  # where bundle_files puts its artifact
        assert f"{git['path']}/{example.rel_path}" in orders_cluster.bundle_files(
            {b.name: b"" for b in BUNDLES}
        )
        assert git["secretRef"] == {"name": orders_cluster.GIT_SECRET}


def test_the_git_server_is_the_services_and_runs_the_charts_default_image() -> None:
    (config_map, deployment, service) = orders_cluster.load("git-server")
    assert {o["metadata"]["namespace"] for o in (config_map, deployment, service)} == {
        orders_cluster.NAMESPACE
    }
    assert service["metadata"]["name"] == orders_cluster.SERVER
    assert f"//{orders_cluster.SERVER}.{orders_cluster.NAMESPACE}.svc" in orders_cluster.SERVICE_URL
    assert service["spec"]["ports"][0]["port"] == 80  # the URL names no port
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert container["image"] == f"{values['image']['repository']}:{chart['appVersion']}"
    assert orders_cluster.SERVER_LISTEN in container["args"]
    args = container["args"]
    assert args[args.index("--repository") + 1] == orders_cluster.REPOSITORY
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env == {
        "GIT_USERNAME": {"name": orders_cluster.GIT_SECRET, "key": "username"},
        "GIT_PASSWORD": {"name": orders_cluster.GIT_SECRET, "key": "password"},
    }
    compile(config_map["data"]["git_server.py"], "git_server.py", "exec")


def test_make_kind_images_builds_what_the_chart_and_the_git_server_name() -> None:
    makefile = (REPO / "Makefile").read_text()
    built = set(re.findall(r"-t \$\(IMAGE_REPO\)/([\w-]+):\$\(IMAGE_TAG\)", makefile))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    named = {values["image"]["repository"]} | {
        image["repository"]
        for image in values["probe"]["runtimeImages"].values()
        if image["repository"]
    }
    assert {f"ghcr.io/langsdk/{name}" for name in built} == named
    assert "IMAGE_REPO   ?= ghcr.io/langsdk" in makefile


def test_the_process_node_copy_changes_the_address_only() -> None:
    objects = [*orders_cluster.load("git-server"), *orders_cluster.load("bundles")]
    moved = orders_cluster.on_process_node(objects, 41234)
    changed = {
        f"{o['kind']}/{o['metadata']['name']}{path}": (value, leaves(m)[path])
        for o, m in zip(objects, moved, strict=True)
        for path, value in leaves(o).items()
        if leaves(m)[path] != value
    }
    server = "Deployment/bundle-git-server/spec/template/spec/containers/0"
    url = "http://127.0.0.1:41234/orders-bundles.git"
    assert changed == {
        f"{server}/args/1": ("0.0.0.0:8080", "127.0.0.1:41234"),
        f"{server}/ports/0/containerPort": (8080, 41234),
        f"{server}/readinessProbe/httpGet/port": (8080, 41234),
        **{
            f"TaskHandlerBundle/{b.name}/spec/source/git/url": (orders_cluster.SERVICE_URL, url)
            for b in BUNDLES
        },
    }
    assert all(leaves(o).keys() == leaves(m).keys() for o, m in zip(objects, moved, strict=True))


def test_the_real_nodes_server_runs_the_local_image_and_nothing_else_changes() -> None:
    objects = orders_cluster.load("git-server")
    moved = orders_cluster.on_real_node(objects, IMAGE)
    expected = copy.deepcopy(objects)
    (container,) = expected[1]["spec"]["template"]["spec"]["containers"]
    assert container["image"] != IMAGE
    container.update(image=IMAGE, imagePullPolicy="Never")
    assert moved == expected
    assert objects == orders_cluster.load("git-server")  # the input is left alone


def test_the_real_nodes_bundles_fetch_from_the_server_pod_when_given() -> None:
    objects = orders_cluster.load("bundles")
    assert orders_cluster.on_real_node(objects, IMAGE) == objects
    moved = orders_cluster.on_real_node(objects, IMAGE, POD_URL)
    assert [b["spec"]["source"]["git"]["url"] for b in moved] == [POD_URL] * 3
    for before, after in zip(objects, moved, strict=True):
        after["spec"]["source"]["git"]["url"] = before["spec"]["source"]["git"]["url"]
        assert after == before
