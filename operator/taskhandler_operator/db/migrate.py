"""Run the operator's Alembic migrations (``taskhandler-operator db upgrade``).

One transaction, in this order:

1. take a cluster-wide advisory lock, so a Helm hook and an operator starting at the same time
   do not migrate twice;
2. require Airflow's schema (``dag`` and friends): the binding table's FK points into it;
3. compare each Airflow-named table that already exists with our model; any difference stops
   the upgrade with the differences named (:class:`SchemaMismatch`), before anything changed;
4. when a handover is pending (``db handover`` ran, then Airflow's migration created its own
   tables), move the held rows into them (:func:`taskhandler_operator.db.handover.restore`);
5. run Alembic up to ``head`` with the version table ``thop_alembic_version``; revision
   ``thop0001`` creates only the Airflow-named tables that are missing;
6. at ``head``, create an Airflow-named table that is missing although the history says it
   exists (an Airflow downgrade dropped it: the operator's objects never block that), exactly
   as the model declares it, and record the operator as its creator.

:func:`hand_over` and :func:`undo_handover` take the same lock for ``db handover``.

Running it again is a no-op. Alembic is synchronous: async callers run :func:`upgrade` in a
worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from pydantic import BaseModel, ConfigDict
from sqlalchemy import BigInteger, Connection, bindparam, func, inspect, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL

from taskhandler_operator.db import handover
from taskhandler_operator.db.airflow_tables import REQUIRED_AIRFLOW_TABLES
from taskhandler_operator.db.catalog import (
    compare_definitions,
    expected_definition,
    read_definition,
)
from taskhandler_operator.db.engine import (
    DatabaseError,
    create_sync_engine,
    describe,
    translate_errors_sync,
)
from taskhandler_operator.db.handover import (
    HandoverPending,
    HandoverRefused,
    HandoverReport,
    RestoreReport,
)
from taskhandler_operator.db.schema_check import check_tables, summarize
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    ORIGIN_OPERATOR,
    VERSION_TABLE,
    metadata,
    origin_table,
)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any constant distinct from Airflow's own migration lock (which uses a small integer id).
MIGRATION_LOCK_KEY = 0x7468_6F70_6D69_6772  # "thopmigr"


class SchemaMismatch(DatabaseError):
    """An Airflow-named table exists with a shape the operator cannot use."""


class AirflowSchemaMissing(DatabaseError):
    """The database has no Airflow metadata schema to attach our tables to."""


class UnknownRevision(DatabaseError):
    """The requested target revision is not in the operator's migration history."""


class UpgradeReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    database: str
    before: str | None
    after: str | None
    adopted: tuple[str, ...]
    # Set when this upgrade moved the rows of a handover back (see db/handover.py).
    restored: RestoreReport | None = None
    # Airflow-named tables created again at head (an Airflow downgrade had dropped them).
    recreated: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.before != self.after


class CheckReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    database: str
    current: str | None
    head: str
    missing_tables: tuple[str, ...]
    # Why the operator could not use a table (schema_check): blocks an upgrade.
    differences: dict[str, list[str]]
    # Every difference from the exact definition, by name (catalog): for the Airflow-named
    # tables, from Airflow's own model.
    definition_differences: dict[str, list[str]] = {}
    # Airflow's own tables the binding tables need (``db upgrade`` refuses without them).
    missing_airflow_tables: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return (
            self.current == self.head
            and not self.missing_tables
            and not self.differences
            and not self.definition_differences
            and not self.missing_airflow_tables
        )


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the history always has a head
        raise RuntimeError("the migration history has no head")
    return head


def current_revision(conn: Connection) -> str | None:
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _require_airflow(conn: Connection, database: str) -> None:
    inspector = inspect(conn)
    missing = [name for name in REQUIRED_AIRFLOW_TABLES if not inspector.has_table(name)]
    if missing:
        raise AirflowSchemaMissing(
            f"{database} has no Airflow metadata schema (missing table "
            f"{', '.join(repr(m) for m in missing)}); run `airflow db migrate` against it first"
        )


def upgrade_on(conn: Connection, *, database: str = "", revision: str = "head") -> UpgradeReport:
    """Upgrade on a connection inside a transaction the caller commits."""
    _take_lock(conn)
    _require_airflow(conn, database)
    before = current_revision(conn)
    held = handover.pending(conn)
    if held:
        absent = [name for name in AIRFLOW_NAMED_TABLES if not inspect(conn).has_table(name)]
        if absent:
            raise HandoverPending(
                f"{database}: a handover is pending and Airflow has not created {absent[0]!r} "
                "yet: run `airflow db migrate` with the Airflow release whose migration creates "
                "it, then `taskhandler-operator db upgrade` again; or put the tables back with "
                "`taskhandler-operator db handover --undo`"
            )
    differences = check_tables(conn, AIRFLOW_NAMED_TABLES)
    if differences:
        table, found = next(iter(differences.items()))
        raise SchemaMismatch(
            f"refusing to adopt it: {summarize(table, found)}. The operator needs the shape of "
            "ADR-0013 Design B (see docs/database.md); fix or drop the table, then run "
            "`taskhandler-operator db upgrade` again"
        )
    # The return path of a handover: Airflow's migration created its tables, the rows go back.
    restored = handover.restore(conn, database) if held else None
    inspector = inspect(conn)
    adopted = tuple(
        name for name in AIRFLOW_NAMED_TABLES if before is None and inspector.has_table(name)
    )
    config = alembic_config()
    config.attributes["connection"] = conn
    try:
        command.upgrade(config, revision)
    except CommandError as exc:
        # Alembic's message already names the revision ("Can't locate revision ...").
        raise UnknownRevision(f"cannot upgrade to revision {revision!r}: {exc}") from None
    after = current_revision(conn)
    recreated = _recreate_dropped_tables(conn) if after == head_revision() else ()
    return UpgradeReport(
        database=database,
        before=before,
        after=after,
        adopted=adopted,
        restored=restored,
        recreated=recreated,
    )


