"""What an administrator sees and settles about bundle names: ``taskhandler-operator db claims``.

The operator decides every claim it can (a holder gone from its own cluster is taken over); a
claim held from another cluster id, or rows nobody claims (written before claims existed, or
left by ``deletionPolicy: Orphan``), wait for a person. :func:`list_claims` shows every bundle
name with rows or a claim; :func:`admin_release` frees a name, optionally with its rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Select, delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.claims import StoredClaim, read_claim
from taskhandler_operator.db.engine import DatabaseError, connection, translate_errors
from taskhandler_operator.db.tables import (
    artifact_table,
    binding_table,
    bundle_claim_table,
    problem_table,
    queue_claim_table,
)
from taskhandler_operator.db.write_models import BundleRowsDeleted
from taskhandler_operator.db.write_statements import advisory_lock_statement, bundle_lock_key
from taskhandler_operator.db.writer import delete_rows_in
from taskhandler_operator.records import BundleOwner


class ClaimMismatch(DatabaseError):
    """``--uid`` named another holder than the one stored: someone took the name meanwhile."""


class NameListing(BaseModel):
    """One bundle name: its holder (None: unowned rows) and how many rows it has."""

    model_config = ConfigDict(frozen=True)

    bundle_name: str
    owner: BundleOwner | None
    claimed_at: datetime | None
    queues: tuple[str, ...]
    artifacts: int
    bindings: int
    problems: int


class Released(BaseModel):
    model_config = ConfigDict(frozen=True)

    claim: StoredClaim | None
    rows: BundleRowsDeleted | None


async def list_claims(engine: AsyncEngine) -> list[NameListing]:
    """Every bundle name that has a claim or rows, sorted by name (one query per table)."""
    a, b, p = artifact_table, binding_table, problem_table
    c, q = bundle_claim_table, queue_claim_table
    async with connection(engine) as conn:
        claims = (await conn.execute(select(c))).all()
        queues = (await conn.execute(select(q.c.bundle_name, q.c.queue).order_by(q.c.queue))).all()
        artifacts = await _counts(
            conn, select(a.c.bundle_name, func.count()).group_by(a.c.bundle_name)
        )
        bound = await _counts(
            conn,
            select(a.c.bundle_name, func.count())
            .select_from(b.join(a, a.c.id == b.c.artifact_id))
            .group_by(a.c.bundle_name),
        )
        problems = await _counts(
            conn, select(p.c.bundle_name, func.count()).group_by(p.c.bundle_name)
        )
    held = {row.bundle_name: row for row in claims}
    names = sorted({*held, *artifacts, *problems})
    out = []
    for name in names:
        row = held.get(name)
        owner = (
            None
            if row is None
            else BundleOwner(
                cluster_id=row.cluster_id, namespace=row.namespace, name=row.name, uid=row.uid
            )
        )
        out.append(
            NameListing(
                bundle_name=name,
                owner=owner,
                claimed_at=None if row is None else row.claimed_at,
                queues=tuple(qr.queue for qr in queues if qr.bundle_name == name),
                artifacts=artifacts.get(name, 0),
                bindings=bound.get(name, 0),
                problems=problems.get(name, 0),
            )
        )
    return out


async def _counts(conn: AsyncConnection, query: Select[Any]) -> dict[str, int]:
    return {str(row[0]): int(row[1]) for row in await conn.execute(query)}


async def admin_release(
    engine: AsyncEngine, bundle_name: str, *, uid: str | None = None, delete_rows: bool = False
) -> Released:
    """Free ``bundle_name`` (its claim and queue claims), under the bundle's lock; with
    ``uid``, only if that holder still has it (:class:`ClaimMismatch` otherwise). With
    ``delete_rows`` the name's rows go too (also for an unowned name); without, they stay
    unowned for the next claimant to adopt."""
    c = bundle_claim_table
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(advisory_lock_statement(), {"lock_key": bundle_lock_key(bundle_name)})
        claim = await read_claim(conn, bundle_name)
        if uid is not None and (claim is None or claim.owner.uid != uid):
            held = "nobody" if claim is None else claim.owner.describe()
            raise ClaimMismatch(
                f"bundle name {bundle_name!r} is held by {held}, not by uid {uid!r}; "
                "nothing was changed (run `taskhandler-operator db claims list`)"
            )
        if claim is not None:
            await conn.execute(delete(c).where(c.c.bundle_name == bundle_name))
        rows = await delete_rows_in(conn, bundle_name) if delete_rows else None
        return Released(claim=claim, rows=rows)
