"""The write path's SQL: statement builders and the array parameters they take.

Every row set travels as one array parameter per column, expanded with ``unnest`` (see
:func:`_rows`), so a pass issues a fixed number of statements whatever its size. The parameters
are computed by :func:`prepare_params`, off the event loop (hashing, JSON).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Executable,
    Text,
    Uuid,
    and_,
    bindparam,
    cast,
    column,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.types import TypeEngine

from taskhandler_operator.db.airflow_tables import dag as airflow_dag
from taskhandler_operator.db.tables import (
    artifact_table,
    binding_table,
    declared_task_handlers,
    fileloc_hash,
    probe_table,
    problem_table,
    stored_task_handlers,
)
from taskhandler_operator.db.write_models import BundlePass
from taskhandler_operator.publication.changes import BindingRow, declared
from taskhandler_operator.records import ArtifactRecord, BundleProblem, TaskHandlerArtifact


def problem_key(problem: BundleProblem) -> str:
    """A stable identity of a problem, so an unchanged problem is never rewritten."""
    identity = json.dumps(
        [
            problem.severity,
            problem.kind,
            problem.dag_id,
            problem.task_id,
            problem.message,
            problem.other_bundle,
        ]
    )
    return hashlib.md5(identity.encode("utf-8"), usedforsecurity=False).hexdigest()


def bundle_lock_key(bundle_name: str) -> int:
    """A signed 64-bit advisory-lock key for one bundle (stable across processes)."""
    digest = hashlib.blake2b(f"thop-bundle:{bundle_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def advisory_lock_statement() -> Executable:
    """Wait for the transaction-scoped advisory lock ``:lock_key`` (see :func:`bundle_lock_key`)."""
    return select(func.pg_advisory_xact_lock(bindparam("lock_key", type_=BigInteger())))


# --- statements --------------------------------------------------------------------------------


def _rows(
    alias: str, prefix: str, columns: Sequence[tuple[str, TypeEngine[Any]]]
) -> TableValuedAlias:
    """``unnest(:p_a, :p_b, ...) AS alias(a, b, ...)``: one array parameter per column."""
    params = [bindparam(f"{prefix}_{name}", type_=ARRAY(type_)) for name, type_ in columns]
    return (
        func.unnest(*params)
        .table_valued(*(column(name, type_) for name, type_ in columns))
        .render_derived(name=alias)
    )


_ARTIFACT_COLUMNS: list[tuple[str, TypeEngine[Any]]] = [
    ("id", Uuid()),
    ("path", Text()),
    ("path_hash", Text()),
    ("size", BigInteger()),
    ("digest", Text()),
    ("handlers", Text()),
    ("probed_at", DateTime(timezone=True)),
]


def _inserted_flag(table_name: str) -> Any:
    # xmax is 0 on a row version this statement inserted and set on one it updated.
    return literal_column(f"({table_name}.xmax = 0)").label("inserted")


def upsert_artifacts_statement(*, probed: bool, prefix: str) -> Executable:
    """Upsert artifact rows; ``probed`` also moves ``last_probed_at`` (fast-path rows keep it)."""
    k = _rows("k", prefix, _ARTIFACT_COLUMNS)
    a = artifact_table
    probed_at = k.c.probed_at if probed else func.now()
    source = select(
        k.c.id,
        bindparam("bundle_name", type_=Text()),
        k.c.path,
        k.c.path_hash,
        k.c.size,
        k.c.digest,
        cast(k.c.handlers, JSON),
        probed_at,
    )
    stmt = pg_insert(a).from_select(
        [
            "id",
            "bundle_name",
            "relative_fileloc",
            "relative_fileloc_hash",
            "size_bytes",
            "cache_digest",
            "task_handlers",
            "last_probed_at",
        ],
        source,
    )
    new = stmt.excluded
    changed = [
        a.c.relative_fileloc.is_distinct_from(new.relative_fileloc),
        a.c.size_bytes.is_distinct_from(new.size_bytes),
        a.c.cache_digest.is_distinct_from(new.cache_digest),
        # json has no equality operator; jsonb compares by value.
        cast(a.c.task_handlers, JSONB).is_distinct_from(cast(new.task_handlers, JSONB)),
    ]
    updates: dict[str, Any] = {
        "relative_fileloc": new.relative_fileloc,
        "size_bytes": new.size_bytes,
        "cache_digest": new.cache_digest,
        "task_handlers": new.task_handlers,
    }
    if probed:
        changed.append(a.c.last_probed_at.is_distinct_from(new.last_probed_at))
        updates["last_probed_at"] = new.last_probed_at
    return stmt.on_conflict_do_update(
        index_elements=[a.c.bundle_name, a.c.relative_fileloc_hash],
        set_=updates,
        where=or_(*changed),
    ).returning(a.c.id, _inserted_flag(a.name))


def upsert_probes_statement() -> Executable:
    k = _rows(
        "k",
        "probe",
        [
            ("path_hash", Text()),
            ("revision", Text()),
            ("probed_at", DateTime(timezone=True)),
            ("declared", Text()),
            ("requested", Text()),
        ],
    )
    a = artifact_table
    p = probe_table
    source = select(
        a.c.id,
        k.c.revision,
        k.c.probed_at,
        cast(k.c.declared, JSON),
        cast(k.c.requested, JSON),
    ).join(
        a,
        and_(
            a.c.bundle_name == bindparam("bundle_name", type_=Text()),
            a.c.relative_fileloc_hash == k.c.path_hash,
        ),
    )
    stmt = pg_insert(p).from_select(
        ["artifact_id", "revision", "probed_at", "declared_task_handlers", "requested_dag_ids"],
        source,
    )
    new = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[p.c.artifact_id],
        set_={
            "revision": new.revision,
            "probed_at": new.probed_at,
            "declared_task_handlers": new.declared_task_handlers,
            "requested_dag_ids": new.requested_dag_ids,
        },
        where=or_(
            p.c.revision.is_distinct_from(new.revision),
            p.c.probed_at.is_distinct_from(new.probed_at),
            cast(p.c.declared_task_handlers, JSONB).is_distinct_from(
                cast(new.declared_task_handlers, JSONB)
            ),
            cast(p.c.requested_dag_ids, JSONB).is_distinct_from(cast(new.requested_dag_ids, JSONB)),
        ),
    ).returning(p.c.artifact_id)


def _ours(artifact_id: Any) -> Any:
    """The artifact ``artifact_id`` belongs to the pass's bundle.

    An uncorrelated ``IN``: inside ``ON CONFLICT ... WHERE`` SQLAlchemy cannot correlate a
    subquery to the conflicting row, and this form needs no correlation.
    """
    a = artifact_table
    ours = select(a.c.id).where(a.c.bundle_name == bindparam("bundle_name", type_=Text()))
    return artifact_id.in_(ours)


def delete_vanished_bindings_statement() -> Executable:
    """This bundle's rows of the validated Dags whose (dag_id, task_id) is no longer wanted."""
    b = binding_table
    keep = _rows("keep", "keep", [("dag_id", Text()), ("task_id", Text())])
    wanted = (
        exists().select_from(keep).where(keep.c.dag_id == b.c.dag_id, keep.c.task_id == b.c.task_id)
    )
    dag_ids = bindparam("reconciled_dag_ids", type_=ARRAY(Text()))
    return (
        delete(b)
        .where(b.c.dag_id == dag_ids.any_(), _ours(b.c.artifact_id), ~wanted)
        .returning(b.c.dag_id, b.c.task_id)
    )


