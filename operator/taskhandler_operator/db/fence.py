"""Fencing: a deposed leader cannot write.

The Lease decides who leads, but only by time: a leader whose process stalls (SIGSTOP, a CPU
throttle, an event loop blocked for longer than the lease) can wake up after a standby has taken
over and finish a write it had prepared from an older revision. The database is the one place
both see, so the write path checks a token there.

The token of a leadership term is the Lease's identity (cluster id, namespace, name), its uid,
the holder and its ``leaseTransitions``, which the holder increments each time it takes the
Lease from someone else. ``thop_leader_fence`` holds one row per Lease: the newest term
recorded. Rules:

* **Record** (:meth:`Fence.record`, when leadership starts and again before a write if it has
  not succeeded yet): the row is replaced only by a *newer* term — more transitions, or another
  Lease object (a Lease deleted and created again starts counting anew). A term older than the
  stored one is refused: the replica was deposed before it could record.
* **Check** (:meth:`Fence.check`, inside every write transaction, under the bundle's advisory
  lock, before anything is written): the stored term must be this replica's. Otherwise the
  write raises :class:`FencedOut`, its transaction rolls back, the refusal is logged and the
  replica's ``on_deposed`` callback makes it step down.

Why that is enough: a new leader records its term before its first write. An old leader's write
that checked before that record holds the bundle's advisory lock until it commits, so the new
leader's write of the same bundle commits after it; one that checks after it is refused. So no
row of a deposed leader ever lands after a row of its successor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import BigInteger, Executable, Text, bindparam, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.engine import translate_errors
from taskhandler_operator.db.tables import leader_fence_table

__all__ = ["Fence", "FencedOut", "LeaderTerm", "check_term", "read_term", "record_term"]

log = logging.getLogger(__name__)


class LeaderTerm(BaseModel):
    """One leadership term of one Lease."""

    model_config = ConfigDict(frozen=True)

    cluster_id: str
    lease_namespace: str
    lease_name: str
    lease_uid: str
    holder: str
    transitions: int

    def describe(self) -> str:
        return f"{self.holder} (term {self.transitions} of Lease {self.lease_uid})"


class FencedOut(Exception):
    """A newer leader has recorded its term: this replica may not write. Not retryable."""

    retryable = False

    def __init__(self, mine: LeaderTerm | None, stored: LeaderTerm | None, what: str) -> None:
        self.mine = mine
        self.stored = stored
        held = stored.describe() if stored is not None else "nobody (no term recorded)"
        ours = mine.describe() if mine is not None else "no recorded term"
        super().__init__(
            f"{what} refused: this replica is {ours}, the database fences writes to {held}"
        )


_KEY = {
    "fence_cluster_id": bindparam("fence_cluster_id", type_=Text()),
    "fence_namespace": bindparam("fence_namespace", type_=Text()),
    "fence_name": bindparam("fence_name", type_=Text()),
}


def _params(term: LeaderTerm) -> dict[str, Any]:
    return {
        "fence_cluster_id": term.cluster_id,
        "fence_namespace": term.lease_namespace,
        "fence_name": term.lease_name,
        "fence_uid": term.lease_uid,
        "fence_holder": term.holder,
        "fence_transitions": term.transitions,
    }


def read_term_statement() -> Executable:
    f = leader_fence_table
    return select(f.c.lease_uid, f.c.holder, f.c.transitions).where(
        f.c.cluster_id == _KEY["fence_cluster_id"],
        f.c.lease_namespace == _KEY["fence_namespace"],
        f.c.lease_name == _KEY["fence_name"],
    )


def record_term_statement() -> Executable:
    """Insert the term, or replace the stored one when ours is newer; nothing otherwise."""
    f = leader_fence_table
    stmt = pg_insert(f).values(
        cluster_id=_KEY["fence_cluster_id"],
        lease_namespace=_KEY["fence_namespace"],
        lease_name=_KEY["fence_name"],
        lease_uid=bindparam("fence_uid", type_=Text()),
        holder=bindparam("fence_holder", type_=Text()),
        transitions=bindparam("fence_transitions", type_=BigInteger()),
    )
    return stmt.on_conflict_do_update(
        index_elements=[f.c.cluster_id, f.c.lease_namespace, f.c.lease_name],
        set_={
            "lease_uid": stmt.excluded.lease_uid,
            "holder": stmt.excluded.holder,
            "transitions": stmt.excluded.transitions,
            "recorded_at": func.now(),
        },
        where=or_(
            f.c.lease_uid != stmt.excluded.lease_uid,
            f.c.transitions < stmt.excluded.transitions,
        ),
    )


def _stored(term: LeaderTerm, row: Any) -> LeaderTerm | None:
    if row is None:
        return None
    return term.model_copy(
        update={"lease_uid": row.lease_uid, "holder": row.holder, "transitions": row.transitions}
    )


async def read_term(conn: AsyncConnection, term: LeaderTerm) -> LeaderTerm | None:
    """The term stored for ``term``'s Lease, or None."""
    return _stored(term, (await conn.execute(read_term_statement(), _params(term))).first())


