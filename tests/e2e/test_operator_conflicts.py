"""Claims, end to end: two bundles claiming one queue, two claiming one ``bundleName`` (in
different namespaces) — the later one is ``Stalled`` naming the owner and writes nothing, and
takes over when the owner is deleted; two artifacts claiming one (dag_id, task_id) — the Dag is
reported with both paths and keeps its rows."""

from __future__ import annotations

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    git_bundle,
    go_handlers,
    reconcile_now,
    row_counts,
    seed_dags,
    stalled,
    wait_ready,
    wait_stalled,
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


def test_later_claimants_stall_and_take_over(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders": [("extract", "go")], "spare": [("spare", "spare")]})
    commit_files(
        git_repo,
        {
            "go/extract": go_handlers(runtime_factory, ("orders", "extract")),
            "spare/spare": go_handlers(runtime_factory, ("spare", "spare")),
        },
        "artifacts",
    )
    url = git_repo.http_url(source_http)
    op = start([namespace, second_namespace])

    apply(kube_cluster, git_bundle(namespace, "first", language="go", url=url, path="go"))
    wait_ready(kube_cluster, namespace, "first", op)
    # The same queue, another bundle name, the same namespace.
    apply(kube_cluster, git_bundle(namespace, "second", language="go", url=url, path="go"))
    # The same bundle name, another queue, another namespace.
    apply(
        kube_cluster,
        git_bundle(
            second_namespace,
            "third",
            language="go",
            url=url,
            path="spare",
            queues=["spare"],
            bundle_name="first",
        ),
    )
    second = wait_stalled(kube_cluster, namespace, "second", op, "QueueConflict")
    third = wait_stalled(kube_cluster, second_namespace, "third", op, "BundleNameConflict")
    for status in (second, third):
        conflict = stalled(status)
        assert "first" in conflict["message"] and namespace in conflict["message"], conflict
        ready = condition(status, "Ready") or {}
        assert (ready["status"], ready["reason"]) == ("False", conflict["reason"]), ready
    # The later claimants wrote nothing: no rows of theirs, the owner's rows unchanged.
    assert row_counts(migrated, "second") == {"artifacts": 0, "bindings": 0, "problems": 0}
    assert bindings(migrated) == {("orders", "extract"): "extract"}
    assert bindings(migrated, "first") == {("orders", "extract"): "extract"}

    # The owner goes: both later claimants take over (deletion wakes them).
    kube_cluster.kubectl("delete", "thb", "first", "-n", namespace, "--timeout=120s")
    wait_ready(kube_cluster, namespace, "second", op)
    wait_ready(kube_cluster, second_namespace, "third", op)
    assert bindings(migrated, "second") == {("orders", "extract"): "extract"}
    assert bindings(migrated, "first") == {("spare", "spare"): "spare"}
    for ns, name in ((namespace, "second"), (second_namespace, "third")):
        assert condition(reconcile_now(kube_cluster, ns, name, op), "Stalled") is None
    assert op.proc.poll() is None, op.tail()


def test_two_artifacts_claiming_one_task_are_reported_and_the_dag_keeps_its_rows(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders": [("extract", "go"), ("load", "go")]})
    commit_files(
        git_repo,
        {
            "go/one": go_handlers(runtime_factory, ("orders", "extract")),
            "go/two": go_handlers(runtime_factory, ("orders", "load")),
        },
        "one handler each",
    )
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(namespace, "dups", language="go", url=git_repo.http_url(source_http), path="go"),
    )
    wait_ready(kube_cluster, namespace, "dups", op)
    good = {("orders", "extract"): "one", ("orders", "load"): "two"}
    assert bindings(migrated, "dups") == good

    # two now claims extract as well.
    commit = commit_files(
        git_repo,
        {"go/two": go_handlers(runtime_factory, ("orders", "load"), ("orders", "extract"))},
        "two claims both",
    )
    reconcile_now(kube_cluster, namespace, "dups", op)
    status = wait_status(
        kube_cluster,
        namespace,
        "dups",
        op,
        "reported the ambiguous task",
        lambda s: (
            commit in (s.get("revision") or "")
            and any(p.get("kind") == "ambiguous" for p in s.get("problems") or ())
        ),
    )
    problem = next(p for p in status["problems"] if p["kind"] == "ambiguous")
    assert (problem["dagId"], problem["taskId"]) == ("orders", "extract"), problem
    assert "one" in problem["message"] and "two" in problem["message"], problem
    published = condition(status, "BindingsPublished") or {}
    assert published["status"] == "False", published
    assert bindings(migrated, "dups") == good  # the Dag keeps its rows
    assert op.proc.poll() is None, op.tail()