_BINDING_COLUMNS: list[tuple[str, TypeEngine[Any]]] = [
    ("dag_id", Text()),
    ("task_id", Text()),
    ("artifact_hash", Text()),
    ("dag_bundle_name", Text()),
    ("dag_fileloc", Text()),
    ("dag_fileloc_hash", Text()),
]


def upsert_bindings_statement() -> Executable:
    """Insert or update wanted rows; a row held by another bundle's artifact is left alone."""
    k = _rows("k", "bind", _BINDING_COLUMNS)
    a = artifact_table
    b = binding_table
    source = (
        select(
            k.c.dag_id,
            k.c.task_id,
            a.c.id,
            k.c.dag_bundle_name,
            k.c.dag_fileloc,
            k.c.dag_fileloc_hash,
        )
        .join(
            a,
            and_(
                a.c.bundle_name == bindparam("bundle_name", type_=Text()),
                a.c.relative_fileloc_hash == k.c.artifact_hash,
            ),
        )
        # A Dag deleted since the inventory was read has nothing left to bind (and the FK
        # would refuse the row).
        .join(airflow_dag, airflow_dag.c.dag_id == k.c.dag_id)
    )
    stmt = pg_insert(b).from_select(
        [
            "dag_id",
            "task_id",
            "artifact_id",
            "dag_bundle_name",
            "dag_relative_fileloc",
            "dag_relative_fileloc_hash",
        ],
        source,
    )
    new = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[b.c.dag_id, b.c.task_id],
        set_={
            "artifact_id": new.artifact_id,
            "dag_bundle_name": new.dag_bundle_name,
            "dag_relative_fileloc": new.dag_relative_fileloc,
            "dag_relative_fileloc_hash": new.dag_relative_fileloc_hash,
        },
        where=and_(
            _ours(b.c.artifact_id),
            or_(
                b.c.artifact_id.is_distinct_from(new.artifact_id),
                b.c.dag_bundle_name.is_distinct_from(new.dag_bundle_name),
                b.c.dag_relative_fileloc.is_distinct_from(new.dag_relative_fileloc),
                b.c.dag_relative_fileloc_hash.is_distinct_from(new.dag_relative_fileloc_hash),
            ),
        ),
    ).returning(b.c.dag_id, b.c.task_id, _inserted_flag(b.name))


