"""A bundle cannot read what is not its own (issue 20, deliverable 13), end to end: the real
operator process on the real control plane, volume sources allowed below one root only.

Before, ``spec.source.volume.path`` accepted any absolute path of the operator's file system:
a tenant pointed it at another namespace's revisions in the operator's store (and had them
served back through its own probe image), at the operator's mounted Secrets, or at ``/proc``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.manifests import bundle_manifest
from tests.e2e.operator_env import (
    Operator,
    apply,
    condition,
    probe_jobs,
    row_counts,
    start_operator,
    wait_status,
)

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]


def volume_bundle(namespace: str, name: str, path: Path | str) -> dict[str, Any]:
    return bundle_manifest(
        namespace, name, language="go", source={"volume": {"path": str(path)}}, queues=[name]
    )


def source_ready(status: dict[str, Any]) -> dict[str, Any]:
    return condition(status, "SourceReady") or {}


def wait_source(
    cluster: KubeCluster, namespace: str, name: str, op: Operator, reason: str
) -> dict[str, Any]:
    return wait_status(
        cluster,
        namespace,
        name,
        op,
        f"SourceReady reason {reason}",
        lambda s: source_ready(s).get("reason") == reason,
    )


def revisions_of(store: Path, namespace: str, name: str) -> list[str]:
    folder = store / namespace / name
    return (
        sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        if (folder.is_dir())
        else []
    )


def test_volume_sources_read_only_below_the_allowed_roots(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    tmp_path: Path,
) -> None:
    allowed = tmp_path / "bundles"
    (allowed / "victim").mkdir(parents=True)
    (allowed / "victim" / "handlers.txt").write_text("the other team's artifacts")
    (allowed / "own").mkdir()
    (allowed / "own" / "README.md").write_text("ours")
    (tmp_path / "elsewhere").mkdir()
    secrets = tmp_path / "operator-secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "signing-key").write_text(os.urandom(32).hex())
    workdir = tmp_path / "operator"
    workdir.mkdir()
    store = workdir / "revisions"
    op = start_operator(
        kube_cluster,
        [namespace, second_namespace],
        migrated,
        workdir,
        THOP_VOLUME_ROOTS=str(allowed),
        THOP_SIGNING_KEY_FILE=str(secrets / "signing-key"),
    )
    try:
        # The other namespace's bundle: its revision lands in the operator's store.
        apply(kube_cluster, volume_bundle(second_namespace, "victim", allowed / "victim"))
        wait_source(kube_cluster, second_namespace, "victim", op, "Synced")
        (victim_revision,) = revisions_of(store, second_namespace, "victim")
        victim_files = store / second_namespace / "victim" / victim_revision
        assert (victim_files / "handlers.txt").is_file()

        # A folder below the allowed root is read as before.
        apply(kube_cluster, volume_bundle(namespace, "own", allowed / "own"))
        wait_source(kube_cluster, namespace, "own", op, "Synced")

        (allowed / "shortcut").symlink_to(store / second_namespace)
        escapes: dict[str, tuple[Path | str, str]] = {
            "store-escape": (victim_files, "overlaps"),
            "secret-escape": (secrets, "overlaps"),
            "symlink-escape": (allowed / "shortcut" / "victim", "resolves to"),
            "proc-escape": ("/proc/self", "overlaps /proc"),
            "outside-escape": (tmp_path / "elsewhere", "outside the folders"),
        }
        for name, (path, _) in escapes.items():
            apply(kube_cluster, volume_bundle(namespace, name, path))
        for name, (_, words) in escapes.items():
            status = wait_source(kube_cluster, namespace, name, op, "VolumeNotAllowed")
            message = source_ready(status)["message"]
            assert words in message, message
            assert "THOP_VOLUME_ROOTS" in message or "never read" in message, message
            ready = condition(status, "Ready") or {}
            assert ready.get("status") == "False", status
            assert not status.get("revision"), status
            # No revision, no probe Job, no row.
            assert revisions_of(store, namespace, name) == []
            assert probe_jobs(kube_cluster, namespace, name) == []
            assert row_counts(migrated, name) == {"artifacts": 0, "bindings": 0, "problems": 0}
        # Nothing was copied out of the victim's revision or the Secret folder.
        copied = [
            p
            for p in (store / namespace).rglob("*")
            if p.name in ("handlers.txt", "signing-key") or p.name == "status"
        ]
        assert copied == []
    finally:
        op.stop()


def test_no_roots_refuses_every_volume_source(
    kube_cluster: KubeCluster, namespace: str, migrated: str, tmp_path: Path
) -> None:
    """The default: an operator given no roots reads no volume, and says how to allow one."""
    folder = tmp_path / "bundles" / "team"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("hello")
    workdir = tmp_path / "operator"
    workdir.mkdir()
    op = start_operator(kube_cluster, [namespace], migrated, workdir)
    try:
        apply(kube_cluster, volume_bundle(namespace, "team", folder))
        status = wait_source(kube_cluster, namespace, "team", op, "VolumeNotAllowed")
        message = source_ready(status)["message"]
        assert "allows no volume sources" in message and "THOP_VOLUME_ROOTS" in message
        assert revisions_of(workdir / "revisions", namespace, "team") == []
    finally:
        op.stop()
