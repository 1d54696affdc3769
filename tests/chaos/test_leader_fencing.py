"""Chaos: a deposed leader cannot write (the leader fence, ``db/fence.py``).

Two ``taskhandler-operator run`` replicas on one Lease, the real control plane and PostgreSQL.
Leader ``a`` reconciles a Go bundle and is about to write it: its write transaction waits for
the bundle's advisory lock, which the test holds. The test stops ``a`` with SIGSTOP for longer
than the Lease, and meanwhile pushes a new revision. Standby ``b`` takes the Lease, records its
term in ``thop_leader_fence``, probes the new revision and queues its own write behind ``a``'s.
The test releases the lock (``a``'s transaction gets it first, frozen) and SIGCONTs ``a``: its
next statement is the fence check, which refuses: ``a`` logs the refusal naming ``b``, rolls
back and exits 1, and ``b`` writes. Every row of the bundle is then ``b``'s, written by one
transaction. Without the fence ``a`` commits the old revision's rows, and ``b``'s write of the
new one leaves the binding ``a`` wrote (it points at the same artifact row), so the rows carry
two writers.

Run: ``.venv/bin/pytest tests/chaos/test_leader_fencing.py`` (about a minute and a half; part of
the default suite).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.db.write_statements import bundle_lock_key
from tests.chaos.conftest import FreshDatabase, MakeReplica
from tests.chaos.harness import readyz, wait_leading
from tests.chaos.test_database_outage import writers
from tests.e2e.faults_support import Replica, condition, thb, wait_for
from tests.e2e.operator_env import apply, git_bundle, handler_spec
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

BUNDLE = "fenced-go"
DAG, TASK = "fenced_etl", "extract"
#: ``a`` waits on the lock and sits frozen in its transaction for a minute or more: its own
#: bounds must outlast that (the defaults would end its session, which is not what is tested).
PATIENT = {
    "THOP_DATABASE_STATEMENT_TIMEOUT": "600",
    "THOP_DATABASE_LOCK_TIMEOUT": "600",
    "THOP_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": "600",
}


def lock_waiters(conn: psycopg.Connection[Any]) -> list[int]:
    """Backends waiting for an advisory lock (only bundle writes take them), oldest first."""
    rows = conn.execute(
        "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND NOT l.granted ORDER BY a.query_start"
    ).fetchall()
    return [int(r[0]) for r in rows]


def holds_lock(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = %s",
        [pid],
    ).fetchone()
    return bool(row and row[0])


def fence_holder(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute("SELECT holder FROM thop_leader_fence").fetchone()
    return None if row is None else str(row[0])


@contextmanager
def stopped(replica: Replica) -> Iterator[None]:
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(replica.pid, signal.SIGCONT)


def commit_artifact(repo: GitRepo, binary: Path, message: str) -> None:
    repo.commit({"go/extract": binary.read_bytes()}, message)
    (repo.work / "go" / "extract").chmod(0o755)  # git keeps the mode the work tree has
    repo.commit({}, f"{message} (executable)")


def test_a_deposed_leaders_write_is_refused_logged_and_rolled_back(
    kube_cluster: KubeCluster,
    namespace: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    fresh_database: FreshDatabase,
    replicas: MakeReplica,
) -> None:
    spec = handler_spec((DAG, TASK))
    commit_artifact(git_repo, Path(runtime_factory("go", spec=spec)), "revision 1")
    database = fresh_database({DAG: [(TASK, "go")]})
    a = replicas(namespace, database, "a", **PATIENT).start()
    b = replicas(namespace, database, "b", **PATIENT)

    def more() -> str:
        try:
            status = thb(kube_cluster, namespace, BUNDLE).get("status")
        except Exception as exc:  # not applied yet, or the apiserver is busy
            status = repr(exc)
        return f"status: {status}\n--- a ---\n{a.tail(80)}\n--- b ---\n{b.tail(80)}"

    wait_leading(a, more)
    b.start()  # only once a leads
    wait_for("b waits as a standby", lambda: readyz(b) == 503, 120, more=more)
    admin = psycopg.connect(database.replace("postgresql+psycopg://", "postgresql://"))
    admin.autocommit = True
    try:
        # The test holds the bundle's lock: a's write will wait for it.
        admin.execute("SELECT pg_advisory_lock(%s)", [bundle_lock_key(BUNDLE)])
        apply(
            kube_cluster,
            git_bundle(
                namespace, BUNDLE, language="go", url=git_repo.http_url(source_http), path="go"
            ),
        )
        [a_backend] = wait_for(
            "a's write waiting for the bundle lock", lambda: lock_waiters(admin), 240, more=more
        )
        a_term = fence_holder(admin)  # recorded when a started leading
        assert a_term is not None, more()

        with stopped(a):
            # A new revision while a is frozen; b takes the Lease and writes it.
            other = Path(runtime_factory("go", "get-variable-first", spec=spec))
            commit_artifact(git_repo, other, "revision 2")
            wait_for("b leads", lambda: readyz(b) == 200, 120, more=more)
            holder = wait_for(
                "b's term recorded",
                lambda: (h := fence_holder(admin)) != a_term and h,
                60,
                more=more,
            )
            wait_for(
                "b's write queued behind a's",
                lambda: len(lock_waiters(admin)) == 2,
                240,
                more=more,
            )
            admin.execute("SELECT pg_advisory_unlock(%s)", [bundle_lock_key(BUNDLE)])
            # a's frozen transaction got the lock (it asked first); b still waits.
            wait_for("a's transaction holds the lock", lambda: holds_lock(admin, a_backend), 30)
            assert lock_waiters(admin) != [], more()

        # a resumes: its next statement is the fence check.
        assert a.proc is not None
        code = a.proc.wait(90)
        log = a.text()
        assert code == 1, more()
        assert f"write of bundle {BUNDLE!r} refused" in log, more()
        assert f"fences writes to {holder}" in log, more()
        assert "rolled back, this replica steps down" in log, more()

        # b writes the new revision; every row of the bundle is from one transaction (b's).
        def published() -> dict[str, Any] | None:
            obj = thb(kube_cluster, namespace, BUNDLE)
            return obj if condition(obj, "Ready").get("status") == "True" else None

        done = wait_for("b publishes the bundle", published, 240, more=more)
        assert done["status"]["counts"]["bindings"] == 1, more()
        wrote: dict[str, set[str]] = writers(database, BUNDLE)
        assert all(len(ids) == 1 for ids in wrote.values()), (wrote, more())
        assert len(set().union(*wrote.values())) == 1, (wrote, more())
        assert fence_holder(admin) == holder
    finally:
        admin.close()