def held_elsewhere_statement() -> Executable:
    """Wanted (dag_id, task_id) whose row points at another bundle's artifact."""
    k = _rows("k", "bind", _BINDING_COLUMNS)
    a = artifact_table
    b = binding_table
    return (
        select(k.c.dag_id, k.c.task_id, a.c.bundle_name, a.c.relative_fileloc)
        .join(b, and_(b.c.dag_id == k.c.dag_id, b.c.task_id == k.c.task_id))
        .join(a, a.c.id == b.c.artifact_id)
        .where(a.c.bundle_name != bindparam("bundle_name", type_=Text()))
    )


def sweep_artifacts_statement() -> Executable:
    """Delete this bundle's unlisted, unreferenced artifacts and their probe rows.

    ``thop_artifact_probe`` has no foreign key into Airflow's table (it must never block
    Airflow's own DDL), so its rows go with their artifact here, in the same statement.
    """
    a = artifact_table
    b = binding_table
    p = probe_table
    listed = bindparam("listed_hashes", type_=ARRAY(Text()))
    referenced = exists().where(b.c.artifact_id == a.c.id)
    swept = (
        delete(a)
        .where(
            a.c.bundle_name == bindparam("bundle_name", type_=Text()),
            a.c.relative_fileloc_hash != listed.all_(),
            ~referenced,
        )
        .returning(a.c.id)
        .cte("swept")
    )
    probes = (
        delete(p).where(p.c.artifact_id.in_(select(swept.c.id))).returning(p.c.artifact_id)
    ).cte("swept_probes")
    # PostgreSQL runs a data-modifying CTE whether or not the main query reads it.
    return select(swept.c.id).add_cte(probes)


_PROBLEM_COLUMNS: list[tuple[str, TypeEngine[Any]]] = [
    ("problem_key", Text()),
    ("severity", Text()),
    ("kind", Text()),
    ("dag_id", Text()),
    ("task_id", Text()),
    ("relative_fileloc", Text()),
    ("message", Text()),
    ("other_bundle", Text()),
]


def delete_stale_problems_statement() -> Executable:
    p = problem_table
    keys = bindparam("problem_keys", type_=ARRAY(Text()))
    return (
        delete(p)
        .where(
            p.c.bundle_name == bindparam("bundle_name", type_=Text()),
            p.c.problem_key != keys.all_(),
        )
        .returning(p.c.problem_key)
    )


def insert_problems_statement() -> Executable:
    k = _rows("k", "problem", _PROBLEM_COLUMNS)
    p = problem_table
    names = [name for name, _ in _PROBLEM_COLUMNS]
    source = select(bindparam("bundle_name", type_=Text()), *(k.c[name] for name in names))
    return (
        pg_insert(p)
        .from_select(["bundle_name", *names], source)
        .on_conflict_do_nothing(index_elements=[p.c.bundle_name, p.c.problem_key])
        .returning(p.c.problem_key)
    )


def held_conflicts_statement() -> Executable:
    p = problem_table
    return select(p.c.bundle_name, p.c.dag_id, p.c.task_id).where(
        p.c.kind == "conflict", p.c.other_bundle == bindparam("bundle_name", type_=Text())
    )


# --- parameters --------------------------------------------------------------------------------


def _columns(
    rows: Sequence[Sequence[Any]], names: Sequence[str], prefix: str
) -> dict[str, list[Any]]:
    """Row tuples to one list per column, named like :func:`_rows` parameters."""
    return {f"{prefix}_{name}": [row[i] for row in rows] for i, name in enumerate(names)}


def _artifact_params(records: Sequence[ArtifactRecord], prefix: str) -> dict[str, list[Any]]:
    rows = [
        (
            uuid.uuid4(),
            r.artifact.relative_fileloc,
            fileloc_hash(r.artifact.relative_fileloc),
            r.artifact.size_bytes,
            r.artifact.cache_digest,
            json.dumps(stored_task_handlers(r.artifact.task_handlers), sort_keys=True),
            r.probed_at,
        )
        for r in records
    ]
    return _columns(rows, [name for name, _ in _ARTIFACT_COLUMNS], prefix)


