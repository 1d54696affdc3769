"""The PostgreSQL fixture is real: Airflow's schema, per-test isolation, Airflow's own
Dag rows, and one-line failures for bad setups."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors as pg_errors
from psycopg.rows import TupleRow

from taskhandler_devenv.postgres import (
    AIRFLOW_VERSION,
    DIR_PREFIX,
    OWNER_FILE,
    VENV_SCRIPT,
    AirflowCli,
    AirflowCliError,
    PortInUse,
    PostgresBinariesMissing,
    PostgresServer,
    PostgresStartFailed,
    default_base_dir,
    ensure_airflow_venv,
    find_pg_bin,
    pick_free_port,
    remove_stale_dirs,
)
from tests.fixtures.postgres_plugin import fail_fixture_on_error

pytestmark = pytest.mark.integration

# Filled by the insert test so the isolation test can prove that database was dropped.
_seen_databases: list[str] = []

TINY_DAG = textwrap.dedent(
    """
    from airflow.sdk import dag, task


    @dag(dag_id="tiny", schedule=None)
    def tiny():
        @task(queue="java")
        def extract():
            return 1

        @task
        def load(value):
            print(value)

        load(extract())


    tiny()
    """
)


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(pg_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A private parent for server dirs, reachable by the postgres user (pytest's
    tmp_path sits under a root-only 0700 dir)."""
    path = Path(tempfile.mkdtemp(prefix="thop-pgtest-", dir=default_base_dir()))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _columns(engine: sa.Engine, table: str) -> dict[str, tuple[str, int | None, str]]:
    query = sa.text(
        "SELECT column_name, data_type, character_maximum_length, is_nullable "
        "FROM information_schema.columns WHERE table_schema = 'public' AND table_name = :t"
    )
    with engine.connect() as conn:
        rows = conn.execute(query, {"t": table}).all()
    return {name: (dtype, length, nullable) for name, dtype, length, nullable in rows}


def _insert_bundle_and_dag(conn: psycopg.Connection[TupleRow], bundle: str) -> None:
    conn.execute("INSERT INTO dag_bundle (name, active) VALUES (%s, true)", (bundle,))
    _insert_dag(conn, "etl_java", bundle)


def _insert_dag(conn: psycopg.Connection[TupleRow], dag_id: str, bundle: str) -> None:
    conn.execute(
        "INSERT INTO dag (dag_id, bundle_name, relative_fileloc, is_paused, is_stale,"
        " timetable_type, partition_mapper_info, max_active_tasks,"
        " max_consecutive_failed_dag_runs, has_task_concurrency_limits)"
        " VALUES (%s, %s, 'etl.py', false, false, 'NullTimetable', '{}', 16, 0, false)",
        (dag_id, bundle),
    )


# --------------------------------------------------------------------------- schema


def test_serialized_dag_has_airflows_real_columns(engine: sa.Engine) -> None:
    cols = _columns(engine, "serialized_dag")
    assert cols["data"] == ("jsonb", None, "YES")
    assert cols["data_compressed"] == ("bytea", None, "YES")
    assert cols["dag_hash"] == ("character varying", 32, "NO")
    assert cols["dag_version_id"] == ("uuid", None, "NO")
    assert cols["dag_id"] == ("character varying", 250, "NO")

    fks = sa.inspect(engine).get_foreign_keys("serialized_dag")
    (to_version,) = [fk for fk in fks if fk["referred_table"] == "dag_version"]
    assert to_version["constrained_columns"] == ["dag_version_id"]
    assert to_version["options"].get("ondelete") == "CASCADE"


def test_dag_table_and_its_bundle_foreign_key(engine: sa.Engine) -> None:
    cols = _columns(engine, "dag")
    assert cols["dag_id"] == ("character varying", 250, "NO")
    assert cols["bundle_name"] == ("character varying", 250, "NO")
    assert cols["is_stale"][0] == "boolean"
    assert cols["relative_fileloc"][0] == "character varying"

    inspector = sa.inspect(engine)
    assert inspector.get_pk_constraint("dag")["constrained_columns"] == ["dag_id"]
    fks = inspector.get_foreign_keys("dag")
    assert [(fk["constrained_columns"], fk["referred_table"]) for fk in fks] == [
        (["bundle_name"], "dag_bundle")
    ]
    version_fks = inspector.get_foreign_keys("dag_version")
    assert [(fk["referred_table"], fk["options"].get("ondelete")) for fk in version_fks] == [
        ("dag", "CASCADE")
    ]


