"""Database benchmark: the scheduler read path and the bundle write path on real PostgreSQL.

In one run, on a database with Airflow 3.3.2's schema and the operator's migrations:

* **resolve**: 10,000 ``(dag_id, task_id)`` pairs against 100,000 binding rows with
  :func:`resolve_task_handlers_sync` (a catalog lookup, then one statement for all pairs),
  against a baseline of one query per pair
  on the same connection; the plan is checked for the primary-key probe;
* **reconcile**: one bundle pass writing 10,000 bindings (100 artifacts) from empty, then the
  same pass again (it must write zero rows), against a baseline that upserts the same rows one
  statement per row;
* **statements per pass** for 10, 100 and 1,000 artifacts (two bindings each), counted by a
  SQLAlchemy ``before_cursor_execute`` listener, independently of the writer's own count.

Without ``--url`` it starts a throwaway PostgreSQL and migrates Airflow's schema into it with the
side virtualenv (``hack/airflow-venv.sh``), as the tests do. Run:
``python -m benchmarks.database [--url URL] [--pairs 10000] [--rows 100000] [--bindings 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine, event
from tests.integration.db.helpers import plan_nodes, resolve_plan, seed_bindings

from benchmarks._report import print_table, ratio, timed, write_json
from taskhandler_devenv.postgres import (
    TEMPLATE_DB,
    AirflowCli,
    PostgresServer,
    ensure_airflow_venv,
)
from taskhandler_operator.airflow.serialized import DagStubs, StubTask
from taskhandler_operator.db.engine import create_engine, create_sync_engine
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.db.tables import fileloc_hash
from taskhandler_operator.db.writer import ArtifactRecord, BundlePass, PassResult, write_pass
from taskhandler_operator.records import BundleOwner, TaskHandlerArtifact, TaskHandlerDeclaration
from taskhandler_operator.scheduler import resolve_task_handlers_sync
from taskhandler_operator.validation import validate_bundle

PROBED_AT = datetime(2026, 1, 1, tzinfo=UTC)
TASKS_PER_DAG = 4


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """The benchmark database: ``url`` as given, or a fresh throwaway server."""
    if url is not None:
        yield url
        return
    server = PostgresServer()
    server.start()
    try:
        cli = AirflowCli(ensure_airflow_venv())
        server.create_database(TEMPLATE_DB)
        cli(server.url(TEMPLATE_DB), "db", "migrate", timeout=300)
        yield server.url(TEMPLATE_DB)
    finally:
        server.stop()


class StatementCounter:
    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1


# --- resolve -----------------------------------------------------------------------------------


def bench_resolve(engine: Engine, rows: int, pairs_wanted: int) -> dict[str, Any]:
    dags = rows // TASKS_PER_DAG
    with engine.begin() as conn:
        seed_bindings(conn, dags=dags, tasks=TASKS_PER_DAG, artifacts=100, bundle="seed")
        stored = conn.execute(sa.text("SELECT count(*) FROM lang_sdk_task_handler")).scalar_one()
    rng = random.Random(7)
    keys = rng.sample(range(dags * TASKS_PER_DAG), pairs_wanted)
    pairs = [(f"seed_{k // TASKS_PER_DAG}", f"t{k % TASKS_PER_DAG}") for k in keys]

    counter = StatementCounter(engine)
    with engine.connect() as conn:
        plan = resolve_plan(conn, pairs)
        resolve_task_handlers_sync(conn, pairs[:10])  # warm the connection and catalog cache
        before = counter.count
        ours, resolved = timed(lambda: resolve_task_handlers_sync(conn, pairs), repeat=3)
        round_trips = (counter.count - before) // 3

        one = sa.text(
            "SELECT a.bundle_name, a.relative_fileloc FROM lang_sdk_task_handler b "
            "JOIN lang_sdk_task_handler_artifact a ON a.id = b.artifact_id "
            "WHERE b.dag_id = :d AND b.task_id = :t"
        )

        def per_pair() -> int:
            return sum(
                1 for d, t in pairs if conn.execute(one, {"d": d, "t": t}).first() is not None
            )

        baseline, found = timed(per_pair)
    assert len(resolved) == found == pairs_wanted
    nodes = [n for n in plan_nodes(plan) if n.get("Relation Name") == "lang_sdk_task_handler"]
    return {
        "binding_rows": stored,
        "pairs": pairs_wanted,
        "resolved": len(resolved),
        "round_trips": round_trips,
        "ours_s": ours,
        "per_pair_baseline_s": baseline,
        "speedup": ratio(baseline, ours),
        "plan_scans": sorted(
            {f"{n['Node Type']} {n.get('Index Name', '')}".strip() for n in nodes}
        ),
    }


# --- reconcile ---------------------------------------------------------------------------------


def seed_dags(engine: Engine, prefix: str, count: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO dag (dag_id, is_paused, is_stale, fileloc, relative_fileloc,
                    bundle_name, timetable_type, partition_mapper_info, max_active_tasks,
                    max_consecutive_failed_dag_runs, has_task_concurrency_limits)
                SELECT :p || i, false, false, '/x', :p || i || '.py', 'dags-folder', '', '{}',
                       16, 0, false
                FROM generate_series(0, :n - 1) AS i
                """
            ),
            {"p": prefix, "n": count},
        )


