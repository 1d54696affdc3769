"""The Airflow-named tables are Airflow's own, object by object and name by name.

Compared with the tables Airflow's Design-B DDL creates (``tests/fixtures/data/
airflow-design-b.sql``, the stand-in for Airflow's migration) through the catalog: every column
(type, nullability, default, collation, comment), every constraint and index by name and
definition, the table comment.
"""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from taskhandler_operator.cli import main
from taskhandler_operator.db.migrate import check, downgrade, head_revision, upgrade
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    ORIGIN_AIRFLOW,
    ORIGIN_OPERATOR,
)
from tests.fixtures.airflow_design_b import airflow_creates_binding_tables
from tests.integration.db.catalog import snapshots
from tests.integration.db.helpers import seed_bindings

pytestmark = pytest.mark.integration

TABLES = AIRFLOW_NAMED_TABLES


def _execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _rows(url: str) -> dict[str, list[str]]:
    """Every row of the tables that hold bindings, whole, as text."""
    queries = {
        ARTIFACT_TABLE: f"SELECT t::text FROM {ARTIFACT_TABLE} t ORDER BY id",
        BINDING_TABLE: f"SELECT t::text FROM {BINDING_TABLE} t ORDER BY dag_id, task_id",
        "thop_artifact_probe": "SELECT (artifact_id, revision, probed_at)::text "
        "FROM thop_artifact_probe ORDER BY artifact_id",
    }
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {name: list(conn.execute(sa.text(q)).scalars()) for name, q in queries.items()}
    finally:
        engine.dispose()


