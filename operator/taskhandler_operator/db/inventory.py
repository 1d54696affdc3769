"""The stub inventory: stub tasks read from Airflow's ``serialized_dag``, incrementally.

A Dag can have several ``serialized_dag`` rows, one per Dag version; the newest (highest
``dag_version.version_number``) is the one that counts. Airflow may also rewrite that row in
place, so a row id alone does not say "unchanged": its ``dag_hash`` does.

Each :meth:`StubInventory.refresh` first reads one row: the count and a sum of hashes of what
the cheap query would return (:func:`fingerprint_query`, computed by PostgreSQL). When it equals
the previous refresh's, nothing changed and the refresh ends there: the bundles' passes ask for
a refresh up to once a second, and reading and comparing a row per live Dag in Python each time
took most of a core at a few thousand Dags. Otherwise the cheap query, ``(dag_id, row id,
dag_hash, bundle, relative file)`` for every live Dag, is compared with what the previous
refresh saw, and only the documents of the Dags that changed are fetched and parsed (in bounded
chunks, parsed in a worker thread so the event loop never decodes JSON). The state lives in the
:class:`StubInventory` object the caller keeps between passes.

One inventory serves every bundle of an operator, and bundles reconcile concurrently: refreshes
take turns (an ``asyncio.Lock``), and each publishes a new mapping instead of editing the old,
so a pass validating against :attr:`StubInventory.dags` (in a worker thread) keeps a consistent
snapshot while another pass refreshes. That mapping is an
:class:`~taskhandler_operator.airflow.snapshot.InventorySnapshot`: indexed by queue once per
refresh that changed something, so that each pass reads only the Dags of its own queues.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Text, bindparam, cast, func, select
from sqlalchemy.dialects.postgresql import ARRAY, distinct_on
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select

from taskhandler_operator.airflow.serialized import (
    DEFAULT_QUEUE,
    DagReadProblem,
    DagStubs,
    DocumentError,
    decode_document,
    read_stubs,
)
from taskhandler_operator.airflow.snapshot import InventorySnapshot
from taskhandler_operator.db.airflow_tables import dag, dag_version, serialized_dag
from taskhandler_operator.db.engine import connection

log = logging.getLogger(__name__)

DEFAULT_FETCH_CHUNK = 200


@dataclass(frozen=True)
class _RowKey:
    """What the cheap query says about a Dag; any difference means "parse it again"."""

    serialized_id: uuid.UUID
    dag_hash: str
    bundle_name: str
    relative_fileloc: str


class InventoryDelta(BaseModel):
    """What one refresh found: Dags parsed again, Dags gone, and how many were skipped."""

    model_config = ConfigDict(frozen=True)

    changed: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: int

    @property
    def parsed(self) -> int:
        return len(self.changed)


def newest_rows_query() -> Select[Any]:
    """The cheap query: the newest serialized row of every live Dag, without its document."""
    return (
        select(
            serialized_dag.c.dag_id,
            serialized_dag.c.id,
            serialized_dag.c.dag_hash,
            dag.c.bundle_name,
            dag.c.relative_fileloc,
        )
        .join(dag_version, dag_version.c.id == serialized_dag.c.dag_version_id)
        .join(dag, dag.c.dag_id == serialized_dag.c.dag_id)
        # A stale Dag vanished from its file; Airflow keeps its rows but never schedules it.
        .where(dag.c.is_stale.is_(False))
        .order_by(serialized_dag.c.dag_id, dag_version.c.version_number.desc())
        .ext(distinct_on(serialized_dag.c.dag_id))
    )


#: Separates the fields hashed together (a character no Dag id, hash or path holds).
_UNIT_SEPARATOR = "\x1f"


def fingerprint_query() -> Select[Any]:
    """One row for the whole answer of :func:`newest_rows_query`: its row count and the sum of
    a 64-bit hash of each row's fields. Any row added, removed or changed changes it (a
    collision of both needs a 64-bit hash sum to come out equal)."""
    newest = newest_rows_query().subquery()
    fields = func.concat_ws(
        _UNIT_SEPARATOR,
        newest.c.dag_id,
        cast(newest.c.id, Text),
        func.coalesce(newest.c.dag_hash, ""),
        func.coalesce(newest.c.bundle_name, ""),
        func.coalesce(newest.c.relative_fileloc, ""),
    )
    return select(
        func.count().label("n"),
        func.coalesce(func.sum(func.hashtextextended(fields, 0)), 0).label("h"),
    ).select_from(newest)


def documents_query() -> Select[Any]:
    """The documents of some serialized rows; jsonb comes back as text, parsed off the loop."""
    return select(
        serialized_dag.c.id,
        serialized_dag.c.dag_hash,
        cast(serialized_dag.c.data, Text).label("data"),
        serialized_dag.c.data_compressed,
    ).where(serialized_dag.c.id == bindparam("ids", type_=ARRAY(serialized_dag.c.id.type)).any_())


class StubInventory:
    """Every live Dag's stub tasks, kept up to date by :meth:`refresh`."""

    def __init__(
        self,
        *,
        default_queue: str = DEFAULT_QUEUE,
        fetch_chunk: int = DEFAULT_FETCH_CHUNK,
    ) -> None:
        if fetch_chunk < 1:
            raise ValueError("fetch_chunk must be at least 1")
        self.default_queue = default_queue
        self.fetch_chunk = fetch_chunk
        self._seen: dict[str, _RowKey] = {}
        self._dags = InventorySnapshot()
        # The fingerprint read before the last full comparison (None: none made yet).
        self._fingerprint: tuple[int, int] | None = None
        self._refreshing = asyncio.Lock()

    @property
    def dags(self) -> InventorySnapshot:
        """The inventory as of the last refresh, by dag_id: an immutable snapshot that later
        refreshes replace rather than change, and replace only when something changed (so an
        unchanged inventory is the very same object)."""
        return self._dags

    async def refresh(self, engine: AsyncEngine | AsyncConnection) -> InventoryDelta:
        """Re-read what changed since the previous refresh (everything, the first time).

        Concurrent callers take turns; the second one sees the first one's result and reads
        only what changed since.
        """
        async with self._refreshing, connection(engine) as conn:
            return await self._refresh(conn)

    async def _refresh(self, conn: AsyncConnection) -> InventoryDelta:
        mark = (await conn.execute(fingerprint_query())).one()
        fingerprint = (int(mark.n), int(mark.h))
        if fingerprint == self._fingerprint:
            return InventoryDelta(changed=(), removed=(), unchanged=len(self._seen))
        current: dict[str, _RowKey] = {}
        for row in (await conn.execute(newest_rows_query())).all():
            current[row.dag_id] = _RowKey(
                serialized_id=row.id,
                dag_hash=row.dag_hash,
                bundle_name=row.bundle_name,
                relative_fileloc=row.relative_fileloc or "",
            )
        removed = sorted(set(self._seen) - set(current))
        stale = {dag_id: key for dag_id, key in current.items() if self._seen.get(dag_id) != key}

        parsed: dict[str, tuple[_RowKey, DagStubs]] = {}
        wanted = sorted(stale.items(), key=lambda item: item[0])
        for start in range(0, len(wanted), self.fetch_chunk):
            chunk = dict(wanted[start : start + self.fetch_chunk])
            by_row = {key.serialized_id: (dag_id, key) for dag_id, key in chunk.items()}
            rows = (await conn.execute(documents_query(), {"ids": list(by_row)})).all()
            fetched = [
                (by_row[row.id][0], by_row[row.id][1], row.dag_hash, row.data, row.data_compressed)
                for row in rows
            ]
            parsed.update(await asyncio.to_thread(_parse_rows, fetched, self.default_queue))

        if removed or parsed:
            seen = dict(self._seen)
            dags = dict(self._dags)
            for dag_id in removed:
                seen.pop(dag_id, None)
                dags.pop(dag_id, None)
            for dag_id, (key, stubs) in parsed.items():
                seen[dag_id] = key
                dags[dag_id] = stubs
            # Indexed off the event loop: a pass over a thousand Dags of stubs.
            snapshot = await asyncio.to_thread(InventorySnapshot, dags)
            self._seen = seen
            self._dags = snapshot
        # else the snapshot stays the same object: "``dags is`` the last pass's" means unchanged.
        # A row that vanished between the two queries is picked up by the next refresh.
        # The fingerprint was read before the comparison: a change that landed after it makes
        # the next one differ, so the next refresh compares again.
        self._fingerprint = fingerprint
        return InventoryDelta(
            changed=tuple(sorted(parsed)),
            removed=tuple(removed),
            unchanged=len(current) - len(stale),
        )


def _parse_rows(
    rows: Sequence[tuple[str, _RowKey, str, Any, bytes | None]], default_queue: str
) -> dict[str, tuple[_RowKey, DagStubs]]:
    """Decode and read documents; runs in a worker thread."""
    out: dict[str, tuple[_RowKey, DagStubs]] = {}
    for dag_id, key, dag_hash, data, data_compressed in rows:
        # The hash of the document actually read, in case the row changed since the cheap query.
        seen = _RowKey(key.serialized_id, dag_hash, key.bundle_name, key.relative_fileloc)
        try:
            document = decode_document(data, data_compressed)
        except DocumentError as exc:
            log.warning("Dag %s: %s", dag_id, exc)
            stubs = DagStubs(
                dag_id=dag_id,
                bundle_name=key.bundle_name,
                relative_fileloc=key.relative_fileloc,
                dag_hash=dag_hash,
                problems=(DagReadProblem(message=str(exc)),),
            )
        else:
            stubs = read_stubs(
                document,
                dag_id=dag_id,
                bundle_name=key.bundle_name,
                relative_fileloc=key.relative_fileloc,
                dag_hash=dag_hash,
                default_queue=default_queue,
            )
        out[dag_id] = (seen, stubs)
    return out