def bundle_pass(bundle: str, prefix: str, dags: int, artifacts: int, tasks: int) -> BundlePass:
    """A pass binding ``dags * tasks`` stubs to ``artifacts`` artifacts, built like the
    controller builds it: stub inventory (in memory here) + validation."""
    inventory = [
        DagStubs(
            dag_id=f"{prefix}{i}",
            bundle_name="dags-folder",
            relative_fileloc=f"{prefix}{i}.py",
            stubs=tuple(StubTask(task_id=f"t{j}", queue=bundle) for j in range(tasks)),
        )
        for i in range(dags)
    ]
    handlers: list[dict[str, list[TaskHandlerDeclaration]]] = [{} for _ in range(artifacts)]
    for i in range(dags):
        handlers[i % artifacts][f"{prefix}{i}"] = [
            TaskHandlerDeclaration(task_id=f"t{j}", params=[]) for j in range(tasks)
        ]
    arts = [
        TaskHandlerArtifact(
            bundle_name=bundle,
            relative_fileloc=f"lib/a{k}.jar",
            size_bytes=1000 + k,
            cache_digest=f"digest-{k}",
            task_handlers=handlers[k],
        )
        for k in range(artifacts)
    ]
    result = validate_bundle(bundle_name=bundle, queues=[bundle], dags=inventory, artifacts=arts)
    return BundlePass(
        bundle_name=bundle,
        owner=BundleOwner(cluster_id="benchmark", namespace="default", name=bundle, uid=bundle),
        queues=(bundle,),
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in arts),
        verdicts=result.verdicts,
    )


async def _timed_pass(url: str, bundle_pass_: BundlePass) -> tuple[float, PassResult, int]:
    engine = create_engine(url)
    counter = StatementCounter(engine.sync_engine)
    try:
        async with engine.connect():
            pass  # open the pool's connection outside the measurement
        start = time.perf_counter()
        result = await write_pass(engine, bundle_pass_)
        return time.perf_counter() - start, result, counter.count
    finally:
        await engine.dispose()


def naive_write(engine: Engine, bundle_pass_: BundlePass) -> int:
    """The baseline: the same rows, one upsert statement per row, one transaction."""
    artifact_sql = sa.text(
        """
        INSERT INTO lang_sdk_task_handler_artifact (id, bundle_name, relative_fileloc,
            relative_fileloc_hash, size_bytes, cache_digest, task_handlers, last_probed_at)
        VALUES (:id, :b, :p, :h, :s, :d, '{}', :t)
        ON CONFLICT (bundle_name, relative_fileloc_hash)
            DO UPDATE SET size_bytes = excluded.size_bytes
        RETURNING id
        """
    )
    binding_sql = sa.text(
        """
        INSERT INTO lang_sdk_task_handler (dag_id, task_id, artifact_id, dag_bundle_name,
            dag_relative_fileloc, dag_relative_fileloc_hash)
        VALUES (:d, :t, :a, 'dags-folder', :f, :fh)
        ON CONFLICT (dag_id, task_id) DO UPDATE SET artifact_id = excluded.artifact_id
        """
    )
    statements = 0
    with engine.begin() as conn:
        ids: dict[str, Any] = {}
        for record in bundle_pass_.artifacts:
            a = record.artifact
            ids[a.relative_fileloc] = conn.execute(
                artifact_sql,
                {
                    "id": uuid.uuid4(),
                    "b": "naive",
                    "p": a.relative_fileloc,
                    "h": fileloc_hash(a.relative_fileloc),
                    "s": a.size_bytes,
                    "d": a.cache_digest,
                    "t": PROBED_AT,
                },
            ).scalar_one()
            statements += 1
        for verdict in bundle_pass_.verdicts:
            for binding in verdict.bindings or ():
                conn.execute(
                    binding_sql,
                    {
                        "d": binding.dag_id,
                        "t": binding.task_id,
                        "a": ids[binding.artifact_rel_path],
                        "f": verdict.relative_fileloc,
                        "fh": fileloc_hash(verdict.relative_fileloc),
                    },
                )
                statements += 1
    return statements


