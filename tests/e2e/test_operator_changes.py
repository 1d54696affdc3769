"""A bundle following its git source, end to end (``taskhandler-operator run`` on the real
control plane, process node, PostgreSQL with Airflow's schema and git over HTTP).

A commit changing one artifact creates exactly one probe Job and republishes that artifact's
binding; a commit changing nothing creates none; removing an artifact (and the stub it served)
removes its rows; a stub whose handler disappears is reported unbound with its reason while its
Dag keeps its rows (DESIGN §3.6).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.serialized_dags import dag_document, insert_dag, python_task
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    git_bundle,
    handler_spec,
    job_artifacts,
    probe_jobs,
    reconcile_now,
    row_counts,
    seed_dags,
    wait_ready,
    wait_status,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

NAME = "orders"


def probe_revisions(database: str) -> dict[str, str | None]:
    """``relative_fileloc -> revision`` the artifact was last probed at."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT a.relative_fileloc, p.revision FROM thop_artifact_probe p "
                    "JOIN lang_sdk_task_handler_artifact a ON a.id = p.artifact_id "
                    "WHERE a.bundle_name = :b"
                ),
                {"b": NAME},
            ).all()
    finally:
        engine.dispose()
    return {r.relative_fileloc: r.revision for r in rows}


def test_commits_change_exactly_what_they_touch(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(
        migrated,
        {
            "orders_etl": [("extract", "go"), ("load", "go")],
            "cleanup": [("purge", "go")],
        },
    )

    def go(*keys: tuple[str, str]) -> bytes:
        return Path(runtime_factory("go", spec=handler_spec(*keys))).read_bytes()

    commit_files(
        git_repo,
        {
            "go/extract": go(("orders_etl", "extract")),
            "go/load": go(("orders_etl", "load")),
            "go/purge": go(("cleanup", "purge")),
        },
        "three artifacts",
    )
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(namespace, NAME, language="go", url=git_repo.http_url(source_http), path="go"),
    )
    wait_ready(kube_cluster, namespace, NAME, op)
    first_jobs = probe_jobs(kube_cluster, namespace, NAME)
    assert job_artifacts(kube_cluster, namespace, first_jobs) == ["extract", "load", "purge"]
    assert bindings(migrated, NAME) == {
        ("orders_etl", "extract"): "extract",
        ("orders_etl", "load"): "load",
        ("cleanup", "purge"): "purge",
    }
    before = probe_revisions(migrated)

    # 1. One artifact changes (it declares one more handler): exactly one new Job, for it.
    commit = commit_files(
        git_repo,
        {"go/load": go(("orders_etl", "load"), ("reports", "summary"))},
        "load grows a handler",
    )
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        f"published {commit}",
        lambda s: (
            commit in (s.get("publishedRevision") or "")
            and (condition(s, "Ready") or {}).get("status") == "True"
        ),
    )
    jobs = probe_jobs(kube_cluster, namespace, NAME)
    new = sorted(set(jobs) - set(first_jobs))
    assert len(new) == 1, (first_jobs, jobs)
    assert job_artifacts(kube_cluster, namespace, new) == ["load"]
    # The pass that probed "load" says 1 probed, 2 cached; the finished Job's own events may wake
    # one more pass before this read, which reuses all three answers. Either way exactly one
    # new Job ran (above), and nothing else was probed.
    counts = status["counts"]
    assert (counts["probed"], counts["cached"]) in {(1, 2), (0, 3)}, counts
    assert status["counts"]["handlers"] == 4
    after = probe_revisions(migrated)
    assert after["load"] != before["load"] and after["load"] is not None
    assert commit in after["load"]  # republished at the new revision
    assert after["extract"] == before["extract"] and after["purge"] == before["purge"]
    assert bindings(migrated, NAME)[("orders_etl", "load")] == "load"

    # 2. A commit that changes nothing under the bundle's path: no Job.
    docs = commit_files(git_repo, {"README.md": b"docs only"}, "docs", executable=False)
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        f"published {docs}",
        lambda s: docs in (s.get("publishedRevision") or ""),
    )
    assert probe_jobs(kube_cluster, namespace, NAME) == jobs
    assert status["counts"]["probed"] == 0 and status["counts"]["cached"] == 3

    # 3. The purge artifact goes, and the cleanup Dag's purge is no longer a stub: its rows go.
    engine = sa.create_engine(migrated)
    with engine.begin() as conn:
        insert_dag(conn, dag_document("cleanup", [python_task("purge")]))
    engine.dispose()
    gone = commit_files(git_repo, {"go/purge": None}, "purge removed")
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        f"published {gone}",
        lambda s: gone in (s.get("publishedRevision") or ""),
    )
    assert (condition(status, "Ready") or {}).get("status") == "True", status
    assert bindings(migrated, NAME) == {
        ("orders_etl", "extract"): "extract",
        ("orders_etl", "load"): "load",
    }
    assert row_counts(migrated, NAME)["artifacts"] == 2
    assert probe_jobs(kube_cluster, namespace, NAME) == jobs

    # 4. The load artifact goes while its stub stays: reported unbound with its reason; the
    # orders_etl Dag keeps its rows (a Dag with problems is left untouched).
    unbound = commit_files(git_repo, {"go/load": None}, "load removed")
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "reported the unbound stub",
        lambda s: (
            unbound in (s.get("revision") or "")
            and (condition(s, "BindingsPublished") or {}).get("reason") == "StubsUnbound"
        ),
    )
    published = condition(status, "BindingsPublished") or {}
    assert published["status"] == "False"
    assert "1 stub unbound" in published["message"], published
    problems = [p for p in status["problems"] if p.get("kind") == "unbound"]
    assert [(p["dagId"], p["taskId"]) for p in problems] == [("orders_etl", "load")], status
    assert problems[0]["severity"] == "error" and problems[0]["message"], problems
    assert status["counts"]["unboundStubs"] == 1
    assert (condition(status, "Ready") or {}).get("reason") == "StubsUnbound"
    assert bindings(migrated, NAME) == {
        ("orders_etl", "extract"): "extract",
        ("orders_etl", "load"): "load",
    }
    assert op.proc.poll() is None, op.tail()
