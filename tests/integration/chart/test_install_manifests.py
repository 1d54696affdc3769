"""The install without Helm (deploy/, hack/render_install.py, docs/install.md "Without Helm").

Rendering the chart again with the real helm gives the committed files byte for byte; the
Kustomize base renders the same objects as install.yaml; install.yaml applied with
``kubectl apply --server-side`` into its restricted namespace is accepted, its migration Job
migrates the test PostgreSQL and the operator's Deployment becomes available on the process node.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from taskhandler_devenv.kubecluster.bins import ensure_bins
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
NAMESPACE = "taskhandler-system"
Key = tuple[str, str, str, str]


def objects(text: str) -> dict[Key, dict[str, Any]]:
    found: dict[Key, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            meta = doc["metadata"]
            key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])
            assert key not in found, key
            found[key] = doc
    return found


def test_committed_manifests_match_the_chart(tmp_path: Path) -> None:
    helm = ensure_bins()["helm"]
    script = ROOT / "hack" / "render_install.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "--helm", str(helm)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    fresh = {p.relative_to(tmp_path) for p in tmp_path.rglob("*.yaml")}
    committed = {p.relative_to(DEPLOY) for p in (DEPLOY / "kustomize" / "base").glob("*.yaml")}
    assert fresh == committed | {Path("install.yaml")}, "run `make install-manifests`"
    for rel in sorted(fresh):
        assert (tmp_path / rel).read_text() == (DEPLOY / rel).read_text(), (
            f"deploy/{rel} drifted from the chart: run `make install-manifests`"
        )


def test_manifests_have_no_helm_leftovers() -> None:
    install = objects((DEPLOY / "install.yaml").read_text())
    text = json.dumps(list(install.values()))
    assert "helm.sh/" not in text and '"Helm"' not in text
    assert not [k for k in install if k[1] == "Pod"], "helm test pods belong to helm only"
    assert not [k for k in install if k[1] == "Secret"], "no generated key in a static file"
    assert next(iter(install))[1:] == ("Namespace", "", NAMESPACE)
    kinds = [k[1] for k in install]
    assert kinds.index("CustomResourceDefinition") == 1
    (deployment,) = (o for k, o in install.items() if k[1] == "Deployment")
    (env,) = (
        e
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "THOP_CLUSTER_ID"
    )
    assert env == {
        "name": "THOP_CLUSTER_ID",
        "valueFrom": {
            "configMapKeyRef": {"name": "taskhandler-operator-cluster", "key": "clusterId"}
        },
    }


def test_kustomize_base_renders_install_yaml() -> None:
    kubectl = ensure_bins()["kubectl"]
    done = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY / "kustomize" / "base")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert objects(done.stdout) == objects((DEPLOY / "install.yaml").read_text())


def test_example_overlay_moves_namespace_image_and_replicas() -> None:
    """The overlay docs/install.md points to leaves nothing of the base's namespace or tag."""
    kubectl = ensure_bins()["kubectl"]
    overlay = DEPLOY / "kustomize" / "overlays" / "example"
    done = subprocess.run(
        [str(kubectl), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert NAMESPACE not in done.stdout
    rendered = objects(done.stdout)
    (deployment,) = (o for k, o in rendered.items() if k[1] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    images = [container["image"]] + [
        e["value"]
        for e in container["env"]
        if e["name"].startswith(("THOP_OPERATOR_IMAGE", "THOP_RUNTIME_IMAGES"))
    ]
    (job,) = (o for k, o in rendered.items() if k[1] == "Job")
    images += [c["image"] for c in job["spec"]["template"]["spec"]["containers"]]
    assert len(images) == 5 and all(i.endswith(":0.1.1") for i in images), images
    (cluster_map,) = (k[3] for k in rendered if k[1] == "ConfigMap")
    (env,) = (e for e in container["env"] if e["name"] == "THOP_CLUSTER_ID")
    assert env["valueFrom"]["configMapKeyRef"]["name"] == cluster_map


def on_process_node(doc: dict[str, Any]) -> dict[str, Any]:
    """Free host ports for the operator's listeners: process-node pods share the host network
    (the objects are otherwise applied as committed; the image name runs this checkout)."""
    if doc["kind"] != "Deployment":
        return doc
    text = json.dumps(doc)
    for port in ("8090", "8080", "8081"):
        text = text.replace(port, str(free_port()))
    moved: dict[str, Any] = json.loads(text)
    for env in moved["spec"]["template"]["spec"]["containers"][0]["env"]:
        if env["name"] == "THOP_ARTIFACT_SERVER_URL":
            env["value"] = "http://127.0.0.1:" + env["value"].rsplit(":", 1)[1]
    return moved


@pytest.mark.kube
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_server_side_apply_install_yaml(kube_cluster: KubeCluster, pg_url: str) -> None:
    install = objects((DEPLOY / "install.yaml").read_text())
    # The CRD stays: the session's other tests use it.
    ours = [on_process_node(o) for k, o in install.items() if k[1] != "CustomResourceDefinition"]
    kubectl = kube_cluster.kubectl
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(install[next(iter(install))]))
    try:
        # What must exist first (docs/install.md): two Secrets and the cluster id.
        uid = kubectl("get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}").stdout
        kubectl("create", "secret", "generic", "taskhandler-operator-database", "-n", NAMESPACE)
        kubectl(
            "create", "secret", "generic", "taskhandler-operator-signing-key", "-n", NAMESPACE,
            f"--from-literal=key={secrets.token_hex(32)}",
        )  # fmt: skip
        kubectl(
            "patch", "secret", "taskhandler-operator-database", "-n", NAMESPACE, "--type=merge",
            "-p", json.dumps({"stringData": {"url": pg_url}}),
        )  # fmt: skip
        kubectl(
            "create", "configmap", "taskhandler-operator-cluster", "-n", NAMESPACE,
            f"--from-literal=clusterId={uid}",
        )  # fmt: skip
        # The committed file as it is, as a user applies it (a server-side dry run: its ports
        # are not free host ports on the process node).
        # The session's CRD was installed by a Helm release of another test, as a cluster moving
        # from the chart to these manifests has it: its fields belong to the manager "helm", so
        # the apply takes them over (--force-conflicts, as docs/install.md says).
        dry = kubectl(
            "apply", "--server-side", "--force-conflicts", "--dry-run=server",
            "-f", str(DEPLOY / "install.yaml"), check=False,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        crd = [o for k, o in install.items() if k[1] == "CustomResourceDefinition"]
        applied = kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crd + ours}),
            check=False,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        assert "Warning" not in applied.stderr, applied.stderr  # Pod Security: restricted
        waited = kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=complete",
            "job/taskhandler-operator-db-upgrade", "--timeout=240s", check=False, timeout=260,
        )  # fmt: skip
        assert waited.returncode == 0, diagnostics(kube_cluster)
        engine = sa.create_engine(pg_url)
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        engine.dispose()
        assert {ARTIFACT_TABLE, BINDING_TABLE} <= tables, sorted(tables)
        waited = kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=available",
            "deployment/taskhandler-operator", "--timeout=240s", check=False, timeout=260,
        )  # fmt: skip
        assert waited.returncode == 0, diagnostics(kube_cluster)
    finally:
        everything = {"apiVersion": "v1", "kind": "List", "items": ours[::-1]}
        kubectl(
            "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=120s",
            input=json.dumps(everything), check=False, timeout=150,
        )  # fmt: skip
    gone = kubectl("get", "namespace", NAMESPACE, check=False)
    assert gone.returncode != 0, "the namespace was not deleted"


def diagnostics(cluster: KubeCluster) -> str:
    parts = [cluster.kubectl("get", "all,events", "-n", NAMESPACE, check=False).stdout[-4000:]]
    for target in ("job/taskhandler-operator-db-upgrade", "deployment/taskhandler-operator"):
        logs = cluster.kubectl("logs", target, "-n", NAMESPACE, "--tail=40", check=False)
        parts.append(logs.stdout + logs.stderr)
    return "\n".join(parts)
