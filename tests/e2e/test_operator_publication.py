"""Publication under control, end to end (``taskhandler-operator run`` on the real control plane,
process node, PostgreSQL with Airflow's schema and git over HTTP; docs/operator.md,
"Publication under control").

* ``NoRemoval``: a revision that removes a handler (and the Dag's stub with it) is held with the
  right change (``status.pendingChange``, ``taskhandler-operator diff``); an approval of another
  revision is refused with an Event; the approval of the pending one publishes it.
* ``Manual``: a harmless change (one binding added) is held until approved; a rollback
  (``taskhandler-operator rollback``) restores the earlier rows exactly with no probe Job.
* The history lists each step, in ``status.publications`` and in ``thop_publication``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.serialized_dags import dag_document, insert_dag, python_task
from taskhandler_operator.kube import names
from tests.e2e.operator_env import (
    Operator,
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    events,
    git_bundle,
    go_handlers,
    probe_jobs,
    reconcile_now,
    seed_dags,
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
PUBLISHED = "BindingsPublished"


def cli(cluster: KubeCluster, database: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The real ``taskhandler-operator`` console script, as a person runs it."""
    script = Path(sys.executable).parent / "taskhandler-operator"
    return subprocess.run(
        [str(script), *argv, "--kubeconfig", str(cluster.kubeconfig), "--url", database],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def annotate(cluster: KubeCluster, namespace: str, key: str, value: str | None) -> None:
    setting = f"{key}-" if value is None else f"{key}={value}"
    cluster.kubectl("annotate", "--overwrite", "thb", NAME, "-n", namespace, setting)


def published(status: Mapping[str, Any]) -> dict[str, Any]:
    return condition(status, PUBLISHED) or {}


def is_held(status: Mapping[str, Any], revision_part: str) -> bool:
    pending = status.get("pendingChange") or {}
    return published(status).get("reason") == "PublishHeld" and revision_part in str(
        pending.get("revision") or ""
    )


def binding_rows(database: str) -> list[tuple[Any, ...]]:
    """Every column of the bundle's binding rows, with the bound artifact's path and digest."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT b.*, a.relative_fileloc, a.cache_digest "
                    "FROM lang_sdk_task_handler b "
                    "JOIN lang_sdk_task_handler_artifact a ON a.id = b.artifact_id "
                    "WHERE a.bundle_name = :b ORDER BY b.dag_id, b.task_id"
                ),
                {"b": NAME},
            ).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]


def history(database: str) -> list[tuple[str, str | None, int, int, int, int]]:
    """``thop_publication``, newest first: (kind, revision, added, removed, moved, changed)."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT kind, revision, added, removed, moved, changed "
                    "FROM thop_publication WHERE bundle_name = :b AND kind <> 'held' "
                    "ORDER BY id DESC"
                ),
                {"b": NAME},
            ).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]


def approvers(database: str) -> list[str | None]:
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT approved_by FROM thop_publication WHERE bundle_name = :b "
                    "AND kind = 'approved' ORDER BY id"
                ),
                {"b": NAME},
            ).scalars()
            return list(found)
    finally:
        engine.dispose()


def status_history(status: Mapping[str, Any]) -> list[str]:
    """``status.publications`` as ``kind revision`` (the revisions shortened by the caller)."""
    return [f"{p.get('kind')} {p.get('revision')}" for p in status.get("publications") or ()]


def wait_event(
    cluster: KubeCluster, namespace: str, op: Operator, reason: str, part: str
) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen(_: dict[str, Any]) -> bool:
        found[:] = [
            e
            for e in events(cluster, namespace, NAME)
            if e.get("reason") == reason and part in (e.get("note") or "")
        ]
        return bool(found)

    wait_status(cluster, namespace, NAME, op, f"Event {reason} ({part})", seen)
    return found[0]