def _origins(url: str) -> dict[str, str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT table_name, created_by FROM thop_table_origin"))
            return {r[0]: r[1] for r in rows}
    finally:
        engine.dispose()


def _seed(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            seed_bindings(conn, dags=40, tasks=3, artifacts=7)
            conn.execute(
                sa.text(
                    "INSERT INTO thop_artifact_probe (artifact_id, revision, probed_at) "
                    "SELECT id, 'rev-1', last_probed_at FROM lang_sdk_task_handler_artifact"
                )
            )
    finally:
        engine.dispose()


def test_fresh_tables_equal_airflows_ddl_object_by_object(
    pg_url: str, airflow_ddl_url: str
) -> None:
    upgrade(pg_url)
    ours, airflows = snapshots(pg_url, TABLES), snapshots(airflow_ddl_url, TABLES)
    assert ours == airflows
    # Spot checks, so an empty snapshot could not pass unnoticed.
    assert set(ours[BINDING_TABLE]["constraints"]) == {
        "lang_sdk_task_handler_pkey",
        "lang_sdk_task_handler_dag_id_fkey",
        "lang_sdk_task_handler_artifact_id_fkey",
    }
    assert "idx_lang_sdk_task_handler_artifact_last_probed_at" in ours[ARTIFACT_TABLE]["indexes"]
    assert ours[ARTIFACT_TABLE]["table"]["comment"] is None
    assert len(ours[ARTIFACT_TABLE]["columns"]) == 8
    # The package's own expectation agrees with Airflow's DDL too.
    assert check(pg_url).ok
    assert check(airflow_ddl_url).definition_differences == {}
    assert _origins(pg_url) == {ARTIFACT_TABLE: ORIGIN_OPERATOR, BINDING_TABLE: ORIGIN_OPERATOR}


def test_airflows_migration_fails_on_tables_the_operator_created(pg_url: str) -> None:
    """Why ``db handover`` exists: the plain CREATE TABLE stops, and changes nothing."""
    upgrade(pg_url)
    with pytest.raises(psycopg.errors.DuplicateTable) as caught:
        airflow_creates_binding_tables(pg_url)
    assert str(caught.value) == 'relation "lang_sdk_task_handler_artifact" already exists'
    assert check(pg_url).ok


def test_tables_airflow_created_are_adopted_as_they_are(airflow_ddl_url: str) -> None:
    before = snapshots(airflow_ddl_url, TABLES)
    report = upgrade(airflow_ddl_url)
    assert report.adopted == TABLES
    assert snapshots(airflow_ddl_url, TABLES) == before
    assert _origins(airflow_ddl_url) == {
        ARTIFACT_TABLE: ORIGIN_AIRFLOW,
        BINDING_TABLE: ORIGIN_AIRFLOW,
    }
    assert check(airflow_ddl_url).ok


def test_an_existing_installation_gets_airflows_names_without_losing_a_row(
    pg_url: str, airflow_ddl_url: str
) -> None:
    upgrade(pg_url, "thop0003")  # what every installation so far has
    _seed(pg_url)
    old = snapshots(pg_url, TABLES)
    assert "lsth_dag_fkey" in old[BINDING_TABLE]["constraints"]
    assert old[ARTIFACT_TABLE]["table"]["comment"] == "created by taskhandler-operator"
    rows = _rows(pg_url)
    assert len(rows[BINDING_TABLE]) == 120 and len(rows[ARTIFACT_TABLE]) == 7

    report = upgrade(pg_url)
    assert (report.before, report.after) == ("thop0003", head_revision())
    assert _rows(pg_url) == rows
    assert snapshots(pg_url, TABLES) == snapshots(airflow_ddl_url, TABLES)
    assert _origins(pg_url) == {ARTIFACT_TABLE: ORIGIN_OPERATOR, BINDING_TABLE: ORIGIN_OPERATOR}
    assert check(pg_url).ok

    # And back: the old names and the comment, the same rows.
    downgrade(pg_url, "thop0003")
    assert snapshots(pg_url, TABLES) == old
    assert _rows(pg_url) == rows


ODD_NAMES = [
    # An earlier iteration, or a hand-made table: Airflow's definitions under other names, a
    # unique index standing in for the unique constraint, a duplicate index, a missing index
    # and somebody's comment.
    "ALTER TABLE lang_sdk_task_handler_artifact DROP CONSTRAINT "
    "lang_sdk_task_handler_artifact_bundle_fileloc_uq",
    "CREATE UNIQUE INDEX artifact_key ON lang_sdk_task_handler_artifact "
    "(bundle_name, relative_fileloc_hash)",
    "ALTER TABLE lang_sdk_task_handler RENAME CONSTRAINT lang_sdk_task_handler_dag_id_fkey "
    "TO lsth_dag_fkey",
    "ALTER INDEX idx_lang_sdk_task_handler_artifact_id RENAME TO by_artifact",
    "CREATE INDEX by_artifact_again ON lang_sdk_task_handler (artifact_id)",
    "DROP INDEX idx_lang_sdk_task_handler_artifact_last_probed_at",
    "COMMENT ON TABLE lang_sdk_task_handler IS 'made by hand'",
]


def test_db_check_names_each_difference_and_the_migration_fixes_the_names(
    airflow_ddl_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _execute(airflow_ddl_url, *ODD_NAMES)
    assert check(airflow_ddl_url).definition_differences == {
        ARTIFACT_TABLE: [
            "constraint 'lang_sdk_task_handler_artifact_bundle_fileloc_uq' (UNIQUE (bundle_name, "
            "relative_fileloc_hash)) is missing",
            "index 'idx_lang_sdk_task_handler_artifact_last_probed_at' (btree (last_probed_at)) "
            "is missing",
            "index 'artifact_key' (UNIQUE btree (bundle_name, relative_fileloc_hash)) is not in "
            "Airflow's model",
        ],
        BINDING_TABLE: [
            "constraint 'lsth_dag_fkey' (FOREIGN KEY (dag_id) REFERENCES dag(dag_id) ON DELETE "
            "CASCADE) is named 'lang_sdk_task_handler_dag_id_fkey' in Airflow's model",
            "index 'by_artifact' (btree (artifact_id)) is named "
            "'idx_lang_sdk_task_handler_artifact_id' in Airflow's model",
            "index 'by_artifact_again' (btree (artifact_id)) is not in Airflow's model",
            "table comment 'made by hand' is not in Airflow's model",
        ],
    }
    assert main(["db", "check", "--url", airflow_ddl_url]) == 1
    out = capsys.readouterr().out
    assert (
        "table 'lang_sdk_task_handler': constraint 'lsth_dag_fkey' (FOREIGN KEY (dag_id) "
        "REFERENCES dag(dag_id) ON DELETE CASCADE) is named 'lang_sdk_task_handler_dag_id_fkey' "
        "in Airflow's model\n"
    ) in out

    upgrade(airflow_ddl_url)
    # Renamed, converted, created, the duplicate dropped; a comment we did not write stays.
    assert check(airflow_ddl_url).definition_differences == {
        BINDING_TABLE: ["table comment 'made by hand' is not in Airflow's model"]
    }
    _execute(airflow_ddl_url, "COMMENT ON TABLE lang_sdk_task_handler IS NULL")
    assert check(airflow_ddl_url).ok
