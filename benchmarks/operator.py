"""Operator benchmark: the whole operator on the real control plane, process node and PostgreSQL.

One run measures, each against a baseline measured in the same run where one applies:

* **probe Job time** (the baseline): a bundle with one TypeScript artifact, probed five times
  (created, then changed four times); the median time from the Job's creation to its completion, as
  seen by a watch on Jobs (millisecond resolution, not the API's whole-second timestamps);
* **cold start**: a bundle of ``--cold-artifacts`` new artifacts at ``--parallelism``: wall time
  from ``kubectl apply`` to Ready, over the ideal ``ceil(artifacts / parallelism)`` × the probe
  Job time, and over the same rounds of its own Jobs' median time under load; then as many new
  artifacts at parallelism ``--free-cores`` (the machine's cores), where that ideal is
  physically reachable: the target (≤ 1.3x) applies to that run;
* **change propagation**: a git bundle of three artifacts; a commit changes one of them, then
  the reconcile-now annotation; the time from the commit until its task's binding row points at
  the new content in the database (the bound artifact row has the new size), over the probe Job
  time (target ≤ 1x + 2 s);
* **steady state**: ``--bundles`` volume bundles of ``--artifacts`` unchanged artifacts each,
  with a short ``--interval``, then two smaller sets of a tenth of the bundles, one with
  ``--artifacts`` and one with twice as many (the statement count per pass must not depend on
  the artifact count; the two share a bundle count, since the bundle count changes how often
  the shared inventory refresh and the connection pool's churn fall on a pass). Over a
  ``--window`` after the first passes and a ``--settle`` (by default one interval: each
  bundle's first pass binds its Dags, so its second still takes the whole path; later ones keep
  the outcome): probe Jobs created (target 0), SQL statements per pass (pg_stat_statements of
  the database, every statement the server executed, BEGIN/COMMIT included), operator
  CPU-seconds per pass (psutil, process and children; the target is on its ratio to a reference
  workload measured in the same run, ``reference_samples``, calibrated to 20 ms on the machine
  the targets were set on), peak RSS (the kernel's VmHWM, target ≤ 256 MiB, the chart's memory
  request) and apiserver requests per pass by verb (the apiserver's own
  ``apiserver_request_total``; target: no writes). Passes are the operator's own
  ``taskhandler_operator_reconcile_duration_seconds_count``;
* **the unchanged pass with a publish policy**: a third smaller set, as many bundles and
  artifacts as the first of the two above (which sets no ``spec.publish``: today's
  ``Automatic``), with ``spec.publish.policy: NoRemoval`` (issue 23): its CPU and SQL statements
  per pass over the policy-free set's, as ratios (targets ``TARGET_POLICY_*_RATIO``: within
  noise), and no probe Job or apiserver write;
* **failover**: two replicas; SIGKILL of the leader; the time until the standby holds the Lease
  and has finished a reconcile pass (its own metrics), against the Lease duration + 5 s;
* **restart** (``benchmarks/_restart.py``): ``--bundles`` × ``--artifacts`` bundles bound by
  one operator (its cold first start reported too), stopped gracefully, then a new one started:
  seconds until every bundle's first pass in the new process and its first and last Ready
  (target: every first pass within 60 s);
* **probe Jobs followed by watches**: ``--watch-probes`` artifacts probed at once, each writing
  ``--watch-log-mib`` MiB into its container log (the TypeScript runtime's ``big-log`` mode,
  past the probe driver's relay budget) and answering after ``--watch-seconds``: the operator's
  requests on Jobs, pods and logs per running Job per minute, from the apiserver's audit log of
  the operator's user (watches apart; target: at most 2), and the operator's peak RSS (VmHWM)
  before and after the probes;
* **scale-out by shards** (``benchmarks/_scaleout.py``): ``--scaleout-bundles`` bundles of
  ``--scaleout-artifacts`` unchanged artifacts as one shard, then the same bundles as two shards
  of half each (the second half labelled ``langsdk.dev/shard: b``), then as one shard again:
  each shard's CPU per second over the mean of the single shard's two windows and its peak RSS
  above an operator with no bundles over the single shard's (target ≤ 0.55 each), every
  bundle reconciled by exactly one shard in the window (passes per bundle from each operator's
  metrics), apiserver requests per pass of two shards over one's, and the time until every
  bundle's first pass in each;
* **one probe's own cost** (``benchmarks/probe_cost.py``), first, before PostgreSQL and the
  control plane start.

Setting the numbers up. Probing 1,000 × 20 artifacts once would take hours on a small machine
and measures nothing of the steady state, so the steady-state bundles' answers are recorded
before the operator starts, as Airflow's Dag processor may record them: one artifact is probed
for real (the baseline bundle), and its answer, with the Dag and task names changed, is written
for every artifact of every bundle through the operator's own writer (``record_artifacts``,
under each bundle's claim). The operator's first pass therefore finds every artifact known,
exactly as in a steady state; its Job count over the whole run says so.

How the operator runs. The chart is rendered with ``helm template`` (the values the process
node needs, from ``devenv.chart_install``) and its Deployment's container command, arguments and
environment are run as a host process, with what the kubelet would supply supplied by hand:
the namespace from the downward API, the mounted Secrets as host files, the revisions volume as
a host folder and, instead of the service account token, a kubeconfig of a user bound to the
chart's own RBAC rules. A process is needed rather than a pod to measure its CPU and memory and
to SIGKILL it; two chart replicas on the process node would also clash on host ports. Probe Jobs
are real Jobs, run by the process node (TypeScript artifacts: no toolchain build per artifact).

Run: ``python -m benchmarks.operator [--bundles 1000] [--artifacts 20] [--cold-artifacts 100]
[--parallelism 8] [--scaleout-bundles 2000] [--phases ...]``; progress goes to stderr, the table
to stdout, JSON to ``benchmarks/results/operator.json``. Needs ``make k8s-bins system-deps
airflow-venv``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import _scaleout
from benchmarks._operator_env import (
    WRITE_VERBS,
    AuditCounter,
    JobWatcher,
    OperatorProcess,
    admin_api,
    apiserver_requests,
    audit_args,
    bundle_manifest,
    bundle_status,
    chart_operator,
    handler_spec,
    is_ready,
    list_bundles,
    log,
    make_namespace,
    request_delta,
    statements_executed,
    typescript_artifact,
    wait_until,
    write_world_readable,
)
from benchmarks._report import print_table, write_json
from benchmarks._restart import restart_phase, restart_rows
from taskhandler_devenv.kubecluster.bins import REPO_ROOT, ensure_bins
from taskhandler_devenv.kubecluster.control_plane import (
    ControlPlaneOptions,
    KubeCluster,
    start_cluster,
)
from taskhandler_devenv.operator_process import apply_all, request_reconcile
from taskhandler_devenv.postgres import (
    AirflowCli,
    PostgresServer,
    ensure_airflow_venv,
)
from taskhandler_devenv.serialized_dags import (
    dag_document,
    ensure_bundle,
    insert_dag,
    stub_task,
)
from taskhandler_operator.controller.leader import ElectionConfig
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.known_artifacts import load_known_artifacts
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.db.writer import record_artifacts
from taskhandler_operator.kube import names
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.records import ArtifactRecord, BundleOwner, TaskHandlerArtifact

TARGET_COLD_RATIO = 1.3
TARGET_CHANGE_EXTRA_S = 2.0
TARGET_CPU_MS = 20.0
#: The CPU per unchanged pass over the reference workload's CPU (``reference_samples``), both
#: measured in the same run: the target that holds on any machine (issue 24). Calibrated so that
#: it means TARGET_CPU_MS on the kind of machine issue 14's targets were set on (2 CPUs; one
#: probe Job alone 1.02-1.03 s): the median of 19 runs on such a machine, 2026-12-03 (the 10 of
#: that day's full benchmark run, load average about 1, and 9 alone at load average 0.8): 1,006 ms
#: (873-1,263). The first calibration (2,780 ms, 2026-12-02) was taken on a machine about twice
#: as slow, which made the ratio mean 7.2 ms on this kind. Re-measure on a quiet machine with
#: ``python -c "from benchmarks.operator import reference_samples as r; print(r(9))"``; a busy
#: one inflates it (1,539 ms right after another benchmark's run, 1,027 ms a minute later).
REFERENCE_CALIBRATION_MS = 1006.0
TARGET_CPU_RATIO = round(TARGET_CPU_MS / REFERENCE_CALIBRATION_MS, 4)
#: Fresh interpreters the reference workload is the median of, before and after the windows.
REFERENCE_RUNS = 5
#: What the reference imports: the operator's own start-up (the `run` command's closure).
REFERENCE_IMPORTS = (
    "kopf",
    "kubernetes.client",
    "taskhandler_operator.controller.runtime",
    "taskhandler_operator.controller.switchboard",
    "taskhandler_operator.controller.leader",
    "taskhandler_operator.controller.health",
    "taskhandler_operator.controller.metrics",
    "taskhandler_operator.controller.bundle",
)
TARGET_RSS_MIB = 256.0  # the chart's default memory request (issue 24)
#: The unchanged pass with a publish policy set (issue 23) against the same set without one,
#: both measured in this run: CPU per pass within this ratio (the noise between two windows of
#: equal sets on a shared 2-core machine: the 20- and 40-artifact sets of this benchmark, whose
#: passes do the same work, have differed by 10 %), SQL statements per pass within 10 % (one
#: pass more or less in a window), and no apiserver write.
POLICY_UNDER_TEST = "NoRemoval"
TARGET_POLICY_CPU_RATIO = 1.25
TARGET_POLICY_SQL_RATIO = 1.10
FAILOVER_GRACE_S = 5.0
#: Requests on Jobs, pods and logs per running probe Job per minute, besides the watches.
TARGET_JOB_REQUESTS_PER_MINUTE = 2.0
#: Resources whose requests a probe Job costs.
_JOB_RESOURCES = frozenset({"jobs", "pods", "pods/log", "jobs/status", "pods/status"})
TEMPLATE_DAG = "benchdagtemplate"
TEMPLATE_TASK = "benchtasktemplate"
WAIT = 900.0
#: Probes of one artifact the probe Job time is the median of.
BASELINE_PROBES = 5
DATABASE = "operator_bench"
ALL_PHASES = "probe,steady,failover,restart,watch,cost,scaleout"


# --- set-up ---------------------------------------------------------------------------------


@contextmanager
def postgres() -> Iterator[tuple[PostgresServer, str]]:
    """A throwaway server with pg_stat_statements, Airflow's schema and the operator's."""
    server = PostgresServer(
        settings={
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all",
            "pg_stat_statements.max": "10000",
        }
    )
    server.start()
    try:
        log("PostgreSQL started; migrating Airflow's schema (side venv)")
        server.create_database(DATABASE)
        AirflowCli(ensure_airflow_venv())(server.url(DATABASE), "db", "migrate", timeout=600)
        url = server.url(DATABASE)
        upgrade(url)
        with server.connect() as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.commit()
        yield server, url
    finally:
        server.stop()


@contextmanager
def cluster(work: Path) -> Iterator[KubeCluster]:
    log("starting the control plane and the process node")
    # The apiserver audits the operator's user only: its requests, counted by the server.
    options = ControlPlaneOptions(extra_apiserver_args=audit_args(work / "audit"))
    kube = start_cluster(ensure_bins(), options)
    try:
        kube.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / names.CRD_FILE))
        kube.kubectl(
            "wait", "--for=condition=Established", f"crd/{names.CRD_NAME}", "--timeout=60s"
        )
        yield kube
    finally:
        kube.stop()


def seed_dags(url: str, dags: dict[str, tuple[str, Sequence[str]]]) -> None:
    """Serialized Dags, ``dag_id -> (queue, task_ids)``, every task a stub on the queue, and
    the Dag bundle of each queue's TaskHandlerBundle (each is named as its queue) registered."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for dag_id, (queue, tasks) in dags.items():
                ensure_bundle(conn, queue)
                insert_dag(conn, dag_document(dag_id, [stub_task(t, queue=queue) for t in tasks]))
    finally:
        engine.dispose()


