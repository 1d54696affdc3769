"""Handing the Airflow-named tables over to an Airflow release that creates them itself.

The Airflow release that ships ADR-0013 Design B creates ``lang_sdk_task_handler_artifact`` and
``lang_sdk_task_handler`` with a plain ``CREATE TABLE``; where the operator created them first,
``airflow db migrate`` stops with ``relation "lang_sdk_task_handler_artifact" already exists``.
The handover, in one transaction each:

1. :func:`hand_over` (``taskhandler-operator db handover``) renames both tables, their
   constraints and indexes to ``thop_handover_artifact`` / ``thop_handover_binding``. Nothing is
   copied, so no row can be lost on the way; the rows keep their foreign keys (a Dag Airflow
   deletes meanwhile still takes its bindings with it) and their grants.
   ``thop_artifact_probe`` has no foreign key (thop0008): it follows whichever artifact table
   is current by id.
2. ``airflow db migrate`` creates Airflow's own, empty tables.
3. :func:`restore` (run by ``taskhandler-operator db upgrade``) moves the held rows into them
   (a row someone wrote meanwhile under the same key is newer and is kept), copies the grants,
   drops the probe rows of artifacts that did not come back, and drops the holding tables.

:func:`undo` (``db handover --undo``) renames everything back while Airflow has not created its
tables yet. While a handover is pending, the scheduler read path resolves from the holding
tables (:func:`taskhandler_operator.scheduler.resolve_task_handlers`).

The callers in :mod:`taskhandler_operator.db.migrate` take the migration lock and check the
revision; this module holds the mechanics and the refusals.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict
from sqlalchemy import (
    BigInteger,
    Connection,
    Text,
    and_,
    bindparam,
    column,
    delete,
    exists,
    func,
    select,
    table,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from taskhandler_operator.db.engine import DatabaseError
from taskhandler_operator.db.tables import (
    AIRFLOW_NAMED_TABLES,
    ARTIFACT_TABLE,
    BINDING_TABLE,
    BUNDLE_CLAIM_TABLE,
    HOLD_ARTIFACT_TABLE,
    HOLD_BINDING_TABLE,
    HOLDING_TABLES,
    ORIGIN_AIRFLOW,
    PROBLEM_TABLE,
    artifact_table,
    binding_table,
    held_artifact_table,
    held_binding_table,
    origin_table,
    probe_table,
)
from taskhandler_operator.db.writer import bundle_lock_key


class HandoverRefused(DatabaseError):
    """The handover (or its return path) would be unsafe now; nothing was changed."""


class HandoverPending(HandoverRefused):
    """Rows are held for Airflow's migration, which has not created its tables yet."""


class HandoverReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    database: str
    artifacts: int
    bindings: int


class RestoreReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    artifacts_restored: int
    # Held rows whose key a newer row (written after the handover) already has.
    artifacts_superseded: int
    bindings_restored: int
    bindings_superseded: int
    probes_dropped: int


# --- small catalog helpers ---------------------------------------------------------------------


def _exists(conn: Connection, name: str) -> bool:
    found = conn.execute(select(func.to_regclass(bindparam("name", type_=Text()))), {"name": name})
    return found.scalar() is not None


def pending(conn: Connection) -> bool:
    """Whether rows are held for Airflow's migration (a handover ran, its return path not yet)."""
    return any(_exists(conn, name) for name in HOLDING_TABLES.values())


def _quote(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))


def _count(conn: Connection, name: str) -> int:
    return int(conn.execute(select(func.count()).select_from(table(name))).scalar_one())


def _object_names(conn: Connection, name: str) -> tuple[list[str], list[str]]:
    """(constraint names, names of indexes that no constraint owns) of table ``name``."""
    params = {"table": name}
    constraints = conn.execute(
        text(
            "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:table) "
            "AND contype <> 'n' ORDER BY conname"
        ),
        params,
    ).scalars()
    indexes = conn.execute(
        text(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(:table) AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY c.relname"
        ),
        params,
    ).scalars()
    return list(constraints), list(indexes)


def _rename_table(conn: Connection, old: str, new: str) -> None:
    """Rename table ``old`` to ``new`` with every constraint and index carrying its name.

    Index names share one namespace with tables, so Airflow's ``CREATE TABLE`` of ``old`` would
    collide with an index left as ``old_pkey``; foreign keys are renamed too, for clarity.
    """
    constraints, indexes = _object_names(conn, old)
    q = _quote(conn, old)
    for name in constraints:
        if old in name:
            renamed = name.replace(old, new, 1)
            conn.execute(
                text(
                    f"ALTER TABLE {q} RENAME CONSTRAINT {_quote(conn, name)} TO "
                    f"{_quote(conn, renamed)}"
                )
            )
    for name in indexes:
        if old in name:
            renamed = name.replace(old, new, 1)
            conn.execute(
                text(f"ALTER INDEX {_quote(conn, name)} RENAME TO {_quote(conn, renamed)}")
            )
    conn.execute(text(f"ALTER TABLE {q} RENAME TO {_quote(conn, new)}"))