def bench_reconcile(url: str, engine: Engine, bindings: int) -> dict[str, Any]:
    dags = bindings // TASKS_PER_DAG
    seed_dags(engine, "bench_", dags)
    started = time.perf_counter()
    the_pass = bundle_pass("bench", "bench_", dags, artifacts=100, tasks=TASKS_PER_DAG)
    validate_s = time.perf_counter() - started
    first_s, first, first_statements = asyncio.run(_timed_pass(url, the_pass))
    second_s, second, second_statements = asyncio.run(_timed_pass(url, the_pass))
    assert first.bindings_inserted == bindings, first
    assert second.rows_written == 0, second
    # The baseline writes the same binding rows again, under another artifact bundle's ids.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM lang_sdk_task_handler WHERE dag_id LIKE 'bench_%'"))
    naive_s, naive_statements = timed(lambda: naive_write(engine, the_pass))
    return {
        "bindings": bindings,
        "artifacts": 100,
        "validate_s": validate_s,
        "first_pass_s": first_s,
        "first_rows_written": first.rows_written,
        "first_statements": first_statements,
        "unchanged_pass_s": second_s,
        "unchanged_rows_written": second.rows_written,
        "unchanged_statements": second_statements,
        "naive_row_by_row_s": naive_s,
        "naive_statements": naive_statements,
        "speedup_first_vs_naive": ratio(naive_s, first_s),
    }


def bench_statements(url: str, engine: Engine) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for artifacts in (10, 100, 1000):
        prefix = f"st{artifacts}_"
        seed_dags(engine, prefix, artifacts)
        the_pass = bundle_pass(f"st{artifacts}", prefix, artifacts, artifacts=artifacts, tasks=2)
        seconds, result, counted = asyncio.run(_timed_pass(url, the_pass))
        rows.append(
            {
                "artifacts": artifacts,
                "bindings": result.bindings_inserted,
                "statements": counted,
                "writer_reported": result.statements,
                "seconds": seconds,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an Airflow database to use (default: a throwaway one)")
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--bindings", type=int, default=10_000)
    args = parser.parse_args()

    with database(args.url) as url:
        upgrade(url)
        engine = create_sync_engine(url)
        try:
            resolve = bench_resolve(engine, args.rows, args.pairs)
            reconcile = bench_reconcile(url, engine, args.bindings)
            statements = bench_statements(url, engine)
        finally:
            engine.dispose()

    print_table(
        [
            {k: v for k, v in resolve.items() if k != "plan_scans"},
        ],
        title=(
            "resolve: pairs against binding rows "
            "(one statement after a catalog lookup vs one query per pair)"
        ),
    )
    print(f"plan on lang_sdk_task_handler: {', '.join(resolve['plan_scans'])}\n")
    print_table(
        [
            {
                "pass": "first (empty)",
                "seconds": reconcile["first_pass_s"],
                "rows_written": reconcile["first_rows_written"],
                "statements": reconcile["first_statements"],
            },
            {
                "pass": "unchanged",
                "seconds": reconcile["unchanged_pass_s"],
                "rows_written": reconcile["unchanged_rows_written"],
                "statements": reconcile["unchanged_statements"],
            },
            {
                "pass": "naive row-by-row",
                "seconds": reconcile["naive_row_by_row_s"],
                "rows_written": reconcile["bindings"] + reconcile["artifacts"],
                "statements": reconcile["naive_statements"],
            },
        ],
        title=(
            f"reconcile {reconcile['bindings']:,} bindings, one bundle "
            f"(first pass {reconcile['speedup_first_vs_naive']:.1f}x faster than naive; "
            f"validation {reconcile['validate_s']:.2f} s)"
        ),
    )
    print()
    print_table(statements, title="statements per bundle pass (listener count)")
    path = write_json(
        "database", {"resolve": resolve, "reconcile": reconcile, "statements": statements}
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
