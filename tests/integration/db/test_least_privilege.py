"""The operator's database role, granted exactly what docs/airflow.md lists.

The grants are read from the docs page itself, so the page and this test cannot drift: a full
write pass, every read, and the read path through a handover work; anything more is refused.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.postgres import PostgresServer
from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.cli import main
from taskhandler_operator.db.dag_bundle import dag_bundle_sync
from taskhandler_operator.db.engine import create_engine, create_sync_engine
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.known_artifacts import load_known_artifacts
from taskhandler_operator.db.migrate import check, hand_over, upgrade
from taskhandler_operator.db.writer import (
    ArtifactRecord,
    delete_bundle_rows,
    record_artifacts,
)
from taskhandler_operator.scheduler import explain_unbound, resolve_task_handlers
from tests.fixtures.airflow_design_b import airflow_creates_binding_tables
from tests.integration.db.helpers import (
    PROBED_AT,
    add_dags,
    artifact,
    declaration,
    owner,
    reconcile,
)

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[3] / "docs" / "airflow.md"
DOC_ROLE = "thop_operator"


def documented_grants() -> str:
    """The SQL block between the operator-grants markers of docs/airflow.md."""
    text = DOCS.read_text()
    block = re.search(
        r"<!-- operator-grants:begin -->\n```sql\n(.*?)```\n<!-- operator-grants:end -->",
        text,
        re.S,
    )
    assert block is not None, "docs/airflow.md lost its operator-grants block"
    return block.group(1)


@pytest.fixture
def role_url(db_url: str, pg_server: PostgresServer) -> Iterator[str]:
    role = f"thop_op_{uuid.uuid4().hex[:10]}"
    sql = documented_grants().replace(DOC_ROLE, role)
    assert role in sql and DOC_ROLE not in sql
    admin = sa.create_engine(db_url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(sql)
        yield make_url(db_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
        admin.dispose()
        with pg_server.connect() as conn:
            conn.execute(f"DROP ROLE {role}")


@pytest.fixture
async def as_operator(role_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(role_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _airflow_writes_dags(admin: AsyncEngine) -> None:
    """Airflow's own user writes the Dags, as its Dag processor would."""
    await add_dags(
        admin,
        dag_document("etl", [stub_task("extract", queue="java"), stub_task("load", queue="java")]),
        dag_document(
            "report", [stub_task("publish", queue="java"), stub_task("gone", queue="java")]
        ),
    )


HANDLERS = {
    "etl": [declaration("extract"), declaration("load")],
    "report": [declaration("publish")],
}
PAIRS = [("etl", "extract"), ("etl", "load"), ("report", "publish"), ("report", "gone")]


async def test_a_full_write_pass_and_the_read_path_work_with_the_documented_grants(
    engine: AsyncEngine, as_operator: AsyncEngine, role_url: str
) -> None:
    await _airflow_writes_dags(engine)
    arts = [artifact("java", "jobs/etl.jar", HANDLERS), artifact("java", "old.jar", {})]

    # A full pass: inventory, artifacts, bindings, problems ("gone" has no handler), revisions.
    result, written = await reconcile(as_operator, "java", ["java"], arts, revision="c1")
    assert written.artifacts_inserted == 2 and written.probes_written == 2
    assert written.problems_inserted == 1
    assert written.bindings_inserted == 2  # etl; report keeps nothing while 'gone' is unbound
    # The next pass updates, deletes and sweeps: the old artifact is gone from the listing.
    await add_dags(engine, dag_document("report", [stub_task("publish", queue="java")]))
    _, again = await reconcile(as_operator, "java", ["java"], arts[:1], revision="c2")
    assert (again.bindings_inserted, again.artifacts_deleted, again.problems_deleted) == (1, 1, 1)
    counts = await record_artifacts(
        as_operator,
        "java",
        [ArtifactRecord(artifact=arts[0], probed_at=PROBED_AT, revision="c3")],
        owner=owner("java"),
    )
    assert counts.probes_written == 1  # the same answer, probed at another revision

    # Every read the operator and a scheduler make.
    refs = await resolve_task_handlers(as_operator, PAIRS, pin_version=True)
    assert set(refs) == {("etl", "extract"), ("etl", "load"), ("report", "publish")}
    assert set(await explain_unbound(as_operator, [("report", "gone")])) == {("report", "gone")}
    assert [a.relative_fileloc for a in await load_known_artifacts(as_operator, "java")] == [
        "jobs/etl.jar"
    ]
    assert (await dag_bundle_sync(as_operator, "java")).reason == "UnknownDagBundle"
    inventory = StubInventory()
    await inventory.refresh(as_operator)
    assert set(inventory.dags) == {"etl", "report"}
    assert check(role_url).ok
    assert main(["db", "upgrade", "--url", role_url]) == 0  # at head: nothing to do

    deleted = await delete_bundle_rows(as_operator, "java", owner=owner("java"))
    assert (deleted.bindings, deleted.artifacts) == (3, 1)
    assert result.verdicts  # the pass validated real Dags