def test_insert_dag_row_and_read_it_back(pg_url: str) -> None:
    url = sa.make_url(pg_url)
    assert url.drivername == "postgresql+psycopg"
    assert url.database is not None
    _seen_databases.append(url.database)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database
    ) as conn:
        _insert_bundle_and_dag(conn, "java-etl")
        conn.commit()
        with pytest.raises(pg_errors.ForeignKeyViolation):
            _insert_dag(conn, "orphan", "no-such-bundle")
        conn.rollback()

    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT dag_id, bundle_name, relative_fileloc, is_stale FROM dag")
            ).one()
    finally:
        engine.dispose()
    assert tuple(row) == ("etl_java", "java-etl", "etl.py", False)


def test_next_test_gets_an_empty_database(pg_url: str, engine: sa.Engine) -> None:
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM dag")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM dag_bundle")).scalar_one() == 0
        # The schema is all there (the template was migrated, not just created).
        assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
        # The insert test's database (when it ran first) was dropped, not just emptied.
        leftover = conn.execute(
            sa.text("SELECT datname FROM pg_database WHERE datname = ANY(:names)"),
            {"names": _seen_databases},
        ).all()
    assert leftover == []
    assert sa.make_url(pg_url).database not in _seen_databases


def test_pg_server_exposes_admin_connection(
    pg_server: PostgresServer, airflow_template: str
) -> None:
    assert pg_server.host == "127.0.0.1"
    assert pg_server.superuser == "postgres"
    assert (
        pg_server.admin_url == f"postgresql+psycopg://postgres@127.0.0.1:{pg_server.port}/postgres"
    )
    with pg_server.connect() as conn:
        row = conn.execute("SHOW fsync").fetchone()
        template = conn.execute(
            "SELECT datistemplate, datallowconn FROM pg_database WHERE datname = 'airflow_template'"
        ).fetchone()
    assert row == ("off",)
    assert airflow_template == "airflow_template"
    assert template == (True, False)  # a template nobody can hold open


# --------------------------------------------------------------------------- Airflow CLI


def test_reserialize_writes_real_dag_rows(
    pg_url: str, tmp_path: Path, reserialize_dags: Callable[[Path, str], None], engine: sa.Engine
) -> None:
    (tmp_path / "tiny.py").write_text(TINY_DAG)
    reserialize_dags(tmp_path, pg_url)

    with engine.connect() as conn:
        bundles = conn.execute(sa.text("SELECT name FROM dag_bundle")).scalars().all()
        dag = conn.execute(sa.text("SELECT dag_id, bundle_name, relative_fileloc FROM dag")).one()
        versions = conn.execute(sa.text("SELECT dag_id, version_number FROM dag_version")).all()
        serialized = conn.execute(
            sa.text(
                "SELECT s.dag_id, s.data, s.data_compressed, length(s.dag_hash)"
                " FROM serialized_dag s JOIN dag_version v ON v.id = s.dag_version_id"
            )
        ).one()
    assert bundles == ["dags-folder"]
    assert tuple(dag) == ("tiny", "dags-folder", "tiny.py")
    assert [tuple(v) for v in versions] == [("tiny", 1)]
    dag_id, data, compressed, hash_len = serialized
    assert (dag_id, compressed, hash_len) == ("tiny", None, 32)
    tasks = {t["__var"]["task_id"]: t["__var"] for t in data["dag"]["tasks"]}
    assert set(tasks) == {"extract", "load"}
    assert tasks["extract"]["queue"] == "java"
    assert "queue" not in tasks["load"]  # the default queue is not serialized


