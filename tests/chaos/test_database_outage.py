"""PostgreSQL stopped in the middle of a pass: shut down, or frozen.

What it proves: when the database goes away while a bundle's pass is probing (the hook: the
probe Jobs of the pass' last wave exist, so the validate and write steps come next), the bundle
says so (``BindingsPublished=False`` and ``Ready=False`` with reason ``DatabaseUnavailable``,
a ``DatabaseUnavailable`` Event) and the operator keeps running; nothing is half-written: once
the database is back, every artifact, binding and probe row of the bundle was written by one
transaction (they share one ``xmin``), with the counts of a complete pass; the bundle heals by
itself (no nudge) and its probes were not redone (one Job per artifact, from a watch on the
apiserver: the Jobs of the failed pass are adopted).

How: a Go bundle of 4 artifacts at ``probe.parallelism: 2`` on a fresh database; PostgreSQL is
stopped (``pg_ctl stop -m fast``, data and port kept) once Jobs exist for all 4 artifacts, kept
down until the status reports the outage and at least the outage length, then started again.

Frozen (every process of the cluster stopped with SIGSTOP: the port still accepts connections,
nothing answers, open sessions hang mid-statement; no server-side timeout can fire): the pass
that meets it ends within the client's bound (statement timeout plus 5 s, or the connect timeout)
with ``DatabaseUnavailable``, or at the latest at the pass deadline with ``PassTimedOut``; the
operator keeps running, and after SIGCONT the bundle heals by itself with a complete pass.

Run: the 10 s outage and the 25 s freeze are part of the default suite; the 30 s outage and the
90 s freeze are marked ``chaos``::

    make chaos
    .venv/bin/pytest -m chaos tests/chaos/test_database_outage.py
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE, PROBE_TABLE
from tests.chaos.conftest import StartBundleRun
from tests.chaos.harness import (
    many_artifacts_repo,
    wait_condition,
    wait_ready,
)
from tests.e2e.faults_support import condition, events, wait_for
from tests.e2e.operator_env import row_counts
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

ARTIFACTS = 4
PARALLELISM = 2
BUNDLE = "chaos-db"


def writers(database: str, bundle: str) -> dict[str, set[str]]:
    """The transaction ids (``xmin``) that wrote the bundle's rows, per table."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            one = {"b": bundle}
            artifacts = conn.execute(
                sa.text(f"SELECT xmin::text FROM {ARTIFACT_TABLE} WHERE bundle_name = :b"), one
            ).scalars()
            bindings = conn.execute(
                sa.text(
                    f"SELECT b.xmin::text FROM {BINDING_TABLE} b JOIN {ARTIFACT_TABLE} a "
                    "ON a.id = b.artifact_id WHERE a.bundle_name = :b"
                ),
                one,
            ).scalars()
            probes = conn.execute(
                sa.text(
                    f"SELECT p.xmin::text FROM {PROBE_TABLE} p JOIN {ARTIFACT_TABLE} a "
                    "ON a.id = p.artifact_id WHERE a.bundle_name = :b"
                ),
                one,
            ).scalars()
            return {
                "artifacts": set(artifacts),
                "bindings": set(bindings),
                "probes": set(probes),
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param(10.0, id="10s"),
        pytest.param(30.0, id="30s", marks=[pytest.mark.chaos, pytest.mark.timeout(600)]),
    ],
)
def test_postgres_stopped_mid_pass_is_reported_writes_all_or_nothing_and_heals(
    outage: float,
    kube_cluster: KubeCluster,
    namespace: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    pg_server: PostgresServer,
    bundle_run: StartBundleRun,
) -> None:
    url = many_artifacts_repo(git_repo, runtime_factory, ARTIFACTS).http_url(source_http)
    database, recorder, op, more = bundle_run(
        namespace, url, bundle=BUNDLE, artifacts=ARTIFACTS, parallelism=PARALLELISM
    )

    # The hook: the last wave's Jobs exist, so the pass is probing and writes next.
    wait_for(
        f"probe Jobs for all {ARTIFACTS} artifacts",
        lambda: recorder.artifacts_started(BUNDLE) == ARTIFACTS,
        240,
        more=more,
    )
    assert row_counts(database, BUNDLE)["artifacts"] == 0, more()  # nothing written yet
    pg_server.pause()
    stopped = time.monotonic()
    try:
        failed = wait_condition(
            kube_cluster,
            namespace,
            BUNDLE,
            "BindingsPublished",
            lambda c: c.get("status") == "False",
            more,
            timeout=240,
        )
        reported = time.monotonic() - stopped
        # Keep it down for the whole outage, whatever the pass does meanwhile.
        time.sleep(max(0.0, stopped + outage - time.monotonic()))
        during = failed["status"]
        assert op.proc is not None and op.proc.poll() is None, more()
    finally:
        pg_server.resume()
    print(f"outage reported {reported:.1f}s after the stop; down {time.monotonic() - stopped:.1f}s")

    published = condition(failed, "BindingsPublished")
    assert published["reason"] == "DatabaseUnavailable", (published, more())
    ready = condition(failed, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "DatabaseUnavailable"), more()
    assert not during.get("publishedRevision"), during  # nothing was published

    healed = wait_ready(kube_cluster, namespace, BUNDLE, more)
    assert condition(healed, "BindingsPublished")["reason"] == "Published", more()
    assert healed["status"]["counts"]["bindings"] == ARTIFACTS, more()
    assert "DatabaseUnavailable" in events(kube_cluster, namespace, BUNDLE), more()

    # All or nothing: a complete pass' rows, every one written by the same transaction.
    counts = row_counts(database, BUNDLE)
    assert counts == {"artifacts": ARTIFACTS, "bindings": ARTIFACTS, "problems": 0}, more()
    wrote: dict[str, Any] = writers(database, BUNDLE)
    assert all(len(ids) == 1 for ids in wrote.values()), (wrote, more())
    assert len(set().union(*wrote.values())) == 1, (wrote, more())
    # The probes were not redone after the outage: each artifact had one Job.
    assert not recorder.duplicates(), more()


