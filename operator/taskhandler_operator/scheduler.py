"""The scheduler's read path: which artifact runs each stub task.

Importable without kopf or the Kubernetes client: a scheduler (Airflow's is synchronous
SQLAlchemy) needs only SQLAlchemy and pydantic. Everything here reads the Airflow-named
binding tables, plus ``thop_bundle_problem`` to say why a stub has no binding.

* :func:`resolve_task_handlers` / :func:`resolve_task_handlers_sync` map many
  ``(dag_id, task_id)`` pairs to :class:`TaskHandlerArtifactRef` in one statement per
  ``chunk_size`` pairs, after one catalog lookup per call (see the handover below). The pairs
  travel as two array parameters; a ``LATERAL`` lookup per pair makes PostgreSQL use the
  binding table's primary key whatever the batch size.
* Routing, as Airflow's scheduler does it: given ``routed_queues`` (the keys of
  ``[sdk] queue_to_coordinator``), only tasks whose queue is routed are looked up, a task
  without a queue being on ``default_queue``. Without ``routed_queues`` every pair is resolved
  and the filtering is the caller's.
* A pending ``db handover`` (rows held in ``thop_handover_*`` while Airflow's migration creates
  its own tables) is followed: one catalog lookup per call finds where the rows are, so the
  references stay the same before, during and after the handover.
* :func:`attach_task_handlers` puts the references on ``ExecuteTask``-shaped payloads (as
  ``task_handler_artifact``) and lists the stub tasks that have none.
* :func:`explain_unbound` / :func:`explain_unbound_sync` give the reason for those, in words a
  Dag author can act on. Whether to fail such a task is the caller's choice (ADR-0013
  Design A fails it; Design B leaves it to the worker).

Example (sync, inside Airflow's scheduler session)::

    routed = routed_queues_from_config(
        conf.get("sdk", "queue_to_coordinator", fallback=None),
        conf.get("sdk", "coordinators", fallback=None),
    )
    tasks = [(ti.dag_id, ti.task_id, ti.queue) for ti in stubs]
    refs = resolve_task_handlers_sync(session, tasks, routed_queues=routed)
    result = attach_task_handlers(
        payloads, refs, stub_keys={(t.dag_id, t.task_id) for t in stubs}, routed_queues=routed
    )
    reasons = explain_unbound_sync(session, result.unbound)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, Text, bindparam, case, column, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from taskhandler_operator.db.engine import connection, translate_errors_sync
from taskhandler_operator.db.tables import (
    BINDING_TABLE,
    HOLD_BINDING_TABLE,
    artifact_table,
    binding_table,
    held_artifact_table,
    held_binding_table,
    probe_table,
    problem_table,
)
from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef

_log = logging.getLogger(__name__)

# The scheduler's API; the reference types are re-exported so a caller needs this module only.
__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "WORKLOAD_FIELD",
    "AttachResult",
    "BundleInfo",
    "CoordinatorConfigError",
    "TaskHandlerArtifactRef",
    "TaskKey",
    "attach_task_handlers",
    "explain_unbound",
    "explain_unbound_sync",
    "kept_dag_reason",
    "no_record_reason",
    "parse_queue_to_coordinator",
    "resolve_statement",
    "resolve_task_handlers",
    "resolve_task_handlers_sync",
    "routed_queues_from_config",
    "workload_key",
]

TaskKey = tuple[str, str]
#: A task to look up: ``(dag_id, task_id)`` or ``(dag_id, task_id, queue)``. A missing, None or
#: empty queue is the default queue, as for an Airflow task instance.
TaskLookup = tuple[str, str] | tuple[str, str, str | None]

#: Pairs per statement: 10,000 pairs are two arrays of about 300 KB, one round trip.
DEFAULT_CHUNK_SIZE = 10_000
#: The ``ExecuteTask``/``StartupDetails`` field of ADR-0013 Design B.
WORKLOAD_FIELD = "task_handler_artifact"
#: Airflow's ``[operators] default_queue`` default.
DEFAULT_QUEUE = "default"


# --- routing -----------------------------------------------------------------------------------


class CoordinatorConfigError(ValueError):
    """``[sdk] queue_to_coordinator`` (or ``[sdk] coordinators``) is not a valid configuration."""


def parse_queue_to_coordinator(
    value: str | None, coordinators: str | None = None
) -> frozenset[str]:
    """The queues ``[sdk] queue_to_coordinator`` routes, or :class:`CoordinatorConfigError`.

    The rules are Airflow's (``CoordinatorManager``): unset, empty or JSON ``null`` routes
    nothing; otherwise a JSON object whose values are non-empty strings. With ``coordinators``
    (the ``[sdk] coordinators`` JSON text) every value must also name a configured coordinator,
    and ``coordinators`` itself must be a JSON object (or unset/``null``).
    """
    routes = _json_option("queue_to_coordinator", value)
    if routes is None:
        return frozenset()
    if not isinstance(routes, dict):
        raise CoordinatorConfigError("[sdk] queue_to_coordinator must be a JSON object")
    for queue, name in routes.items():
        if not isinstance(name, str) or not name:
            raise CoordinatorConfigError(
                f"[sdk] queue_to_coordinator: the coordinator of queue {queue!r} must be a "
                "non-empty string"
            )
    if coordinators is not None:
        known = _json_option("coordinators", coordinators)
        if known is not None and not isinstance(known, dict):
            raise CoordinatorConfigError("[sdk] coordinators must be a JSON object")
        for queue, name in routes.items():
            if name not in (known or {}):
                raise CoordinatorConfigError(
                    f"[sdk] queue_to_coordinator: queue {queue!r} references unknown "
                    f"coordinator {name!r}"
                )
    return frozenset(routes)


def routed_queues_from_config(value: str | None, coordinators: str | None = None) -> frozenset[str]:
    """The queues ``[sdk] queue_to_coordinator`` routes to a coordinator (its keys).

    ``value`` is the option's JSON text (``conf.get("sdk", "queue_to_coordinator")``), and
    ``coordinators`` optionally ``[sdk] coordinators``'. As Airflow's scheduler does, an invalid
    configuration never raises into the scheduling loop: it is logged as a warning (with the
    reason) on every call and routes nothing, so no stub task gets a reference.
    :func:`parse_queue_to_coordinator` is the strict form.
    """
    try:
        return parse_queue_to_coordinator(value, coordinators)
    except CoordinatorConfigError:
        _log.warning(
            "invalid [sdk] coordinator configuration: no stub task is resolved", exc_info=True
        )
        return frozenset()


def _json_option(option: str, value: str | None) -> Any:
    """The option's JSON value; None when unset, blank or ``null``."""
    if value is None or not value.strip():
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise CoordinatorConfigError(f"[sdk] {option} is not JSON: {exc}") from None