def test_reserialize_reports_a_broken_dag_file(
    pg_url: str, tmp_path: Path, reserialize_dags: Callable[[Path, str], None]
) -> None:
    # Airflow only parses files mentioning "airflow" and "dag"; this one does, then raises.
    (tmp_path / "broken.py").write_text(
        'from airflow.sdk import dag\nraise RuntimeError("boom in dag file")\n'
    )
    with pytest.raises(pytest.fail.Exception) as failed:
        reserialize_dags(tmp_path, pg_url)
    assert str(failed.value) == (
        "AirflowCliError: airflow dags reserialize could not import broken.py: "
        "RuntimeError: boom in dag file"
    )


def test_airflow_cli_failure_is_one_line(pg_url: str, airflow_cli: AirflowCli) -> None:
    with pytest.raises(AirflowCliError) as failed:
        airflow_cli(pg_url, "dags", "no-such-command")
    message = str(failed.value)
    assert message.startswith("`airflow dags no-such-command` failed (exit 2): ")
    assert "invalid choice: 'no-such-command'" in message
    assert "\n" not in message


def test_airflow_cli_targets_the_given_database(pg_url: str, airflow_cli: AirflowCli) -> None:
    proc = airflow_cli(pg_url, "config", "get-value", "database", "sql_alchemy_conn")
    # Airflow gets the same database, on the driver it was tested with.
    expected = pg_url.replace("postgresql+psycopg://", "postgresql+psycopg2://")
    assert proc.stdout.strip().splitlines()[-1] == expected


# --------------------------------------------------------------------------- bad input


def test_missing_binaries_in_thop_pg_bin(tmp_path: Path) -> None:
    with pytest.raises(PostgresBinariesMissing) as failed:
        PostgresServer(env={"THOP_PG_BIN": str(tmp_path)})
    assert str(failed.value) == (
        f"PostgreSQL server binaries not found: THOP_PG_BIN={tmp_path} lacks initdb, pg_ctl, "
        "postgres; install them with `apt-get install postgresql` or point THOP_PG_BIN at "
        "their bin dir"
    )


def test_missing_binaries_in_default_search_path(tmp_path: Path) -> None:
    (tmp_path / "15" / "bin").mkdir(parents=True)
    pattern = f"{tmp_path}/*/bin"
    with pytest.raises(PostgresBinariesMissing) as failed:
        find_pg_bin(env={}, search_glob=pattern)
    assert str(failed.value) == (
        f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in {pattern}; "
        "install them with `apt-get install postgresql` or point THOP_PG_BIN at their bin dir"
    )


def test_fixture_turns_errors_into_one_line_failures(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed, fail_fixture_on_error():
        PostgresServer(env={"THOP_PG_BIN": str(tmp_path)})
    assert str(failed.value).startswith("PostgresBinariesMissing: PostgreSQL server binaries")
    assert failed.value.pytrace is False


def test_requested_port_already_taken(base_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse) as failed:
            PostgresServer(port=port, base_dir=base_dir).start()
    assert str(failed.value) == (
        f"port {port} on 127.0.0.1 is already in use; "
        "choose another port or leave it unset to get a free one"
    )
    assert list(base_dir.iterdir()) == []


def test_taken_picked_port_is_retried_on_another(
    base_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])

        def picker() -> int:
            return next(ports, 0) or pick_free_port()

        caplog.set_level(logging.WARNING, logger="taskhandler_devenv.postgres")
        with PostgresServer(base_dir=base_dir, port_picker=picker) as server:
            assert server.port != busy
            with server.connect() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
    assert f"port {busy} on 127.0.0.1 is taken; trying another (attempt 1/3)" in caplog.text
    assert list(base_dir.iterdir()) == []


def test_pg_ctl_start_failure_shows_server_log_tail(base_dir: Path) -> None:
    server = PostgresServer(base_dir=base_dir, settings={"shared_buffers": "lots"})
    with pytest.raises(PostgresStartFailed) as failed:
        server.start()
    message = str(failed.value)
    assert message.startswith("pg_ctl start failed (exit 1) on 127.0.0.1:")
    assert "; server log tail: " in message
    assert 'invalid value for parameter "shared_buffers": "lots"' in message
    assert "\n" not in message
    assert list(base_dir.iterdir()) == []  # the half-made cluster was removed


