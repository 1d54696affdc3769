"""``db handover`` and its return path in ``db upgrade``, played against a stand-in migration.

The stand-in (``tests/fixtures/airflow_design_b.py``) does exactly what the migration of the
Airflow release shipping Design B does: a plain ``CREATE TABLE`` of Airflow's DDL, which fails
where the tables exist.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.cli import main
from taskhandler_operator.db.handover import HandoverPending, HandoverRefused
from taskhandler_operator.db.migrate import (
    check,
    hand_over,
    head_revision,
    undo_handover,
    upgrade,
)
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    HOLD_ARTIFACT_TABLE,
    HOLD_BINDING_TABLE,
    ORIGIN_AIRFLOW,
)
from taskhandler_operator.db.writer import bundle_lock_key
from taskhandler_operator.records import TaskHandlerArtifactRef
from taskhandler_operator.scheduler import (
    TaskKey,
    resolve_task_handlers,
    resolve_task_handlers_sync,
)
from tests.fixtures.airflow_design_b import airflow_creates_binding_tables
from tests.integration.db.catalog import snapshots
from tests.integration.db.helpers import add_dags, artifact, declaration, reconcile

pytestmark = pytest.mark.integration

PAIRS: list[TaskKey] = [
    ("etl", "extract"),
    ("etl", "load"),
    ("report", "publish"),
    ("report", "python"),  # not a bound stub: never resolves
]


async def _bind_world(engine: AsyncEngine) -> None:
    await add_dags(
        engine,
        dag_document("etl", [stub_task("extract", queue="java"), stub_task("load", queue="java")]),
        dag_document("report", [stub_task("publish", queue="go")]),
    )
    etl = {"etl": [declaration("extract"), declaration("load")]}
    await reconcile(
        engine, "java", ["java"], [artifact("java", "jobs/etl.jar", etl)], revision="c1"
    )
    report = {"report": [declaration("publish")]}
    await reconcile(engine, "go", ["go"], [artifact("go", "report.bin", report)], revision="c2")


def _refs(sync_engine: Engine) -> dict[TaskKey, TaskHandlerArtifactRef]:
    with sync_engine.connect() as conn:
        return resolve_task_handlers_sync(conn, PAIRS, pin_version=True)


def _rows(sync_engine: Engine, artifacts: str, bindings: str) -> dict[str, list[str]]:
    queries = {
        "artifacts": f"SELECT t::text FROM {artifacts} t ORDER BY id",
        "bindings": f"SELECT t::text FROM {bindings} t ORDER BY dag_id, task_id",
        "probes": "SELECT t::text FROM thop_artifact_probe t ORDER BY artifact_id",
    }
    with sync_engine.connect() as conn:
        return {k: list(conn.execute(sa.text(q)).scalars()) for k, q in queries.items()}


def _present(sync_engine: Engine) -> set[str]:
    names = [*AIRFLOW_NAMED_TABLES, HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE]
    with sync_engine.connect() as conn:
        return {
            n for n in names if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": n}).scalar()
        }


def _probe_fk(sync_engine: Engine) -> str | None:
    with sync_engine.connect() as conn:
        value = conn.execute(
            sa.text(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conname = 'thop_artifact_probe_artifact_fkey'"
            )
        ).scalar()
    return None if value is None else str(value)


async def test_the_whole_handover_keeps_every_reference_and_every_row(
    engine: AsyncEngine,
    sync_engine: Engine,
    db_url: str,
    airflow_ddl_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await _bind_world(engine)
    before = _refs(sync_engine)
    assert set(before) == {("etl", "extract"), ("etl", "load"), ("report", "publish")}
    assert before[("etl", "extract")].bundle_info is not None
    assert before[("etl", "extract")].bundle_info.version == "c1"
    rows = _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE)
    assert len(rows["bindings"]) == 3 and len(rows["probes"]) == 2

    # 1. Hand over: the tables move out of Airflow's way, the rows with them.
    assert main(["db", "handover", "--url", db_url]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        ": handed over: 2 artifact and 3 binding rows wait in thop_handover_artifact and "
        "thop_handover_binding. Next: `airflow db migrate`, then `taskhandler-operator db "
        "upgrade`\n"
    )
    assert _present(sync_engine) == {HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE}
    assert _rows(sync_engine, HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE) == rows
    assert _refs(sync_engine) == before  # the read path follows the rows
    assert await resolve_task_handlers(engine, PAIRS, pin_version=True) == before

    # Run twice: refused, nothing changes. db upgrade before Airflow's migration: refused.
    assert main(["db", "handover", "--url", db_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith(
        ": a handover is already pending (the rows are held in thop_handover_artifact and "
        "thop_handover_binding): run `airflow db migrate`, then `taskhandler-operator db "
        "upgrade`; or `taskhandler-operator db handover --undo`\n"
    )
    with pytest.raises(HandoverPending, match="Airflow has not created 'lang_sdk_task_handler_"):
        upgrade(db_url)
    assert main(["db", "dag-bundle", "java", "--url", db_url]) == 1
    assert capsys.readouterr().err.endswith(
        ": a handover is pending (the bindings wait in thop_handover_artifact); run `airflow db "
        "migrate`, then `taskhandler-operator db upgrade`, and ask again\n"
    )
    assert _rows(sync_engine, HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE) == rows

    # 2. Airflow's migration: the plain CREATE TABLE now succeeds.
    airflow_creates_binding_tables(db_url)
    assert _present(sync_engine) == {*AIRFLOW_NAMED_TABLES, HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE}
    assert _refs(sync_engine) == before  # Airflow's tables are empty: the held rows answer

    # 3. db upgrade moves the rows back and drops the holding tables.
    assert main(["db", "upgrade", "--url", db_url]) == 0
    out = capsys.readouterr().out
    assert ": moved 2 artifact and 3 binding rows back from the handover\n" in out
    assert _present(sync_engine) == set(AIRFLOW_NAMED_TABLES)
    assert _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE) == rows
    assert _refs(sync_engine) == before
    # Nothing of the operator's depends on Airflow's tables (thop0008).
    assert _probe_fk(sync_engine) is None
    # The tables are Airflow's now, exactly as its DDL makes them.
    assert snapshots(db_url, AIRFLOW_NAMED_TABLES) == snapshots(
        airflow_ddl_url, AIRFLOW_NAMED_TABLES
    )
    assert check(db_url).ok
    with sync_engine.connect() as conn:
        origins: dict[str, str] = dict(
            conn.execute(sa.text("SELECT table_name, created_by FROM thop_table_origin")).all()
        )
    assert origins == {ARTIFACT_TABLE: ORIGIN_AIRFLOW, BINDING_TABLE: ORIGIN_AIRFLOW}

    # Nothing to hand over any more: Airflow's migrations own the tables.
    with pytest.raises(HandoverRefused) as caught:
        hand_over(db_url)
    assert str(caught.value).endswith(
        ": table 'lang_sdk_task_handler' was created by Airflow, whose own migrations manage "
        "it; there is nothing to hand over"
    )
    # The operator carries on: the same state written again changes no row.
    etl = {"etl": [declaration("extract"), declaration("load")]}
    _, written = await reconcile(
        engine, "java", ["java"], [artifact("java", "jobs/etl.jar", etl)], revision="c1"
    )
    assert written.rows_written == 0
    assert _refs(sync_engine) == before


async def test_refused_while_the_operator_writes(
    engine: AsyncEngine, sync_engine: Engine, db_url: str
) -> None:
    await _bind_world(engine)
    rows = _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE)
    # A pass of bundle "go" in flight holds its advisory lock.
    with sync_engine.connect() as other, other.begin():
        other.execute(sa.select(sa.func.pg_advisory_xact_lock(bundle_lock_key("go"))))
        with pytest.raises(HandoverRefused) as caught:
            hand_over(db_url)
    assert str(caught.value) == (
        "the operator is writing bundle 'go' right now (its advisory lock is held): stop the "
        "operator (scale its Deployment to 0 replicas), then run `taskhandler-operator db "
        "handover` again"
    )
    assert _present(sync_engine) == set(AIRFLOW_NAMED_TABLES)
    assert _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE) == rows
    assert hand_over(db_url).bindings == 3  # once the pass is over


def test_refused_before_the_operators_tables_are_current(pg_url: str) -> None:
    upgrade(pg_url, "thop0003")
    with pytest.raises(HandoverRefused) as caught:
        hand_over(pg_url)
    assert str(caught.value).endswith(
        f": the operator's tables are at revision thop0003, not {head_revision()}: run "
        "`taskhandler-operator db upgrade` first"
    )


async def test_undo_puts_everything_back(
    engine: AsyncEngine, sync_engine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _bind_world(engine)
    before = snapshots(db_url, AIRFLOW_NAMED_TABLES)
    rows = _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE)
    refs = _refs(sync_engine)
    hand_over(db_url)
    assert main(["db", "handover", "--undo", "--url", db_url]) == 0
    assert capsys.readouterr().out.endswith(
        ": put 2 artifact and 3 binding rows back; the handover is undone\n"
    )
    assert snapshots(db_url, AIRFLOW_NAMED_TABLES) == before
    assert _rows(sync_engine, ARTIFACT_TABLE, BINDING_TABLE) == rows
    assert _refs(sync_engine) == refs
    assert _probe_fk(sync_engine) is None  # thop0008: no foreign key into Airflow's tables
    assert check(db_url).ok
    with pytest.raises(HandoverRefused, match=r"no handover is pending; nothing to undo$"):
        undo_handover(db_url)

    # Once Airflow created its tables, undo would collide with them: refused.
    hand_over(db_url)
    airflow_creates_binding_tables(db_url)
    with pytest.raises(HandoverRefused) as caught:
        undo_handover(db_url)
    assert str(caught.value).endswith(
        ": Airflow's migration already created 'lang_sdk_task_handler_artifact'; run "
        "`taskhandler-operator db upgrade` to move the held rows into it"
    )


async def test_rows_written_since_the_handover_are_newer_and_kept(
    engine: AsyncEngine, sync_engine: Engine, db_url: str
) -> None:
    await _bind_world(engine)
    hand_over(db_url)
    airflow_creates_binding_tables(db_url)
    # An operator left running writes bundle "java" into Airflow's new tables: a new build.
    etl = {"etl": [declaration("extract"), declaration("load")]}
    await reconcile(
        engine, "java", ["java"], [artifact("java", "jobs/etl.jar", etl, size=200)], revision="c9"
    )
    report = upgrade(db_url).restored
    assert report is not None
    assert (report.artifacts_restored, report.artifacts_superseded) == (1, 1)
    assert (report.bindings_restored, report.bindings_superseded) == (1, 2)
    refs = _refs(sync_engine)
    assert set(refs) == {("etl", "extract"), ("etl", "load"), ("report", "publish")}
    java = refs[("etl", "extract")].bundle_info
    assert java is not None and java.version == "c9"  # the newer probe, not the held one
    with sync_engine.connect() as conn:
        sizes: dict[str, int] = dict(
            conn.execute(
                sa.text("SELECT relative_fileloc, size_bytes FROM lang_sdk_task_handler_artifact")
            ).all()
        )
    assert sizes == {"jobs/etl.jar": 200, "report.bin": 100}