@pytest.mark.timeout(900)  # several passes, a probe Job each step under load
def test_no_removal_holds_a_removed_handler_until_its_revision_is_approved(
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
        {"orders_etl": [("extract", "go"), ("load", "go")], "cleanup": [("purge", "go")]},
    )
    first = commit_files(
        git_repo,
        {
            "go/extract": go_handlers(runtime_factory, ("orders_etl", "extract")),
            "go/load": go_handlers(runtime_factory, ("orders_etl", "load")),
            "go/purge": go_handlers(runtime_factory, ("cleanup", "purge")),
        },
        "three artifacts",
    )
    op = start([namespace])
    manifest = git_bundle(
        namespace, NAME, language="go", url=git_repo.http_url(source_http), path="go"
    )
    manifest["spec"]["publish"] = {"policy": "NoRemoval"}
    apply(kube_cluster, manifest)
    # Adding bindings needs no approval under NoRemoval.
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        f"published {first}",
        lambda s: (
            first in (s.get("publishedRevision") or "") and published(s).get("status") == "True"
        ),
    )
    rows = bindings(migrated, NAME)
    assert set(rows) == {("orders_etl", "extract"), ("orders_etl", "load"), ("cleanup", "purge")}
    assert not status.get("pendingChange"), status
    first_revision = str(status["publishedRevision"])
    jobs = probe_jobs(kube_cluster, namespace, NAME)

    # The purge handler goes (its stub still there: reported unbound, rows kept as today) ...
    removal = commit_files(git_repo, {"go/purge": None}, "purge removed")
    reconcile_now(kube_cluster, namespace, NAME, op)
    # ... and the cleanup Dag's purge stops being a stub: the pass would remove its binding.
    engine = sa.create_engine(migrated)
    with engine.begin() as conn:
        insert_dag(conn, dag_document("cleanup", [python_task("purge")]))
    engine.dispose()
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster, namespace, NAME, op, "held the removal", lambda s: is_held(s, removal)
    )
    condition_ = published(status)
    assert condition_["status"] == "False"
    assert "cleanup/purge" in condition_["message"], condition_
    pending = status["pendingChange"]
    held_revision = str(pending["revision"])
    assert pending["counts"]["removed"] == 1 and pending["counts"].get("added", 0) == 0
    assert [line.split(": was")[0] for line in pending["first"]] == ["removed cleanup/purge"]
    assert "NoRemoval" in pending["reason"] and pending.get("omitted", 0) == 0, pending
    # The published rows stay while it is held.
    assert bindings(migrated, NAME) == rows

    # The CLI prints the whole change set, one binding a line.
    done = cli(kube_cluster, migrated, "diff", f"{namespace}/{NAME}")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("removed cleanup/purge: was purge"), done.stdout
    assert f"revision {held_revision}" in done.stdout
    document = json.loads(
        cli(kube_cluster, migrated, "diff", f"{namespace}/{NAME}", "--json").stdout
    )
    assert document["state"] == "pending" and document["revision"] == held_revision
    assert [(c["kind"], c["dag_id"], c["task_id"]) for c in document["changes"]] == [
        ("removed", "cleanup", "purge")
    ]

    # An approval of another revision (the first one: stale) is refused with an Event. (Not
    # publishedRevision: the pass that reported purge unbound published the other Dags' rows
    # at the removal's revision.)
    stale = first_revision
    assert held_revision != stale
    annotate(kube_cluster, namespace, names.ANNOTATION_APPROVE_REVISION, stale)
    reconcile_now(kube_cluster, namespace, NAME, op)
    refused = wait_event(kube_cluster, namespace, op, "ApprovalRefused", stale)
    assert held_revision in refused["note"] and refused["type"] == "Warning"
    assert bindings(migrated, NAME) == rows
    assert is_held(reconcile_now(kube_cluster, namespace, NAME, op), removal)

    # The approval of the pending revision publishes exactly that change.
    annotate(kube_cluster, namespace, names.ANNOTATION_APPROVE_REVISION, held_revision)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "published the approved change",
        lambda s: published(s).get("status") == "True" and not s.get("pendingChange"),
    )
    assert bindings(migrated, NAME) == {
        ("orders_etl", "extract"): "extract",
        ("orders_etl", "load"): "load",
    }
    changed = wait_event(kube_cluster, namespace, op, "BindingsChanged", "removed")
    assert "cleanup/purge" in changed["note"]
    # The history: the first publication, then the approved removal (no probe Job for it).
    assert [h[:1] + h[2:] for h in history(migrated)] == [
        ("approved", 0, 1, 0, 0),
        ("published", 3, 0, 0, 0),
    ]
    assert removal in str(history(migrated)[0][1]) and first in str(history(migrated)[1][1])
    assert approvers(migrated) and approvers(migrated)[0], "the approval names who set it"
    assert [p.split()[0] for p in status_history(status)] == ["approved", "published"]
    assert probe_jobs(kube_cluster, namespace, NAME) == jobs


