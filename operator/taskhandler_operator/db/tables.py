"""SQLAlchemy models of the tables the operator writes.

Two tables carry Airflow's names and follow ADR-0013 "Design B" exactly (columns, types,
lengths, constraints), so a scheduler written against the ADR reads our rows unchanged:

* ``lang_sdk_task_handler_artifact``: one probed artifact of an artifact bundle and every
  task handler it declared (the cache the fast path compares against).
* ``lang_sdk_task_handler``: one binding ``(dag_id, task_id) -> artifact``.

Their constraints and indexes carry the names Airflow's model gives them (its metadata naming
convention), they have no table comment, and stored answers stay in Design B's value domain
(:func:`stored_task_handlers`), so Airflow's own migrations and model find exactly their own.

We never add columns to those. Operator-only bookkeeping lives in ``thop_``-prefixed tables:

* ``thop_artifact_probe``: the source revision each artifact was last probed at, and the
  runtime's own answer where the stored form loses something validation reads. It refers to
  an artifact by id without a foreign key, so nothing of ours blocks Airflow's DDL on its
  tables.
* ``thop_table_origin``: who created each Airflow-named table (the operator, or Airflow), which
  decides what a downgrade may drop and whether a handover is needed.
* ``thop_bundle_problem``: the current problems of each bundle pass (unbound stubs, argument
  mismatches, unreadable Dags, conflicts with other bundles), which the scheduler read path
  also uses to explain a missing binding.
* ``thop_bundle_claim``: which TaskHandlerBundle (cluster id, namespace, name, uid) owns a bundle
  name. Every other row is keyed by the bundle name alone, so two resources naming the same
  ``bundleName`` (in two namespaces, or two clusters sharing one Airflow database) would sweep
  each other's rows without it; the database is the only place all operators see.
* ``thop_queue_claim``: which bundle name serves each stub queue, across operators too; it goes
  with its bundle's claim (``ON DELETE CASCADE``).
* ``thop_leader_fence``: the newest leadership term of each operator Lease (holder and
  ``leaseTransitions``), which every write transaction checks so a deposed leader cannot write
  (see ``db/fence.py``).
* ``thop_publication``: each bundle's publication history (what every publication changed, and
  the whole binding set it published, for a rollback), bounded per bundle, plus the bundle's
  one held change (``kind = 'held'``) while its publish policy holds it (``db/publications.py``).

The migrations in ``migrations/versions`` create exactly these shapes; a test compares them.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    column,
    func,
    table,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import TableClause

from taskhandler_operator.db.airflow_tables import dag as airflow_dag
from taskhandler_operator.limits import (
    CACHE_DIGEST_LENGTH,
    CLUSTER_ID_LENGTH,
    ID_LENGTH,
    KUBE_NAME_LENGTH,
    KUBE_UID_LENGTH,
    MD5_HEX_LENGTH,
    ORIGIN_LENGTH,
    PATH_LENGTH,
    PROBLEM_KIND_LENGTH,
    PROBLEM_SEVERITY_LENGTH,
    PUBLICATION_KIND_LENGTH,
    QUEUE_LENGTH,
    REVISION_LENGTH,
)
from taskhandler_operator.records import TaskHandlerDeclaration, TaskHandlers

ARTIFACT_TABLE = "lang_sdk_task_handler_artifact"
BINDING_TABLE = "lang_sdk_task_handler"
PROBE_TABLE = "thop_artifact_probe"
PROBLEM_TABLE = "thop_bundle_problem"
BUNDLE_CLAIM_TABLE = "thop_bundle_claim"
QUEUE_CLAIM_TABLE = "thop_queue_claim"
ORIGIN_TABLE = "thop_table_origin"
LEADER_FENCE_TABLE = "thop_leader_fence"
PUBLICATION_TABLE = "thop_publication"
#: Where ``db handover`` keeps the Airflow-named tables until Airflow has created its own.
HOLD_ARTIFACT_TABLE = "thop_handover_artifact"
HOLD_BINDING_TABLE = "thop_handover_binding"
#: ``thop_table_origin.created_by`` values.
ORIGIN_OPERATOR = "taskhandler-operator"
ORIGIN_AIRFLOW = "airflow"
#: Our Alembic history's version table; Airflow keeps its own ``alembic_version``.
VERSION_TABLE = "thop_alembic_version"

#: Tables carrying Airflow's names: adopted when they already exist with the same shape.
AIRFLOW_NAMED_TABLES: tuple[str, ...] = (ARTIFACT_TABLE, BINDING_TABLE)
HOLDING_TABLES: dict[str, str] = {
    ARTIFACT_TABLE: HOLD_ARTIFACT_TABLE,
    BINDING_TABLE: HOLD_BINDING_TABLE,
}

metadata = MetaData()


def fileloc_hash(relative_fileloc: str) -> str:
    """The 32-hex MD5 of a relative path, as the ``*_fileloc_hash`` columns hold it.

    A 2000-character path is too long for a portable unique index; its digest is not.
    """
    return hashlib.md5(relative_fileloc.encode("utf-8"), usedforsecurity=False).hexdigest()


#: The ``binding`` values Airflow's Design-B model accepts in a stored answer.
STORED_BINDINGS: tuple[str, ...] = ("positional", "named")
#: The keys of a stored parameter (Design B's ``TaskHandlerParam``).
STORED_PARAM_KEYS: frozenset[str] = frozenset({"name", "value_schema", "exact_name"})


def _stored_declaration(declaration: TaskHandlerDeclaration) -> dict[str, Any] | None:
    mode = declaration.mode
    if mode is None:
        return None
    return {
        "task_id": declaration.task_id,
        "binding": mode,
        "params": None
        if declaration.params is None
        else [
            param.model_dump(mode="json", include=set(STORED_PARAM_KEYS))
            for param in declaration.params
        ],
    }


def stored_task_handlers(handlers: TaskHandlers) -> dict[str, list[dict[str, Any]]]:
    """The ``task_handlers`` column's JSON, in Design B's value domain (what Airflow's model
    loads): ``binding`` is ``positional`` or ``named`` (``named_or_whole`` and ``named_open``,
    which validation reads as ``named``, are stored as ``named``); a parameter has exactly
    ``name``, ``value_schema`` and ``exact_name`` (Design A's ``required`` and any other key
    are dropped); a declaration in a mode nobody knows is left out. ``params: null`` is kept:
    it means "check presence only".
    """
    stored: dict[str, list[dict[str, Any]]] = {}
    for dag_id, declarations in handlers.items():
        kept = (_stored_declaration(d) for d in declarations)
        stored[dag_id] = [d for d in kept if d is not None]
    return stored


def _loses_meaning(declaration: TaskHandlerDeclaration) -> bool:
    """Whether validation reads the stored form of ``declaration`` differently."""
    if declaration.mode is None:
        return True
    return any(param.required is not None for param in declaration.params or ())


def declared_task_handlers(handlers: TaskHandlers) -> dict[str, list[dict[str, Any]]] | None:
    """The runtime's own answer, kept in the operator's table only when worth keeping.

    That is when :func:`stored_task_handlers` loses something validation reads: a declaration
    in an unknown mode (it errs when a stub uses it) or Design A's ``required``. Otherwise
    None: the stored form says everything, and answers reused by the fast path validate the
    same as fresh ones either way.
    """
    if not any(_loses_meaning(d) for ds in handlers.values() for d in ds):
        return None
    return {
        dag_id: [
            {
                "task_id": d.task_id,
                "binding": d.binding,
                "params": None
                if d.params is None
                else [
                    p.model_dump(mode="json", exclude={"required"} if p.required is None else set())
                    for p in d.params
                ],
            }
            for d in declarations
        ]
        for dag_id, declarations in handlers.items()
    }


class Base(DeclarativeBase):
    metadata = metadata


class TaskHandlerArtifactRow(Base):
    __tablename__ = ARTIFACT_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("id", name="lang_sdk_task_handler_artifact_pkey"),
        UniqueConstraint(
            "bundle_name",
            "relative_fileloc_hash",
            name="lang_sdk_task_handler_artifact_bundle_fileloc_uq",
        ),
        Index("idx_lang_sdk_task_handler_artifact_last_probed_at", "last_probed_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, default=uuid.uuid4)
    bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    relative_fileloc: Mapped[str] = mapped_column(String(PATH_LENGTH), nullable=False)
    relative_fileloc_hash: Mapped[str] = mapped_column(String(MD5_HEX_LENGTH), nullable=False)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cache_digest: Mapped[str | None] = mapped_column(String(CACHE_DIGEST_LENGTH), nullable=True)
    task_handlers: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    last_probed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class TaskHandlerBindingRow(Base):
    __tablename__ = BINDING_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("dag_id", "task_id", name="lang_sdk_task_handler_pkey"),
        # The Dag owns its bindings: deleting the dag row reclaims them.
        ForeignKeyConstraint(
            ["dag_id"],
            [airflow_dag.c.dag_id],
            name="lang_sdk_task_handler_dag_id_fkey",
            ondelete="CASCADE",
        ),
        Index("idx_lang_sdk_task_handler_dag_file", "dag_bundle_name", "dag_relative_fileloc_hash"),
        Index("idx_lang_sdk_task_handler_artifact_id", "artifact_id"),
    )

    dag_id: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    task_id: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    artifact_id: Mapped[uuid.UUID] = mapped_column(
        Uuid,
        ForeignKey(f"{ARTIFACT_TABLE}.id", name="lang_sdk_task_handler_artifact_id_fkey"),
        nullable=False,
    )
    dag_bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    dag_relative_fileloc: Mapped[str] = mapped_column(String(PATH_LENGTH), nullable=False)
    dag_relative_fileloc_hash: Mapped[str] = mapped_column(String(MD5_HEX_LENGTH), nullable=False)


class ArtifactProbeRow(Base):
    """Operator-only: which source revision an artifact's stored answer came from."""

    __tablename__ = PROBE_TABLE
    __table_args__ = (PrimaryKeyConstraint("artifact_id", name="thop_artifact_probe_pkey"),)

    # No foreign key into Airflow's table: an object depending on it would block Airflow's own
    # DDL (a downgrade dropping the table, a column change). The write path deletes a probe row
    # with its artifact, and readers join on the artifact (thop0008).
    artifact_id: Mapped[uuid.UUID] = mapped_column(Uuid, nullable=False)
    revision: Mapped[str | None] = mapped_column(String(REVISION_LENGTH), nullable=True)
    probed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # The runtime's answer when the stored form loses meaning (declared_task_handlers); read
    # back only while the artifact row is still the one this probe wrote.
    declared_task_handlers: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The ``dag_ids`` the probe request named (a JSON array; null: none were sent). An answer
    # from a runtime that answers only the Dags it is asked about speaks for these alone.
    requested_dag_ids: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)