def problem_params(problems: Sequence[BundleProblem]) -> tuple[list[str], dict[str, list[Any]]]:
    """Deduplicated problem rows, sorted by key: (keys, one list per column)."""
    by_key: dict[str, BundleProblem] = {}
    for problem in problems:
        by_key.setdefault(problem_key(problem), problem)
    keys = sorted(by_key)
    rows = [
        (
            key,
            by_key[key].severity,
            by_key[key].kind,
            by_key[key].dag_id,
            by_key[key].task_id,
            by_key[key].relative_fileloc,
            # A text column cannot hold NUL; a reason quoting runtime output might.
            by_key[key].message.replace("\x00", "\\x00"),
            by_key[key].other_bundle,
        )
        for key in keys
    ]
    return keys, _columns(rows, [name for name, _ in _PROBLEM_COLUMNS], "problem")


def _declared(record: ArtifactRecord) -> str | None:
    """The runtime's own answer, when the stored form loses meaning (see tables.py)."""
    declared = declared_task_handlers(record.artifact.task_handlers)
    return None if declared is None else json.dumps(declared, sort_keys=True)


@dataclass(frozen=True)
class PassParams:
    """Every array parameter of a pass, computed off the event loop (hashing, JSON)."""

    lock_key: int
    probed: dict[str, list[Any]]
    reused: dict[str, list[Any]]
    probes: dict[str, list[Any]]
    reconciled_dag_ids: list[str]
    bindings: dict[str, list[Any]]
    listed_hashes: list[str]
    problems: list[BundleProblem]
    files: dict[str, str]
    # The rows the pass wants for the Dags it reconciles, as the publication history sees them.
    wanted: list[BindingRow]


def prepare_params(bundle_pass: BundlePass) -> PassParams:
    # Sorted by key so that every writer takes row locks in the same order (no deadlocks).
    ordered = sorted(bundle_pass.artifacts, key=lambda r: fileloc_hash(r.artifact.relative_fileloc))
    probed = [r for r in ordered if r.probed_at is not None]
    reused = [r for r in ordered if r.probed_at is None]
    probe_rows = [
        (
            fileloc_hash(r.artifact.relative_fileloc),
            r.revision,
            r.probed_at,
            _declared(r),
            None if r.requested_dag_ids is None else json.dumps(list(r.requested_dag_ids)),
        )
        for r in probed
    ]
    reconciled = [v for v in bundle_pass.verdicts if v.bindings is not None]
    wanted = sorted(
        (
            b.dag_id,
            b.task_id,
            fileloc_hash(b.artifact_rel_path),
            v.bundle_name,
            v.relative_fileloc,
            fileloc_hash(v.relative_fileloc),
        )
        for v in reconciled
        for b in v.bindings or ()
    )
    answers = {r.artifact.relative_fileloc: r.artifact for r in ordered}
    wanted_rows = [
        _wanted_row(
            answers[b.artifact_rel_path], b.dag_id, b.task_id, v.bundle_name, v.relative_fileloc
        )
        for v in reconciled
        for b in v.bindings or ()
    ]
    problems = list(bundle_pass.problems)
    for verdict in bundle_pass.verdicts:
        problems += [*verdict.errors, *verdict.warnings]
    return PassParams(
        lock_key=bundle_lock_key(bundle_pass.bundle_name),
        probed=_artifact_params(probed, "art"),
        reused=_artifact_params(reused, "art"),
        probes=_columns(
            probe_rows, ["path_hash", "revision", "probed_at", "declared", "requested"], "probe"
        ),
        reconciled_dag_ids=[v.dag_id for v in reconciled],
        bindings=_columns(wanted, [name for name, _ in _BINDING_COLUMNS], "bind"),
        listed_hashes=[fileloc_hash(r.artifact.relative_fileloc) for r in ordered],
        problems=problems,
        files={v.dag_id: v.relative_fileloc for v in bundle_pass.verdicts},
        wanted=sorted(wanted_rows, key=lambda r: r.key),
    )


def _wanted_row(
    artifact: TaskHandlerArtifact, dag_id: str, task_id: str, dag_bundle: str, dag_fileloc: str
) -> BindingRow:
    binding, params = declared(artifact.task_handlers, dag_id, task_id)
    return BindingRow(
        dag_id=dag_id,
        task_id=task_id,
        artifact_path=artifact.relative_fileloc,
        artifact_digest=artifact.cache_digest,
        binding=binding,
        params=params,
        dag_bundle_name=dag_bundle,
        dag_fileloc=dag_fileloc,
    )


def restore_params(rows: Sequence[BindingRow]) -> dict[str, list[Any]]:
    """The binding parameters (as :func:`upsert_bindings_statement` takes them) that put
    ``rows`` back, e.g. a rollback's recorded binding set."""
    ordered = sorted(rows, key=lambda r: r.key)
    return _columns(
        [
            (
                r.dag_id,
                r.task_id,
                fileloc_hash(r.artifact_path),
                r.dag_bundle_name,
                r.dag_fileloc,
                fileloc_hash(r.dag_fileloc),
            )
            for r in ordered
        ],
        [name for name, _ in _BINDING_COLUMNS],
        "bind",
    )