@pytest.mark.timeout(900)
def test_manual_holds_a_harmless_change_and_a_rollback_restores_the_rows_without_a_probe(
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
        {"orders_etl": [("extract", "go"), ("load", "go")], "reports": [("summary", "go")]},
    )
    first = commit_files(
        git_repo,
        {
            "go/extract": go_handlers(runtime_factory, ("orders_etl", "extract")),
            "go/load": go_handlers(runtime_factory, ("orders_etl", "load")),
        },
        "two artifacts; reports.summary not served yet",
    )
    op = start([namespace])
    manifest = git_bundle(
        namespace, NAME, language="go", url=git_repo.http_url(source_http), path="go"
    )
    manifest["spec"]["publish"] = {"policy": "Manual"}
    apply(kube_cluster, manifest)

    def approve(revision_part: str) -> dict[str, Any]:
        status = wait_status(
            kube_cluster,
            namespace,
            NAME,
            op,
            f"held {revision_part}",
            lambda s: is_held(s, revision_part),
        )
        revision = str(status["pendingChange"]["revision"])
        annotate(kube_cluster, namespace, names.ANNOTATION_APPROVE_REVISION, revision)
        return wait_status(
            kube_cluster,
            namespace,
            NAME,
            op,
            f"published the approved {revision_part}",
            lambda s: (
                revision_part in (s.get("publishedRevision") or "") and not s.get("pendingChange")
            ),
        )

    # Manual holds even the first publication until approved.
    approve(first)
    before = binding_rows(migrated)
    assert [(r[-2]) for r in before] == ["extract", "load"]

    # A harmless change: one artifact added, serving the unbound stub. Held, rows untouched.
    added = commit_files(
        git_repo,
        {"go/summary": go_handlers(runtime_factory, ("reports", "summary"))},
        "summary served",
    )
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster, namespace, NAME, op, "held the addition", lambda s: is_held(s, added)
    )
    assert status["pendingChange"]["counts"]["added"] == 1
    assert status["pendingChange"]["counts"].get("removed", 0) == 0
    assert binding_rows(migrated) == before
    approve(added)
    assert len(binding_rows(migrated)) == 3
    jobs = probe_jobs(kube_cluster, namespace, NAME)

    # Roll back with the CLI: by default to the publication before the current one.
    done = cli(kube_cluster, migrated, "rollback", f"{namespace}/{NAME}")
    assert done.returncode == 0, done.stderr
    assert f"{names.ANNOTATION_ROLLBACK_TO}=" in done.stdout and first in done.stdout
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "rolled back",
        lambda s: (
            binding_rows(migrated) == before
            and (s.get("publications") or [{}])[0].get("kind") == "rolled_back"
        ),
    )
    # The rows are exactly the earlier ones (every column), and no probe Job ran for it.
    assert binding_rows(migrated) == before
    assert probe_jobs(kube_cluster, namespace, NAME) == jobs
    # It holds there: another pass keeps the rolled-back rows.
    reconcile_now(kube_cluster, namespace, NAME, op)
    assert binding_rows(migrated) == before
    # The history lists each step, newest first.
    steps = history(migrated)
    assert [(h[0], h[2], h[3]) for h in steps] == [
        ("rolled_back", 0, 1),
        ("approved", 1, 0),
        ("approved", 2, 0),
    ]
    assert first in str(steps[0][1]) and added in str(steps[1][1]) and first in str(steps[2][1])
    assert [p.split()[0] for p in status_history(status)] == [
        "rolled_back",
        "approved",
        "approved",
    ]
