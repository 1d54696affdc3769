"""The scheduler's read path: which artifact runs each stub task.

Importable without kopf or the Kubernetes client: a scheduler (Airflow's is synchronous
SQLAlchemy) needs only SQLAlchemy and pydantic. Everything here reads the Airflow-named
binding tables, plus ``thop_bundle_problem`` to say why a stub has no binding.

* :func:`resolve_task_handlers` / :func:`resolve_task_handlers_sync` map many
  ``(dag_id, task_id)`` pairs to :class:`TaskHandlerArtifactRef` in one round trip per
  ``chunk_size`` pairs. The pairs travel as two array parameters; a ``LATERAL`` lookup per
  pair makes PostgreSQL use the binding table's primary key whatever the batch size.
* :func:`attach_task_handlers` puts the references on ``ExecuteTask``-shaped payloads (as
  ``task_handler_artifact``) and lists the stub tasks that have none.
* :func:`explain_unbound` / :func:`explain_unbound_sync` give the reason for those, in words a
  Dag author can act on. Whether to fail such a task is the caller's choice (ADR-0013
  Design A fails it; Design B leaves it to the worker).

Example (sync, inside Airflow's scheduler session)::

    refs = resolve_task_handlers_sync(session, [(ti.dag_id, ti.task_id) for ti in stubs])
    result = attach_task_handlers(payloads, refs, stub_keys={(t.dag_id, t.task_id) for t in stubs})
    reasons = explain_unbound_sync(session, result.unbound)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, Text, bindparam, case, column, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from taskhandler_operator.db.engine import connection, translate_errors_sync
from taskhandler_operator.db.tables import artifact_table, binding_table, probe_table, problem_table
from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef

TaskKey = tuple[str, str]

#: Pairs per statement: 10,000 pairs are two arrays of about 300 KB, one round trip.
DEFAULT_CHUNK_SIZE = 10_000
#: The ``ExecuteTask``/``StartupDetails`` field of ADR-0013 Design B.
WORKLOAD_FIELD = "task_handler_artifact"


def _pairs_table() -> Any:
    params = [
        bindparam("dag_ids", type_=ARRAY(Text())),
        bindparam("task_ids", type_=ARRAY(Text())),
    ]
    return (
        func.unnest(*params)
        .table_valued(column("dag_id", Text()), column("task_id", Text()))
        .render_derived(name="wanted")
    )


def resolve_statement(*, pin_version: bool = False) -> Select[Any]:
    """One row per requested pair that has a binding.

    ``pin_version`` also returns the source revision the artifact was probed at, for
    deployments whose Airflow artifact bundle is versioned by the same revisions (a git
    source and a ``GitDagBundle`` of the same repository).
    """
    wanted = _pairs_table()
    b = binding_table
    a = artifact_table
    columns = [b.c.dag_id, b.c.task_id, a.c.bundle_name, a.c.relative_fileloc]
    lookup = select(*columns).join(a, a.c.id == b.c.artifact_id)
    if pin_version:
        lookup = lookup.add_columns(probe_table.c.revision).outerjoin(
            probe_table, probe_table.c.artifact_id == a.c.id
        )
    # LIMIT 1 (the primary key allows one row anyway) keeps PostgreSQL from flattening the
    # LATERAL into a hash join over the whole table: each pair is one primary-key probe.
    found = (
        lookup.where(b.c.dag_id == wanted.c.dag_id, b.c.task_id == wanted.c.task_id)
        .limit(1)
        .lateral("found")
    )
    return select(found).select_from(wanted).join(found, true())


def _chunks(keys: Sequence[TaskKey], size: int) -> Iterator[dict[str, list[str]]]:
    if size < 1:
        raise ValueError("chunk_size must be at least 1")
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        yield {"dag_ids": [k[0] for k in chunk], "task_ids": [k[1] for k in chunk]}


def _unique(pairs: Iterable[TaskKey]) -> list[TaskKey]:
    return list(dict.fromkeys((str(d), str(t)) for d, t in pairs))


def _ref(row: Any, pin_version: bool) -> TaskHandlerArtifactRef:
    version = row.revision if pin_version else None
    return TaskHandlerArtifactRef(
        bundle_info=BundleInfo(name=row.bundle_name, version=version),
        rel_path=row.relative_fileloc,
    )


async def resolve_task_handlers(
    engine: AsyncEngine | AsyncConnection,
    pairs: Iterable[TaskKey],
    *,
    pin_version: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[TaskKey, TaskHandlerArtifactRef]:
    """The artifact reference of every pair that has a binding; pairs without one are absent."""
    keys = _unique(pairs)
    statement = resolve_statement(pin_version=pin_version)
    refs: dict[TaskKey, TaskHandlerArtifactRef] = {}
    if not keys:
        return refs
    async with connection(engine) as conn:
        for params in _chunks(keys, chunk_size):
            for row in (await conn.execute(statement, params)).all():
                refs[(row.dag_id, row.task_id)] = _ref(row, pin_version)
    return refs


def resolve_task_handlers_sync(
    conn: Connection | Session,
    pairs: Iterable[TaskKey],
    *,
    pin_version: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[TaskKey, TaskHandlerArtifactRef]:
    """:func:`resolve_task_handlers` on a sync connection or ORM session (psycopg or psycopg2)."""
    keys = _unique(pairs)
    statement = resolve_statement(pin_version=pin_version)
    refs: dict[TaskKey, TaskHandlerArtifactRef] = {}
    with translate_errors_sync():
        for params in _chunks(keys, chunk_size):
            for row in conn.execute(statement, params).all():
                refs[(row.dag_id, row.task_id)] = _ref(row, pin_version)
    return refs


# --- workloads ---------------------------------------------------------------------------------


class AttachResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    workloads: list[dict[str, Any]]
    # Stub tasks that have no binding, in payload order.
    unbound: list[TaskKey]


def workload_key(workload: Mapping[str, Any]) -> TaskKey:
    """``(ti.dag_id, ti.task_id)`` of an ``ExecuteTask``-shaped payload."""
    ti = workload.get("ti")
    if not isinstance(ti, Mapping):
        raise ValueError("workload has no 'ti' object")
    dag_id, task_id = ti.get("dag_id"), ti.get("task_id")
    if not isinstance(dag_id, str) or not isinstance(task_id, str):
        raise ValueError("workload 'ti' lacks a string dag_id or task_id")
    return dag_id, task_id


def attach_task_handlers(
    workloads: Iterable[Mapping[str, Any]],
    refs: Mapping[TaskKey, TaskHandlerArtifactRef],
    *,
    stub_keys: Collection[TaskKey],
    field: str = WORKLOAD_FIELD,
) -> AttachResult:
    """Copies of ``workloads`` with ``field`` set: the reference for a bound task, null for the
    rest (an ordinary task needs no artifact). Stubs in ``stub_keys`` without a reference are
    listed in :attr:`AttachResult.unbound`."""
    out: list[dict[str, Any]] = []
    unbound: list[TaskKey] = []
    for workload in workloads:
        key = workload_key(workload)
        ref = refs.get(key)
        payload = dict(workload)
        payload[field] = ref.model_dump(mode="json") if ref is not None else None
        if ref is None and key in stub_keys:
            unbound.append(key)
        out.append(payload)
    return AttachResult(workloads=out, unbound=unbound)


# --- reasons -----------------------------------------------------------------------------------


#: Problems of the rest of a Dag quoted when a stub has none of its own.
MAX_DAG_PROBLEMS_QUOTED = 3


def _reasons_statement() -> Select[Any]:
    """The error problems of the requested Dags, whole Dags rather than pairs: a Dag with an
    error anywhere keeps its rows untouched, which is why a stub without a problem of its own
    can still have no binding."""
    p = problem_table
    dag_ids = bindparam("dag_ids", type_=ARRAY(Text()))
    return (
        select(p.c.dag_id, p.c.task_id, p.c.kind, p.c.message)
        .where(p.c.dag_id == dag_ids.any_(), p.c.severity == "error")
        .order_by(
            p.c.dag_id,
            p.c.task_id.nulls_first(),
            case((p.c.kind == "conflict", 1), else_=0),
            p.c.message,
        )
    )


def _dag_chunks(keys: Sequence[TaskKey], size: int) -> Iterator[dict[str, list[str]]]:
    dag_ids = list(dict.fromkeys(dag_id for dag_id, _ in keys))
    for start in range(0, len(dag_ids), size):
        yield {"dag_ids": dag_ids[start : start + size]}


def no_record_reason(key: TaskKey) -> str:
    return (
        f"Dag {key[0]!r}, task {key[1]!r}: no task handler binding is recorded; no "
        "TaskHandlerBundle serves the stub's queue, or its bundle has not been reconciled "
        "since the Dag changed"
    )


def kept_dag_reason(key: TaskKey, dag_problems: Sequence[str]) -> str:
    """A stub whose Dag was left unchanged because of problems elsewhere in the Dag."""
    quoted = "; ".join(dag_problems[:MAX_DAG_PROBLEMS_QUOTED])
    more = len(dag_problems) - MAX_DAG_PROBLEMS_QUOTED
    suffix = f" (and {more} more)" if more > 0 else ""
    return (
        f"Dag {key[0]!r}, task {key[1]!r}: no task handler binding is recorded; the Dag's "
        f"bindings are left unchanged until its problems are fixed: {quoted}{suffix}"
    )


def _collect(rows: Iterable[Any], keys: Sequence[TaskKey]) -> dict[TaskKey, str]:
    by_dag: dict[str, list[Any]] = {}
    for row in rows:
        by_dag.setdefault(row.dag_id, []).append(row)
    reasons: dict[TaskKey, str] = {}
    for key in keys:
        dag_rows = by_dag.get(key[0], [])
        own = [row.message for row in dag_rows if row.task_id == key[1]]
        # A conflict on another task does not stop the Dag's other rows from being written.
        elsewhere = [
            row.message for row in dag_rows if row.task_id != key[1] and row.kind != "conflict"
        ]
        if own:
            reasons[key] = "; ".join(dict.fromkeys(own))
        elif elsewhere:
            reasons[key] = kept_dag_reason(key, list(dict.fromkeys(elsewhere)))
        else:
            reasons[key] = no_record_reason(key)
    return reasons


async def explain_unbound(
    engine: AsyncEngine | AsyncConnection, pairs: Iterable[TaskKey]
) -> dict[TaskKey, str]:
    """Why each pair has no binding: the bundle problems recorded for it, or a generic reason."""
    keys = _unique(pairs)
    if not keys:
        return {}
    rows: list[Any] = []
    async with connection(engine) as conn:
        for params in _dag_chunks(keys, DEFAULT_CHUNK_SIZE):
            rows += (await conn.execute(_reasons_statement(), params)).all()
    return _collect(rows, keys)


def explain_unbound_sync(
    conn: Connection | Session, pairs: Iterable[TaskKey]
) -> dict[TaskKey, str]:
    keys = _unique(pairs)
    rows: list[Any] = []
    with translate_errors_sync():
        for params in _dag_chunks(keys, DEFAULT_CHUNK_SIZE):
            rows += conn.execute(_reasons_statement(), params).all()
    return _collect(rows, keys)