def bound_size(url: str, dag_id: str, task_id: str) -> int | None:
    """The size of the artifact the task's binding row points at (None: no binding)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            size = conn.execute(
                sa.text(
                    "SELECT a.size_bytes FROM lang_sdk_task_handler b "
                    "JOIN lang_sdk_task_handler_artifact a ON a.id = b.artifact_id "
                    "WHERE b.dag_id = :d AND b.task_id = :t"
                ),
                {"d": dag_id, "t": task_id},
            ).scalar_one_or_none()
    finally:
        engine.dispose()
    return None if size is None else int(size)


def wait_ready(api: Any, namespace: str, name: str, op: OperatorProcess) -> float:
    def ready() -> bool:
        if not op.alive():
            raise RuntimeError(f"the operator exited:\n{op.tail()}")
        return is_ready(bundle_status(api, namespace, name))

    try:
        return wait_until(f"{name} Ready", ready, WAIT, poll=0.1)
    except TimeoutError as exc:
        status = json.dumps(bundle_status(api, namespace, name))[-2000:]
        raise RuntimeError(f"{exc}\nstatus: {status}\noperator log:\n{op.tail()}") from None


def wait_handled(api: Any, namespace: str, name: str, token: str) -> None:
    wait_until(
        f"{name} handled {token}",
        lambda: bundle_status(api, namespace, name).get("lastHandledReconcileAt") == token,
        WAIT,
    )


# --- probe Job time, cold start, change propagation -------------------------------------------


def probe_phase(
    kube: KubeCluster, url: str, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The baseline probe Job time, the cold start and the change propagation, on one
    operator; also returns the recorded answer the steady state's rows are made from."""
    from taskhandler_devenv.git_server import make_repo, start_http_server

    namespace = f"bench-probe-{uuid.uuid4().hex[:6]}"
    make_namespace(kube, namespace)
    api = admin_api(kube)
    jobs = JobWatcher(api, namespace).start()
    folder = work / "volumes" / "probe-one"
    seed_dags(
        url,
        {
            TEMPLATE_DAG: ("probe-one", [TEMPLATE_TASK]),
            "bench_cold": ("cold", [f"c{i}" for i in range(args.cold_artifacts)]),
            "bench_cold_cores": ("cold-cores", [f"c{i}" for i in range(args.cold_artifacts)]),
            "bench_git": ("git", ["g0", "g1", "g2"]),
        },
    )
    op = chart_operator(kube, namespace, url, work / "probe-operator", parallelism=args.parallelism)
    server = start_http_server(work / "git-http", None)
    try:
        op.start()
        # 1. The baseline: one artifact, probed BASELINE_PROBES times (created, then changed).
        artifact = folder / "one.min.mjs"
        write_world_readable(
            artifact, typescript_artifact(handler_spec(TEMPLATE_DAG, [TEMPLATE_TASK]))
        )
        volume = {"volume": {"path": str(folder)}}
        apply_all(kube, [bundle_manifest(namespace, "probe-one", volume)])
        wait_ready(api, namespace, "probe-one", op)
        log("baseline bundle Ready; reading its recorded answer")
        template = asyncio.run(_known(url, "probe-one"))[0]
        for i in range(BASELINE_PROBES - 1):
            extra = f"unstubbed_{i}"
            spec = handler_spec(TEMPLATE_DAG, [TEMPLATE_TASK, extra])
            write_world_readable(artifact, typescript_artifact(spec))
            token = f"baseline-{i}"
            request_reconcile(kube, namespace, "probe-one", token)
            wait_handled(api, namespace, "probe-one", token)
        samples = jobs.durations()
        if len(samples) < BASELINE_PROBES:
            raise RuntimeError(f"expected {BASELINE_PROBES} baseline probe Jobs: {samples}")
        job_s = statistics.median(samples)
        log(f"probe Job time: {job_s:.2f}s (median of {[round(s, 2) for s in samples]})")

        # 2. Cold start: N new artifacts at the given parallelism, then at as many as the
        # machine's free cores (where the ideal can be reached).
        cold = cold_start(
            kube, api, jobs, op, work, namespace, "cold", args.cold_artifacts, args.parallelism
        )
        cold_cores = cold_start(
            kube, api, jobs, op, work, namespace, "cold-cores", args.cold_artifacts, args.free_cores
        )

        # 3. Change propagation from a git commit.
        repo = make_repo(server.root / "git", "bench", work / "git-work")
        files: dict[str, bytes | str | None] = {
            f"ts/g{i}.min.mjs": typescript_artifact(handler_spec("bench_git", [f"g{i}"]))
            for i in range(3)
        }
        repo.commit(files, "three artifacts")
        source = {"git": {"url": repo.http_url(server), "ref": "main", "path": "ts"}}
        apply_all(kube, [bundle_manifest(namespace, "git", source)])
        wait_ready(api, namespace, "git", op)
        # The changed g0 also declares a handler no stub uses: new content, new size.
        changed = typescript_artifact(handler_spec("bench_git", ["g0", "g_unstubbed"]))
        change_since = time.monotonic()
        repo.commit({"ts/g0.min.mjs": changed}, "g0 changed")
        request_reconcile(kube, namespace, "git", "change-1")
        change_done = wait_until(
            "g0's binding to the new content",
            lambda: bound_size(url, "bench_git", "g0") == len(changed),
            WAIT,
            0.05,
        )
        change_s = change_done - change_since
        change_jobs = jobs.durations(since=change_since)
        log(f"change propagation: {change_s:.2f}s (its probe Job: {change_jobs})")
    finally:
        op.stop()
        server.proc.stop(2)
        jobs.stop()
        api.close()
    # The apiserver counts requests cluster-wide: Jobs left here would be deleted by the TTL
    # controller during a later window and counted as writes there. Delete them (and their
    # pods) now.
    log("deleting the probe phase's Jobs and pods")
    kube.kubectl(
        "delete",
        "jobs",
        "--all",
        "-n",
        namespace,
        "--cascade=foreground",
        "--wait=true",
        timeout=600,
    )
    return {
        "namespace": namespace,
        "template": template,
        "probe_job_seconds": round(job_s, 3),
        "probe_job_samples": [round(s, 3) for s in samples],
        "cold_start": cold_ratios(cold, job_s),
        "cold_start_free_cores": cold_ratios(cold_cores, job_s),
        "free_cores": args.free_cores,
        "change": {
            "seconds": round(change_s, 3),
            "probe_job_seconds": round(job_s, 3),
            "over_job_seconds": round(change_s - job_s, 3),
            "jobs": len(change_jobs),
        },
    }


