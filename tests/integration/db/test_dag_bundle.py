"""DagBundle awareness against Airflow 3.3.2's real ``dag_bundle`` table.

Airflow's own Dag processor writes the rows: a versioned DagBundle (a tiny ``BaseDagBundle``
subclass pinned to a commit, standing in for a ``GitDagBundle``, whose provider the side venv
lacks) and the unversioned ``LocalDagBundle`` ``dags-folder``. Bindings are then written by the
operator's own write path at a probe revision, and each state gives its answer.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.postgres import AirflowCli, PostgresServer
from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.cli import main
from taskhandler_operator.db.dag_bundle import (
    DagBundleRecord,
    dag_bundle_sync,
    dag_bundle_sync_sync,
    read_dag_bundle_sync,
)
from tests.integration.db.helpers import add_dags, artifact, declaration, reconcile

pytestmark = pytest.mark.integration

PROBED = "3f2c1b0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
NEWER = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b"

PINNED_BUNDLE = '''
from pathlib import Path

from airflow.dag_processing.bundles.base import BaseDagBundle


class PinnedBundle(BaseDagBundle):
    """A versioned DagBundle whose current version is a fixed commit (like a GitDagBundle)."""

    supports_versioning = True

    def __init__(self, *, folder: str, commit: str, **kwargs):
        super().__init__(**kwargs)
        self._folder = Path(folder)
        self._commit = commit

    @property
    def path(self) -> Path:
        return self._folder

    def get_current_version(self) -> str:
        return self._commit

    def refresh(self) -> None:
        pass
'''


def _run_dag_processor(airflow_cli: AirflowCli, url: str, tmp_path: Path) -> None:
    """One loop of Airflow's Dag processor with three bundles configured."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "pinned_bundle.py").write_text(PINNED_BUNDLE)
    folders = {name: tmp_path / name for name in ("java", "go", "local")}
    for folder in folders.values():
        folder.mkdir()
    bundles = [
        {
            "name": "java",
            "classpath": "pinned_bundle.PinnedBundle",
            "kwargs": {"folder": str(folders["java"]), "commit": PROBED},
        },
        {
            "name": "go",
            "classpath": "pinned_bundle.PinnedBundle",
            "kwargs": {"folder": str(folders["go"]), "commit": NEWER},
        },
        {
            "name": "dags-folder",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(folders["local"])},
        },
    ]
    airflow_cli(
        url,
        "dag-processor",
        "--num-runs",
        "1",
        env={
            "PYTHONPATH": str(plugin),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(tmp_path / "storage"),
        },
    )


async def _bind(engine: AsyncEngine, bundle: str) -> None:
    dag_id = f"uses_{bundle.replace('-', '_')}"
    await add_dags(engine, dag_document(dag_id, [stub_task("run", queue=bundle)]))
    handlers = {dag_id: [declaration("run")]}
    await reconcile(
        engine, bundle, [bundle], [artifact(bundle, "a.bin", handlers)], revision=PROBED
    )


