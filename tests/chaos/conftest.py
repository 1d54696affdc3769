"""Fixtures of the chaos tests (bounded, self-stopping fault tests on the real parts).

Run them all, long variants included, with ``make chaos``; the short variants also run in the
default suite (``make test``), the long ones carry the ``chaos`` marker, which the default run
deselects. Randomness comes from one seed, printed at the end of the run and in every failure
message; ``THOP_CHAOS_SEED=<n>`` replays it.

From ``tests/e2e/conftest.py`` (imported here, unchanged):

* ``thb_crd``: the TaskHandlerBundle CRD, applied and Established.
* ``migrated``: a fresh database with Airflow's schema and ours.
* ``namespace``: ``kube_namespace`` prepared for the operator (restricted Pod Security, the
  probe account, the operator's RBAC, the git Secret).
* ``start``: ``start([namespaces]) -> Operator``, one ``taskhandler-operator run``.

Added here:

* ``chaos_rng``: a ``random.Random`` for this test, derived from the session seed and the
  test's id (the same seed replays the same draws).
* ``replicas``: ``replicas(namespace, database, name, **THOP_env) -> Replica`` (not started):
  ``taskhandler-operator run`` under the operator's least-privilege identity; replicas of a
  test share its revision store and signing key, so ``replica.start()`` after ``kill()`` is a
  restarted pod. All are stopped at teardown.
* ``record_jobs``: ``record_jobs(namespace) -> JobRecorder``, a watch on the apiserver
  recording every probe Job ever created in the namespace (one entry per uid, across watch
  reconnects); stopped at teardown. ``duplicates()`` lists artifacts probed by two Jobs.
* ``fresh_database``: ``fresh_database(stubs) -> url``, another database with both schemas
  and the given ``{dag_id: [(task_id, queue)]}`` stubs; dropped at teardown.
* ``fresh_namespace``: ``fresh_namespace() -> name``, another prepared namespace; deleted at
  teardown.
* ``bundle_run``: ``bundle_run(namespace, url, bundle=, artifacts=, parallelism=, env=) ->
  BundleRun``,
  the setup the control-plane, database and kill tests share: a fresh database with the
  artifacts' stubs, a Job recorder, a replica started and leading, then the Go bundle over
  ``url`` applied.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.db.migrate import upgrade
from tests.chaos.harness import (
    JobRecorder,
    chaos_seed,
    diagnose,
    go_bundle,
    replay_hint,
    seeded,
    stubs,
    wait_leading,
)
from tests.e2e.conftest import migrated as migrated
from tests.e2e.conftest import namespace as namespace
from tests.e2e.conftest import start as start
from tests.e2e.conftest import thb_crd as thb_crd
from tests.e2e.faults_support import Replica, replica
from tests.e2e.operator_env import OPERATOR_USER, apply, prepare_namespace, seed_dags

MakeReplica = Callable[..., Replica]
RecordJobs = Callable[[str], JobRecorder]
FreshDatabase = Callable[[Mapping[str, Sequence[tuple[str, str]]]], str]
FreshNamespace = Callable[[], str]

_used_seed: list[int] = []


@pytest.fixture
def chaos_rng(request: pytest.FixtureRequest) -> random.Random:
    _used_seed[:] = [chaos_seed()]
    print(f"chaos seed {chaos_seed()} ({replay_hint()})")
    return seeded(request.node.nodeid)


@pytest.fixture
def replicas(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[MakeReplica]:
    made: list[Replica] = []

    def make(namespace: str, database: str, name: str, **extra: str) -> Replica:
        r = replica(kube_cluster, OPERATOR_USER, namespace, database, tmp_path, name, **extra)
        made.append(r)
        return r

    try:
        yield make
    finally:
        for r in made:
            r.stop()


@pytest.fixture
def record_jobs(kube_cluster: KubeCluster) -> Iterator[RecordJobs]:
    recorders: list[JobRecorder] = []

    def record(namespace: str) -> JobRecorder:
        recorder = JobRecorder(kube_cluster.kubeconfig, namespace).start()
        recorders.append(recorder)
        return recorder

    try:
        yield record
    finally:
        for recorder in recorders:
            recorder.stop()


@pytest.fixture
def fresh_database(pg_server: PostgresServer, airflow_template: str) -> Iterator[FreshDatabase]:
    made: list[str] = []

    def make(dags: Mapping[str, Sequence[tuple[str, str]]]) -> str:
        name = f"thop_chaos_{uuid.uuid4().hex[:12]}"
        pg_server.create_database(name, template=airflow_template)
        made.append(name)
        url = pg_server.url(name)
        upgrade(url)
        seed_dags(url, dags)
        return url

    try:
        yield make
    finally:
        for name in made:
            pg_server.drop_database(name)


@pytest.fixture
def fresh_namespace(kube_cluster: KubeCluster) -> Iterator[FreshNamespace]:
    made: list[str] = []

    def make() -> str:
        name = f"chaos-{uuid.uuid4().hex[:10]}"
        kube_cluster.kubectl("create", "namespace", name)
        made.append(name)
        # Pods are refused until the serviceaccount controller has made the default account.
        kube_cluster.kubectl(
            "wait",
            "--for=jsonpath={.metadata.name}=default",
            "serviceaccount/default",
            "-n",
            name,
            "--timeout=60s",
            check=False,
        )
        prepare_namespace(kube_cluster, name)
        return name

    try:
        yield make
    finally:
        for name in made:
            kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class BundleRun(NamedTuple):
    """A Go bundle applied under a leading replica, and what a test reads and reports of it."""

    database: str
    recorder: JobRecorder
    op: Replica
    more: Callable[[], str]


@dataclass(frozen=True)
class StartBundleRun:
    """``bundle_run(namespace, url, ...)``: what the ``bundle_run`` fixture hands a test."""

    cluster: KubeCluster
    fresh_database: FreshDatabase
    replicas: MakeReplica
    record_jobs: RecordJobs

    def __call__(
        self,
        namespace: str,
        url: str,
        *,
        bundle: str,
        artifacts: int,
        parallelism: int,
        run: str = "a",
        note: Callable[[], str] = lambda: "",
        env: Mapping[str, str] | None = None,
    ) -> BundleRun:
        """A fresh database with ``artifacts`` stubs, a Job recorder on ``namespace``, replica
        ``run`` started (with the ``THOP_*`` settings ``env``) and leading, then the Go
        ``bundle`` over ``url`` applied; ``more()`` is the failure report, after ``note()``."""
        database = self.fresh_database(stubs(artifacts))
        recorder = self.record_jobs(namespace)
        op = self.replicas(namespace, database, run, **dict(env or {})).start()

        def more() -> str:
            return note() + diagnose(self.cluster, namespace, [bundle], [op], recorder)

        wait_leading(op, more)
        apply(self.cluster, go_bundle(namespace, bundle, url, parallelism))
        return BundleRun(database, recorder, op, more)


@pytest.fixture
def bundle_run(
    kube_cluster: KubeCluster,
    fresh_database: FreshDatabase,
    replicas: MakeReplica,
    record_jobs: RecordJobs,
) -> StartBundleRun:
    return StartBundleRun(kube_cluster, fresh_database, replicas, record_jobs)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _used_seed:
        terminalreporter.write_line(f"chaos tests ran with seed {_used_seed[0]} ({replay_hint()})")
