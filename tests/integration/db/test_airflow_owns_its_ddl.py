"""Airflow can always drop and alter its own tables, whatever path made them.

After ``db upgrade`` on a fresh database, after adopting tables Airflow's own migration made,
and after the return path of a handover, Airflow's downgrade DDL (drop both binding tables,
without CASCADE) and a column change succeed: no object of the operator depends on them.
The operator then names the missing tables (``db check``, and a typed ``SchemaMissing`` from a
pass), and ``db upgrade`` creates them again so the next pass binds.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from taskhandler_devenv.postgres import PostgresServer
from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.cli import main
from taskhandler_operator.db.engine import SchemaMissing, create_engine
from taskhandler_operator.db.migrate import check, hand_over, upgrade
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    ORIGIN_OPERATOR,
)
from tests.fixtures.airflow_design_b import airflow_creates_binding_tables
from tests.integration.db.helpers import add_dags, artifact, bindings, declaration, reconcile

pytestmark = pytest.mark.integration

# What an Airflow downgrade of the Design-B migration runs: plain drops, children first.
AIRFLOW_DOWNGRADE = (f"DROP TABLE {BINDING_TABLE}", f"DROP TABLE {ARTIFACT_TABLE}")
# A later Airflow migration changing a column of its own table (and back).
AIRFLOW_COLUMN_CHANGES = (
    f"ALTER TABLE {ARTIFACT_TABLE} ALTER COLUMN cache_digest TYPE VARCHAR(256)",
    f"ALTER TABLE {ARTIFACT_TABLE} ALTER COLUMN id TYPE UUID USING id",
    f"ALTER TABLE {ARTIFACT_TABLE} ALTER COLUMN cache_digest TYPE VARCHAR(128)",
)
ETL = {"etl": [declaration("extract")]}


def _execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _fresh(url: str) -> None:
    upgrade(url)


def _adopted(url: str) -> None:
    airflow_creates_binding_tables(url)
    assert upgrade(url).adopted == AIRFLOW_NAMED_TABLES


def _handed_over_and_back(url: str) -> None:
    upgrade(url)
    hand_over(url)
    airflow_creates_binding_tables(url)
    assert upgrade(url).restored is not None


@pytest.mark.parametrize(
    "make_tables",
    [
        pytest.param(_fresh, id="db-upgrade"),
        pytest.param(_adopted, id="adopted"),
        pytest.param(_handed_over_and_back, id="handover-return-path"),
    ],
)
async def test_airflow_drops_and_alters_its_tables_and_db_upgrade_recovers(
    pg_server: PostgresServer,
    airflow_template: str,
    make_tables: Callable[[str], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"thop_ddl_{make_tables.__name__.strip('_')}"
    pg_server.create_database(name, template=airflow_template)
    url = pg_server.url(name)
    engine = create_engine(url)
    try:
        make_tables(url)
        await add_dags(engine, dag_document("etl", [stub_task("extract", queue="java")]))
        await reconcile(engine, "java", ["java"], [artifact("java", "etl.jar", ETL)])
        assert set(await bindings(engine)) == {("etl", "extract")}

        # Airflow's own DDL goes through: before thop0008 the probe table's foreign key made
        # the drop fail ("other objects depend on it").
        _execute(url, *AIRFLOW_COLUMN_CHANGES)
        _execute(url, *AIRFLOW_DOWNGRADE)

        report = check(url)
        assert set(report.missing_tables) == set(AIRFLOW_NAMED_TABLES)
        assert main(["db", "check", "--url", url]) == 1
        capsys.readouterr()
        # A pass names the problem as a typed, non-retryable error, not a ProgrammingError.
        with pytest.raises(SchemaMissing) as caught:
            await reconcile(engine, "java", ["java"], [artifact("java", "etl.jar", ETL)])
        assert "db upgrade" in str(caught.value)
        assert caught.value.retryable is False

        # db upgrade creates them again (owned by the operator now) and the next pass binds.
        assert main(["db", "upgrade", "--url", url]) == 0
        out = capsys.readouterr().out
        assert f"created {ARTIFACT_TABLE}, {BINDING_TABLE} again" in out
        assert check(url).ok
        with sa.create_engine(url).connect() as conn:
            origins: dict[str, str] = dict(
                conn.execute(sa.text("SELECT table_name, created_by FROM thop_table_origin")).all()
            )
        assert origins == {ARTIFACT_TABLE: ORIGIN_OPERATOR, BINDING_TABLE: ORIGIN_OPERATOR}
        await reconcile(engine, "java", ["java"], [artifact("java", "etl.jar", ETL)])
        assert set(await bindings(engine)) == {("etl", "extract")}
        # And Airflow may drop them again, whoever created them last.
        _execute(url, *AIRFLOW_DOWNGRADE)
    finally:
        await engine.dispose()
        pg_server.drop_database(name)