async def test_each_dag_bundle_state_gives_its_answer(
    engine: AsyncEngine,
    sync_engine: Engine,
    db_url: str,
    airflow_cli: AirflowCli,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _run_dag_processor(airflow_cli, db_url, tmp_path)
    with sync_engine.begin() as conn:
        # Airflow wrote these rows; "retired" stands for a bundle Airflow deactivated.
        rows = conn.execute(sa.text("SELECT name, active, version FROM dag_bundle ORDER BY name"))
        assert [tuple(r) for r in rows] == [
            ("dags-folder", True, None),
            ("go", True, NEWER),
            ("java", True, PROBED),
        ]
        conn.execute(
            sa.text("INSERT INTO dag_bundle (name, active, version) VALUES ('retired', false, :v)"),
            {"v": PROBED},
        )
    for bundle in ("java", "go", "dags-folder", "nowhere", "retired"):
        await _bind(engine, bundle)

    java = await dag_bundle_sync(engine, "java")
    assert (java.reason, java.status, java.in_sync, java.warn) == ("InSync", "True", True, False)
    assert (java.airflow_version, java.revision) == (PROBED, PROBED)
    assert java.last_refreshed is not None

    go = await dag_bundle_sync(engine, "go")
    assert (go.reason, go.status, go.warn) == ("Drift", "False", True)
    assert go.message == (
        f"Airflow's DagBundle 'go' is at version '{NEWER}', but the bindings were probed at "
        f"revision '{PROBED}': workers may run artifacts the bindings were not checked against"
    )
    # The controller passes its own source revision instead of the recorded one.
    assert (await dag_bundle_sync(engine, "go", revision=NEWER)).reason == "InSync"

    local = await dag_bundle_sync(engine, "dags-folder")
    assert (local.reason, local.status, local.in_sync) == ("VersionUnknown", "Unknown", False)
    assert local.message == (
        "Airflow records no version for DagBundle 'dags-folder' (an unversioned bundle, such as "
        f"a LocalDagBundle or S3DagBundle), so whether its workers see revision '{PROBED}' "
        "cannot be told"
    )

    unknown = await dag_bundle_sync(engine, "nowhere")
    assert (unknown.reason, unknown.status) == ("UnknownDagBundle", "False")
    assert unknown.message.startswith("Airflow has no DagBundle 'nowhere', so its workers")
    retired = await dag_bundle_sync(engine, "retired")
    assert (retired.reason, retired.airflow_version) == ("UnknownDagBundle", PROBED)
    assert "is inactive" in retired.message

    with sync_engine.connect() as conn:
        assert dag_bundle_sync_sync(conn, "go") == go
        assert read_dag_bundle_sync(conn, "nowhere") is None
        assert read_dag_bundle_sync(conn, "java") == DagBundleRecord(
            name="java", active=True, version=PROBED, last_refreshed=java.last_refreshed
        )

    # The CLI: exit 0 only in sync, one line either way.
    assert main(["db", "dag-bundle", "java", "--url", db_url]) == 0
    assert main(["db", "dag-bundle", "go", "--url", db_url]) == 1
    assert main(["db", "dag-bundle", "go", "--url", db_url, "--revision", NEWER]) == 0
    assert main(["db", "dag-bundle", "dags-folder", "--url", db_url]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"DagBundleInSync=True reason=InSync: {java.message}"
    assert out[1] == f"DagBundleInSync=False reason=Drift: {go.message}"
    assert out[3] == f"DagBundleInSync=Unknown reason=VersionUnknown: {local.message}"


async def test_no_probe_revision_is_version_unknown(
    engine: AsyncEngine, sync_engine: Engine
) -> None:
    with sync_engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO dag_bundle (name, active, version) VALUES ('j', true, :v)"),
            {"v": PROBED},
        )
    answer = await dag_bundle_sync(engine, "j")
    assert (answer.reason, answer.revision) == ("VersionUnknown", None)
    assert answer.message == (
        f"Airflow's DagBundle 'j' is at version '{PROBED}', but no probe revision is recorded "
        "for the bindings, so whether they match cannot be told"
    )


def test_cli_names_what_is_missing(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "dag-bundle", "java", "--url", pg_url]) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        "has no table 'lang_sdk_task_handler_artifact'; run `taskhandler-operator db upgrade` "
        "first\n"
    )
    assert err.startswith("error: 127.0.0.1:")


def test_cli_on_a_database_without_airflow(
    pg_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"thop_empty_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(name)
    try:
        assert main(["db", "dag-bundle", "java", "--url", pg_server.url(name)]) == 1
    finally:
        pg_server.drop_database(name)
    assert capsys.readouterr().err == (
        f"error: 127.0.0.1:{pg_server.port}/{name} has no Airflow table 'dag_bundle' (Airflow 3 "
        "keeps its DagBundles there); is this Airflow's metadata database?\n"
    )


def test_the_demo_registers_a_dag_bundle_as_airflows_dag_processor_does(
    sync_engine: Engine, db_url: str, airflow_cli: AirflowCli, tmp_path: Path
) -> None:
    """``make demo`` seeds its bundles' ``dag_bundle`` rows itself: every column must be what
    Airflow's Dag processor writes for a versioned bundle at the same commit ("java", above),
    and the operator's check must then answer InSync, not UnknownDagBundle."""
    from datetime import UTC, datetime

    from taskhandler_devenv.orders_example import BUNDLES, register_bundles

    _run_dag_processor(airflow_cli, db_url, tmp_path)
    with sync_engine.begin() as conn:
        before = {r.name for r in conn.execute(sa.text("SELECT name FROM dag_bundle"))}
        assert not before & {b.name for b in BUNDLES}
        register_bundles(conn, PROBED, datetime.now(UTC))
        register_bundles(conn, PROBED, datetime.now(UTC))  # a second run changes nothing else
    with sync_engine.connect() as conn:
        columns = [c["name"] for c in sa.inspect(conn).get_columns("dag_bundle")]
        rows = {
            r["name"]: r for r in conn.execute(sa.text("SELECT * FROM dag_bundle")).mappings().all()
        }
        airflows = rows["java"]
        for bundle in BUNDLES:
            ours = rows[bundle.name]
            assert {c: ours[c] for c in columns if c not in ("name", "last_refreshed")} == {
                c: airflows[c] for c in columns if c not in ("name", "last_refreshed")
            }
            assert ours["last_refreshed"] is not None
            found = dag_bundle_sync_sync(conn, bundle.name, PROBED)
            assert (found.reason, found.status) == ("InSync", "True"), found.message
        teams = conn.execute(sa.text("SELECT count(*) FROM dag_bundle_team")).scalar()
        assert teams == 0