def task_queue(task: TaskLookup, default_queue: str = DEFAULT_QUEUE) -> str:
    """The queue Airflow routes ``task`` by: its own, else the default queue."""
    queue = task[2] if len(task) > 2 else None
    return queue or default_queue


def routed_keys(
    tasks: Iterable[TaskLookup],
    routed_queues: Collection[str] | None,
    default_queue: str = DEFAULT_QUEUE,
) -> list[TaskKey]:
    """The distinct ``(dag_id, task_id)`` Airflow's scheduler would look up, in input order.

    ``routed_queues=None`` means "no routing given": every task is kept. An empty collection
    routes nothing (Airflow with ``queue_to_coordinator`` unset resolves no stub).
    """
    keys = (
        (str(task[0]), str(task[1]))
        for task in tasks
        if routed_queues is None or task_queue(task, default_queue) in routed_queues
    )
    return list(dict.fromkeys(keys))


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


def resolve_statement(*, pin_version: bool = False, held: bool = False) -> Select[Any]:
    """One row per requested pair that has a binding.

    ``pin_version`` also returns the source revision the artifact was probed at, for
    deployments whose Airflow artifact bundle is versioned by the same revisions (a git
    source and a ``GitDagBundle`` of the same repository). ``held`` reads the tables a pending
    ``db handover`` keeps the rows in.
    """
    wanted = _pairs_table()
    b: Any = held_binding_table if held else binding_table
    a: Any = held_artifact_table if held else artifact_table
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


def _sources_statement() -> Select[bool, bool]:
    name = bindparam("binding", type_=Text())
    held = bindparam("held", type_=Text())
    return select(
        func.to_regclass(name).is_not(None).label("airflow"),
        func.to_regclass(held).is_not(None).label("held"),
    )


