"""Broken and misbehaving artifacts, end to end: a Go bundle missing its first bytes is refused
with its reason and a runtime that answers garbage fails its probe Job, each named in the status
with why, while the bundle's other artifacts stay bound and the last good bindings stay."""

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
    events,
    git_bundle,
    handler_spec,
    reconcile_now,
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

NAME = "faulty"


def test_broken_and_misbehaving_artifacts_keep_the_last_good_bindings(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    start: StartOperator,
) -> None:
    # One Dag per artifact, so one artifact's trouble leaves the others' Dags valid.
    seed_dags(
        migrated,
        {"dag_a": [("extract", "go")], "dag_b": [("load", "go")], "dag_c": [("publish", "go")]},
    )

    def go(key: tuple[str, str], mode: str = "ok") -> bytes:
        return Path(runtime_factory("go", mode=mode, spec=handler_spec(key))).read_bytes()

    good_load = go(("dag_b", "load"))
    commit_files(
        git_repo,
        {
            "go/extract": go(("dag_a", "extract")),
            "go/load": good_load,
            "go/publish": go(("dag_c", "publish")),
        },
        "three good artifacts",
    )
    op = start([namespace])
    apply(
        kube_cluster,
        git_bundle(namespace, NAME, language="go", url=git_repo.http_url(source_http), path="go"),
    )
    wait_ready(kube_cluster, namespace, NAME, op)
    good = {
        ("dag_a", "extract"): "extract",
        ("dag_b", "load"): "load",
        ("dag_c", "publish"): "publish",
    }
    assert bindings(migrated, NAME) == good

    # load loses its first bytes (its trailer and stored digest intact, so the listing still
    # sees a Go bundle of another size and probes it; verification refuses it); publish becomes
    # a runtime that answers garbage.
    commit = commit_files(
        git_repo,
        {
            "go/load": good_load[4096:],
            "go/publish": go(("dag_c", "publish"), mode="garbage"),
        },
        "break two artifacts",
    )
    reconcile_now(kube_cluster, namespace, NAME, op)
    status = wait_status(
        kube_cluster,
        namespace,
        NAME,
        op,
        "reported both failures",
        lambda s: (
            commit in (s.get("revision") or "")
            and (condition(s, "ArtifactsProbed") or {}).get("reason") == "ArtifactsFailed"
            and {a["path"] for a in s.get("artifacts") or () if a.get("reason")}
            >= {"load", "publish"}
        ),
    )
    artifacts = {a["path"]: a for a in status["artifacts"]}
    load, publish = artifacts["load"], artifacts["publish"]
    assert load["state"] in ("Rejected", "Failed") and load["reason"] == "ArtifactRefused", load
    assert load["message"], load
    assert publish["state"] == "Failed" and publish["reason"] == "RuntimeFailed", publish
    assert publish["message"], publish
    probed = condition(status, "ArtifactsProbed") or {}
    assert probed["status"] == "False"
    assert "load" in probed["message"] and "publish" in probed["message"], probed
    ready = condition(status, "Ready") or {}
    assert ready["status"] == "False", ready
    # The last good bindings stay: the failing artifacts' Dags keep their rows, extract's Dag
    # is still bound.
    assert bindings(migrated, NAME) == good
    reasons = [e["reason"] for e in events(kube_cluster, namespace, NAME)]
    assert "ProbeFailed" in reasons or "ArtifactRejected" in reasons, reasons

    # Another pass changes nothing and repeats no failure Event (transitions only).
    before = sorted(reasons)
    reconcile_now(kube_cluster, namespace, NAME, op)
    assert sorted(e["reason"] for e in events(kube_cluster, namespace, NAME)) == before
    assert bindings(migrated, NAME) == good
    assert op.proc.poll() is None, op.tail()
