"""The publication history (``thop_publication``): record, list, load; the held change.

Every publication of a bundle's bindings (by a pass under ``Automatic``, by an approval, by a
rollback) is one row: its revision, time, the operator replica that wrote it, who approved it,
the change set and the whole binding set it published (what a rollback restores). A change the
bundle's publish policy holds is the bundle's one row of kind ``held``. The write path
(:mod:`.writer`) records in its own transaction, under the bundle lock, and keeps the newest
``THOP_PUBLICATION_HISTORY`` publications per bundle in the same statement.

Reads for people (the CLI, the tests) take an engine; the write path's statements take the
transaction's connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import ARRAY, Text, TextClause, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.engine import connection
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE, PUBLICATION_TABLE
from taskhandler_operator.publication.changes import (
    BindingRow,
    ChangeCounts,
    ChangeSet,
    declared,
)
from taskhandler_operator.publication.history import (
    PUBLISHED_KINDS,
    Publication,
    PublicationKind,
)

__all__ = [
    "PublishedState",
    "artifact_digests",
    "clear_held",
    "list_publications",
    "load_publication",
    "load_publication_in",
    "pending_change",
    "read_published",
    "record_publication",
    "save_held",
]

_COLUMNS = (
    "id, bundle_name, kind, revision, recorded_at, operator, approved_by, reason, "
    "added, removed, moved, changed"
)


@cache
def _published_statement() -> TextClause:
    """The bundle's binding rows with what their artifact declares for each task (only that
    declaration, not the artifact's whole answer), the rows of ``dag_ids`` another bundle
    holds, and the held change: one row, two JSON values."""
    # Constant table names; every value is a bound parameter.
    sql = f"""
        SELECT
          (SELECT coalesce(json_agg(json_build_object(
               'bundle', a.bundle_name, 'dag_id', b.dag_id, 'task_id', b.task_id,
               'path', a.relative_fileloc, 'digest', a.cache_digest,
               'decl', (SELECT d FROM json_array_elements(
                            CASE WHEN json_typeof(a.task_handlers -> b.dag_id) = 'array'
                                 THEN a.task_handlers -> b.dag_id ELSE '[]'::json END) AS d
                        WHERE d ->> 'task_id' = b.task_id LIMIT 1),
               'dag_bundle', b.dag_bundle_name, 'dag_fileloc', b.dag_relative_fileloc)),
             '[]'::json)
           FROM {BINDING_TABLE} AS b JOIN {ARTIFACT_TABLE} AS a ON a.id = b.artifact_id
           WHERE a.bundle_name = :bundle_name OR b.dag_id = ANY(:dag_ids)) AS bindings,
          (SELECT json_build_object(
               'id', h.id, 'bundle_name', h.bundle_name, 'kind', h.kind,
               'revision', h.revision, 'recorded_at', h.recorded_at, 'operator', h.operator,
               'reason', h.reason, 'changes', h.changes)
           FROM {PUBLICATION_TABLE} AS h
           WHERE h.bundle_name = :bundle_name AND h.kind = 'held'
           ORDER BY h.id DESC LIMIT 1) AS held
    """  # noqa: S608
    return text(sql).bindparams(
        bindparam("bundle_name", type_=Text()), bindparam("dag_ids", type_=ARRAY(Text()))
    )


@dataclass(frozen=True)
class PublishedState:
    """What is published for a bundle, read under its lock at the start of a write."""

    rows: tuple[BindingRow, ...]  # the bundle's binding rows
    held_elsewhere: frozenset[tuple[str, str]]  # rows of the pass's Dags another bundle holds
    held: Publication | None  # the held change, with its change set


def _row(item: Mapping[str, Any]) -> BindingRow:
    decl = item.get("decl")
    binding, params = (
        declared({item["dag_id"]: [decl]}, item["dag_id"], item["task_id"])
        if isinstance(decl, Mapping)
        else (None, None)
    )
    return BindingRow(
        dag_id=item["dag_id"],
        task_id=item["task_id"],
        artifact_path=item["path"],
        artifact_digest=item.get("digest"),
        binding=binding,
        params=params,
        dag_bundle_name=item.get("dag_bundle") or "",
        dag_fileloc=item.get("dag_fileloc") or "",
    )


def _parse_state(bundle_name: str, bindings: Any, held: Any) -> PublishedState:
    items = _json(bindings) or []
    rows = tuple(
        sorted((_row(i) for i in items if i["bundle"] == bundle_name), key=lambda r: r.key)
    )
    elsewhere = frozenset((i["dag_id"], i["task_id"]) for i in items if i["bundle"] != bundle_name)
    held_row = _json(held)
    publication = None
    if held_row is not None:
        change = ChangeSet.from_json(_json(held_row["changes"]) or {})
        publication = Publication(
            id=held_row["id"],
            bundle_name=held_row["bundle_name"],
            kind="held",
            revision=held_row.get("revision"),
            recorded_at=held_row["recorded_at"],
            operator=held_row.get("operator") or "",
            reason=held_row.get("reason"),
            counts=change.counts(),
            change=change,
        )
    return PublishedState(rows=rows, held_elsewhere=elsewhere, held=publication)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


async def read_published(
    conn: AsyncConnection, bundle_name: str, dag_ids: Sequence[str]
) -> PublishedState:
    """One statement: the bundle's published rows, the rows of ``dag_ids`` other bundles
    hold, and the held change."""
    row = (
        await conn.execute(
            _published_statement(), {"bundle_name": bundle_name, "dag_ids": list(dag_ids)}
        )
    ).one()
    return _parse_state(bundle_name, row.bindings, row.held)


@cache
def _record_statement(held: bool) -> TextClause:
    """Insert a publication (or the held change), dropping the bundle's held change and, for a
    publication, the oldest ones beyond ``:keep`` + this one, in the same statement."""
    trim = (
        ""
        if held
        else f""",
        trimmed AS (
            DELETE FROM {PUBLICATION_TABLE}
            WHERE bundle_name = :bundle_name AND kind <> 'held' AND id NOT IN (
                SELECT id FROM {PUBLICATION_TABLE}
                WHERE bundle_name = :bundle_name AND kind <> 'held'
                ORDER BY id DESC LIMIT :keep)
            RETURNING id)"""  # noqa: S608 - a constant table name
    )
    sql = f"""
        WITH cleared AS (
            DELETE FROM {PUBLICATION_TABLE} WHERE bundle_name = :bundle_name AND kind = 'held'
            RETURNING id){trim}
        INSERT INTO {PUBLICATION_TABLE}
            (bundle_name, id, kind, revision, operator, approved_by, reason,
             added, removed, moved, changed, changes, bindings)
        SELECT :bundle_name, coalesce(max(id), 0) + 1, :kind, :revision, :operator,
               :approved_by, :reason, :added, :removed, :moved, :changed,
               CAST(:changes AS json), CAST(:bindings AS json)
        FROM {PUBLICATION_TABLE} WHERE bundle_name = :bundle_name
        RETURNING id, recorded_at
    """  # noqa: S608
    return text(sql)


def _bindings_json(rows: Sequence[BindingRow]) -> str:
    return json.dumps([r.model_dump(mode="json", exclude_none=True) for r in rows], sort_keys=True)


async def _insert(
    conn: AsyncConnection,
    *,
    bundle_name: str,
    kind: PublicationKind,
    revision: str | None,
    operator: str,
    change: ChangeSet,
    bindings: Sequence[BindingRow],
    approved_by: str | None,
    reason: str | None,
    keep: int,
) -> Publication:
    counts = change.counts()
    params: dict[str, Any] = {
        "bundle_name": bundle_name,
        "kind": kind,
        "revision": revision,
        "operator": operator,
        "approved_by": approved_by,
        "reason": reason,
        **counts.model_dump(),
        "changes": change.to_json(),
        "bindings": _bindings_json(bindings),
    }
    if kind != "held":
        params["keep"] = max(0, keep)
    row = (await conn.execute(_record_statement(kind == "held"), params)).one()
    return Publication(
        id=row.id,
        bundle_name=bundle_name,
        kind=kind,
        revision=revision,
        recorded_at=row.recorded_at,
        operator=operator,
        approved_by=approved_by,
        reason=reason,
        counts=counts,
    )


async def record_publication(
    conn: AsyncConnection,
    bundle_name: str,
    *,
    kind: PublicationKind,
    revision: str | None,
    operator: str,
    change: ChangeSet,
    bindings: Sequence[BindingRow],
    approved_by: str | None = None,
    reason: str | None = None,
    limit: int,
) -> Publication:
    """Record a publication in the caller's transaction (one statement): drops the bundle's
    held change and keeps the newest ``limit`` publications, this one included."""
    if kind == "held":
        raise ValueError("a held change is saved with save_held")
    return await _insert(
        conn,
        bundle_name=bundle_name,
        kind=kind,
        revision=revision,
        operator=operator,
        change=change,
        bindings=bindings,
        approved_by=approved_by,
        reason=reason,
        keep=limit - 1,
    )


async def save_held(
    conn: AsyncConnection,
    bundle_name: str,
    *,
    revision: str | None,
    operator: str,
    change: ChangeSet,
    bindings: Sequence[BindingRow],
    reason: str,
) -> Publication:
    """Replace the bundle's held change (one statement)."""
    return await _insert(
        conn,
        bundle_name=bundle_name,
        kind="held",
        revision=revision,
        operator=operator,
        change=change,
        bindings=bindings,
        approved_by=None,
        reason=reason,
        keep=0,
    )


