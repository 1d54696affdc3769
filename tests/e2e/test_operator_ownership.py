"""Ownership end to end (issue 20): a resource deletes only rows under a claim it holds; a claim
whose holder is gone is taken over with Events on both sides; a later claimant creates no probe
Job; a bundle can finish deleting while PostgreSQL is down (``skip-cleanup``), leaving its rows
and claim for ``taskhandler-operator db claims release``."""

from __future__ import annotations

import json
import time

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.cli import main
from taskhandler_operator.kube import names
from tests.e2e.operator_env import (
    WAIT_SECONDS,
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    events,
    get_bundle,
    git_bundle,
    go_handlers,
    probe_jobs,
    seed_dags,
    stalled,
    wait_ready,
    wait_stalled,
    wait_status,
)
from tests.e2e.test_security_ownership import claims
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]


def reasons(cluster: KubeCluster, namespace: str, name: str) -> dict[str, list[str]]:
    """Event reason -> notes, of the operator's Events about ``namespace/name``."""
    found: dict[str, list[str]] = {}
    for event in events(cluster, namespace, name):
        found.setdefault(event["reason"], []).append(event.get("note") or "")
    return found


def wait_event(cluster: KubeCluster, namespace: str, name: str, reason: str) -> list[str]:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        notes = reasons(cluster, namespace, name).get(reason)
        if notes:
            return notes
        time.sleep(1)
    pytest.fail(f"no Event {reason} on {namespace}/{name}: {reasons(cluster, namespace, name)}")


def gone(cluster: KubeCluster, namespace: str, name: str, timeout: int = 120) -> bool:
    done = cluster.kubectl(
        "wait", "--for=delete", f"thb/{name}", "-n", namespace, f"--timeout={timeout}s",
        check=False, timeout=timeout + 20,
    )  # fmt: skip
    return done.returncode == 0