REFUSED = [
    # Airflow's tables are read-only to the operator ...
    "INSERT INTO dag_bundle (name) VALUES ('x')",
    "UPDATE dag SET is_paused = true",
    "DELETE FROM serialized_dag",
    "UPDATE dag_bundle SET version = 'x'",
    # ... the rest of Airflow's schema is out of reach (connections hold secrets) ...
    "SELECT * FROM connection",
    "SELECT * FROM variable",
    "SELECT * FROM task_instance",
    "DELETE FROM alembic_version",
    # ... and nothing is created, altered, dropped or truncated.
    "CREATE TABLE thop_extra (id int)",
    "TRUNCATE lang_sdk_task_handler",
    "DROP TABLE thop_bundle_problem",
    "ALTER TABLE lang_sdk_task_handler_artifact ADD COLUMN extra int",
    "CREATE INDEX extra ON lang_sdk_task_handler (dag_bundle_name)",
    "COMMENT ON TABLE lang_sdk_task_handler IS 'x'",
    "UPDATE thop_alembic_version SET version_num = 'x'",
    "DELETE FROM thop_table_origin",
]


@pytest.mark.parametrize("statement", REFUSED)
def test_anything_more_is_refused(role_url: str, statement: str) -> None:
    engine = create_sync_engine(role_url)
    try:
        with pytest.raises(sqlalchemy.exc.DBAPIError) as caught, engine.begin() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
    assert getattr(caught.value.orig, "sqlstate", None) == "42501", caught.value


def test_migrations_and_the_handover_need_the_owner(
    role_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "handover", "--url", role_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: must be owner of table ")
    assert err.endswith(
        ": the database role lacks that privilege (docs/airflow.md lists what the migration "
        "role and the operator's role need)\n"
    )
    assert "\n" not in err.rstrip("\n")


async def test_the_grants_follow_the_rows_through_a_handover(
    engine: AsyncEngine, as_operator: AsyncEngine, db_url: str
) -> None:
    await _airflow_writes_dags(engine)
    await add_dags(engine, dag_document("report", [stub_task("publish", queue="java")]))
    arts = [artifact("java", "jobs/etl.jar", HANDLERS)]
    await reconcile(as_operator, "java", ["java"], arts)
    before = await resolve_task_handlers(as_operator, PAIRS)
    assert len(before) == 3

    hand_over(db_url)  # as the owner
    assert await resolve_task_handlers(as_operator, PAIRS) == before
    # Airflow's user creates its tables (no grants for the operator's role on them yet), then
    # db upgrade moves the rows back and copies the grants.
    airflow_creates_binding_tables(db_url)
    upgrade(db_url)

    assert await resolve_task_handlers(as_operator, PAIRS) == before
    # Writing into the tables Airflow's migration created: the copied grants at work.
    await add_dags(engine, dag_document("more", [stub_task("x", queue="java")]))
    more = [artifact("java", "jobs/etl.jar", {**HANDLERS, "more": [declaration("x")]})]
    _, written = await reconcile(as_operator, "java", ["java"], more, revision="c2")
    assert (written.artifacts_updated, written.bindings_inserted, written.probes_written) == (
        1,
        1,
        1,
    )
    after = await resolve_task_handlers(as_operator, [*PAIRS, ("more", "x")])
    assert set(after) == {*before, ("more", "x")}
