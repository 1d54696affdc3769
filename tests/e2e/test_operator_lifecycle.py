"""A bundle's lifecycle end to end: ``deletionPolicy`` on deletion (``Delete`` removes the
bundle's rows, ``Orphan`` keeps them; the finalizer goes, the resource disappears, its Jobs go
by garbage collection), and the informational ``DagBundleInSync`` condition against Airflow's
``dag_bundle`` row (which never makes the bundle un-Ready)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.e2e.operator_env import (
    WAIT_SECONDS,
    StartOperator,
    apply,
    commit_files,
    condition,
    events,
    get_status,
    git_bundle,
    handler_spec,
    probe_jobs,
    reconcile_now,
    row_counts,
    seed_dags,
    wait_ready,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]


def test_deletion_policy_delete_and_orphan(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"dropped": [("a", "qdel")], "kept": [("b", "qorph")]})
    commit_files(
        git_repo,
        {
            "del/a": Path(runtime_factory("go", spec=handler_spec(("dropped", "a")))).read_bytes(),
            "orph/b": Path(runtime_factory("go", spec=handler_spec(("kept", "b")))).read_bytes(),
        },
        "two bundles",
    )
    url = git_repo.http_url(source_http)
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(namespace, "drop", language="go", url=url, path="del", queues=["qdel"]),
    )
    apply(
        kube_cluster,
        git_bundle(
            namespace,
            "keep",
            language="go",
            url=url,
            path="orph",
            queues=["qorph"],
            deletionPolicy="Orphan",
        ),
    )
    for name in ("drop", "keep"):
        wait_ready(kube_cluster, namespace, name, op)
        finalizers = kube_cluster.kubectl(
            "get", "thb", name, "-n", namespace, "-o", "jsonpath={.metadata.finalizers}"
        ).stdout
        assert f"{names.GROUP}/finalizer" in finalizers, finalizers
    assert row_counts(migrated, "drop")["bindings"] == 1
    kept = row_counts(migrated, "keep")
    assert kept["bindings"] == 1 and kept["artifacts"] == 1
    assert probe_jobs(kube_cluster, namespace, "drop") and probe_jobs(
        kube_cluster, namespace, "keep"
    )

    for name in ("drop", "keep"):
        # kubectl returns once the finalizer is gone and the object with it.
        kube_cluster.kubectl(
            "delete",
            "thb",
            name,
            "-n",
            namespace,
            f"--timeout={WAIT_SECONDS}s",
            timeout=WAIT_SECONDS + 20,
        )
        gone = kube_cluster.kubectl("get", "thb", name, "-n", namespace, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone
    assert row_counts(migrated, "drop") == {"artifacts": 0, "bindings": 0, "problems": 0}
    assert row_counts(migrated, "keep") == kept
    # Jobs go by garbage collection (owner references): bounded wait, no timing assumption.
    deadline = time.monotonic() + WAIT_SECONDS
    while probe_jobs(kube_cluster, namespace) and time.monotonic() < deadline:
        time.sleep(1)
    assert probe_jobs(kube_cluster, namespace) == []
    assert op.proc.poll() is None, op.tail()


def test_dag_bundle_in_sync_is_reported_and_never_blocks_ready(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders": [("extract", "go")]})
    commit = commit_files(
        git_repo,
        {
            "go/extract": Path(
                runtime_factory("go", spec=handler_spec(("orders", "extract")))
            ).read_bytes()
        },
        "one artifact",
    )
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(
            namespace, "synced", language="go", url=git_repo.http_url(source_http), path="go"
        ),
    )
    wait_ready(kube_cluster, namespace, "synced", op)

    # Airflow has no DagBundle "synced": reported, but Ready stays True (informational).
    status = get_status(kube_cluster, namespace, "synced")
    in_sync = condition(status, "DagBundleInSync") or {}
    assert (in_sync.get("status"), in_sync.get("reason")) == ("False", "UnknownDagBundle"), status
    assert (condition(status, "Ready") or {}).get("status") == "True"

    engine = sa.create_engine(migrated)

    def set_version(version: str) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM dag_bundle WHERE name = 'synced'"))
            conn.execute(
                sa.text(
                    "INSERT INTO dag_bundle (name, active, version) VALUES ('synced', true, :v)"
                ),
                {"v": version},
            )

    try:
        # Airflow's GitDagBundle records the bare commit the bindings were probed at.
        set_version(commit)
        status = reconcile_now(kube_cluster, namespace, "synced", op)
        in_sync = condition(status, "DagBundleInSync") or {}
        assert (in_sync["status"], in_sync["reason"]) == ("True", "InSync"), in_sync
        assert commit in in_sync["message"]

        # Airflow moved on to another commit: Drift names both, a Warning Event once.
        other = "0" * 40
        set_version(other)
        for _ in range(2):
            status = reconcile_now(kube_cluster, namespace, "synced", op)
        in_sync = condition(status, "DagBundleInSync") or {}
        assert (in_sync["status"], in_sync["reason"]) == ("False", "Drift"), in_sync
        assert commit in in_sync["message"] and other in in_sync["message"], in_sync
        assert (condition(status, "Ready") or {}).get("status") == "True", status
        drift = [
            e for e in events(kube_cluster, namespace, "synced") if e["reason"] == "DagBundleDrift"
        ]
        assert len(drift) == 1 and drift[0]["type"] == "Warning", drift
    finally:
        engine.dispose()
    assert op.proc.poll() is None, op.tail()