def cold_start(
    kube: KubeCluster,
    api: Any,
    jobs: JobWatcher,
    op: OperatorProcess,
    work: Path,
    namespace: str,
    name: str,
    artifacts: int,
    parallelism: int,
) -> dict[str, Any]:
    """One bundle of ``artifacts`` new artifacts at ``parallelism``: wall time to Ready and the
    Jobs' own durations (each artifact declares one task of the Dag seeded for ``name``)."""
    dag_id = {"cold": "bench_cold", "cold-cores": "bench_cold_cores"}[name]
    folder = work / "volumes" / name
    for i in range(artifacts):
        data = typescript_artifact(handler_spec(dag_id, [f"c{i}"]))
        write_world_readable(folder / f"a{i:03d}.min.mjs", data)
    since = time.monotonic()
    manifest = bundle_manifest(
        namespace, name, {"volume": {"path": str(folder)}}, parallelism=parallelism
    )
    apply_all(kube, [manifest])
    wall = wait_ready(api, namespace, name, op) - since
    log(f"{name}: {wall:.1f}s for {artifacts} artifacts at parallelism {parallelism}")
    return {
        "artifacts": artifacts,
        "parallelism": parallelism,
        "wall_seconds": wall,
        "job_seconds": jobs.durations(since=since),
    }