@cache
def _clear_statement() -> TextClause:
    return text(
        f"DELETE FROM {PUBLICATION_TABLE} "  # noqa: S608 - a constant table name
        "WHERE bundle_name = :bundle_name AND kind = 'held' RETURNING id"
    )


async def clear_held(conn: AsyncConnection, bundle_name: str) -> bool:
    """Drop the bundle's held change; whether there was one."""
    rows = (await conn.execute(_clear_statement(), {"bundle_name": bundle_name})).all()
    return bool(rows)


def _publication(row: Any, *, full: bool) -> Publication:
    change = ChangeSet.from_json(_json(row.changes) or {}) if full else None
    bindings = (
        tuple(BindingRow.model_validate(b) for b in _json(row.bindings) or []) if full else None
    )
    return Publication(
        id=row.id,
        bundle_name=row.bundle_name,
        kind=row.kind,
        revision=row.revision,
        recorded_at=row.recorded_at,
        operator=row.operator,
        approved_by=row.approved_by,
        reason=row.reason,
        counts=ChangeCounts(
            added=row.added, removed=row.removed, moved=row.moved, changed=row.changed
        ),
        change=change,
        bindings=bindings,
    )


async def list_publications(
    engine: AsyncEngine | AsyncConnection, bundle_name: str, limit: int | None = None
) -> list[Publication]:
    """The bundle's publications, newest first (counts only; not the held change)."""
    sql = (
        f"SELECT {_COLUMNS} FROM {PUBLICATION_TABLE} "  # noqa: S608 - constant names
        "WHERE bundle_name = :bundle_name AND kind <> 'held' ORDER BY id DESC"
    )
    params: dict[str, Any] = {"bundle_name": bundle_name}
    if limit is not None:
        sql += " LIMIT :limit"
        params["limit"] = limit
    async with connection(engine) as conn:
        rows = (await conn.execute(text(sql), params)).all()
    return [_publication(r, full=False) for r in rows]


