"""Reading a bundle's stored artifacts back: the fast path's "known artifacts"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from sqlalchemy import Text, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.engine import connection
from taskhandler_operator.db.tables import artifact_table, probe_table, stored_task_handlers
from taskhandler_operator.records import TaskHandlerArtifact, TaskHandlers

log = logging.getLogger(__name__)
_HANDLERS: TypeAdapter[TaskHandlers] = TypeAdapter(TaskHandlers)


class StoredArtifact(BaseModel):
    """A stored artifact row with the operator's bookkeeping beside it."""

    model_config = ConfigDict(frozen=True)

    artifact: TaskHandlerArtifact
    last_probed_at: datetime
    # The source revision of the last probe, when the operator (not Airflow) probed it.
    revision: str | None = None


async def load_stored_artifacts(
    engine: AsyncEngine | AsyncConnection, bundle_name: str
) -> list[StoredArtifact]:
    """Every artifact row of ``bundle_name``, by relative path.

    A row whose ``task_handlers`` no longer validates (written by some other tool) is skipped
    with a warning: treated as unknown, the artifact is simply probed again.
    """
    a = artifact_table
    p = probe_table
    query = (
        select(
            a.c.relative_fileloc,
            a.c.size_bytes,
            a.c.cache_digest,
            a.c.task_handlers,
            a.c.last_probed_at,
            p.c.revision,
            p.c.declared_task_handlers,
        )
        .outerjoin(p, p.c.artifact_id == a.c.id)
        .where(a.c.bundle_name == bindparam("bundle_name", type_=Text()))
        .order_by(a.c.relative_fileloc)
    )
    async with connection(engine) as conn:
        rows = (await conn.execute(query, {"bundle_name": bundle_name})).all()
    # Declarations of a large bundle are a lot of JSON to validate: off the event loop.
    return await asyncio.to_thread(_stored_of, bundle_name, rows)


def _stored_of(bundle_name: str, rows: Sequence[Any]) -> list[StoredArtifact]:
    stored: list[StoredArtifact] = []
    for row in rows:
        try:
            artifact = TaskHandlerArtifact(
                bundle_name=bundle_name,
                relative_fileloc=row.relative_fileloc,
                size_bytes=row.size_bytes,
                cache_digest=row.cache_digest,
                task_handlers=_answer(row.task_handlers, row.declared_task_handlers),
            )
        except ValidationError as exc:
            log.warning(
                "bundle %s: ignoring stored artifact %s: %s",
                bundle_name,
                row.relative_fileloc,
                exc.errors()[0].get("msg", exc),
            )
            continue
        stored.append(
            StoredArtifact(
                artifact=artifact, last_probed_at=row.last_probed_at, revision=row.revision
            )
        )
    return stored


def _answer(stored: Any, declared: Any) -> Any:
    """The answer to validate against: the runtime's own when the operator kept it and it is
    still what the row holds (its stored form equals the row), else the row as it is.

    A row rewritten since (by Airflow's Dag processor, say) no longer matches the original, and
    an original that does not parse is ignored; either way the row speaks for itself.
    """
    if declared is None:
        return stored
    try:
        original = _HANDLERS.validate_python(declared)
        current = _HANDLERS.validate_python(stored)
    except ValidationError:
        return stored
    if stored_task_handlers(original) != stored_task_handlers(current):
        return stored
    return declared


async def load_known_artifacts(
    engine: AsyncEngine | AsyncConnection, bundle_name: str
) -> list[TaskHandlerArtifact]:
    """The planner's input: the stored answers of ``bundle_name``."""
    return [s.artifact for s in await load_stored_artifacts(engine, bundle_name)]


async def load_requested_dag_ids(
    engine: AsyncEngine | AsyncConnection, bundle_name: str
) -> dict[str, tuple[str, ...]]:
    """The ``dag_ids`` each stored answer of ``bundle_name`` was asked with, by relative path.

    A path is missing when its answer was asked nothing (no probe row: Airflow wrote it; or
    null: stored before probes sent ``dag_ids``), so it speaks for every Dag it declares. A value
    that is not a list of strings (written by another tool) counts as asked nothing too.
    """
    a = artifact_table
    p = probe_table
    query = (
        select(a.c.relative_fileloc, p.c.requested_dag_ids)
        .join(p, p.c.artifact_id == a.c.id)
        .where(
            a.c.bundle_name == bindparam("bundle_name", type_=Text()),
            p.c.requested_dag_ids.is_not(None),
        )
    )
    async with connection(engine) as conn:
        rows = (await conn.execute(query, {"bundle_name": bundle_name})).all()
    out: dict[str, tuple[str, ...]] = {}
    for path, requested in rows:
        if isinstance(requested, list) and all(isinstance(d, str) for d in requested):
            out[path] = tuple(requested)
    return out
