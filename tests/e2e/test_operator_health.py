"""Health a machine can read, end to end (issue 20, items 4, 7 and 10).

* kstatus itself (``status.Compute`` of sigs.k8s.io/cli-utils, built by hack/build-kstatus.sh)
  reads the TaskHandlerBundles the control plane returns: a Ready bundle is ``Current``; a Go
  bundle on a queue whose stubs no artifact registers is ``Failed`` (Stalled, StubsUnbound),
  not ``InProgress`` forever; a bundle whose probe Jobs cannot start is ``InProgress``
  (Reconciling, Probing) instead of silent.
* A status someone else patched (``kubectl patch --subresource=status``) is restored by the
  next pass.
* An unexpected error (a ProgrammingError from Airflow's ``dag_bundle`` table with a renamed
  column, on the real PostgreSQL) becomes an ``InternalError`` condition; the bundle's loop keeps
  running and heals by its back-off once the table is fixed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    commit_files,
    condition,
    get_bundle,
    get_status,
    git_bundle,
    go_handlers,
    reconcile_now,
    seed_dags,
    stalled,
    wait_ready,
    wait_status,
)
from tests.fixtures.kstatus import kstatus
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
    # Three bundles with probe Jobs on a shared 2-core machine: more than the 300 s default.
    pytest.mark.timeout(600),
]


def reason(status: dict[str, Any], type_: str) -> str | None:
    found = condition(status, type_)
    return None if found is None else str(found.get("reason"))


def test_kstatus_reads_ready_stalled_and_probing_bundles_truthfully(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(
        migrated,
        {
            "orders": [("extract", "go")],
            "reports": [("render", "java")],
            "later": [("late", "late")],
        },
    )
    commit_files(
        git_repo,
        {
            "go/extract": go_handlers(runtime_factory, ("orders", "extract")),
            # A Go artifact on the java queue that registers nothing its stubs need.
            "wrong/other": go_handlers(runtime_factory, ("orders", "unrelated")),
            "late/late": go_handlers(runtime_factory, ("later", "late")),
        },
        "artifacts",
    )
    url = git_repo.http_url(source_http)
    # In the second namespace probe pods cannot start: the service account they run as is gone,
    # so admission refuses every pod the Job controller makes.
    kube_cluster.kubectl("delete", "serviceaccount", "taskhandler-probe", "-n", second_namespace)
    op = start([namespace, second_namespace])
    apply(kube_cluster, git_bundle(namespace, "ready", language="go", url=url, path="go"))
    apply(
        kube_cluster,
        git_bundle(namespace, "unbound", language="go", url=url, path="wrong", queues=["java"]),
    )
    apply(
        kube_cluster,
        git_bundle(
            second_namespace, "blocked", language="go", url=url, path="late", queues=["late"]
        ),
    )

    wait_ready(kube_cluster, namespace, "ready", op)
    assert kstatus(get_bundle(kube_cluster, namespace, "ready")) == ("Current", "Resource is Ready")

    unbound = wait_status(
        kube_cluster,
        namespace,
        "unbound",
        op,
        "Stalled on StubsUnbound",
        lambda s: stalled(s).get("reason") == "StubsUnbound",
    )
    assert condition(unbound, "Reconciling") is None
    verdict, message = kstatus(get_bundle(kube_cluster, namespace, "unbound"))
    assert verdict == "Failed", (verdict, message)
    assert "reports.render" in message or "render" in message, message

    blocked = wait_status(
        kube_cluster,
        second_namespace,
        "blocked",
        op,
        "Reconciling while its probe Job cannot start",
        lambda s: reason(s, "Reconciling") == "Probing",
    )
    assert reason(blocked, "Ready") == "Probing"
    assert [(a["path"], a["state"]) for a in blocked["artifacts"]] == [("late", "Probing")]
    verdict, message = kstatus(get_bundle(kube_cluster, second_namespace, "blocked"))
    reconciling = condition(blocked, "Reconciling") or {}
    assert (verdict, message) == ("InProgress", reconciling.get("message"))


def test_a_hand_patched_status_is_restored_and_an_unexpected_error_heals(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders": [("extract", "go")]})
    commit_files(
        git_repo, {"go/extract": go_handlers(runtime_factory, ("orders", "extract"))}, "go"
    )
    url = git_repo.http_url(source_http)
    op = start([namespace])
    apply(kube_cluster, git_bundle(namespace, "etl", language="go", url=url, path="go"))
    wait_ready(kube_cluster, namespace, "etl", op)
    good = get_status(kube_cluster, namespace, "etl")

    # Someone else writes the status: a late PATCH of an old leader, a restore, a person.
    forged = {
        "status": {
            "counts": {"bindings": 99},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "Forged",
                    "message": "written by hand",
                    "lastTransitionTime": "2020-01-01T00:00:00Z",
                }
            ],
            "problems": [{"severity": "error", "kind": "unbound", "message": "forged"}],
        }
    }
    kube_cluster.kubectl(
        "patch",
        "thb",
        "etl",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(forged),
    )
    assert get_status(kube_cluster, namespace, "etl")["counts"]["bindings"] == 99
    restored = reconcile_now(kube_cluster, namespace, "etl", op)
    # (The answer is now reused rather than probed: cached and probed differ, nothing else.)
    for key in ("bindings", "handlers", "candidates", "unboundStubs"):
        assert restored["counts"].get(key) == good["counts"].get(key), key
    assert restored.get("problems", []) == good.get("problems", [])
    assert {c["type"]: (c["status"], c["reason"]) for c in restored["conditions"]} == {
        c["type"]: (c["status"], c["reason"]) for c in good["conditions"]
    }
    assert kstatus(get_bundle(kube_cluster, namespace, "etl"))[0] == "Current"

    # A real fault no step expects: Airflow's dag_bundle table of another shape.
    engine = sa.create_engine(migrated)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE dag_bundle RENAME COLUMN version TO version_moved"))
        broken = reconcile_now(kube_cluster, namespace, "etl", op)
        in_sync = condition(broken, "DagBundleInSync") or {}
        assert (in_sync.get("status"), in_sync.get("reason")) == ("Unknown", "InternalError")
        assert in_sync["message"].startswith("ProgrammingError: "), in_sync
        assert reason(broken, "Ready") == "Succeeded"  # informational: the bindings are fine
        assert op.proc.poll() is None
        assert "Traceback" in op.log.read_text(errors="replace")
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE dag_bundle RENAME COLUMN version_moved TO version"))
    finally:
        engine.dispose()
    # Healed by the back-off's retry alone (no reconcile request; the interval is an hour).
    healed = wait_status(
        kube_cluster,
        namespace,
        "etl",
        op,
        "healed after the table was fixed",
        lambda s: reason(s, "DagBundleInSync") not in (None, "InternalError"),
    )
    assert reason(healed, "Ready") == "Succeeded"
    assert op.proc.poll() is None
