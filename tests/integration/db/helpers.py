"""Small builders shared by the database tests."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import insert_dag
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.writer import ArtifactRecord, BundlePass, PassResult, write_pass
from taskhandler_operator.publication.policy import PublishControl
from taskhandler_operator.records import (
    BundleOwner,
    TaskHandlerArtifact,
    TaskHandlerDeclaration,
    TaskHandlerParam,
)
from taskhandler_operator.validation import ValidationResult, validate_bundle

PROBED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def owner(bundle: str, namespace: str = "default", cluster_id: str = "test-cluster") -> BundleOwner:
    """The TaskHandlerBundle writing ``bundle`` in these tests: one resource per bundle name."""
    return BundleOwner(
        cluster_id=cluster_id, namespace=namespace, name=bundle, uid=f"uid-{namespace}-{bundle}"
    )


def bundle_pass(bundle: str, queues: Sequence[str] = (), **fields: Any) -> BundlePass:
    """A pass of ``bundle`` by its usual test owner."""
    return BundlePass(bundle_name=bundle, owner=owner(bundle), queues=tuple(queues), **fields)


def declaration(task_id: str, *param_schemas: dict[str, Any] | None) -> TaskHandlerDeclaration:
    return TaskHandlerDeclaration(
        task_id=task_id, params=[TaskHandlerParam(value_schema=s) for s in param_schemas]
    )


def artifact(
    bundle: str, path: str, handlers: dict[str, list[TaskHandlerDeclaration]], size: int = 100
) -> TaskHandlerArtifact:
    return TaskHandlerArtifact(
        bundle_name=bundle,
        relative_fileloc=path,
        size_bytes=size,
        cache_digest=f"digest-{path}-{size}",
        task_handlers=handlers,
    )


async def add_dags(engine: AsyncEngine, *documents: dict[str, Any], **kwargs: Any) -> None:
    async with engine.begin() as conn:
        for document in documents:
            await conn.run_sync(functools.partial(insert_dag, document=document, **kwargs))


async def reconcile(
    engine: AsyncEngine,
    bundle: str,
    queues: Sequence[str],
    artifacts: Iterable[TaskHandlerArtifact],
    *,
    inventory: StubInventory | None = None,
    probed: bool = True,
    revision: str | None = "rev-1",
    publish: PublishControl | None = None,
) -> tuple[ValidationResult, PassResult]:
    """One bundle pass the way the controller runs it: inventory, validate (the Dags of the
    bundle's queues), write (told the inventory's Dags, to remove the rows of the others)."""
    inventory = inventory or StubInventory()
    await inventory.refresh(engine)
    artifact_list = list(artifacts)
    result = validate_bundle(
        bundle_name=bundle,
        queues=queues,
        dags=inventory.dags.concerning(queues),
        artifacts=artifact_list,
    )
    records = tuple(
        ArtifactRecord(
            artifact=a,
            probed_at=PROBED_AT if probed else None,
            revision=revision if probed else None,
        )
        for a in artifact_list
    )
    control = {} if publish is None else {"publish": publish}
    written = await write_pass(
        engine,
        bundle_pass(
            bundle,
            queues,
            artifacts=records,
            verdicts=result.verdicts,
            inventory_dags=inventory.dags.keys(),
            **control,
        ),
    )
    return result, written


async def bindings(engine: AsyncEngine) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(dag_id, task_id) -> (artifact bundle, artifact path, dag_relative_fileloc)."""
    query = sa.text(
        """
        SELECT b.dag_id, b.task_id, a.bundle_name, a.relative_fileloc, b.dag_relative_fileloc
        FROM lang_sdk_task_handler b JOIN lang_sdk_task_handler_artifact a ON a.id = b.artifact_id
        """
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return {(r[0], r[1]): (r[2], r[3], r[4]) for r in rows}


async def row_versions(engine: AsyncEngine) -> dict[str, list[tuple[str, str]]]:
    """Every row's ctid and xmin per table: equal before and after means nothing was rewritten."""
    out: dict[str, list[tuple[str, str]]] = {}
    async with engine.connect() as conn:
        for table in (
            "lang_sdk_task_handler_artifact",
            "lang_sdk_task_handler",
            "thop_artifact_probe",
            "thop_bundle_problem",
        ):
            rows = await conn.execute(
                sa.text(f"SELECT ctid::text, xmin::text FROM {table} ORDER BY ctid")
            )
            out[table] = [(r[0], r[1]) for r in rows]
    return out


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        value = (await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one()
    return int(value)


SEED_SQL = [
    "INSERT INTO dag_bundle (name, active) VALUES ('dags-folder', true) ON CONFLICT DO NOTHING",
    """
    INSERT INTO dag (dag_id, is_paused, is_stale, fileloc, relative_fileloc, bundle_name,
                     timetable_type, partition_mapper_info, max_active_tasks,
                     max_consecutive_failed_dag_runs, has_task_concurrency_limits)
    SELECT 'seed_' || i, false, false, '/opt/airflow/dags/seed_' || i || '.py',
           'seed_' || i || '.py', 'dags-folder', '', '{}', 16, 0, false
    FROM generate_series(0, :dags - 1) AS i
    """,
    """
    INSERT INTO lang_sdk_task_handler_artifact (id, bundle_name, relative_fileloc,
        relative_fileloc_hash, size_bytes, cache_digest, task_handlers, last_probed_at)
    SELECT gen_random_uuid(), :bundle, 'a' || i || '.jar', md5('a' || i || '.jar'), 1000,
           'digest', '{}', now()
    FROM generate_series(0, :artifacts - 1) AS i
    """,
    """
    INSERT INTO lang_sdk_task_handler (dag_id, task_id, artifact_id, dag_bundle_name,
        dag_relative_fileloc, dag_relative_fileloc_hash)
    SELECT 'seed_' || i, 't' || j, a.id, 'dags-folder', 'seed_' || i || '.py',
           md5('seed_' || i || '.py')
    FROM generate_series(0, :dags - 1) AS i
    CROSS JOIN generate_series(0, :tasks - 1) AS j
    JOIN lang_sdk_task_handler_artifact a
      ON a.bundle_name = :bundle AND a.relative_fileloc = 'a' || (i % :artifacts) || '.jar'
    """,
]


def seed_bindings(
    conn: sa.Connection, *, dags: int, tasks: int, artifacts: int = 100, bundle: str = "seed"
) -> None:
    """``dags * tasks`` binding rows (``seed_<i>``, ``t<j>``) over ``artifacts`` artifacts, then
    ANALYZE so the planner sees the real sizes."""
    params = {"dags": dags, "tasks": tasks, "artifacts": artifacts, "bundle": bundle}
    for statement in SEED_SQL:
        conn.execute(sa.text(statement), params)
    conn.execute(sa.text("ANALYZE dag, lang_sdk_task_handler, lang_sdk_task_handler_artifact"))


def resolve_plan(conn: sa.Connection, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """EXPLAIN (FORMAT JSON) of the scheduler's resolve statement for ``pairs``."""
    from taskhandler_operator.scheduler import resolve_statement

    compiled = resolve_statement().compile(dialect=conn.dialect)
    params = {
        **compiled.params,
        "dag_ids": [p[0] for p in pairs],
        "task_ids": [p[1] for p in pairs],
    }
    row = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {compiled}", params).scalar_one()
    plan: dict[str, Any] = row[0]["Plan"]
    return plan


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes
