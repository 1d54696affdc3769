"""Migrations on Airflow's real schema: from empty, idempotent, adopting, refusing."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect

from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.cli import main
from taskhandler_operator.db.migrate import (
    AirflowSchemaMissing,
    SchemaMismatch,
    check,
    downgrade,
    head_revision,
    upgrade,
)
from taskhandler_operator.db.schema_check import check_tables
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    VERSION_TABLE,
    artifact_table,
    binding_table,
    metadata,
)

pytestmark = pytest.mark.integration


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_creates_every_table(pg_url: str) -> None:
    before = table_names(pg_url)
    assert "dag" in before and ARTIFACT_TABLE not in before
    report = upgrade(pg_url)
    assert (report.before, report.after, report.adopted) == (None, head_revision(), ())
    created = table_names(pg_url) - before
    assert created == {*metadata.tables, VERSION_TABLE}
    # Airflow's own history is untouched and separate.
    assert "alembic_version" in before


def test_migrated_schema_matches_the_models(pg_url: str) -> None:
    upgrade(pg_url)
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        assert check_tables(conn, sorted(metadata.tables)) == {}
        indexes = {i["name"] for i in inspect(conn).get_indexes(BINDING_TABLE)}
    engine.dispose()
    assert indexes == {
        "idx_lang_sdk_task_handler_dag_file",
        "idx_lang_sdk_task_handler_artifact_id",
    }
    assert check(pg_url).ok


def test_upgrade_is_idempotent(pg_url: str) -> None:
    first = upgrade(pg_url)
    second = upgrade(pg_url)
    assert first.changed and not second.changed
    assert second.before == second.after == head_revision()


def test_concurrent_upgrades_do_not_collide(pg_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "taskhandler_operator", "db", "upgrade", "--url", pg_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    lines = sorted(out.strip().splitlines()[-1].split(": ", 1)[1] for out, _ in outputs)
    head = head_revision()
    assert lines == [f"already at {head}", f"already at {head}", f"upgraded from (empty) to {head}"]


def _create_airflow_named_tables(url: str) -> None:
    """What an Airflow release shipping ADR-0013 would have created, with a row in it."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn, tables=[artifact_table, binding_table])
        conn.execute(
            artifact_table.insert().values(
                id=uuid.uuid4(),
                bundle_name="java",
                relative_fileloc="a.jar",
                relative_fileloc_hash="0" * 32,
                size_bytes=1,
                task_handlers={},
                last_probed_at=sa.func.now(),
            )
        )
    engine.dispose()


def test_existing_tables_with_the_expected_shape_are_adopted(pg_url: str) -> None:
    _create_airflow_named_tables(pg_url)
    report = upgrade(pg_url)
    assert report.adopted == AIRFLOW_NAMED_TABLES
    assert report.after == head_revision()
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        # not recreated: the row written before is still there, and no "created by" comment
        assert conn.execute(sa.select(sa.func.count()).select_from(artifact_table)).scalar() == 1
        assert inspect(conn).get_table_comment(ARTIFACT_TABLE)["text"] is None
    engine.dispose()
    # downgrading never drops tables it adopted
    downgrade(pg_url, "base")
    assert {ARTIFACT_TABLE, BINDING_TABLE} <= table_names(pg_url)
    assert "thop_bundle_problem" not in table_names(pg_url)


def test_downgrade_drops_tables_it_created(pg_url: str) -> None:
    upgrade(pg_url)
    downgrade(pg_url, "base")
    names = table_names(pg_url)
    assert not ({*metadata.tables} & names)
    upgrade(pg_url)  # and up again
    assert set(metadata.tables) <= table_names(pg_url)


DESIGN_A_ARTIFACT = """
CREATE TABLE lang_sdk_task_handler_artifact (
    id UUID NOT NULL PRIMARY KEY,
    bundle_name VARCHAR(250) NOT NULL,
    relative_fileloc VARCHAR(2000) NOT NULL,
    size_bytes BIGINT NOT NULL,
    cache_digest VARCHAR(64) NOT NULL,
    last_probed_at TIMESTAMP NOT NULL,
    CONSTRAINT lstha_bundle_fileloc_uq UNIQUE (bundle_name, relative_fileloc)
)
"""


def test_existing_table_with_another_shape_stops_the_upgrade(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(DESIGN_A_ARTIFACT))
    engine.dispose()
    with pytest.raises(SchemaMismatch) as caught:
        upgrade(pg_url)
    assert str(caught.value) == (
        "refusing to adopt it: table 'lang_sdk_task_handler_artifact' exists with a different "
        "shape: column 'relative_fileloc_hash' is missing; column 'cache_digest' is "
        "varchar(64), shorter than varchar(128); column 'cache_digest' is NOT NULL, expected "
        "nullable (and 3 more). The operator needs the shape of ADR-0013 Design B (see "
        "docs/database.md); fix or drop the table, then run `taskhandler-operator db upgrade` "
        "again"
    )
    # nothing was created, not even our version table
    names = table_names(pg_url)
    assert BINDING_TABLE not in names and VERSION_TABLE not in names


def test_cli_reports_a_mismatch_and_exits_1(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(DESIGN_A_ARTIFACT))
    engine.dispose()
    proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", "db", "upgrade", "--url", pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "error: refusing to adopt it: table 'lang_sdk_task_handler_artifact' exists with a "
        "different shape: column 'relative_fileloc_hash' is missing;"
    )
    check_proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", "db", "check", "--url", pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check_proc.returncode == 1
    assert f"revision (none), head {head_revision()}" in check_proc.stdout
    assert "missing table 'lang_sdk_task_handler'" in check_proc.stdout


