"""Pure logic of the process node (devenv/taskhandler_devenv/kubecluster): no cluster needed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster import podspec
from taskhandler_devenv.kubecluster.control_plane import ToolError
from taskhandler_devenv.kubecluster.logserver import tail_lines
from taskhandler_devenv.kubecluster.mounttargets import MountTargets
from taskhandler_devenv.kubecluster.podspec import (
    ContainerConfigError,
    ImagePullError,
    Mount,
    container_argv,
    container_env,
    container_mounts,
    expand,
    field_ref,
    resolve_image,
    resource_field_ref,
    rewrite_paths,
    run_as,
)
from taskhandler_devenv.kubecluster.podstatus import termination_message
from taskhandler_devenv.kubecluster.volumes import prepare_volumes
from taskhandler_devenv.scratch import scratch_parent

VENV = Path("/opt/venv/bin")
POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"team": "blue", "app": "x"},
        "annotations": {"note": "n"},
    },
    "spec": {"nodeName": "thop-node", "serviceAccountName": "default", "containers": []},
    "status": {"podIP": "127.0.0.1"},
}


def no_objects(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    return {"settings": {"mode": "fast", "level": "3"}}.get(name) if kind == "configmap" else None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "x-$(B)"),
        ("$$(A)", "$(A)"),
        ("cost $$5", "cost $5"),
        ("open $(A", "open $(A"),
        ("$A stays", "$A stays"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "x"}) == expected


def test_rewrite_paths_only_replaces_whole_path_prefixes() -> None:
    mounts = [
        Mount(Path("/host/data"), "/data"),
        Mount(Path("/host/deep"), "/data/deep"),
        Mount(Path("/host/term"), "/dev/termination-log", is_file=True),
    ]
    assert rewrite_paths("/data/x /database /data", mounts) == "/host/data/x /database /host/data"
    assert rewrite_paths("--out=/data/deep/f", mounts) == "--out=/host/deep/f"
    assert rewrite_paths("echo > /dev/termination-log", mounts) == "echo > /host/term"
    assert rewrite_paths("a/data", mounts) == "a/data"


def test_image_table() -> None:
    operator = resolve_image("registry.local/team/taskhandler-operator:dev", VENV)
    assert operator.path.startswith("/opt/venv/bin:")
    assert operator.entrypoint == ("taskhandler-operator",)
    assert resolve_image("eclipse-temurin:21-jre", VENV).kind == "java"
    assert resolve_image("node:22-slim", VENV).kind == "node"
    assert resolve_image("python:3.12@sha256:abc", VENV).cmd == ("python3",)
    assert resolve_image("busybox", VENV).cmd == ("sh",)
    with pytest.raises(ImagePullError, match='Failed to pull image "nginx:1": the process node'):
        resolve_image("nginx:1", VENV)


def test_container_argv_follows_entrypoint_and_cmd_rules() -> None:
    op = resolve_image("taskhandler-operator", VENV)
    box = resolve_image("busybox", VENV)
    assert container_argv({"name": "c", "command": ["a"], "args": ["b"]}, box) == ["a", "b"]
    assert container_argv({"name": "c", "command": ["a"]}, op) == ["a"]
    assert container_argv({"name": "c", "args": ["--version"]}, op) == [
        "taskhandler-operator",
        "--version",
    ]
    assert container_argv({"name": "c"}, box) == ["sh"]
    empty = podspec.ImageRuntime("host", "/bin")
    with pytest.raises(ContainerConfigError, match='container "c": no command specified'):
        container_argv({"name": "c"}, empty)


def test_field_refs() -> None:
    assert field_ref(POD, "metadata.labels['team']") == "blue"
    assert field_ref(POD, "metadata.annotations['missing']") == ""
    assert field_ref(POD, "status.podIP") == "127.0.0.1"
    assert field_ref(POD, "metadata.labels") == 'app="x"\nteam="blue"'
    with pytest.raises(
        ContainerConfigError, match=re.escape('unsupported fieldRef fieldPath "spec.hostname"')
    ):
        field_ref(POD, "spec.hostname")


def test_container_env_order_sources_and_errors() -> None:
    container = {
        "name": "c",
        "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
        "env": [
            {
                "name": "LEVEL",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
            },
            {"name": "MSG", "value": "$(CFG_mode)/$(LEVEL)/$(BASE)"},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
            },
        ],
    }
    env = container_env(POD, container, {"BASE": "b"}, no_objects, {})
    assert env["CFG_mode"] == "fast"
    assert env["MSG"] == "fast/3/b"
    assert "OPT" not in env
    missing = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    with pytest.raises(ContainerConfigError, match='secret "s" not found'):
        container_env(POD, missing, {}, no_objects, {})
    bad_key = {
        "name": "c",
        "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope"}}}
        ],
    }
    with pytest.raises(
        ContainerConfigError, match="couldn't find key nope in configmap ns/settings"
    ):
        container_env(POD, bad_key, {}, no_objects, {})


def test_resource_field_ref_rounds_up_and_falls_back_to_allocatable() -> None:
    container = {"resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
    assert resource_field_ref(container, {"resource": "limits.cpu"}, {}) == "1"
    assert (
        resource_field_ref(container, {"resource": "limits.memory", "divisor": "1Mi"}, {}) == "64"
    )
    assert resource_field_ref({}, {"resource": "limits.cpu"}, {"cpu": "2"}) == "2"
    with pytest.raises(ContainerConfigError, match='cannot parse quantity "lots"'):
        resource_field_ref(
            {"resources": {"limits": {"cpu": "lots"}}}, {"resource": "limits.cpu"}, {}
        )


def test_run_as() -> None:
    pod = {"spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 2000}}}
    assert run_as(pod, {"securityContext": {"runAsUser": 65534}}) == (65534, 65534, [2000])
    assert run_as(pod, {}) == (1000, 1000, [2000])
    with pytest.raises(ContainerConfigError, match="container has runAsNonRoot and image will run"):
        run_as({"spec": {}}, {"securityContext": {"runAsNonRoot": True}})


def test_container_mounts_order_and_errors(tmp_path: Path) -> None:
    term = tmp_path / "t"
    container = {
        "name": "c",
        "volumeMounts": [
            {"name": "a", "mountPath": "/x/y/z"},
            {"name": "a", "mountPath": "/x", "readOnly": True},
        ],
        "terminationMessagePath": "/tmp/msg",
    }
    mounts = container_mounts(container, {"a": tmp_path}, term)
    assert [m.target for m in mounts] == ["/x", "/x/y/z", "/tmp/msg"]
    assert mounts[0].read_only and mounts[-1].source == term
    with pytest.raises(ContainerConfigError, match='volume "b" is not defined by the pod'):
        container_mounts(
            {"name": "c", "volumeMounts": [{"name": "b", "mountPath": "/b"}]}, {}, term
        )
    escape = {"name": "c", "volumeMounts": [{"name": "a", "mountPath": "/b", "subPath": "../up"}]}
    with pytest.raises(
        ContainerConfigError, match=re.escape('subPath "../up" must be a relative path')
    ):
        container_mounts(escape, {"a": tmp_path}, term)


def test_termination_message_rules() -> None:
    assert termination_message(b"file", "FallbackToLogsOnError", 1, b"log") == "file"
    assert termination_message(b"", "FallbackToLogsOnError", 1, b"a\nb\n") == "a\nb\n"
    assert termination_message(b"", "FallbackToLogsOnError", 0, b"a\n") == ""
    assert termination_message(b"", "File", 1, b"a\n") == ""
    assert len(termination_message(b"x" * 10000, "File", 0, b"")) == 4096
    many = b"".join(b"line %d\n" % i for i in range(200))
    tail = termination_message(b"", "FallbackToLogsOnError", 2, many)
    assert tail.startswith("line 120\n") and tail.endswith("line 199\n")


def test_tail_lines() -> None:
    assert tail_lines(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail_lines(b"a\nb", 5) == b"a\nb"
    assert tail_lines(b"a\n", 0) == b""


class _NoApi:
    def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if name == "cfg":
            return {"data": {"a.txt": "A"}, "binaryData": {"b.bin": "Qg=="}}
        return None

    def service_account_token(
        self, namespace: str, account: str, audience: str | None, seconds: int, pod: dict[str, Any]
    ) -> str:
        return f"token-for-{account}"


def test_prepare_volumes(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [{"name": "c"}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {
                    "name": "cfg",
                    "configMap": {"name": "cfg", "items": [{"key": "a.txt", "path": "sub/a"}]},
                },
                {
                    "name": "api",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token"}},
                            {"configMap": {"name": "cfg"}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "ns",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ]
                    },
                },
            ],
        },
    }
    dirs = prepare_volumes(pod, tmp_path, _NoApi(), {})
    assert dirs["scratch"].stat().st_mode & 0o777 == 0o777
    assert (dirs["cfg"] / "sub" / "a").read_text() == "A"
    assert (dirs["api"] / "token").read_text() == "token-for-default"
    assert (dirs["api"] / "b.bin").read_bytes() == b"B"
    assert (dirs["api"] / "ns").read_text() == "ns"
    pvc = {
        **pod,
        "spec": {
            "containers": [],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "x"}}],
        },
    }
    with pytest.raises(
        ContainerConfigError, match=r"type \['persistentVolumeClaim'\] is not supported"
    ):
        prepare_volumes(pvc, tmp_path, _NoApi(), {})
    missing = {
        **pod,
        "spec": {"containers": [], "volumes": [{"name": "v", "secret": {"secretName": "gone"}}]},
    }
    with pytest.raises(ContainerConfigError, match='secret "gone" not found'):
        prepare_volumes(missing, tmp_path, _NoApi(), {})


def test_mount_targets_create_and_remove_only_what_they_made(tmp_path: Path) -> None:
    targets = MountTargets(tmp_path / "state")
    existing = tmp_path / "exists"
    existing.mkdir()
    made = tmp_path / "new" / "deep"
    targets.acquire(str(made), is_file=False)
    targets.acquire(str(made), is_file=False)
    targets.acquire(str(existing), is_file=False)
    targets.acquire(str(tmp_path / "term-log"), is_file=True)
    assert made.is_dir() and (tmp_path / "term-log").is_file()
    targets.release(str(made))
    assert made.is_dir()  # still used once
    targets.release(str(made))
    targets.release(str(existing))
    targets.release(str(tmp_path / "term-log"))
    assert not (tmp_path / "new").exists()
    assert not (tmp_path / "term-log").exists()
    assert existing.is_dir()


def test_mount_targets_are_shared_between_nodes(tmp_path: Path) -> None:
    # Two nodes (two registries on one state dir): the target stays while either uses it.
    first, second = MountTargets(tmp_path / "state"), MountTargets(tmp_path / "state")
    target = tmp_path / "shared" / "mnt"
    first.acquire(str(target), is_file=False)
    second.acquire(str(target), is_file=False)
    first.release(str(target))
    assert target.is_dir()
    second.release(str(target))
    assert not (tmp_path / "shared").exists()
    assert list((tmp_path / "state").iterdir()) == [tmp_path / "state" / ".lock"]


def test_cluster_folder_avoids_a_small_shm(tmp_path: Path) -> None:
    """etcd preallocates 128 MB of WAL: a container's default 64 MB /dev/shm must not be used."""
    import tempfile

    assert scratch_parent(tmp_path, min_free=0) == tmp_path
    assert scratch_parent(tmp_path, min_free=1 << 62) == Path(tempfile.gettempdir())
    assert scratch_parent(tmp_path / "absent", min_free=0) == Path(tempfile.gettempdir())


def test_a_failed_tool_call_says_what_the_tool_printed_on_stderr() -> None:
    error = ToolError(1, ["kubectl", "wait"], "", "error: no matching resources found\n")
    assert "no matching resources found" in str(error)
    assert isinstance(error, subprocess.CalledProcessError)  # callers catching it still do
    assert str(ToolError(1, ["kubectl"], "", "")) == str(
        subprocess.CalledProcessError(1, ["kubectl"])
    )
