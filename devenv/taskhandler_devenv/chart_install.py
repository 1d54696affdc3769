"""The chart's values and steps for a release on the process node of the test control plane.

The install test and the demo install the chart with the real helm; only what the process node
lacks is set here. Pods there share the host's network and have no cluster DNS, so the ports
must be free host ports and probe pods download from the loopback artifact port. The image's
name contains ``taskhandler-operator``, which the node runs from the project's venv, so the
chart's own command and arguments run this checkout's code; the Java and TypeScript probe
images are named so too (their probe driver is the same command, the runtime the host's
``java`` or ``node``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

CHART: Final = Path(__file__).resolve().parents[2] / "charts" / "taskhandler-operator"
IMAGE_REPOSITORY: Final = "registry.local/taskhandler-operator"
IMAGE_TAG: Final = "dev"
PROBE_IMAGES: Final = {
    "java": f"{IMAGE_REPOSITORY}-java",
    "typescript": f"{IMAGE_REPOSITORY}-node",
}
CRD_RELEASE_LABEL: Final = "app.kubernetes.io/managed-by=Helm"


@dataclass(frozen=True)
class HostPorts:
    """Free host ports for the operator's three listeners."""

    artifact_server: int
    metrics: int
    health: int


def process_node_values(
    ports: HostPorts,
    *,
    database_secret: str,
    watch_namespaces: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``--set`` arguments for ``helm install``; namespaced mode when namespaces are given."""
    values = [
        f"image.repository={IMAGE_REPOSITORY}",
        f"image.tag={IMAGE_TAG}",
        f"database.existingSecret={database_secret}",
        f"ports.artifactServer={ports.artifact_server}",
        f"ports.metrics={ports.metrics}",
        f"ports.health={ports.health}",
        f"artifactServer.url=http://127.0.0.1:{ports.artifact_server}",
        "logging.format=text",
        *(f"probe.runtimeImages.{lang}.repository={repo}" for lang, repo in PROBE_IMAGES.items()),
        *(f"probe.runtimeImages.{lang}.tag={IMAGE_TAG}" for lang in PROBE_IMAGES),
    ]
    if watch_namespaces:
        values += ["watch.mode=namespaced", f"watch.namespaces={{{','.join(watch_namespaces)}}}"]
    values += extra
    return [arg for value in values for arg in ("--set", value)]


def adopt_crd_commands(crd: str, release: str, namespace: str) -> list[list[str]]:
    """kubectl arguments that make an existing CRD (applied with kubectl) the release's, so
    helm takes it over instead of refusing the install (docs/install.md)."""
    return [
        [
            "annotate",
            "crd",
            crd,
            "--overwrite",
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        ],
        ["label", "crd", crd, "--overwrite", CRD_RELEASE_LABEL],
    ]