def test_deleting_a_resource_that_never_claimed_removes_nothing(
    kube_cluster: KubeCluster,
    namespace: str,
    second_namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo's reproduction: orders-java orphaned, an intruder naming it with a broken
    source (it never claims), deleted: the bindings Airflow used must stay."""
    seed_dags(migrated, {"orders": [("extract", "go")]})
    commit_files(git_repo, {"go/extract": go_handlers(runtime_factory, ("orders", "extract"))}, "a")
    url = git_repo.http_url(source_http)
    op = start([namespace, second_namespace])

    owner = git_bundle(namespace, "orders", language="go", url=url, path="go")
    owner["spec"]["deletionPolicy"] = "Orphan"
    apply(kube_cluster, owner)
    wait_ready(kube_cluster, namespace, "orders", op)
    kept = {("orders", "extract"): "extract"}
    assert bindings(migrated, "orders") == kept
    kube_cluster.kubectl("delete", "thb", "orders", "-n", namespace, "--timeout=120s")
    assert bindings(migrated, "orders") == kept  # Orphan: the rows stay, unowned
    assert claims(migrated)["bundles"] == {}

    intruder = git_bundle(
        second_namespace, "intruder", language="go", url=url, path="go", bundle_name="orders"
    )
    intruder["spec"]["source"]["git"]["secretRef"]["name"] = "missing-secret"
    apply(kube_cluster, intruder)
    wait_status(
        kube_cluster,
        second_namespace,
        "intruder",
        op,
        "failed on its source",
        lambda s: (condition(s, "SourceReady") or {}).get("status") == "False",
    )
    kube_cluster.kubectl("delete", "thb", "intruder", "-n", second_namespace, "--timeout=120s")
    assert bindings(migrated, "orders") == kept
    assert "holds no claim on bundle name 'orders'" in op.log.read_text()

    # An administrator sees the unowned name with its rows.
    capsys.readouterr()
    assert main(["db", "claims", "list", "--url", migrated]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:2] == ["orders", "(unowned)"] and row[-2:] == ["1", "1"], row
    assert op.proc.poll() is None, op.tail()


def test_a_claim_whose_holder_is_gone_is_taken_over_with_events(
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
    first_uid = get_bundle(kube_cluster, namespace, "first")["metadata"]["uid"]

    # A later claimant of the name stalls before probing: no Job, the release command printed.
    third = git_bundle(
        second_namespace,
        "third",
        language="go",
        url=url,
        path="spare",
        queues=["spare"],
        bundle_name="first",
    )
    apply(kube_cluster, third)
    status = wait_stalled(kube_cluster, second_namespace, "third", op, "BundleNameConflict")
    assert (
        f"taskhandler-operator db claims release first --uid {first_uid}"
        in (stalled(status)["message"])
    )
    assert probe_jobs(kube_cluster, second_namespace) == []

    # The holder vanishes without its finalizer running (removed by hand, operator down).
    op.stop()
    kube_cluster.kubectl("delete", "thb", "first", "-n", namespace, "--wait=false")
    patch = json.dumps({"metadata": {"finalizers": None}})
    kube_cluster.kubectl("patch", "thb", "first", "-n", namespace, "--type=merge", "-p", patch)
    assert gone(kube_cluster, namespace, "first")
    assert claims(migrated)["bundles"] == {"first": (namespace, "first")}  # stale

    op = start([namespace, second_namespace])
    wait_ready(kube_cluster, second_namespace, "third", op)
    assert claims(migrated)["bundles"] == {"first": (second_namespace, "third")}
    assert bindings(migrated, "first")[("spare", "spare")] == "spare"
    [taken] = wait_event(kube_cluster, second_namespace, "third", "ClaimTakenOver")
    assert f"from TaskHandlerBundle {namespace}/first" in taken and first_uid in taken, taken
    [left] = wait_event(kube_cluster, namespace, "first", "ClaimTakenOver")
    assert f"taken over by {second_namespace}/third" in left, left
    assert op.proc.poll() is None, op.tail()


def test_skip_cleanup_lets_a_bundle_go_while_the_database_is_down(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    pg_server: PostgresServer,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_dags(migrated, {"orders": [("extract", "go")]})
    commit_files(git_repo, {"go/extract": go_handlers(runtime_factory, ("orders", "extract"))}, "a")
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(
            namespace, "orders", language="go", url=git_repo.http_url(source_http), path="go"
        ),
    )
    wait_ready(kube_cluster, namespace, "orders", op)
    uid = get_bundle(kube_cluster, namespace, "orders")["metadata"]["uid"]

    pg_server.pause()
    try:
        kube_cluster.kubectl("delete", "thb", "orders", "-n", namespace, "--wait=false")
        [failed, *_] = wait_event(kube_cluster, namespace, "orders", "CleanupFailed")
        assert names.ANNOTATION_SKIP_CLEANUP in failed, failed
        assert not gone(kube_cluster, namespace, "orders", timeout=5)  # the finalizer holds it
        kube_cluster.kubectl(
            "annotate", "thb", "orders", "-n", namespace, f"{names.ANNOTATION_SKIP_CLEANUP}=true"
        )
        assert gone(kube_cluster, namespace, "orders"), op.tail()
        [skipped] = reasons(kube_cluster, namespace, "orders")["CleanupSkipped"]
    finally:
        pg_server.resume()
    release = f"taskhandler-operator db claims release orders --uid {uid}"
    assert release in skipped, skipped

    # The rows and the claim stayed; the printed command frees the name.
    assert bindings(migrated, "orders") == {("orders", "extract"): "extract"}
    assert claims(migrated)["bundles"] == {"orders": (namespace, "orders")}
    capsys.readouterr()
    assert main([*release.split()[1:], "--url", migrated]) == 0
    assert claims(migrated)["bundles"] == {}
    assert bindings(migrated, "orders") == {("orders", "extract"): "extract"}
    assert op.proc.poll() is None, op.tail()