def _prune_probes(conn: Connection) -> int:
    """Drop probe rows whose artifact is not in the current artifact table; returns how many.

    Such a row described an artifact that is gone or was superseded on the way back. There is
    no foreign key to do it (thop0008: nothing of ours may depend on Airflow's tables).
    """
    p, a = probe_table, artifact_table
    dropped = conn.execute(
        delete(p).where(~exists().where(a.c.id == p.c.artifact_id)).returning(p.c.artifact_id)
    )
    return len(dropped.all())


def _bundle_names(conn: Connection, tables: Iterable[str]) -> list[str]:
    names: set[str] = set()
    for name in tables:
        if _exists(conn, name):
            query = select(column("bundle_name", Text())).select_from(table(name)).distinct()
            names.update(str(value) for value in conn.execute(query).scalars())
    return sorted(names)


def _require_no_writer(conn: Connection, bundles: Iterable[str]) -> None:
    """Refuse while an operator pass holds a bundle's advisory lock; keep the locks taken.

    Held until this transaction ends, the locks also make a pass that starts meanwhile wait,
    and then fail on the renamed tables with nothing committed.
    """
    for bundle in bundles:
        taken = conn.execute(
            select(func.pg_try_advisory_xact_lock(bindparam("key", type_=BigInteger()))),
            {"key": bundle_lock_key(bundle)},
        ).scalar()
        if not taken:
            raise HandoverRefused(
                f"the operator is writing bundle {bundle!r} right now (its advisory lock is "
                "held): stop the operator (scale its Deployment to 0 replicas), then run "
                "`taskhandler-operator db handover` again"
            )


def _origins(conn: Connection) -> dict[str, str]:
    o = origin_table
    return {str(r.table_name): str(r.created_by) for r in conn.execute(select(o))}


def _set_origin(conn: Connection, created_by: str) -> None:
    o = origin_table
    stmt = pg_insert(o).values(
        [{"table_name": name, "created_by": created_by} for name in AIRFLOW_NAMED_TABLES]
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[o.c.table_name],
            set_={"created_by": stmt.excluded.created_by, "recorded_at": func.now()},
        )
    )


# --- the three steps ---------------------------------------------------------------------------


def hand_over(conn: Connection, database: str) -> HandoverReport:
    """Move the Airflow-named tables out of Airflow's way (the caller holds the migration lock
    and commits)."""
    if pending(conn):
        raise HandoverRefused(
            f"{database}: a handover is already pending (the rows are held in "
            f"{HOLD_ARTIFACT_TABLE} and {HOLD_BINDING_TABLE}): run `airflow db migrate`, then "
            "`taskhandler-operator db upgrade`; or `taskhandler-operator db handover --undo`"
        )
    missing = [name for name in AIRFLOW_NAMED_TABLES if not _exists(conn, name)]
    if missing:
        raise HandoverRefused(
            f"{database}: nothing to hand over: table {missing[0]!r} does not exist; run "
            "`taskhandler-operator db upgrade` first"
        )
    airflows = [name for name, by in _origins(conn).items() if by == ORIGIN_AIRFLOW]
    if airflows:
        raise HandoverRefused(
            f"{database}: table {sorted(airflows)[0]!r} was created by Airflow, whose own "
            "migrations manage it; there is nothing to hand over"
        )
    _require_no_writer(
        conn, _bundle_names(conn, (ARTIFACT_TABLE, PROBLEM_TABLE, BUNDLE_CLAIM_TABLE))
    )
    conn.execute(text(f"LOCK TABLE {BINDING_TABLE}, {ARTIFACT_TABLE} IN ACCESS EXCLUSIVE MODE"))
    before = {name: _count(conn, name) for name in AIRFLOW_NAMED_TABLES}
    for name in (BINDING_TABLE, ARTIFACT_TABLE):
        _rename_table(conn, name, HOLDING_TABLES[name])
    after = {name: _count(conn, HOLDING_TABLES[name]) for name in AIRFLOW_NAMED_TABLES}
    if after != before:  # pragma: no cover - a rename cannot change a count; checked anyway
        raise HandoverRefused(f"{database}: refusing: rows would be lost ({before} -> {after})")
    return HandoverReport(
        database=database, artifacts=before[ARTIFACT_TABLE], bindings=before[BINDING_TABLE]
    )


def undo(conn: Connection, database: str) -> HandoverReport:
    """Put the held tables back under their names, before Airflow created its own."""
    if not pending(conn):
        raise HandoverRefused(f"{database}: no handover is pending; nothing to undo")
    present = [name for name in AIRFLOW_NAMED_TABLES if _exists(conn, name)]
    if present:
        raise HandoverRefused(
            f"{database}: Airflow's migration already created {present[0]!r}; run "
            "`taskhandler-operator db upgrade` to move the held rows into it"
        )
    counts = {name: _count(conn, held) for name, held in HOLDING_TABLES.items()}
    for name in (ARTIFACT_TABLE, BINDING_TABLE):
        _rename_table(conn, HOLDING_TABLES[name], name)
    return HandoverReport(
        database=database, artifacts=counts[ARTIFACT_TABLE], bindings=counts[BINDING_TABLE]
    )