def _recreate_dropped_tables(conn: Connection) -> tuple[str, ...]:
    """Create the Airflow-named tables that are gone at ``head`` (an Airflow downgrade dropped
    them); returns their names. Their rows went with them: the next pass of each bundle probes
    and publishes again."""
    inspector = inspect(conn)
    missing = [name for name in AIRFLOW_NAMED_TABLES if not inspector.has_table(name)]
    if not missing:
        return ()
    # Creation order: the binding table refers to the artifact table.
    for name in (ARTIFACT_TABLE, BINDING_TABLE):
        if name in missing:
            metadata.tables[name].create(conn)
    o = origin_table
    stmt = pg_insert(o).values(
        [{"table_name": name, "created_by": ORIGIN_OPERATOR} for name in missing]
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[o.c.table_name],
            set_={"created_by": stmt.excluded.created_by, "recorded_at": func.now()},
        )
    )
    return tuple(missing)


def upgrade(url: str | URL, revision: str = "head") -> UpgradeReport:
    """Bring the operator's tables to ``revision``; idempotent."""
    database = describe(url)
    engine = create_sync_engine(url)
    try:
        with translate_errors_sync(), engine.begin() as conn:
            return upgrade_on(conn, database=database, revision=revision)
    finally:
        engine.dispose()


def _take_lock(conn: Connection) -> None:
    conn.execute(
        select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger()))),
        {"key": MIGRATION_LOCK_KEY},
    )


def _require_head(conn: Connection, database: str) -> None:
    current, head = current_revision(conn), head_revision()
    if current != head:
        raise HandoverRefused(
            f"{database}: the operator's tables are at revision {current or '(none)'}, not "
            f"{head}: run `taskhandler-operator db upgrade` first"
        )


def handover_on(conn: Connection, *, database: str = "") -> HandoverReport:
    """``db handover`` on a connection inside a transaction the caller commits."""
    _take_lock(conn)
    _require_airflow(conn, database)
    _require_head(conn, database)
    return handover.hand_over(conn, database)


def hand_over(url: str | URL) -> HandoverReport:
    """Prepare the database for an Airflow release whose own migration creates the
    Airflow-named tables (see :mod:`taskhandler_operator.db.handover`); one transaction."""
    database = describe(url)
    engine = create_sync_engine(url)
    try:
        with translate_errors_sync(), engine.begin() as conn:
            return handover_on(conn, database=database)
    finally:
        engine.dispose()


def undo_handover(url: str | URL) -> HandoverReport:
    """Put the held tables back, before Airflow's migration created its own."""
    database = describe(url)
    engine = create_sync_engine(url)
    try:
        with translate_errors_sync(), engine.begin() as conn:
            _take_lock(conn)
            return handover.undo(conn, database)
    finally:
        engine.dispose()


def downgrade(url: str | URL, revision: str) -> None:
    """Step the history back (tests and emergencies); adopted Airflow tables are kept."""
    engine = create_sync_engine(url)
    try:
        with translate_errors_sync(), engine.begin() as conn:
            config = alembic_config()
            config.attributes["connection"] = conn
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def model_label(table: str) -> str:
    """Whose definition a table must match, for messages."""
    return "Airflow's model" if table in AIRFLOW_NAMED_TABLES else "the operator's model"


def definition_differences(conn: Connection, names: Iterable[str]) -> dict[str, list[str]]:
    """Differences of each existing table among ``names`` from its exact definition."""
    found: dict[str, list[str]] = {}
    for name in names:
        observed = read_definition(conn, name)
        if observed is None:
            continue
        expected = expected_definition(metadata.tables[name])
        differences = compare_definitions(expected, observed, model_label(name))
        if differences:
            found[name] = differences
    return found


def check(url: str | URL) -> CheckReport:
    """Compare the database with what this version of the operator needs; changes nothing."""
    database = describe(url)
    engine = create_sync_engine(url)
    try:
        with translate_errors_sync(), engine.connect() as conn:
            inspector = inspect(conn)
            ours = sorted(metadata.tables)
            missing = tuple(name for name in ours if not inspector.has_table(name))
            missing_airflow = tuple(
                name for name in REQUIRED_AIRFLOW_TABLES if not inspector.has_table(name)
            )
            return CheckReport(
                database=database,
                current=current_revision(conn),
                head=head_revision(),
                missing_tables=missing,
                differences=check_tables(conn, ours),
                definition_differences=definition_differences(conn, ours),
                missing_airflow_tables=missing_airflow,
            )
    finally:
        engine.dispose()