def cold_ratios(cold: dict[str, Any], job_s: float) -> dict[str, Any]:
    """A cold start against its ideal, ceil(N / P) x one probe Job alone, and against the same
    rounds of its own Jobs' median time under load."""
    rounds = math.ceil(cold["artifacts"] / cold["parallelism"])
    wall, jobs = cold["wall_seconds"], cold["job_seconds"]
    loaded = statistics.median(jobs) if jobs else job_s
    return {
        "artifacts": cold["artifacts"],
        "parallelism": cold["parallelism"],
        "machine_cores": os.cpu_count(),
        "wall_seconds": round(wall, 2),
        "ideal_seconds": round(rounds * job_s, 2),
        "ratio": round(wall / (rounds * job_s), 3),
        "jobs": len(jobs),
        # The same Jobs' own median while they ran together: the ratio against it says how
        # much of the wall time is the operator's rather than the machine's.
        "job_seconds_median": round(loaded, 3),
        "ratio_to_loaded_job_time": round(wall / (rounds * loaded), 3),
    }


async def _known(url: str, bundle_name: str) -> list[TaskHandlerArtifact]:
    engine = create_engine(url)
    try:
        return await load_known_artifacts(engine, bundle_name)
    finally:
        await engine.dispose()


# --- steady state ------------------------------------------------------------------------------


def renamed(template: TaskHandlerArtifact, dag_id: str, task_id: str) -> dict[str, Any]:
    """The template's recorded answer, declaring ``dag_id.task_id`` instead."""
    text = json.dumps(template.model_dump(mode="json")["task_handlers"])
    text = text.replace(json.dumps(TEMPLATE_DAG), json.dumps(dag_id))
    handlers: dict[str, Any] = json.loads(
        text.replace(json.dumps(TEMPLATE_TASK), json.dumps(task_id))
    )
    for declarations in handlers.values():
        declarations[:] = [d for d in declarations if d.get("task_id") == task_id]
    return handlers


async def _record(
    url: str,
    namespace: str,
    uids: dict[str, str],
    rows: dict[str, list[TaskHandlerArtifact]],
) -> None:
    engine = create_engine(url)
    now = datetime.now(UTC)
    try:
        for name, artifacts in rows.items():
            owner = BundleOwner(cluster_id="bench", namespace=namespace, name=name, uid=uids[name])
            records = [ArtifactRecord(artifact=a, probed_at=now) for a in artifacts]
            await record_artifacts(engine, name, records, owner=owner)
    finally:
        await engine.dispose()


def settle_seconds(args: argparse.Namespace) -> float:
    """The wait between every bundle Ready and the window. By default one interval (with its
    +20 % jitter) plus 10 s: a bundle's first pass binds its Dags (a write), so its second pass
    takes the whole path once more before later ones keep the outcome (the unchanged pass,
    docs/operator.md); the window measures those."""
    if args.settle is not None:
        return float(args.settle)
    return parse_duration(args.interval).total_seconds() * 1.2 + 10.0


def volume_bundles(
    kube: KubeCluster,
    url: str,
    root: Path,
    namespace: str,
    template: TaskHandlerArtifact,
    bundles: Sequence[tuple[str, str]],
    artifacts: int,
    interval: str,
    *,
    label: str,
    **spec: Any,
) -> list[str]:
    """Bundles (name, Dag id) with volume sources under ``root``, ``artifacts`` TypeScript
    artifacts each (one stub task apiece), their Dags seeded, applied with ``interval`` (and
    ``spec``'s extra fields), and every answer recorded as Airflow's Dag processor would, so
    no probe Job is needed; their names in order. Every phase with a bound world makes it so."""
    from taskhandler_operator.artifacts.listing import list_candidates
    from taskhandler_operator.artifacts.models import Language

    log(f"{label}: writing {len(bundles)} bundles x {artifacts} artifacts")
    dags: dict[str, tuple[str, Sequence[str]]] = {}
    specs: dict[str, list[tuple[str, str, str]]] = {}  # name -> (rel, dag, task)
    for name, dag_id in bundles:
        tasks = [f"t{a}" for a in range(artifacts)]
        dags[dag_id] = (name, tasks)
        specs[name] = []
        for a, task in enumerate(tasks):
            rel = f"a{a:02d}.min.mjs"
            data = typescript_artifact(handler_spec(dag_id, [task]))
            write_world_readable(root / name / rel, data)
            specs[name].append((rel, dag_id, task))
    seed_dags(url, dags)
    manifests = [
        bundle_manifest(
            namespace, name, {"volume": {"path": str(root / name)}}, interval=interval, **spec
        )
        for name in specs
    ]
    for start in range(0, len(manifests), 200):
        apply_all(kube, manifests[start : start + 200])
    api = admin_api(kube)
    try:
        uids = {i["metadata"]["name"]: i["metadata"]["uid"] for i in list_bundles(api, namespace)}
    finally:
        api.close()
    log(f"{label}: recording the known answers (as Airflow's Dag processor would)")
    rows: dict[str, list[TaskHandlerArtifact]] = {}
    for name, entries in specs.items():
        listing = list_candidates(root / name, Language.TYPESCRIPT)
        by_rel = {c.rel_path: c for c in listing.candidates}
        rows[name] = [
            TaskHandlerArtifact(
                bundle_name=name,
                relative_fileloc=rel,
                size_bytes=by_rel[rel].size_bytes,
                cache_digest=by_rel[rel].cache_digest,
                task_handlers=renamed(template, dag_id, task),
            )
            for rel, dag_id, task in entries
        ]
    asyncio.run(_record(url, namespace, uids, rows))
    return list(specs)