def _copy_grants(conn: Connection, source: str, target: str) -> None:
    """Grant on ``target`` what was granted on ``source``, so the operator's least-privilege
    role keeps working on the tables Airflow's migration created."""
    rows = conn.execute(
        text(
            "SELECT a.grantee::regrole::text AS grantee, a.privilege_type, a.is_grantable "
            "FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = to_regclass(:source) AND a.grantee <> 0 AND a.grantee <> c.relowner"
        ),
        {"source": source},
    ).all()
    for grantee, privilege, grantable in rows:
        option = " WITH GRANT OPTION" if grantable else ""
        conn.execute(text(f"GRANT {privilege} ON {_quote(conn, target)} TO {grantee}{option}"))


def restore(conn: Connection, database: str) -> RestoreReport:
    """Move the held rows into the tables Airflow's migration created; drop the holding tables.

    The caller checked that both Airflow tables exist and fit. Every held row is either moved or
    superseded by a row with the same key written after the handover (the newer answer wins);
    bindings follow their artifact by ``(bundle_name, relative_fileloc_hash)``.
    """
    held_artifacts, held_bindings = (_count(conn, HOLDING_TABLES[n]) for n in AIRFLOW_NAMED_TABLES)
    # Wait for passes in flight: they write the new tables, and the merge must see their rows.
    bundles = _bundle_names(
        conn, (HOLD_ARTIFACT_TABLE, ARTIFACT_TABLE, PROBLEM_TABLE, BUNDLE_CLAIM_TABLE)
    )
    for bundle in bundles:
        conn.execute(
            select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger()))),
            {"key": bundle_lock_key(bundle)},
        )
    a, b = artifact_table, binding_table
    ha, hb = held_artifact_table, held_binding_table
    names = [c.name for c in a.columns]
    moved_artifacts = conn.execute(
        pg_insert(a)
        .from_select(names, select(*(ha.c[n] for n in names)))
        .on_conflict_do_nothing()
        .returning(a.c.id)
    )
    moved_artifact_count = len(moved_artifacts.all())
    names = [c.name for c in b.columns]
    # A binding follows its artifact by key: the held row, or the newer one that replaced it.
    source = (
        select(*(a.c.id if n == "artifact_id" else hb.c[n] for n in names))
        .join(ha, ha.c.id == hb.c.artifact_id)
        .join(
            a,
            and_(
                a.c.bundle_name == ha.c.bundle_name,
                a.c.relative_fileloc_hash == ha.c.relative_fileloc_hash,
            ),
        )
    )
    moved_bindings = conn.execute(
        pg_insert(b).from_select(names, source).on_conflict_do_nothing().returning(b.c.dag_id)
    )
    moved_binding_count = len(moved_bindings.all())
    report = RestoreReport(
        artifacts_restored=moved_artifact_count,
        artifacts_superseded=held_artifacts - moved_artifact_count,
        bindings_restored=moved_binding_count,
        bindings_superseded=held_bindings - moved_binding_count,
        probes_dropped=_prune_probes(conn),
    )
    _require_accounted(conn, database)
    for name in AIRFLOW_NAMED_TABLES:
        _copy_grants(conn, HOLDING_TABLES[name], name)
    conn.execute(text(f"DROP TABLE {_quote(conn, HOLD_BINDING_TABLE)}"))
    conn.execute(text(f"DROP TABLE {_quote(conn, HOLD_ARTIFACT_TABLE)}"))
    _set_origin(conn, ORIGIN_AIRFLOW)
    return report


def _require_accounted(conn: Connection, database: str) -> None:
    """Every held row has a row with its key in Airflow's tables, else keep them all held."""
    a, b = artifact_table, binding_table
    ha, hb = held_artifact_table, held_binding_table
    artifacts = (
        select(func.count())
        .where(
            ~exists().where(
                a.c.bundle_name == ha.c.bundle_name,
                a.c.relative_fileloc_hash == ha.c.relative_fileloc_hash,
            )
        )
        .select_from(ha)
    )
    bindings = (
        select(func.count())
        .where(~exists().where(b.c.dag_id == hb.c.dag_id, b.c.task_id == hb.c.task_id))
        .select_from(hb)
    )
    lost_artifacts = int(conn.execute(artifacts).scalar_one())
    lost_bindings = int(conn.execute(bindings).scalar_one())
    if lost_artifacts or lost_bindings:
        raise HandoverRefused(
            f"{database}: refusing to drop the holding tables: {lost_artifacts} artifact and "
            f"{lost_bindings} binding rows could not be moved into Airflow's tables"
        )


def restore_summary(report: RestoreReport) -> str:
    superseded = report.artifacts_superseded + report.bindings_superseded
    newer = f"; {superseded} held rows kept the newer row written since" if superseded else ""
    return (
        f"moved {report.artifacts_restored} artifact and {report.bindings_restored} binding rows "
        f"back from the handover{newer}"
    )
