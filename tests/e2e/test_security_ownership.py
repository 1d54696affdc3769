"""A bundle in another namespace cannot take what it does not own (extends
test_operator_conflicts.py, which covers the stall and the take-over after the owner goes).

An intruder in a second namespace names the owner's queue and ships an artifact claiming the
owner's task; an impostor there names the owner's ``bundleName``. Both are Stalled naming the
owner; the database's claims (``thop_bundle_claim``, ``thop_queue_claim``) and the bindings stay
the owner's, through their reconcile requests and through their deletion with
``deletionPolicy: Delete`` — deleting a resource never frees or removes what it never owned.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    get_status,
    git_bundle,
    go_handlers,
    reconcile_now,
    row_counts,
    seed_dags,
    stalled,
    wait_ready,
    wait_stalled,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]


def claims(database: str) -> dict[str, Any]:
    """Bundle claims (name -> (namespace, resource)) and queue claims (queue -> bundle name)."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            owners = conn.execute(
                sa.text("SELECT bundle_name, namespace, name FROM thop_bundle_claim")
            ).all()
            queues = conn.execute(sa.text("SELECT queue, bundle_name FROM thop_queue_claim")).all()
    finally:
        engine.dispose()
    return {
        "bundles": {r.bundle_name: (r.namespace, r.name) for r in owners},
        "queues": {r.queue: r.bundle_name for r in queues},
    }


def test_another_namespace_cannot_take_a_queue_or_name_it_does_not_own(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders": [("extract", "sec-q")]})
    claiming = go_handlers(runtime_factory, ("orders", "extract"))
    commit_files(git_repo, {"owner/extract": claiming, "intruder/take": claiming}, "artifacts")
    url = git_repo.http_url(source_http)
    op = start([namespace, second_namespace])

    owner = git_bundle(
        namespace,
        "owner",
        language="go",
        url=url,
        path="owner",
        queues=["sec-q"],
        bundle_name="owned",
    )
    apply(kube_cluster, owner)
    wait_ready(kube_cluster, namespace, "owner", op)
    before = claims(migrated)
    assert before["bundles"] == {"owned": (namespace, "owner")}
    assert before["queues"] == {"sec-q": "owned"}
    assert bindings(migrated) == {("orders", "extract"): "extract"}

    # The intruder: the owner's queue, an artifact claiming the owner's task. The impostor:
    # the owner's bundle name. Both in the other namespace, both deleting their rows on exit.
    intruder = git_bundle(
        second_namespace,
        "intruder",
        language="go",
        url=url,
        path="intruder",
        queues=["sec-q"],
        deletionPolicy="Delete",
    )
    impostor = git_bundle(
        second_namespace,
        "impostor",
        language="go",
        url=url,
        path="intruder",
        queues=["spare-q"],
        bundle_name="owned",
        deletionPolicy="Delete",
    )
    apply(kube_cluster, intruder)
    apply(kube_cluster, impostor)
    for name, reason in (("intruder", "QueueConflict"), ("impostor", "BundleNameConflict")):
        status = wait_stalled(kube_cluster, second_namespace, name, op, reason)
        message = stalled(status)["message"]
        assert "owner" in message and namespace in message, message
        assert (condition(status, "Ready") or {}).get("status") == "False"
        # Asking again changes nothing.
        again = reconcile_now(kube_cluster, second_namespace, name, op)
        assert stalled(again).get("reason") == reason, again

    assert claims(migrated) == before
    assert bindings(migrated) == {("orders", "extract"): "extract"}
    assert bindings(migrated, "owned") == {("orders", "extract"): "extract"}
    assert row_counts(migrated, "intruder") == {"artifacts": 0, "bindings": 0, "problems": 0}
    owner_status = reconcile_now(kube_cluster, namespace, "owner", op)
    assert (condition(owner_status, "Ready") or {}).get("status") == "True", owner_status
    assert not stalled(owner_status), owner_status

    # Deleting them (deletionPolicy Delete) frees and removes nothing of the owner's.
    for name in ("intruder", "impostor"):
        kube_cluster.kubectl("delete", "thb", name, "-n", second_namespace, "--timeout=120s")
    assert claims(migrated) == before
    assert bindings(migrated, "owned") == {("orders", "extract"): "extract"}
    assert row_counts(migrated, "owned")["artifacts"] == 1
    after = reconcile_now(kube_cluster, namespace, "owner", op)
    assert (condition(after, "Ready") or {}).get("status") == "True", after
    assert get_status(kube_cluster, namespace, "owner")["counts"]["bindings"] == 1
    assert "belongs to another resource; nothing removed" in op.log.read_text()
    assert op.proc.poll() is None, op.tail()