def steady_phase(
    kube: KubeCluster,
    server: PostgresServer,
    url: str,
    work: Path,
    args: argparse.Namespace,
    template: TaskHandlerArtifact,
    bundles: int,
    artifacts: int,
    label: str,
    policy: str | None = None,
) -> dict[str, Any]:
    namespace = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    make_namespace(kube, namespace)
    api = admin_api(kube)
    jobs = JobWatcher(api, namespace).start()
    # None: no spec.publish at all, exactly the manifests from before publish policies existed.
    publish: dict[str, Any] = {} if policy is None else {"publish": {"policy": policy}}
    volume_bundles(
        kube,
        url,
        work / "volumes" / label,
        namespace,
        template,
        [(f"{label}-{b:04d}", f"{label}_{label}-{b:04d}") for b in range(bundles)],
        artifacts,
        args.interval,
        label=label,
        **publish,
    )

    op = chart_operator(
        kube, namespace, url, work / f"{label}-operator", parallelism=args.parallelism
    )
    started = time.monotonic()
    op.start()
    try:
        last_report = [0.0]

        def all_ready() -> bool:
            if not op.alive():
                raise RuntimeError(f"the operator exited:\n{op.tail()}")
            ready = sum(
                1 for item in list_bundles(api, namespace) if is_ready(item.get("status") or {})
            )
            if time.monotonic() - last_report[0] > 15:
                last_report[0] = time.monotonic()
                log(f"{label}: {ready}/{bundles} bundles Ready, {op.passes():.0f} passes")
            return ready == bundles

        wait_until(f"{label}: every bundle Ready", all_ready, max(WAIT, bundles * 3.0), poll=2)
        first_passes_s = time.monotonic() - started
        log(
            f"{label}: first passes done in {first_passes_s:.0f}s; "
            f"settling, then a {args.window:g}s window"
        )
        time.sleep(settle_seconds(args))
        jobs_before = len(jobs.created)
        passes_0, cpu_0 = op.passes(), op.cpu_seconds()
        statements_0 = statements_executed(server.admin_url, DATABASE)
        requests_0 = apiserver_requests(kube)
        time.sleep(args.window)
        requests_1 = apiserver_requests(kube)
        statements_1 = statements_executed(server.admin_url, DATABASE)
        passes_1, cpu_1 = op.passes(), op.cpu_seconds()
        jobs_after = len(jobs.created)
        rss = op.peak_rss_mib()
    finally:
        op.stop()
        jobs.stop()
        api.close()
    passes = passes_1 - passes_0
    # The apiserver counts every client's requests; the window's statements of the operator's
    # kinds are its own (nothing else touches bundles, Jobs or Events in the namespace now).
    delta = request_delta(requests_0, requests_1)
    ours = {k: v for k, v in delta.items() if k[1].split("/")[0] in _OPERATOR_RESOURCES}
    writes = {f"{v} {r}": n for (v, r), n in ours.items() if v in WRITE_VERBS}
    reads = {f"{v} {r}": n for (v, r), n in ours.items() if v not in WRITE_VERBS}
    lease_writes = sum(n for (v, r), n in delta.items() if r == "leases" and v in WRITE_VERBS)
    per_pass = max(passes, 1.0)
    return {
        "namespace": namespace,
        "bundles": bundles,
        "artifacts_per_bundle": artifacts,
        "publish_policy": policy or "Automatic (unset)",
        "interval": args.interval,
        "first_passes_seconds": round(first_passes_s, 1),
        "window_seconds": args.window,
        "settle_seconds": settle_seconds(args),
        "passes": passes,
        "probe_jobs_total": len(jobs.created),
        "probe_jobs_after_first_passes": jobs_after - jobs_before,
        "sql_statements": statements_1 - statements_0,
        "sql_statements_per_pass": round((statements_1 - statements_0) / per_pass, 2),
        "cpu_seconds": round(cpu_1 - cpu_0, 3),
        "cpu_ms_per_pass": round((cpu_1 - cpu_0) * 1000 / per_pass, 2),
        "peak_rss_mib": round(rss, 1),
        "apiserver_writes": writes,
        "apiserver_reads": reads,
        "apiserver_writes_per_pass": round(sum(writes.values()) / per_pass, 3),
        "apiserver_reads_per_pass": round(sum(reads.values()) / per_pass, 3),
        "lease_writes_all_clients": lease_writes,
    }


_OPERATOR_RESOURCES = frozenset({names.PLURAL, "jobs", "pods", "events", "secrets", "configmaps"})


# --- failover ----------------------------------------------------------------------------------


def failover_phase(
    kube: KubeCluster, url: str, work: Path, args: argparse.Namespace, template: TaskHandlerArtifact
) -> dict[str, Any]:
    namespace = f"bench-failover-{uuid.uuid4().hex[:6]}"
    make_namespace(kube, namespace)
    api = admin_api(kube)
    folder = work / "volumes" / "failover"
    seed_dags(url, {"bench_failover": ("failover", ["f0"])})
    write_world_readable(
        folder / "f0.min.mjs", typescript_artifact(handler_spec("bench_failover", ["f0"]))
    )
    replicas_dir = work / "failover-operator"
    first = chart_operator(
        kube, namespace, url, replicas_dir, parallelism=args.parallelism, name="a"
    )
    second = chart_operator(
        kube, namespace, url, replicas_dir, parallelism=args.parallelism, name="b"
    )
    try:
        first.start()
        apply_all(kube, [bundle_manifest(namespace, "failover", {"volume": {"path": str(folder)}})])
        wait_ready(api, namespace, "failover", first)
        second.start()
        wait_until(
            "the standby's metrics",
            lambda: (second.metrics() or {}).get("taskhandler_operator_leader") == 0.0,
            120,
            0.2,
        )
        time.sleep(2)  # the standby has read the Lease at least once
        log("failover: SIGKILL of the leader")
        killed = time.monotonic()
        first.kill()

        def standby_reconciled() -> bool:
            sums = second.metrics() or {}
            return (
                sums.get("taskhandler_operator_leader") == 1.0
                and sums.get("taskhandler_operator_reconcile_duration_seconds_count", 0.0) > 0
            )

        took_over = wait_until("the standby to reconcile", standby_reconciled, 300, 0.1)
    finally:
        first.stop()
        second.stop()
        api.close()
    lease = ElectionConfig(namespace=namespace).lease_duration
    seconds = took_over - killed
    log(f"failover: {seconds:.1f}s (lease {lease}s)")
    return {"seconds": round(seconds, 2), "lease_duration_seconds": lease}


# --- probe Jobs followed by watches -------------------------------------------------------------


