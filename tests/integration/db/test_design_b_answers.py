"""Stored answers in Design B's value domain: on write, and for rows stored before (thop0005)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.known_artifacts import load_known_artifacts, load_stored_artifacts
from taskhandler_operator.db.migrate import downgrade, upgrade
from taskhandler_operator.db.tables import fileloc_hash
from taskhandler_operator.records import TaskHandlerDeclaration, TaskHandlerParam
from tests.integration.db.helpers import add_dags, artifact, bindings, reconcile

pytestmark = pytest.mark.integration

DESIGN_B_BINDINGS = {"positional", "named"}
DESIGN_B_PARAM_KEYS = {"name", "value_schema", "exact_name"}


async def _stored(engine: AsyncEngine, path: str) -> tuple[Any, Any]:
    """(task_handlers of the artifact row, declared_task_handlers beside it)."""
    query = sa.text(
        "SELECT a.task_handlers, p.declared_task_handlers FROM lang_sdk_task_handler_artifact a "
        "LEFT JOIN thop_artifact_probe p ON p.artifact_id = a.id WHERE a.relative_fileloc = :p"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query, {"p": path})).one()
    return row[0], row[1]


def _in_design_b_domain(handlers: dict[str, list[dict[str, Any]]]) -> bool:
    for declarations in handlers.values():
        for declaration in declarations:
            if set(declaration) != {"task_id", "binding", "params"}:
                return False
            if declaration["binding"] not in DESIGN_B_BINDINGS:
                return False
            for param in declaration["params"] or ():
                if set(param) != DESIGN_B_PARAM_KEYS:
                    return False
    return True


async def test_a_named_or_whole_declaration_reads_back_as_named(engine: AsyncEngine) -> None:
    await add_dags(engine, dag_document("etl", [stub_task("extract", queue="go")]))
    go = TaskHandlerDeclaration(task_id="extract", binding="named_or_whole", params=[])
    await reconcile(engine, "go", ["go"], [artifact("go", "etl.bin", {"etl": [go]})])
    assert await bindings(engine) == {("etl", "extract"): ("go", "etl.bin", "etl.py")}

    stored, declared = await _stored(engine, "etl.bin")
    assert stored == {"etl": [{"task_id": "extract", "binding": "named", "params": []}]}
    assert declared is None  # nothing validation reads was lost
    [known] = await load_known_artifacts(engine, "go")
    assert known.task_handlers["etl"][0].binding == "named"


async def test_an_unknown_mode_is_left_out_of_airflows_row_and_validates_the_same_later(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, dag_document("etl", [stub_task("future", queue="go")]))
    handlers = {
        "etl": [
            TaskHandlerDeclaration(task_id="future", binding="whole", params=[]),
            TaskHandlerDeclaration(
                task_id="old", binding="named", params=[TaskHandlerParam(name="x", required=False)]
            ),
        ]
    }
    fresh, _ = await reconcile(engine, "go", ["go"], [artifact("go", "etl.bin", handlers)])
    stored, declared = await _stored(engine, "etl.bin")
    assert _in_design_b_domain(stored)
    assert [d["task_id"] for d in stored["etl"]] == ["old"]
    assert [d["binding"] for d in declared["etl"]] == ["whole", "named"]

    # The fast path reuses the stored answer: the same problem, not "no artifact registers it".
    [known] = await load_known_artifacts(engine, "go")
    reused, _ = await reconcile(engine, "go", ["go"], [known], probed=False)
    messages = [[p.message for p in v.errors] for v in fresh.verdicts]
    assert messages == [[p.message for p in v.errors] for v in reused.verdicts]
    assert messages == [
        [
            "Dag 'etl', task 'future': the task handler in 'etl.bin' binds arguments in unknown "
            "mode 'whole'"
        ]
    ]


async def test_a_row_rewritten_by_someone_else_speaks_for_itself(engine: AsyncEngine) -> None:
    await add_dags(engine, dag_document("etl", [stub_task("future", queue="go")]))
    odd = TaskHandlerDeclaration(task_id="future", binding="whole", params=[])
    await reconcile(engine, "go", ["go"], [artifact("go", "etl.bin", {"etl": [odd]})])
    # Airflow's Dag processor (say) probes it again and writes its own answer.
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "UPDATE lang_sdk_task_handler_artifact SET task_handlers = CAST(:h AS json) "
                "WHERE relative_fileloc = 'etl.bin'"
            ),
            {
                "h": json.dumps(
                    {"etl": [{"task_id": "future", "binding": "positional", "params": []}]}
                )
            },
        )
    [stored] = await load_stored_artifacts(engine, "go")
    assert stored.artifact.task_handlers["etl"][0].binding == "positional"


RAW_ANSWERS: dict[str, Any] = {
    "go.bin": {
        "etl": [
            {"task_id": "a", "binding": "named_or_whole", "params": [{"name": "x"}]},
            {"task_id": "b", "binding": "named_open", "params": None},
            {
                "task_id": "c",
                "params": [
                    {
                        "name": None,
                        "value_schema": {"type": "string"},
                        "exact_name": False,
                        "extra": 1,
                    }
                ],
            },
        ]
    },
    "lossy.bin": {
        "etl": [
            {"task_id": "a", "binding": "whole", "params": []},
            {"task_id": "b", "binding": "named", "params": [{"name": "x", "required": False}]},
        ]
    },
    "fine.bin": {"etl": [{"task_id": "a", "binding": "positional", "params": None}]},
    "not-an-answer.bin": ["written", "by", "another", "tool"],
}


def _insert_raw(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for path, handlers in RAW_ANSWERS.items():
            conn.execute(
                sa.text(
                    "INSERT INTO lang_sdk_task_handler_artifact (id, bundle_name, "
                    "relative_fileloc, relative_fileloc_hash, size_bytes, cache_digest, "
                    "task_handlers, last_probed_at) VALUES (:id, 'go', :p, :h, 1, 'd', "
                    "CAST(:t AS json), now())"
                ),
                {"id": uuid.uuid4(), "p": path, "h": fileloc_hash(path), "t": json.dumps(handlers)},
            )
    engine.dispose()


def _raw(url: str) -> dict[str, tuple[Any, Any]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.relative_fileloc, a.task_handlers, p.declared_task_handlers "
                "FROM lang_sdk_task_handler_artifact a "
                "LEFT JOIN thop_artifact_probe p ON p.artifact_id = a.id"
            )
        ).all()
    engine.dispose()
    return {r[0]: (r[1], r[2]) for r in rows}


async def test_the_migration_normalizes_rows_stored_before(pg_url: str) -> None:
    upgrade(pg_url, "thop0004")
    _insert_raw(pg_url)
    upgrade(pg_url)
    rows = _raw(pg_url)
    assert rows["go.bin"] == (
        {
            "etl": [
                {
                    "task_id": "a",
                    "binding": "named",
                    "params": [{"name": "x", "value_schema": None, "exact_name": False}],
                },
                {"task_id": "b", "binding": "named", "params": None},
                {
                    "task_id": "c",
                    "binding": "positional",
                    "params": [
                        {"name": None, "value_schema": {"type": "string"}, "exact_name": False}
                    ],
                },
            ]
        },
        None,
    )
    lossy, original = rows["lossy.bin"]
    assert lossy == {
        "etl": [
            {
                "task_id": "b",
                "binding": "named",
                "params": [{"name": "x", "value_schema": None, "exact_name": False}],
            }
        ]
    }
    assert original == RAW_ANSWERS["lossy.bin"]
    assert rows["fine.bin"] == (RAW_ANSWERS["fine.bin"], None)
    assert rows["not-an-answer.bin"] == (RAW_ANSWERS["not-an-answer.bin"], None)
    assert all(_in_design_b_domain(h) for p, (h, _) in rows.items() if p != "not-an-answer.bin")

    # Downgrading puts the kept original back (named_or_whole stays named: read the same).
    downgrade(pg_url, "thop0004")
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        back: dict[str, Any] = dict(
            conn.execute(
                sa.text(
                    "SELECT relative_fileloc, task_handlers FROM lang_sdk_task_handler_artifact"
                )
            ).all()
        )
    engine.dispose()
    assert back["lossy.bin"] == RAW_ANSWERS["lossy.bin"]
    assert back["go.bin"] == rows["go.bin"][0]


# The answer Airflow's own model test stores (``required`` on each parameter, a wildcard
# parameter with every field null): a shape Airflow reads, so it stays as Airflow wrote it.
AIRFLOW_SHAPED: dict[str, Any] = {
    "etl": [
        {
            "task_id": "extract",
            "binding": "positional",
            "params": [
                {
                    "name": "path",
                    "value_schema": {"type": "string"},
                    "required": True,
                    "exact_name": True,
                },
                {"name": None, "value_schema": None, "required": False, "exact_name": False},
            ],
        }
    ],
}


async def test_rows_airflow_wrote_before_adoption_stay_as_airflow_wrote_them(
    airflow_ddl_url: str,
) -> None:
    """Adoption runs thop0005 on Airflow's tables: it must not rewrite Airflow's rows."""
    engine = sa.create_engine(airflow_ddl_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO lang_sdk_task_handler_artifact (id, bundle_name, relative_fileloc, "
                "relative_fileloc_hash, size_bytes, cache_digest, task_handlers, last_probed_at) "
                "VALUES (:id, 'java', 'etl.jar', :h, 1024, :d, CAST(:t AS json), now())"
            ),
            {
                "id": uuid.uuid4(),
                "h": fileloc_hash("etl.jar"),
                "d": "0" * 64,
                "t": json.dumps(AIRFLOW_SHAPED),
            },
        )
    with engine.connect() as conn:
        before = conn.execute(
            sa.text("SELECT task_handlers::text FROM lang_sdk_task_handler_artifact")
        ).scalar_one()
    engine.dispose()

    assert upgrade(airflow_ddl_url).adopted
    rows = _raw(airflow_ddl_url)
    assert rows["etl.jar"] == (AIRFLOW_SHAPED, None)
    engine = sa.create_engine(airflow_ddl_url)
    with engine.connect() as conn:
        after = conn.execute(
            sa.text("SELECT task_handlers::text FROM lang_sdk_task_handler_artifact")
        ).scalar_one()
    engine.dispose()
    assert after == before  # byte for byte

    # The operator reads Airflow's shape as it is: the answer is known and validates.
    async_engine = create_engine(airflow_ddl_url)
    try:
        [known] = await load_known_artifacts(async_engine, "java")
        [extract] = known.task_handlers["etl"]
        assert extract.binding == "positional"
        assert [p.required for p in extract.params or ()] == [True, False]
        await add_dags(async_engine, dag_document("etl", [stub_task("extract", queue="java")]))
        result, _ = await reconcile(async_engine, "java", ["java"], [known], probed=False)
        # Validated against the two declared parameters, `required` read as it is.
        [verdict] = result.verdicts
        assert [p.message for p in verdict.errors] == [
            "Dag 'etl', task 'extract': passes 0 argument(s) (0 without defaults), the task "
            "handler takes 2"
        ]
    finally:
        await async_engine.dispose()
