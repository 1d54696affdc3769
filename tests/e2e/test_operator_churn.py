"""Nothing grows without bound (issue 20, deliverable 11), end to end: the real operator process
and its kopf handlers on the real control plane create and delete many bundles, and what the
operator keeps per bundle — its ``taskhandler_operator_tracked_entries`` gauge (wake-ups,
inventory subscriptions, probe slots, Job signals, revision locks and holds, Event memory,
per-bundle metric series, git mirrors) and its revision store on disk — is back at zero.

Before, a wake-up was re-created for every deleted bundle (``delete_bundle`` woke it after its
reconciler had removed its entry) and kept for good, and git mirrors were never removed.
The default run churns 200 bundles; the ``chaos`` run (``make chaos``) churns 1,000.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.manifests import bundle_manifest
from tests.e2e.operator_env import Operator, git_bundle, start_operator
from tests.fixtures.sources import GitRepo, HttpServer, make_repo

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

GIT_BUNDLES = 10  # over two repositories: two mirrors while they live
STRUCTURES = (
    "wakeups",
    "inventory_bundles",
    "probe_slot_bundles",
    "probe_slots",
    "job_signals",
    "revision_locks",
    "revision_holds",
    "revision_removals",
    "event_memory",
    "bundle_series",
    "git_mirrors",
)
BATCH = 100


def tracked(op: Operator) -> dict[str, float]:
    url = f"http://127.0.0.1:{op.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    prefix = 'taskhandler_operator_tracked_entries{structure="'
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line[len(prefix) :].partition('"} ')
            found[name] = float(value)
    return found


def kubectl_json(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json", timeout=300).stdout)


def apply_many(cluster: KubeCluster, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), BATCH):
        batch = {"apiVersion": "v1", "kind": "List", "items": items[start : start + BATCH]}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(batch), timeout=300)


def synced(cluster: KubeCluster, namespace: str) -> int:
    bundles = kubectl_json(cluster, "get", "thb", "-n", namespace)["items"]
    count = 0
    for bundle in bundles:
        for cond in (bundle.get("status") or {}).get("conditions") or ():
            if cond["type"] == "SourceReady" and cond["reason"] == "Synced":
                count += 1
    return count


def wait_for(what: str, check: Any, op: Operator, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        if op.proc.poll() is not None:
            break
        time.sleep(2)
    pytest.fail(f"never {what}; tracked {tracked(op) if op.proc.poll() is None else '-'}\n"
                f"operator log:\n{op.tail()}")  # fmt: skip


def bundle_dirs(store: Path) -> list[str]:
    if not store.is_dir():
        return []
    return sorted(
        f"{ns.name}/{b.name}"
        for ns in store.iterdir()
        if not ns.name.startswith(".") and ns.is_dir()
        for b in ns.iterdir()
    )


def churn(
    cluster: KubeCluster,
    namespace: str,
    database: str,
    tmp_path: Path,
    source_http: HttpServer,
    git_repo: GitRepo,
    count: int,
) -> None:
    allowed = tmp_path / "bundles"
    (allowed / "shared").mkdir(parents=True)
    (allowed / "shared" / "README.md").write_text("no artifacts: a pass syncs and publishes")
    git_repo.commit({"bundle/README.md": "hello"})
    other = make_repo(source_http.root / "git", f"{git_repo.name}-b", tmp_path)
    other.commit({"bundle/README.md": "hello"})
    urls = (git_repo.http_url(source_http), other.http_url(source_http))
    workdir = tmp_path / "operator"
    workdir.mkdir()
    store = workdir / "revisions"
    op = start_operator(cluster, [namespace], database, workdir, THOP_VOLUME_ROOTS=str(allowed))
    try:

        def serving() -> bool:
            try:
                return bool(tracked(op))
            except OSError:  # not listening yet
                return False

        wait_for("served metrics", serving, op, 120)
        before = tracked(op)
        assert {name: before[name] for name in STRUCTURES} == dict.fromkeys(STRUCTURES, 0.0)

        items = [
            git_bundle(
                namespace, f"g{i}", language="go", url=urls[i % 2], path="bundle", queues=[f"g{i}"]
            )
            for i in range(GIT_BUNDLES)
        ]
        items += [
            bundle_manifest(
                namespace,
                f"v{i}",
                language="go",
                source={"volume": {"path": str(allowed / "shared")}},
                queues=[f"v{i}"],
            )
            for i in range(count - GIT_BUNDLES)
        ]
        apply_many(cluster, items)
        wait_for(f"{count} bundles synced", lambda: synced(cluster, namespace) == count, op, 1800)
        during = tracked(op)
        assert during["wakeups"] == count and during["inventory_bundles"] == count, during
        assert during["bundle_series"] >= count and during["git_mirrors"] == 2, during
        assert len(bundle_dirs(store)) == count

        cluster.kubectl("delete", "thb", "--all", "-n", namespace, "--wait=false", timeout=300)
        wait_for(
            "every bundle gone",
            lambda: not kubectl_json(cluster, "get", "thb", "-n", namespace)["items"],
            op,
            1800,
        )

        def flat() -> bool:
            now = tracked(op)
            return all(now[name] == 0 for name in STRUCTURES)

        wait_for("every tracked structure back at 0", flat, op, 120)
        assert bundle_dirs(store) == []
        mirrors = store / ".cache" / "git"
        assert not mirrors.is_dir() or sorted(p.name for p in mirrors.iterdir()) == []
    finally:
        op.stop()


@pytest.mark.timeout(1800)
def test_creating_and_deleting_bundles_leaves_nothing_behind(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    tmp_path: Path,
    source_http: HttpServer,
    git_repo: GitRepo,
) -> None:
    churn(kube_cluster, namespace, migrated, tmp_path, source_http, git_repo, 200)


@pytest.mark.chaos
@pytest.mark.timeout(5400)
def test_a_thousand_bundles_created_and_deleted_leave_nothing_behind(
    kube_cluster: KubeCluster,
    namespace: str,
    migrated: str,
    tmp_path: Path,
    source_http: HttpServer,
    git_repo: GitRepo,
) -> None:
    churn(kube_cluster, namespace, migrated, tmp_path, source_http, git_repo, 1000)
