"""Publication under control, one smoke test on the real parts (``taskhandler-operator run``,
the control plane, PostgreSQL with Airflow's schema, git over HTTP): under ``Manual`` the first
revision is held with its change in status and nothing bound, and the approval annotation
(set with kubectl, so its manager is recorded) publishes it and lists it in the history.
The full "Must show" list of issue 23 lives in the e2e tests beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import (
    StartOperator,
    apply,
    bindings,
    commit_files,
    condition,
    git_bundle,
    handler_spec,
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


def test_manual_holds_the_first_revision_until_the_annotation_approves_it(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    seed_dags(migrated, {"orders_etl": [("extract", "go"), ("load", "go")]})
    spec = handler_spec(("orders_etl", "extract"), ("orders_etl", "load"))
    artifact = Path(runtime_factory("go", spec=spec)).read_bytes()
    commit = commit_files(git_repo, {"go/etl": artifact}, "one artifact")
    op = start([namespace])
    bundle = git_bundle(
        namespace, NAME, language="go", url=git_repo.http_url(source_http), path="go"
    )
    bundle["spec"]["publish"] = {"policy": "Manual"}
    apply(kube_cluster, bundle)

    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "held",
        lambda s: (condition(s, "BindingsPublished") or {}).get("reason") == "PublishHeld",
    )
    pending = status["pendingChange"]
    assert commit in pending["revision"] and pending["counts"]["added"] == 2, pending
    assert pending["first"] == [
        "added orders_etl/extract: etl @" + pending["first"][0].split("@", 1)[1],
        "added orders_etl/load: etl @" + pending["first"][1].split("@", 1)[1],
    ]
    assert (condition(status, "Stalled") or {}).get("reason") == "PublishHeld"
    assert bindings(migrated, NAME) == {}

    revision = pending["revision"]
    kube_cluster.kubectl(
        "annotate", f"thb/{NAME}", "-n", namespace, f"langsdk.dev/approve-revision={revision}"
    )
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "published after the approval",
        lambda s: (condition(s, "Ready") or {}).get("status") == "True",
    )
    assert "pendingChange" not in status
    latest = status["publications"][0]
    assert (latest["kind"], latest["revision"], latest["counts"]["added"]) == (
        "approved",
        revision,
        2,
    )
    assert latest["approvedBy"].startswith("kubectl"), latest
    assert bindings(migrated, NAME) == {
        ("orders_etl", "extract"): "etl",
        ("orders_etl", "load"): "etl",
    }