#: Small bounds, so the freeze is reported within seconds (the defaults are minutes).
FROZEN_ENV = {
    "THOP_DATABASE_STATEMENT_TIMEOUT": "3",
    "THOP_DATABASE_CONNECT_TIMEOUT": "3",
    "THOP_PASS_TIMEOUT": "60",
}


@pytest.mark.parametrize(
    "freeze",
    [
        pytest.param(25.0, id="25s"),
        pytest.param(90.0, id="90s", marks=[pytest.mark.chaos, pytest.mark.timeout(600)]),
    ],
)
def test_postgres_frozen_mid_pass_is_reported_within_the_deadline_and_heals(
    freeze: float,
    kube_cluster: KubeCluster,
    namespace: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    pg_server: PostgresServer,
    bundle_run: StartBundleRun,
) -> None:
    bundle = "chaos-frozen-db"
    url = many_artifacts_repo(git_repo, runtime_factory, ARTIFACTS).http_url(source_http)
    database, recorder, op, more = bundle_run(
        namespace, url, bundle=bundle, artifacts=ARTIFACTS, parallelism=PARALLELISM, env=FROZEN_ENV
    )
    wait_for(
        f"probe Jobs for all {ARTIFACTS} artifacts",
        lambda: recorder.artifacts_started(bundle) == ARTIFACTS,
        240,
        more=more,
    )
    with pg_server.frozen():
        stopped = time.monotonic()
        failed = wait_condition(
            kube_cluster,
            namespace,
            bundle,
            "BindingsPublished",
            lambda c: c.get("status") == "False",
            more,
            timeout=240,
        )
        reported = time.monotonic() - stopped
        time.sleep(max(0.0, stopped + freeze - time.monotonic()))
        assert op.proc is not None and op.proc.poll() is None, more()
    down = time.monotonic() - stopped
    print(f"freeze reported {reported:.1f}s after SIGSTOP; frozen {down:.1f}s")

    published = condition(failed, "BindingsPublished")
    assert published["reason"] in ("DatabaseUnavailable", "PassTimedOut"), (published, more())
    # Within the pass deadline (60 s), with room for the probes still finishing and the load.
    assert reported < 60 + 30, (reported, more())
    assert not failed["status"].get("publishedRevision"), failed["status"]

    healed = wait_ready(kube_cluster, namespace, bundle, more)
    assert condition(healed, "BindingsPublished")["reason"] == "Published", more()
    counts = row_counts(database, bundle)
    assert counts == {"artifacts": ARTIFACTS, "bindings": ARTIFACTS, "problems": 0}, more()
    wrote: dict[str, Any] = writers(database, bundle)
    assert len(set().union(*wrote.values())) == 1, (wrote, more())  # one transaction
    assert not recorder.duplicates(), more()