class TableOriginRow(Base):
    """Operator-only: who created an Airflow-named table (no table comment carries it)."""

    __tablename__ = ORIGIN_TABLE
    __table_args__ = (PrimaryKeyConstraint("table_name", name="thop_table_origin_pkey"),)

    table_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    created_by: Mapped[str] = mapped_column(String(ORIGIN_LENGTH), nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class BundleProblemRow(Base):
    """Operator-only: one current problem of one bundle.

    ``problem_key`` is an MD5 over the problem's identity (severity, kind, Dag, task, text), so
    a pass that finds the same problems again writes nothing and ``first_seen_at`` survives.
    """

    __tablename__ = PROBLEM_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("bundle_name", "problem_key", name="thop_bundle_problem_pkey"),
        Index("idx_thop_problem_task", "dag_id", "task_id"),
        Index("idx_thop_problem_other_bundle", "other_bundle"),
    )

    bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    problem_key: Mapped[str] = mapped_column(String(MD5_HEX_LENGTH), nullable=False)
    severity: Mapped[str] = mapped_column(String(PROBLEM_SEVERITY_LENGTH), nullable=False)
    kind: Mapped[str] = mapped_column(String(PROBLEM_KIND_LENGTH), nullable=False)
    dag_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True)
    task_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True)
    relative_fileloc: Mapped[str | None] = mapped_column(String(PATH_LENGTH), nullable=True)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    # For a conflict: the bundle whose artifact holds the binding, so it can report it too.
    other_bundle: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True)
    first_seen_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class BundleClaimRow(Base):
    """Operator-only: the TaskHandlerBundle that owns a bundle name (see ``db/claims.py``)."""

    __tablename__ = BUNDLE_CLAIM_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("bundle_name", name="thop_bundle_claim_pkey"),
        Index("idx_thop_bundle_claim_owner", "cluster_id", "namespace", "name"),
    )

    bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    cluster_id: Mapped[str] = mapped_column(String(CLUSTER_ID_LENGTH), nullable=False)
    namespace: Mapped[str] = mapped_column(String(KUBE_NAME_LENGTH), nullable=False)
    name: Mapped[str] = mapped_column(String(KUBE_NAME_LENGTH), nullable=False)
    uid: Mapped[str] = mapped_column(String(KUBE_UID_LENGTH), nullable=False)
    claimed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class QueueClaimRow(Base):
    """Operator-only: the bundle name serving a stub queue; released with the bundle's claim."""

    __tablename__ = QUEUE_CLAIM_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("queue", name="thop_queue_claim_pkey"),
        ForeignKeyConstraint(
            ["bundle_name"],
            [f"{BUNDLE_CLAIM_TABLE}.bundle_name"],
            name="thop_queue_claim_bundle_fkey",
            ondelete="CASCADE",
        ),
        Index("idx_thop_queue_claim_bundle", "bundle_name"),
    )

    queue: Mapped[str] = mapped_column(String(QUEUE_LENGTH), nullable=False)
    bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    claimed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class LeaderFenceRow(Base):
    """Operator-only: the newest leadership term of one operator Lease (see ``db/fence.py``)."""

    __tablename__ = LEADER_FENCE_TABLE
    __table_args__ = (
        PrimaryKeyConstraint(
            "cluster_id", "lease_namespace", "lease_name", name="thop_leader_fence_pkey"
        ),
    )

    cluster_id: Mapped[str] = mapped_column(String(CLUSTER_ID_LENGTH), nullable=False)
    lease_namespace: Mapped[str] = mapped_column(String(KUBE_NAME_LENGTH), nullable=False)
    lease_name: Mapped[str] = mapped_column(String(KUBE_NAME_LENGTH), nullable=False)
    lease_uid: Mapped[str] = mapped_column(String(KUBE_UID_LENGTH), nullable=False)
    holder: Mapped[str] = mapped_column(Text, nullable=False)
    transitions: Mapped[int] = mapped_column(BigInteger, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class PublicationRow(Base):
    """Operator-only: one publication of one bundle, or its held change (see
    ``db/publications.py``). ``changes`` is the change set's JSON, ``bindings`` the whole
    binding set published (for a held change: the one it would publish)."""

    __tablename__ = PUBLICATION_TABLE
    __table_args__ = (PrimaryKeyConstraint("bundle_name", "id", name="thop_publication_pkey"),)

    bundle_name: Mapped[str] = mapped_column(String(ID_LENGTH), nullable=False)
    # Numbered per bundle (under the bundle's lock): the newest has the highest.
    id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    kind: Mapped[str] = mapped_column(String(PUBLICATION_KIND_LENGTH), nullable=False)
    revision: Mapped[str | None] = mapped_column(String(REVISION_LENGTH), nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    operator: Mapped[str] = mapped_column(Text, nullable=False)
    approved_by: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    added: Mapped[int] = mapped_column(Integer, nullable=False)
    removed: Mapped[int] = mapped_column(Integer, nullable=False)
    moved: Mapped[int] = mapped_column(Integer, nullable=False)
    changed: Mapped[int] = mapped_column(Integer, nullable=False)
    changes: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    bindings: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)


# Core handles for the bulk statements of the write and read paths.
artifact_table: Table = metadata.tables[ARTIFACT_TABLE]
binding_table: Table = metadata.tables[BINDING_TABLE]
probe_table: Table = metadata.tables[PROBE_TABLE]
problem_table: Table = metadata.tables[PROBLEM_TABLE]
bundle_claim_table: Table = metadata.tables[BUNDLE_CLAIM_TABLE]
queue_claim_table: Table = metadata.tables[QUEUE_CLAIM_TABLE]
origin_table: Table = metadata.tables[ORIGIN_TABLE]
leader_fence_table: Table = metadata.tables[LEADER_FENCE_TABLE]
publication_table: Table = metadata.tables[PUBLICATION_TABLE]


def _clause(name: str, source: Table) -> TableClause:
    return table(name, *(column(c.name, c.type) for c in source.columns))


# The holding tables exist only between ``db handover`` and the ``db upgrade`` after Airflow's
# migration (renamed Airflow-named tables, same columns); never created from this module.
held_artifact_table: TableClause = _clause(HOLD_ARTIFACT_TABLE, artifact_table)
held_binding_table: TableClause = _clause(HOLD_BINDING_TABLE, binding_table)