async def record_term(engine: AsyncEngine, term: LeaderTerm) -> None:
    """Record ``term`` as the Lease's newest; :class:`FencedOut` when a newer one is stored."""
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(record_term_statement(), _params(term))
        stored = await read_term(conn, term)
    if stored != term:
        raise FencedOut(term, stored, "recording the leadership term")


async def check_term(conn: AsyncConnection, term: LeaderTerm | None, what: str) -> None:
    """Raise :class:`FencedOut` unless ``term`` is the Lease's stored term (one statement, in
    the caller's transaction; the caller holds the bundle's advisory lock)."""
    if term is None:
        raise FencedOut(None, None, what)
    stored = await read_term(conn, term)
    if stored != term:
        raise FencedOut(term, stored, what)


class Fence:
    """This replica's side of the fence: its term, recorded once, checked by every write.

    ``on_deposed`` is called (once) with the reason when the database refuses the term: the
    operator steps down, as when it loses the Lease.
    """

    def __init__(self, cluster_id: str, on_deposed: Callable[[str], None] | None = None) -> None:
        self.cluster_id = cluster_id
        self.on_deposed = on_deposed
        self.term: LeaderTerm | None = None
        self.recorded = False
        self.refused: FencedOut | None = None
        self._lock = asyncio.Lock()

    def begin(
        self,
        *,
        lease_namespace: str,
        lease_name: str,
        lease_uid: str,
        holder: str,
        transitions: int,
    ) -> LeaderTerm:
        """The term this replica leads in (not recorded yet)."""
        self.term = LeaderTerm(
            cluster_id=self.cluster_id,
            lease_namespace=lease_namespace,
            lease_name=lease_name,
            lease_uid=lease_uid,
            holder=holder,
            transitions=transitions,
        )
        self.recorded = False
        self.refused = None
        return self.term

    async def record(self, engine: AsyncEngine) -> None:
        """Record the term unless done; :class:`FencedOut` (and a step-down) when refused,
        a :class:`~taskhandler_operator.db.engine.DatabaseError` when the database fails."""
        async with self._lock:
            if self.refused is not None:
                raise self.refused
            if self.recorded:
                return
            if self.term is None:
                raise self._refuse(FencedOut(None, None, "recording the leadership term"))
            try:
                await record_term(engine, self.term)
            except FencedOut as exc:
                raise self._refuse(exc) from None
            self.recorded = True
            log.info("leadership term recorded: %s", self.term.describe())

    async def check(self, conn: AsyncConnection, what: str) -> None:
        """In a write transaction, under the bundle's advisory lock: refuse a deposed leader."""
        if self.refused is not None:
            raise self.refused
        try:
            await check_term(conn, self.term, what)
        except FencedOut as exc:
            raise self._refuse(exc) from None

    def _refuse(self, exc: FencedOut) -> FencedOut:
        if self.refused is None:
            self.refused = exc
            log.error("%s; rolled back, this replica steps down", exc)
            if self.on_deposed is not None:
                self.on_deposed(str(exc))
        else:
            log.error("%s; rolled back", exc)
        return exc