def watch_phase(
    kube: KubeCluster, url: str, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """``--watch-probes`` probes at once, each logging ``--watch-log-mib`` MiB and answering after
    ``--watch-seconds``: the operator's requests per running Job per minute (audit log) and its
    peak RSS before and after."""
    namespace = f"bench-watch-{uuid.uuid4().hex[:6]}"
    make_namespace(kube, namespace)
    api = admin_api(kube)
    jobs = JobWatcher(api, namespace).start()
    count = args.watch_probes
    tasks = [f"w{i}" for i in range(count)]
    seed_dags(url, {"bench_watch": ("watch", tasks)})
    folder = work / "volumes" / "watch"
    options = {"log_mib": args.watch_log_mib, "answer_after_ms": int(args.watch_seconds * 1000)}
    for i, task in enumerate(tasks):
        data = typescript_artifact(handler_spec("bench_watch", [task]), "big-log", options)
        write_world_readable(folder / f"w{i:02d}.min.mjs", data)
    audit = AuditCounter(work / "audit" / "audit.log")
    op = chart_operator(kube, namespace, url, work / "watch-operator", parallelism=count)
    try:
        op.start()
        wait_until("the operator's metrics", lambda: op.metrics() is not None, 120, 0.2)
        time.sleep(3)  # its watches are established and its start-up allocations done
        rss_before = op.peak_rss_mib()
        audit.mark()
        since = time.monotonic()
        manifest = bundle_manifest(
            namespace, "watch", {"volume": {"path": str(folder)}}, parallelism=count
        )
        apply_all(kube, [manifest])
        wait_ready(api, namespace, "watch", op)
        time.sleep(2)  # the audit log is written as requests complete
        rss_after = op.peak_rss_mib()
        requests = audit.requests(namespace)
    finally:
        op.stop()
        jobs.stop()
        api.close()
    durations = jobs.durations(since=since)
    job_minutes = sum(durations) / 60.0
    ours = {k: v for k, v in requests.items() if k[1] in _JOB_RESOURCES and k[0] != "watch"}
    total = sum(ours.values())
    log(
        f"watch: {len(durations)} Jobs, {job_minutes:.2f} Job-minutes, {total} requests "
        f"({ours}); RSS {rss_before:.0f} -> {rss_after:.0f} MiB"
    )
    return {
        "namespace": namespace,
        "probes": count,
        "log_mib": args.watch_log_mib,
        "answer_after_seconds": args.watch_seconds,
        "jobs": len(durations),
        "job_minutes": round(job_minutes, 3),
        "job_requests": {f"{v} {r}": n for (v, r), n in sorted(ours.items())},
        "requests_all_kinds": {f"{v} {r}": n for (v, r), n in sorted(requests.items())},
        "job_requests_per_job": round(total / max(len(durations), 1), 2),
        "job_requests_per_job_minute": round(total / job_minutes, 2) if job_minutes else None,
        "peak_rss_mib_before": round(rss_before, 1),
        "peak_rss_mib_after": round(rss_after, 1),
    }


# --- one probe's own cost ----------------------------------------------------------------------


def probe_cost_phase() -> dict[str, Any]:
    """One probe's and one fetch's own cost per language (``benchmarks/probe_cost.py``)."""
    from benchmarks import probe_cost
    from taskhandler_devenv.runtimes import SEED_SPEC, build_runtime

    out: dict[str, Any] = {}
    for language in ("go", "java", "typescript"):
        artifact = build_runtime(language, SEED_SPEC)
        out[language] = {
            "probe": probe_cost.measure_probe_cost(language, artifact),
            "fetch": probe_cost.measure_fetch_cost(artifact),
        }
    return out


# --- the report ----------------------------------------------------------------------------------


def reference_samples(runs: int = REFERENCE_RUNS) -> list[float]:
    """CPU milliseconds (user + system) of fresh interpreters importing what the operator
    imports at start-up (``REFERENCE_IMPORTS``), after one warm-up that caches their bytecode.

    The reference workload the unchanged pass's CPU is read against: the same kind of work
    (single-threaded Python: bytecode, dicts and objects, small reads and stats), so it scales
    with a machine's single-thread speed as a pass does, and it takes seconds, not a cluster.
    """
    code = "import " + ", ".join(REFERENCE_IMPORTS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    samples = []
    with tempfile.TemporaryDirectory(prefix="thop-reference-") as folder:
        env["PYTHONPYCACHEPREFIX"] = folder
        for n in range(runs + 1):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            if n:  # the first run compiled the bytecode
                samples.append(round(cpu * 1000, 1))
    return samples


def cpu_reference(samples: Sequence[float]) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "workload": "python -c 'import " + ", ".join(REFERENCE_IMPORTS) + "' (CPU)",
        "samples_ms": list(samples),
        "median_ms": round(median, 1),
        "calibration_ms": REFERENCE_CALIBRATION_MS,
        "target_ratio": TARGET_CPU_RATIO,
        # What the ratio target means in milliseconds per pass on this machine.
        "target_ms_here": round(TARGET_CPU_RATIO * median, 1),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows, for the phases that ran (``--phases``)."""
    rows: list[dict[str, Any]] = []
    if "probe" in result:
        rows += _probe_rows(result["probe"])
    if "steady" in result:
        rows += _steady_rows(result)
    if "failover" in result:
        rows += _failover_rows(result["failover"])
    if "restart" in result:
        rows += restart_rows(result["restart"])
    if "watch" in result:
        rows += _watch_rows(result["watch"])
    if "scaleout" in result:
        rows += _scaleout.rows(result["scaleout"])
    return rows + _cost_rows(result)


def _probe_rows(probe: dict[str, Any]) -> list[dict[str, Any]]:
    change = probe["change"]
    job_s = probe["probe_job_seconds"]
    return [
        {
            "measure": "probe Job time (baseline)",
            "measured": f"{job_s:.2f} s",
            "target": "-",
            "result": "-",
        },
        *_cold_rows(probe),
        {
            "measure": "change propagation (commit + annotation to binding)",
            "measured": f"{change['seconds']:.2f} s = job + {change['over_job_seconds']:.2f} s",
            "target": f"<= 1x job + {TARGET_CHANGE_EXTRA_S:g} s",
            "result": verdict(change["seconds"] <= job_s + TARGET_CHANGE_EXTRA_S),
        },
    ]


def _cold_rows(probe: dict[str, Any]) -> list[dict[str, Any]]:
    """Both cold starts; the target applies where the ideal is reachable: at parallelism no
    higher than the machine's free cores (``--free-cores``), each Job can have a core of its own.
    """
    rows = []
    for key in ("cold_start", "cold_start_free_cores"):
        if key not in probe:
            continue
        cold = probe[key]
        reachable = cold["parallelism"] <= probe.get("free_cores", cold["machine_cores"] or 1)
        rows.append(
            {
                "measure": (
                    f"cold start {cold['artifacts']} artifacts, parallelism {cold['parallelism']}"
                    f" ({cold['machine_cores']} cores)"
                ),
                "measured": (
                    f"{cold['wall_seconds']:.1f} s = {cold['ratio']:.2f}x ideal "
                    f"{cold['ideal_seconds']:.1f} s; {cold['ratio_to_loaded_job_time']:.2f}x "
                    f"with the Jobs' time under load ({cold['job_seconds_median']:.1f} s)"
                ),
                "target": f"<= {TARGET_COLD_RATIO}x" if reachable else "- (parallelism > cores)",
                "result": verdict(cold["ratio"] <= TARGET_COLD_RATIO) if reachable else "-",
            }
        )
    return rows


def _steady_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    steady, base, compare = result["steady"], result["steady_base"], result["steady_compare"]
    rows: list[dict[str, Any]] = []
    reference = result.get("cpu_reference")
    for s in (steady, base, compare):
        scale = f"{s['bundles']} x {s['artifacts_per_bundle']}"
        rows += [
            {
                "measure": f"steady {scale}: probe Jobs after first passes",
                "measured": (
                    f"{s['probe_jobs_after_first_passes']} ({s['probe_jobs_total']} in all)"
                ),
                "target": "0",
                "result": verdict(s["probe_jobs_total"] == 0),
            },
            _cpu_row(s, scale, reference),
            {
                "measure": f"steady {scale}: operator peak RSS",
                "measured": f"{s['peak_rss_mib']:.0f} MiB",
                "target": f"<= {TARGET_RSS_MIB:g} MiB",
                "result": verdict(s["peak_rss_mib"] <= TARGET_RSS_MIB),
            },
            {
                "measure": f"steady {scale}: apiserver writes per pass",
                "measured": (
                    f"{s['apiserver_writes_per_pass']:.3f} "
                    f"({s['apiserver_reads_per_pass']:.2f} reads)"
                ),
                "target": "0",
                "result": verdict(s["passes"] > 0 and s["apiserver_writes_per_pass"] == 0),
            },
        ]
    rows += _policy_rows(result)
    # Same bundle count on both sides: only the artifact count differs.
    a, b = base["sql_statements_per_pass"], compare["sql_statements_per_pass"]
    rows.append(
        {
            "measure": (
                f"SQL statements per pass, {base['artifacts_per_bundle']} vs "
                f"{compare['artifacts_per_bundle']} artifacts ({compare['bundles']} bundles each)"
            ),
            "measured": (
                f"{a:.2f} vs {b:.2f} ({steady['sql_statements_per_pass']:.2f} at "
                f"{steady['bundles']} x {steady['artifacts_per_bundle']})"
            ),
            "target": "constant",
            # Passes are sampled over a window, so allow the fraction one pass more or less makes.
            "result": verdict(abs(a - b) <= 0.1 * max(a, b, 1.0)),
        }
    )
    return rows


def _cpu_row(s: dict[str, Any], scale: str, reference: dict[str, Any] | None) -> dict[str, Any]:
    """CPU per unchanged pass over the reference workload's (the target holds on any machine);
    without a reference, in milliseconds against TARGET_CPU_MS (the calibration machine's)."""
    row = {"measure": f"steady {scale}: operator CPU per pass"}
    ms = s["cpu_ms_per_pass"]
    if reference is None:
        return row | {
            "measured": f"{ms:.1f} ms ({s['passes']:.0f} passes)",
            "target": f"<= {TARGET_CPU_MS:g} ms",
            "result": verdict(s["passes"] > 0 and ms <= TARGET_CPU_MS),
        }
    ratio = ms / reference["median_ms"]
    return row | {
        "measured": (
            f"{ms:.1f} ms ({s['passes']:.0f} passes) = {ratio:.4f}x the reference "
            f"{reference['median_ms']:.0f} ms"
        ),
        "target": f"<= {TARGET_CPU_RATIO:g}x ({reference['target_ms_here']:g} ms here)",
        "result": verdict(s["passes"] > 0 and ratio <= TARGET_CPU_RATIO),
    }


def policy_comparison(base: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """The unchanged pass with a publish policy against without one: ratios and verdicts."""

    def ratio(key: str) -> float | None:
        a, b = base[key], policy[key]
        return round(b / a, 3) if a > 0 else None

    cpu, sql = ratio("cpu_ms_per_pass"), ratio("sql_statements_per_pass")
    passes = base["passes"] > 0 and policy["passes"] > 0
    return {
        "policy": policy["publish_policy"],
        "bundles": policy["bundles"],
        "artifacts_per_bundle": policy["artifacts_per_bundle"],
        "cpu_ms_per_pass": [base["cpu_ms_per_pass"], policy["cpu_ms_per_pass"]],
        "cpu_ratio": cpu,
        "cpu_target_ratio": TARGET_POLICY_CPU_RATIO,
        "cpu_ok": passes and cpu is not None and cpu <= TARGET_POLICY_CPU_RATIO,
        "sql_statements_per_pass": [
            base["sql_statements_per_pass"],
            policy["sql_statements_per_pass"],
        ],
        "sql_ratio": sql,
        "sql_target_ratio": TARGET_POLICY_SQL_RATIO,
        "sql_ok": passes and sql is not None and sql <= TARGET_POLICY_SQL_RATIO,
        "probe_jobs_total": policy["probe_jobs_total"],
        "apiserver_writes_per_pass": policy["apiserver_writes_per_pass"],
    }


def _policy_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    if "steady_policy" not in result:
        return []
    c = policy_comparison(result["steady_base"], result["steady_policy"])
    scale = f"{c['bundles']} x {c['artifacts_per_bundle']}"
    cpu_base, cpu_policy = c["cpu_ms_per_pass"]
    sql_base, sql_policy = c["sql_statements_per_pass"]

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    return [
        {
            "measure": f"unchanged pass with policy {c['policy']} vs Automatic ({scale}): CPU",
            "measured": f"{cpu_policy:.1f} vs {cpu_base:.1f} ms = {shown(c['cpu_ratio'])}",
            "target": f"<= {TARGET_POLICY_CPU_RATIO:g}x (noise)",
            "result": verdict(c["cpu_ok"]),
        },
        {
            "measure": (
                f"unchanged pass with policy {c['policy']} vs Automatic ({scale}): SQL statements"
            ),
            "measured": f"{sql_policy:.2f} vs {sql_base:.2f} = {shown(c['sql_ratio'])}",
            "target": f"<= {TARGET_POLICY_SQL_RATIO:g}x",
            "result": verdict(c["sql_ok"]),
        },
        {
            "measure": f"unchanged pass with policy {c['policy']}: probe Jobs, apiserver writes",
            "measured": f"{c['probe_jobs_total']}, {c['apiserver_writes_per_pass']:.3f} per pass",
            "target": "0, 0",
            "result": verdict(c["probe_jobs_total"] == 0 and c["apiserver_writes_per_pass"] == 0),
        },
    ]


def _failover_rows(failover: dict[str, Any]) -> list[dict[str, Any]]:
    limit = failover["lease_duration_seconds"] + FAILOVER_GRACE_S
    return [
        {
            "measure": "failover (SIGKILL of the leader to the standby reconciling)",
            "measured": f"{failover['seconds']:.1f} s",
            "target": f"<= {limit:g} s (lease + {FAILOVER_GRACE_S:g} s)",
            "result": verdict(failover["seconds"] <= limit),
        }
    ]


def _watch_rows(watch: dict[str, Any]) -> list[dict[str, Any]]:
    rate = watch["job_requests_per_job_minute"]
    return [
        {
            "measure": (
                "apiserver requests per running probe Job per minute "
                f"({watch['probes']} Jobs of {watch['answer_after_seconds']:g} s, "
                "watches apart)"
            ),
            "measured": (
                f"{rate:.2f} ({watch['job_requests_per_job']:.1f} per Job)"
                if rate is not None
                else "no Job seen"
            ),
            "target": f"<= {TARGET_JOB_REQUESTS_PER_MINUTE:g}",
            "result": verdict(rate is not None and rate <= TARGET_JOB_REQUESTS_PER_MINUTE),
        },
        {
            "measure": (
                f"operator peak RSS, {watch['probes']} concurrent probes of "
                f"{watch['log_mib']} MiB logs"
            ),
            "measured": (
                f"{watch['peak_rss_mib_after']:.0f} MiB (before the probes "
                f"{watch['peak_rss_mib_before']:.0f} MiB)"
            ),
            "target": f"<= {TARGET_RSS_MIB:g} MiB",
            "result": verdict(watch["peak_rss_mib_after"] <= TARGET_RSS_MIB),
        },
    ]


def _cost_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for language, cost in result.get("probe_cost", {}).items():
        for command in ("probe", "fetch"):
            row = cost[command]
            rows.append(
                {
                    "measure": f"{command} own cost, {language} (over {row['baseline_ms']:.0f} ms)",
                    "measured": f"{row['own_ms']:.0f} ms",
                    "target": f"<= {row['target_ms']:.0f} ms",
                    "result": row["verdict"],
                }
            )
    return rows


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().split()
    return {
        "nproc": os.cpu_count(),
        "ram_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "kubernetes": ensure_bins().versions.kubernetes,
        "load_average_at_end": os.getloadavg(),
    }


def checkpoint(result: dict[str, Any]) -> None:
    """Write the phases finished so far to ``operator-partial.json``.

    A full run takes about 55 minutes and writes ``operator.json`` only at its end; a phase that
    fails late would otherwise lose every earlier phase's figures.
    """
    write_json("operator-partial", {"phases_done": sorted(result), **result})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bundles", type=int, default=1000, help="steady-state bundles")
    parser.add_argument("--artifacts", type=int, default=20, help="artifacts per bundle")
    parser.add_argument("--cold-artifacts", type=int, default=100, help="cold-start artifacts")
    parser.add_argument("--parallelism", type=int, default=8, help="probe Jobs at once")
    parser.add_argument(
        "--free-cores",
        type=int,
        default=os.cpu_count() or 1,
        help="cores free for probe pods (default: the machine's; the benchmark expects nothing "
        "else running): the second cold start's parallelism, where its 1.3x target applies",
    )
    parser.add_argument("--interval", default="60s", help="steady-state bundles' interval")
    parser.add_argument("--window", type=float, default=120.0, help="steady-state window (s)")
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="wait before the window (s); default: one interval with its jitter, plus 10 s",
    )
    parser.add_argument("--watch-probes", type=int, default=8, help="probes followed at once")
    parser.add_argument(
        "--watch-log-mib", type=int, default=32, help="MiB each of those probes logs"
    )
    parser.add_argument(
        "--watch-seconds", type=float, default=60.0, help="seconds each of them runs"
    )
    parser.add_argument(
        "--phases",
        default=ALL_PHASES,
        help=f"comma-separated phases to run (default: all, {ALL_PHASES})",
    )
    _scaleout.add_arguments(parser)
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result: dict[str, Any] = {}
    phases = set(args.phases.split(","))
    if "cost" in phases:
        # First, before PostgreSQL and the control plane start: the probe and fetch processes
        # need neither, and this kind of machine runs slower after the phases' sustained load
        # (the CPU reference rose from 1,232 to 1,774 ms over the 2026-12-03 11:27 run), which
        # is not a probe pod's cost.
        result["probe_cost"] = probe_cost_phase()
        checkpoint(result)
    with ExitStack() as stack:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="thop-bench-operator-"))
        work.mkdir(parents=True, exist_ok=True)
        # Volumes and the repository are read by the operator and the node as other users.
        work.chmod(0o755)
        if args.workdir is None:
            stack.callback(shutil.rmtree, work, True)
        server, url = stack.enter_context(postgres())
        kube = stack.enter_context(cluster(work))
        template: TaskHandlerArtifact | None = None
        if phases & {"probe", "steady", "failover", "restart", "scaleout"}:
            # The steady state's rows and the failover's are made from the probe's answer.
            probe = probe_phase(kube, url, work, args)
            template = probe.pop("template")
            result["probe"] = probe
            checkpoint(result)
        compare_bundles = max(2, args.bundles // 10)
        if "steady" in phases and template is not None:
            # The reference workload, before and after the windows (issue 24: CPU targets).
            reference = reference_samples()
            result["steady"] = steady_phase(
                kube, server, url, work, args, template, args.bundles, args.artifacts, "steady"
            )
            result["steady_base"] = steady_phase(
                kube, server, url, work, args, template, compare_bundles, args.artifacts, "base"
            )
            result["steady_compare"] = steady_phase(
                kube,
                server,
                url,
                work,
                args,
                template,
                compare_bundles,
                args.artifacts * 2,
                "compare",
            )
            # The unchanged pass with a publish policy set, against steady_base (no policy,
            # today's Automatic) at the same scale in the same run.
            result["steady_policy"] = steady_phase(
                kube,
                server,
                url,
                work,
                args,
                template,
                compare_bundles,
                args.artifacts,
                "policy",
                policy=POLICY_UNDER_TEST,
            )
            result["cpu_reference"] = cpu_reference(reference + reference_samples())
            checkpoint(result)
        if "failover" in phases and template is not None:
            result["failover"] = failover_phase(kube, url, work, args, template)
            checkpoint(result)
        if "restart" in phases and template is not None:
            result["restart"] = restart_phase(kube, url, work, args, template)
            checkpoint(result)
        if "watch" in phases:
            result["watch"] = watch_phase(kube, url, work, args)
            checkpoint(result)
        if "scaleout" in phases and template is not None:
            result["scaleout"] = _scaleout.scaleout_phase(kube, url, work, args, template)
            checkpoint(result)
    rows = targets(result)
    print_table(rows, ["measure", "measured", "target", "result"], title="Operator benchmark")
    path = write_json(
        "operator",
        {
            "scale": {
                "bundles": args.bundles,
                "artifacts": args.artifacts,
                "cold_artifacts": args.cold_artifacts,
                "parallelism": args.parallelism,
                "interval": args.interval,
                "window_seconds": args.window,
                "watch_probes": args.watch_probes,
                "watch_log_mib": args.watch_log_mib,
                "watch_seconds": args.watch_seconds,
                "scaleout_bundles": args.scaleout_bundles,
                "scaleout_artifacts": args.scaleout_artifacts,
                "scaleout_interval": args.scaleout_interval,
            },
            "machine_info": machine(),
            "run_seconds": round(time.monotonic() - started, 1),
            "targets": rows,
            **result,
            **(
                {
                    "policy_comparison": policy_comparison(
                        result["steady_base"], result["steady_policy"]
                    )
                }
                if "steady_policy" in result
                else {}
            ),
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