def test_stale_dirs_are_removed_and_live_ones_kept(
    base_dir: Path, pg_server: PostgresServer
) -> None:
    dead = _dead_pid()
    stale = base_dir / f"{DIR_PREFIX}stale"
    (stale / "data").mkdir(parents=True)
    (stale / OWNER_FILE).write_text(f"{dead} 12345")
    (stale / "data" / "postmaster.pid").write_text(f"{dead}\n{stale}/data\n")
    no_owner = base_dir / f"{DIR_PREFIX}no-owner"  # killed before anything was written
    no_owner.mkdir()
    # A test session that is still running, between initdb and start.
    busy = base_dir / f"{DIR_PREFIX}busy"
    busy.mkdir()
    (busy / OWNER_FILE).write_text((pg_server.workdir / OWNER_FILE).read_text())
    # An orphaned but running server: its owner is gone, its postmaster is not.
    orphan = base_dir / f"{DIR_PREFIX}orphan"
    (orphan / "data").mkdir(parents=True)
    (orphan / OWNER_FILE).write_text(f"{dead} 12345")
    (orphan / "data" / "postmaster.pid").write_text(f"{pg_server.postmaster_pid}\n")
    unrelated = base_dir / "not-ours"
    unrelated.mkdir()

    with PostgresServer(base_dir=base_dir) as server:
        assert not stale.exists()
        assert not no_owner.exists()
        assert busy.is_dir()
        assert orphan.is_dir()
        assert unrelated.is_dir()
        assert server.workdir.parent == base_dir

    assert remove_stale_dirs(base_dir) == []  # nothing stale is left to remove
    assert sorted(p.name for p in base_dir.iterdir()) == sorted(
        [busy.name, orphan.name, unrelated.name]
    )


def test_base_dir_override_and_default(tmp_path: Path) -> None:
    assert default_base_dir({"THOP_PG_TMPDIR": str(tmp_path)}) == tmp_path
    assert default_base_dir({}) in (Path("/dev/shm"), Path(tempfile.gettempdir()))


def test_side_venv_script_is_idempotent(airflow_venv: Path) -> None:
    proc = subprocess.run(
        ["bash", str(VENV_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "THOP_AIRFLOW_VENV": str(airflow_venv)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"airflow-venv: up to date in {airflow_venv}\n"
    assert (
        (airflow_venv / ".thop-complete")
        .read_text()
        .startswith(f"apache-airflow-core=={AIRFLOW_VERSION} ")
    )


def test_missing_side_venv_is_built_and_a_failed_build_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "airflow-venv"
    monkeypatch.setenv("THOP_AIRFLOW_VENV", str(venv))
    monkeypatch.setenv("PYTHON", str(tmp_path / "no-python"))
    reported: list[str] = []
    with pytest.raises(AirflowCliError) as failed:
        ensure_airflow_venv(reported.append)
    assert reported == [
        f"building the Airflow {AIRFLOW_VERSION} side venv in {venv} (about a minute)"
    ]
    assert str(failed.value) == (
        f"airflow-venv.sh failed (exit 1): airflow-venv: {tmp_path / 'no-python'} not found"
    )
    assert not (venv / ".thop-complete").exists()


def test_side_venv_whose_airflow_cannot_start_names_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A venv whose install "succeeds" but whose airflow is broken (a half-upgraded venv, a
    # missing transitive dependency): the script's final check must report airflow's error.
    venv = tmp_path / "airflow-venv"
    (venv / "bin").mkdir(parents=True)
    for name, body in (
        ("python", "exit 0"),  # pip install: nothing to do
        ("airflow", "echo \"ModuleNotFoundError: No module named 'sqlalchemy'\" >&2; exit 1"),
    ):
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (venv / "bin" / name).chmod(0o755)
    monkeypatch.setenv("THOP_AIRFLOW_VENV", str(venv))
    with pytest.raises(AirflowCliError) as failed:
        ensure_airflow_venv(lambda line: None)
    assert str(failed.value) == (
        f"airflow-venv.sh failed (exit 1): airflow-venv: 'airflow version' failed in {venv}: "
        "ModuleNotFoundError: No module named 'sqlalchemy'"
    )
    assert not (venv / ".thop-complete").exists()
