"""The chart values for a release on the process node: pure argument building."""

from __future__ import annotations

from taskhandler_devenv.chart_install import (
    HostPorts,
    adopt_crd_commands,
    process_node_values,
)


def _pairs(args: list[str]) -> dict[str, str]:
    assert args[::2] == ["--set"] * (len(args) // 2)
    return dict(value.split("=", 1) for value in args[1::2])


def test_cluster_mode_values_use_free_ports_and_the_loopback_artifact_url() -> None:
    values = _pairs(process_node_values(HostPorts(4001, 4002, 4003), database_secret="db"))
    assert values["database.existingSecret"] == "db"
    assert values["ports.artifactServer"] == "4001"
    assert values["ports.metrics"] == "4002"
    assert values["ports.health"] == "4003"
    assert values["artifactServer.url"] == "http://127.0.0.1:4001"
    assert "taskhandler-operator" in values["image.repository"].rsplit("/", 1)[-1]
    assert "watch.mode" not in values
    # Java and TypeScript probes run the same probe driver from the venv on the process node.
    for lang in ("java", "typescript"):
        assert "taskhandler-operator" in values[f"probe.runtimeImages.{lang}.repository"]
        assert values[f"probe.runtimeImages.{lang}.tag"] == values["image.tag"]


def test_namespaced_mode_lists_the_namespaces_and_extra_values_come_last() -> None:
    args = process_node_values(
        HostPorts(1, 2, 3),
        database_secret="db",
        watch_namespaces=("a", "b"),
        extra=("logging.level=debug",),
    )
    values = _pairs(args)
    assert values["watch.mode"] == "namespaced"
    assert values["watch.namespaces"] == "{a,b}"
    assert args[-1] == "logging.level=debug"


def test_adopting_a_crd_names_the_release() -> None:
    annotate, label = adopt_crd_commands("thb.example", "thop", "ns")
    assert "meta.helm.sh/release-name=thop" in annotate
    assert "meta.helm.sh/release-namespace=ns" in annotate
    assert label[-1] == "app.kubernetes.io/managed-by=Helm"