_SOURCE_PARAMS = {"binding": BINDING_TABLE, "held": HOLD_BINDING_TABLE}


def _statements(airflow: bool, held: bool, pin_version: bool) -> list[Select[Any]]:
    """Where the bindings are: Airflow's tables, or while a handover is pending the holding
    tables (both, between Airflow's migration and ``db upgrade``: Airflow's rows win)."""
    statements = []
    if airflow or not held:
        statements.append(resolve_statement(pin_version=pin_version))
    if held:
        statements.append(resolve_statement(pin_version=pin_version, held=True))
    return statements


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
    pairs: Iterable[TaskLookup],
    *,
    routed_queues: Collection[str] | None = None,
    default_queue: str = DEFAULT_QUEUE,
    pin_version: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[TaskKey, TaskHandlerArtifactRef]:
    """The artifact reference of every pair that has a binding; pairs without one are absent.

    With ``routed_queues``, tasks on other queues are not looked up (see :func:`routed_keys`);
    without, everything given is resolved.
    """
    keys = routed_keys(pairs, routed_queues, default_queue)
    refs: dict[TaskKey, TaskHandlerArtifactRef] = {}
    if not keys:
        return refs
    async with connection(engine) as conn:
        sources = (await conn.execute(_sources_statement(), _SOURCE_PARAMS)).one()
        statements = _statements(sources.airflow, sources.held, pin_version)
        for params in _chunks(keys, chunk_size):
            for statement in statements:
                for row in (await conn.execute(statement, params)).all():
                    refs.setdefault((row.dag_id, row.task_id), _ref(row, pin_version))
    return refs


def resolve_task_handlers_sync(
    conn: Connection | Session,
    pairs: Iterable[TaskLookup],
    *,
    routed_queues: Collection[str] | None = None,
    default_queue: str = DEFAULT_QUEUE,
    pin_version: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[TaskKey, TaskHandlerArtifactRef]:
    """:func:`resolve_task_handlers` on a sync connection or ORM session (psycopg or psycopg2)."""
    keys = routed_keys(pairs, routed_queues, default_queue)
    refs: dict[TaskKey, TaskHandlerArtifactRef] = {}
    if not keys:
        return refs
    with translate_errors_sync():
        sources = conn.execute(_sources_statement(), _SOURCE_PARAMS).one()
        statements = _statements(sources.airflow, sources.held, pin_version)
        for params in _chunks(keys, chunk_size):
            for statement in statements:
                for row in conn.execute(statement, params).all():
                    refs.setdefault((row.dag_id, row.task_id), _ref(row, pin_version))
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


def workload_queue(workload: Mapping[str, Any], default_queue: str = DEFAULT_QUEUE) -> str:
    """``ti.queue`` of an ``ExecuteTask``-shaped payload, the default queue when unset."""
    ti = workload.get("ti")
    queue = ti.get("queue") if isinstance(ti, Mapping) else None
    if queue is not None and not isinstance(queue, str):
        raise ValueError("workload 'ti' has a queue that is not a string")
    return queue or default_queue


def attach_task_handlers(
    workloads: Iterable[Mapping[str, Any]],
    refs: Mapping[TaskKey, TaskHandlerArtifactRef],
    *,
    stub_keys: Collection[TaskKey],
    routed_queues: Collection[str] | None = None,
    default_queue: str = DEFAULT_QUEUE,
    field: str = WORKLOAD_FIELD,
) -> AttachResult:
    """Copies of ``workloads`` with ``field`` set: the reference for a bound task, null for the
    rest (an ordinary task needs no artifact). Stubs in ``stub_keys`` without a reference are
    listed in :attr:`AttachResult.unbound`.

    With ``routed_queues``, a workload whose ``ti.queue`` is not routed gets null and is never
    listed as unbound: Airflow's scheduler does not look such a stub up."""
    out: list[dict[str, Any]] = []
    unbound: list[TaskKey] = []
    for workload in workloads:
        key = workload_key(workload)
        routed = routed_queues is None or workload_queue(workload, default_queue) in routed_queues
        ref = refs.get(key) if routed else None
        payload = dict(workload)
        payload[field] = ref.model_dump(mode="json") if ref is not None else None
        if ref is None and routed and key in stub_keys:
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
