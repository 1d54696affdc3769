"""The operator under faults, on the real parts (control plane + process node, PostgreSQL with
Airflow's schema, git over HTTP): SIGKILL while probe Jobs run, two replicas on one Lease, a
failing source, a database outage, and what its least-privilege identity may not do.

Every wait is bounded and polls for a state (never sleeps for a guessed time); the fixtures are
the ones of tests/e2e/test_operator.py, the helpers are in faults_support.py.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import subprocess
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.operator_process import request_reconcile
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.kube import names
from tests.e2e.faults_support import (
    Replica,
    condition,
    events,
    jobs_by_name,
    replica,
    rows,
    thb,
    wait_for,
)
from tests.e2e.operator_env import OPERATOR_USER, apply
from tests.e2e.test_operator import ARTIFACTS, TASKS, bundle
from tests.e2e.test_operator import database as database
from tests.e2e.test_operator import repo as repo
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD, GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

READY_SECONDS = 300.0


@pytest.fixture
def replicas(tmp_path: Path) -> Any:
    started: list[Replica] = []
    yield started
    for r in started:
        r.stop()


def make(
    started: list[Replica],
    cluster: KubeCluster,
    ns: str,
    db: str,
    workdir: Path,
    name: str,
) -> Replica:
    r = replica(cluster, OPERATOR_USER, ns, db, workdir, name)
    started.append(r)
    return r


def ready(cluster: KubeCluster, ns: str, name: str, *logs: Replica) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = thb(cluster, ns, name)
        return obj if condition(obj, "Ready").get("status") == "True" else None

    def more() -> str:
        status = json.dumps(thb(cluster, ns, name).get("status"), indent=1)[-3000:]
        return f"status: {status}\n" + "\n".join(r.tail() for r in logs)

    return wait_for(f"{ns}/{name} Ready", check, READY_SECONDS, more=more)


def expected_rows(repo: GitRepo, languages: list[str]) -> list[tuple[Any, ...]]:
    out = []
    for language in languages:
        folder, rel = ARTIFACTS[language].split("/", 1)
        size = (repo.work / folder / rel).stat().st_size
        out.append(("orders_etl", TASKS[language], f"orders-{language}", rel, size))
    return sorted(out)


def readyz(r: Replica) -> int:
    port = r.env["THOP_HEALTH_PORT"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def lease(cluster: KubeCluster, ns: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "lease", "taskhandler-operator", "-n", ns, "-o", "json")
    return dict(json.loads(out.stdout)["spec"])


# --- 1. SIGKILL while probe Jobs run ------------------------------------------------------------


def test_sigkill_while_probing_adopts_the_jobs_and_ends_with_the_same_rows(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    first = make(replicas, kube_cluster, namespace, database, tmp_path, "a").start()
    url = repo.http_url(source_http)
    languages = list(ARTIFACTS)
    for language in languages:
        apply(kube_cluster, bundle(namespace, language, url))

    # Kill as soon as the first probe Jobs exist: their pods are still fetching or probing.
    before = wait_for(
        "the first probe Jobs",
        lambda: jobs_by_name(kube_cluster, namespace),
        180,
        more=first.tail,
    )
    first.kill()
    assert first.proc is not None and first.proc.returncode == -9

    second = first.start()  # the same settings: revision store and signing key survive
    for language in languages:
        ready(kube_cluster, namespace, f"orders-{language}", second)

    after = jobs_by_name(kube_cluster, namespace)
    # One Job per artifact; the ones the killed process made were adopted (same uid), never
    # deleted and made again. The one exception is a Job that failed meanwhile: its probe pod
    # downloads from the artifact server inside the operator process, and on a loaded machine
    # the restart can outlast the download's retries. Such a Job is retried, announced in the
    # new process's log, under the same name.
    assert len(after) == len(languages), after
    restarted = second.logs[-1].read_text(errors="replace")
    for job, uid in before.items():
        if after.get(job) != uid:
            assert job in after and "probe retrying in" in restarted, (job, before, after)
    # The rows are what an undisturbed run writes: one artifact and one binding per stub,
    # bound to its own artifact, no problem.
    state = rows(database)
    assert state["bindings"] == expected_rows(repo, languages)
    assert [a[:2] for a in state["artifacts"]] == sorted(
        (f"orders-{lang}", ARTIFACTS[lang].split("/", 1)[1]) for lang in languages
    )
    assert state["problems"] == []
    # And a pass after the recovery (reusing every answer) leaves them as they are.
    request_reconcile(kube_cluster, namespace, "orders-go", "after-kill")
    wait_for(
        "the pass after the restart",
        lambda: (
            (thb(kube_cluster, namespace, "orders-go").get("status") or {}).get(
                "lastHandledReconcileAt"
            )
            == "after-kill"
        ),
        120,
        more=second.tail,
    )
    assert rows(database) == state
    assert jobs_by_name(kube_cluster, namespace) == after


# --- 1b. A restart keeps the stored statuses ------------------------------------------------------

KEPT = "unchanged since the stored status: kept it"


def test_a_restart_keeps_each_stored_status_whose_pass_key_matches_and_redoes_the_changed(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    first = make(replicas, kube_cluster, namespace, database, tmp_path, "a").start()
    url = repo.http_url(source_http)
    for language in ("go", "java"):
        apply(kube_cluster, bundle(namespace, language, url))
    for language in ("go", "java"):
        ready(kube_cluster, namespace, f"orders-{language}", first)
    # The passes that bound wrote rows, so they leave no key (and one bundle's binding moves
    # the other's watermark: both bind stubs of one Dag); the next ones (asked for here,
    # instead of waiting for the interval) change nothing and store it.
    for language in ("go", "java"):
        request_reconcile(kube_cluster, namespace, f"orders-{language}", "settle")

    def keyed(name: str) -> dict[str, Any] | None:
        status = thb(kube_cluster, namespace, name).get("status") or {}
        done = status.get("lastHandledReconcileAt") == "settle" and status.get("passKey")
        return status if done else None

    stored: dict[str, dict[str, Any]] = {}
    for name in ("orders-go", "orders-java"):
        stored[name] = wait_for(
            f"{name}'s pass key", functools.partial(keyed, name), 120, more=first.tail
        )
    assert all(re.fullmatch(r"k1:[0-9a-f]{64}", s["passKey"]) for s in stored.values()), stored
    state = rows(database)
    jobs = jobs_by_name(kube_cluster, namespace)
    first.stop()

    # Nothing changed: the new process keeps both statuses, and writes nothing anywhere.
    second = first.start()

    def kept_lines() -> list[str] | None:
        lines = [line for line in second.logs[-1].read_text(errors="replace").splitlines()]
        found = [line for line in lines if KEPT in line]
        return found if len(found) >= 2 else None

    lines = wait_for("both bundles kept", kept_lines, 120, more=second.tail)
    assert any("/orders-go@" in line for line in lines), lines
    assert any("/orders-java@" in line for line in lines), lines
    assert "reconciled revision" not in second.logs[-1].read_text(errors="replace")
    for name, status in stored.items():
        assert thb(kube_cluster, namespace, name).get("status") == status
    assert rows(database) == state and jobs_by_name(kube_cluster, namespace) == jobs
    second.stop()

    # The Go bundle's spec changes while no operator runs: its stored status describes an
    # older generation, so its first pass takes the whole path (reusing the recorded answers);
    # the Java bundle's status is kept again. (A changed row is in the integration tests.)
    kube_cluster.kubectl(
        "patch",
        "thb",
        "orders-go",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"interval": "7m"}}),
    )
    third = second.start()

    def go_observed() -> dict[str, Any] | None:
        obj = thb(kube_cluster, namespace, "orders-go")
        seen = (obj.get("status") or {}).get("observedGeneration")
        return obj if seen == obj["metadata"]["generation"] else None

    def both_passed() -> list[str] | None:
        lines = third.logs[-1].read_text(errors="replace").splitlines()
        java = any("/orders-java@" in line and KEPT in line for line in lines)
        go = any("/orders-go@" in line and "reconciled revision" in line for line in lines)
        return lines if java and go else None

    go_done = wait_for("the Go bundle's whole pass", go_observed, 120, more=third.tail)
    assert condition(go_done, "Ready").get("status") == "True"
    lines = wait_for("Go reconciled, Java kept", both_passed, 120, more=third.tail)
    assert not any("/orders-go@" in line and KEPT in line for line in lines), lines
    assert rows(database) == state and jobs_by_name(kube_cluster, namespace) == jobs


# --- 2. Two replicas, one Lease -----------------------------------------------------------------


def test_only_the_leader_reconciles_and_a_killed_leader_hands_over(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    leader = make(replicas, kube_cluster, namespace, database, tmp_path, "a").start()
    wait_for("replica a leads", lambda: readyz(leader) == 200, 120, more=leader.tail)
    standby = make(replicas, kube_cluster, namespace, database, tmp_path, "b").start()
    wait_for("replica b serves /readyz", lambda: readyz(standby) == 503, 120, more=standby.tail)
    holder = lease(kube_cluster, namespace)["holderIdentity"]

    apply(kube_cluster, bundle(namespace, "go", repo.http_url(source_http)))
    wait_for("a probe Job", lambda: jobs_by_name(kube_cluster, namespace), 180, more=leader.tail)
    # The standby did nothing: not ready, never reconciled, the Lease is the leader's.
    assert readyz(standby) == 503
    assert "reconciled revision" not in standby.text()
    assert lease(kube_cluster, namespace)["holderIdentity"] == holder

    leader.kill()
    duration = int(lease(kube_cluster, namespace)["leaseDurationSeconds"])
    # The standby takes over once the Lease expires (its duration plus retry periods).
    wait_for(
        "the standby takes the Lease",
        lambda: readyz(standby) == 200,
        duration + 60,
        more=standby.tail,
    )
    assert lease(kube_cluster, namespace)["holderIdentity"] != holder
    status = ready(kube_cluster, namespace, "orders-go", standby)["status"]
    assert status["counts"]["bindings"] == 1
    assert rows(database)["bindings"] == expected_rows(repo, ["go"])
    assert len(jobs_by_name(kube_cluster, namespace)) == 1  # adopted, not made twice

    # SIGTERM: the Lease is released at once (no holder), the process exits 0.
    assert standby.terminate() == 0, standby.tail()
    released = lease(kube_cluster, namespace)
    assert not released.get("holderIdentity"), released
    third = make(replicas, kube_cluster, namespace, database, tmp_path, "c").start()
    # A released Lease is free now: the new replica need not wait for it to expire.
    wait_for("a new replica leads", lambda: readyz(third) == 200, 120, more=third.tail)


# --- 3. A failing source and a database outage ---------------------------------------------------


def secret(ns: str, name: str, password: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "stringData": {"username": HTTP_USER, "password": password},
    }


def test_bad_credentials_back_off_while_another_bundle_goes_on_and_recover(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    op = make(replicas, kube_cluster, namespace, database, tmp_path, "a").start()
    url = repo.http_url(source_http)
    apply(kube_cluster, secret(namespace, "git-auth-ts", PLANTED_PASSWORD))
    other = bundle(namespace, "typescript", url)
    other["spec"]["source"]["git"]["secretRef"]["name"] = "git-auth-ts"
    apply(kube_cluster, bundle(namespace, "go", url))
    apply(kube_cluster, other)
    good = ready(kube_cluster, namespace, "orders-go", op)["status"]
    ready(kube_cluster, namespace, "orders-typescript", op)
    state = rows(database)

    # The go bundle's Secret now holds a wrong password.
    apply(kube_cluster, secret(namespace, "git-auth", "not-the-password"))
    request_reconcile(kube_cluster, namespace, "orders-go", "bad-password")

    def failing() -> dict[str, Any] | None:
        obj = thb(kube_cluster, namespace, "orders-go")
        return obj if condition(obj, "SourceReady").get("status") == "False" else None

    failed = wait_for("SourceReady=False", failing, 120, more=op.tail)
    source = condition(failed, "SourceReady")
    assert source["reason"] == "AuthenticationFailed", source
    assert condition(failed, "Ready")["status"] == "False"
    assert condition(failed, "Reconciling")["reason"] == "ProgressingWithRetry"
    # The last good revision and its bindings stay.
    assert failed["status"]["revision"] == good["revision"]
    assert failed["status"]["publishedRevision"] == good["publishedRevision"]
    assert rows(database) == state
    assert "AuthenticationFailed" in events(kube_cluster, namespace, "orders-go")
    assert PLANTED_PASSWORD not in json.dumps(failed) and "not-the-password" not in op.text()

    # Meanwhile the other bundle still reconciles.
    request_reconcile(kube_cluster, namespace, "orders-typescript", "meanwhile")
    wait_for(
        "the other bundle's pass",
        lambda: (
            (thb(kube_cluster, namespace, "orders-typescript").get("status") or {}).get(
                "lastHandledReconcileAt"
            )
            == "meanwhile"
        ),
        120,
        more=op.tail,
    )
    assert condition(thb(kube_cluster, namespace, "orders-typescript"), "Ready")["status"] == (
        "True"
    )

    # Retries with back-off are logged; fixing the Secret heals the bundle without a nudge.
    wait_for("a retry", lambda: op.text().count("retrying in") >= 2, 120, more=op.tail)
    apply(kube_cluster, secret(namespace, "git-auth", PLANTED_PASSWORD))
    healed = ready(kube_cluster, namespace, "orders-go", op)
    assert condition(healed, "SourceReady")["reason"] == "Synced"
    assert rows(database) == state
    # One Event for the failure however many retries failed.
    assert events(kube_cluster, namespace, "orders-go").count("AuthenticationFailed") == 1


def test_a_probe_download_that_keeps_failing_backs_off_instead_of_recreating_jobs(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    # Probe pods are told an artifact server URL where nothing listens: every download fails.
    # Such a failure is not the artifact's answer; each failed Job's events wake the bundle, and
    # the operator used to create the next Job at once, about one a second, for ever.
    dead = f"http://127.0.0.1:{free_port()}"
    op = replica(
        kube_cluster,
        OPERATOR_USER,
        namespace,
        database,
        tmp_path,
        "a",
        THOP_ARTIFACT_SERVER_URL=dead,
    )
    replicas.append(op.start())
    apply(kube_cluster, bundle(namespace, "go", repo.http_url(source_http)))
    wait_for(
        "two announced probe retries",
        lambda: op.text().count("extract: probe retrying in") >= 2,
        240,
        more=op.tail,
    )
    text = op.text()
    created = [
        datetime.fromisoformat(m.group(1))
        for m in re.finditer(r"^(\S+) INFO .* probe Job \S+ created for extract$", text, re.M)
    ]
    waits = [float(w) for w in re.findall(r"extract: probe retrying in ([\d.]+)s", text)]
    assert len(created) >= 2, text[-3000:]
    # Each Job was created only after the wait announced when the one before failed.
    for (before, after), wait in zip(itertools.pairwise(created), waits, strict=False):
        assert (after - before).total_seconds() >= wait - 0.5, (created, waits)
    obj = thb(kube_cluster, namespace, "orders-go")
    failed = [a for a in obj["status"]["artifacts"] if a["path"] == "extract"]
    assert failed and failed[0]["state"] == "Failed" and failed[0]["reason"] == "FetchFailed"
    assert "next attempt after" in failed[0]["message"], failed
    assert condition(obj, "Ready")["status"] == "False"

    # With the right URL (a new operator process) the artifact is probed and bound.
    op.stop()
    healthy = make(replicas, kube_cluster, namespace, database, tmp_path, "b").start()
    ready(kube_cluster, namespace, "orders-go", healthy)
    assert [b[:2] for b in rows(database)["bindings"]] == [("orders_etl", "extract")]


def test_a_database_outage_is_reported_writes_nothing_and_heals(
    kube_cluster: KubeCluster,
    namespace: str,
    repo: GitRepo,
    source_http: HttpServer,
    database: str,
    pg_server: PostgresServer,
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    op = make(replicas, kube_cluster, namespace, database, tmp_path, "a").start()
    apply(kube_cluster, bundle(namespace, "go", repo.http_url(source_http)))
    good = ready(kube_cluster, namespace, "orders-go", op)["status"]
    state = rows(database)

    pg_server.pause()
    try:
        request_reconcile(kube_cluster, namespace, "orders-go", "db-down")

        def failing() -> dict[str, Any] | None:
            obj = thb(kube_cluster, namespace, "orders-go")
            return obj if condition(obj, "BindingsPublished").get("status") == "False" else None

        failed = wait_for("BindingsPublished=False", failing, 120, more=op.tail)
    finally:
        pg_server.resume()
    published = condition(failed, "BindingsPublished")
    assert published["reason"] == "DatabaseUnavailable", published
    assert condition(failed, "Ready")["reason"] == "DatabaseUnavailable"
    assert failed["status"]["publishedRevision"] == good["publishedRevision"]
    assert "DatabaseUnavailable" in events(kube_cluster, namespace, "orders-go")
    assert op.proc is not None and op.proc.poll() is None, op.tail()

    healed = ready(kube_cluster, namespace, "orders-go", op)
    assert condition(healed, "BindingsPublished")["reason"] == "Published"
    assert rows(database) == state  # nothing half-written, nothing lost


# --- 4. What the operator's identity may not do -------------------------------------------------


def test_the_operator_identity_is_refused_what_it_was_not_given(
    kube_cluster: KubeCluster,
    namespace: str,
) -> None:
    def can(*args: str) -> bool:
        done = kube_cluster.kubectl("auth", "can-i", *args, f"--as={OPERATOR_USER}", check=False)
        return done.stdout.strip() == "yes"

    # What it needs.
    assert can("get", "secrets/git-auth", "-n", namespace)
    assert can("create", "jobs.batch", "-n", namespace)
    assert can("patch", f"{names.PLURAL}.{names.GROUP}/status", "-n", namespace)
    # What it must not do.
    assert not can("list", "secrets", "-n", namespace)
    assert not can("watch", "secrets", "-n", namespace)
    assert not can("get", "secrets", "-n", "kube-system")
    assert not can("create", "pods/exec", "-n", namespace)
    assert not can("delete", f"customresourcedefinitions/{names.CRD_NAME}")
    assert not can("create", "rolebindings.rbac.authorization.k8s.io", "-n", namespace)

    # And for real, with its own credentials against the apiserver.
    kubeconfig = kube_cluster.user_kubeconfig(OPERATOR_USER)

    def as_operator(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(kube_cluster.bins["kubectl"]), "--kubeconfig", str(kubeconfig), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    assert as_operator("get", "secret", "git-auth", "-n", namespace).returncode == 0
    for args in (
        ("get", "secrets", "-n", namespace),
        ("get", "secret", "git-auth", "-n", "default"),
        ("delete", "crd", names.CRD_NAME, "--dry-run=server"),
    ):
        refused = as_operator(*args)
        assert refused.returncode != 0, args
        assert "Forbidden" in refused.stderr or "forbidden" in refused.stderr, refused.stderr
    kube_cluster.kubectl(
        "run",
        "target",
        "-n",
        namespace,
        "--image=registry.local/none:0",
        "--restart=Never",
        "--overrides",
        json.dumps(
            {
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "target",
                            "image": "registry.local/none:0",
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                }
            }
        ),
    )
    refused = as_operator("exec", "target", "-n", namespace, "--", "true")
    assert "forbidden" in refused.stderr.lower() and "pods/exec" in refused.stderr, refused.stderr