async def load_publication_in(
    conn: AsyncConnection, bundle_name: str, revision: str | None = None
) -> Publication | None:
    """The newest publication of ``revision`` (None: the newest of all), with its change set
    and binding set."""
    sql = (
        f"SELECT {_COLUMNS}, changes, bindings FROM {PUBLICATION_TABLE} "  # noqa: S608
        "WHERE bundle_name = :bundle_name AND kind = ANY(:kinds)"
    )
    params: dict[str, Any] = {"bundle_name": bundle_name, "kinds": list(PUBLISHED_KINDS)}
    if revision is not None:
        sql += " AND revision = :revision"
        params["revision"] = revision
    statement = text(sql + " ORDER BY id DESC LIMIT 1").bindparams(
        bindparam("kinds", type_=ARRAY(Text()))
    )
    row = (await conn.execute(statement, params)).one_or_none()
    return None if row is None else _publication(row, full=True)


async def load_publication(
    engine: AsyncEngine | AsyncConnection, bundle_name: str, revision: str | None = None
) -> Publication | None:
    """:func:`load_publication_in` on a connection of its own."""
    async with connection(engine) as conn:
        return await load_publication_in(conn, bundle_name, revision)


async def pending_change(
    engine: AsyncEngine | AsyncConnection, bundle_name: str
) -> Publication | None:
    """The bundle's held change (with its change set and the binding set it would publish),
    or None when nothing is held."""
    sql = (
        f"SELECT {_COLUMNS}, changes, bindings FROM {PUBLICATION_TABLE} "  # noqa: S608
        "WHERE bundle_name = :bundle_name AND kind = 'held' ORDER BY id DESC LIMIT 1"
    )
    async with connection(engine) as conn:
        row = (await conn.execute(text(sql), {"bundle_name": bundle_name})).one_or_none()
    return None if row is None else _publication(row, full=True)


def held_since(publication: Publication | None) -> datetime | None:
    return None if publication is None else publication.recorded_at


async def artifact_digests(conn: AsyncConnection, bundle_name: str) -> dict[str, str | None]:
    """The bundle's stored artifacts: path -> cache digest (whose answers are known)."""
    sql = (
        f"SELECT relative_fileloc, cache_digest FROM {ARTIFACT_TABLE} "  # noqa: S608
        "WHERE bundle_name = :bundle_name"
    )
    rows = (await conn.execute(text(sql), {"bundle_name": bundle_name})).all()
    return {r.relative_fileloc: r.cache_digest for r in rows}