def test_database_without_airflow_schema_is_refused(pg_server: PostgresServer) -> None:
    name = f"thop_empty_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(name)
    try:
        with pytest.raises(AirflowSchemaMissing) as caught:
            upgrade(pg_server.url(name))
        assert str(caught.value) == (
            f"127.0.0.1:{pg_server.port}/{name} has no Airflow metadata schema (missing table "
            "'dag', 'dag_version', 'serialized_dag'); run `airflow db migrate` against it first"
        )
    finally:
        pg_server.drop_database(name)


def test_check_of_a_database_without_airflow_schema_names_it(
    pg_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # `db upgrade` refuses such a database, so `db check` must not advise it.
    name = f"thop_empty_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(name)
    try:
        assert main(["db", "check", "--url", pg_server.url(name)]) == 1
        out, err = capsys.readouterr()
        assert "missing Airflow table 'dag'" in out
        assert err == (
            "Airflow's metadata schema is missing; run `airflow db migrate` against this "
            "database first, then `taskhandler-operator db upgrade`\n"
        )
    finally:
        pg_server.drop_database(name)


@pytest.mark.parametrize("command", ["upgrade", "check"])
def test_a_database_that_does_not_exist_is_permanent(
    pg_server: PostgresServer, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Retrying cannot create it: exit 1, not 75.
    url = pg_server.url(f"thop_absent_{uuid.uuid4().hex[:8]}")
    assert main(["db", command, "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the database refused the connection: connection failed: ")
    assert "does not exist" in err
    assert err.count("\n") == 1


VARIANT_ARTIFACT = """
CREATE TABLE lang_sdk_task_handler_artifact (
    id UUID NOT NULL PRIMARY KEY,
    bundle_name VARCHAR(250) NOT NULL,
    relative_fileloc VARCHAR(4000) NOT NULL,
    relative_fileloc_hash VARCHAR(32) NOT NULL,
    size_bytes BIGINT NOT NULL,
    cache_digest VARCHAR(128),
    task_handlers JSONB NOT NULL,
    last_probed_at TIMESTAMP WITH TIME ZONE NOT NULL,
    team_name VARCHAR(50)
);
CREATE UNIQUE INDEX lsth_artifact_key ON lang_sdk_task_handler_artifact
    (bundle_name, relative_fileloc_hash);
"""


def test_compatible_variations_are_adopted(pg_url: str) -> None:
    """A unique index instead of a constraint, jsonb, a wider path, an extra nullable column."""
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(VARIANT_ARTIFACT))
    engine.dispose()
    report = upgrade(pg_url)
    assert report.adopted == (ARTIFACT_TABLE,)
    checked = check(pg_url)
    assert checked.differences == {}  # usable ...
    # ... but not Airflow's own table: db check names every difference. The unique index
    # became Airflow's named constraint and the missing index was created (thop0004).
    assert checked.definition_differences == {
        ARTIFACT_TABLE: [
            "column 'relative_fileloc' is character varying(4000) NOT NULL, Airflow's model has "
            "character varying(2000) NOT NULL",
            "column 'task_handlers' is jsonb NOT NULL, Airflow's model has json NOT NULL",
            "column 'team_name' (character varying(50)) is not in Airflow's model",
        ]
    }
    assert not checked.ok


def test_partial_unique_index_is_not_enough(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(VARIANT_ARTIFACT))
        conn.execute(sa.text("DROP INDEX lsth_artifact_key"))
        conn.execute(
            sa.text(
                "CREATE UNIQUE INDEX lsth_artifact_key ON lang_sdk_task_handler_artifact "
                "(bundle_name, relative_fileloc_hash) WHERE size_bytes > 0"
            )
        )
    engine.dispose()
    with pytest.raises(SchemaMismatch) as caught:
        upgrade(pg_url)
    assert "no unique key on (bundle_name, relative_fileloc_hash)" in str(caught.value)


def test_unknown_target_revision_is_a_clear_error(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--url", pg_url, "--revision", "nosuchrev"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot upgrade to revision 'nosuchrev': ")
    assert "nosuchrev" in err.split(": ", 2)[2]
    # Nothing was created: the failed upgrade rolled back.
    assert main(["db", "check", "--url", pg_url]) == 1


def test_claims_tables_name_their_constraints_and_cascade(pg_url: str) -> None:
    """thop0003: a queue claim goes with its bundle's claim; every constraint is named thop_."""
    upgrade(pg_url)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        inspector = inspect(conn)
        assert inspector.get_pk_constraint("thop_bundle_claim")["name"] == "thop_bundle_claim_pkey"
        assert inspector.get_pk_constraint("thop_queue_claim")["name"] == "thop_queue_claim_pkey"
        [fk] = inspector.get_foreign_keys("thop_queue_claim")
        assert fk["name"] == "thop_queue_claim_bundle_fkey"
        assert {i["name"] for i in inspector.get_indexes("thop_bundle_claim")} == {
            "idx_thop_bundle_claim_owner"
        }
        conn.execute(
            sa.text(
                "INSERT INTO thop_bundle_claim (bundle_name, cluster_id, namespace, name, uid) "
                "VALUES ('java', 'c1', 'team-a', 'java', 'u1')"
            )
        )
        conn.execute(
            sa.text("INSERT INTO thop_queue_claim (queue, bundle_name) VALUES ('q', 'java')")
        )
        with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
            conn.execute(
                sa.text("INSERT INTO thop_queue_claim (queue, bundle_name) VALUES ('r', 'go')")
            )
        conn.execute(sa.text("DELETE FROM thop_bundle_claim WHERE bundle_name = 'java'"))
        remaining = conn.execute(sa.text("SELECT count(*) FROM thop_queue_claim")).scalar()
    engine.dispose()
    assert remaining == 0
