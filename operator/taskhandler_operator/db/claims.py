"""Who owns a bundle name and its queues, in the database every operator shares.

Every row the write path touches is keyed by the bundle name alone, so two TaskHandlerBundles
naming the same ``bundleName`` — in two namespaces, or in two clusters writing to one Airflow
database — would sweep each other's rows. The claim prevents that: ``thop_bundle_claim`` names the
one resource (cluster id, namespace, name, uid) allowed to write a bundle name, and
``thop_queue_claim`` the one bundle name serving each stub queue.

Rules, applied by :func:`hold_claim` inside every write transaction, under the per-bundle
advisory lock (so two claimants of one name are serialized and never tie):

* a free bundle name is claimed by the first writer; the claim stored first wins, and a later
  claimant gets :class:`BundleClaimed` naming the owner and writes nothing;
* the same cluster, namespace and name with a new uid is the same resource recreated (Kubernetes
  allows one object per name at a time), so it inherits the claim;
* each queue of the pass is claimed for the bundle name; a queue another bundle name holds gives
  :class:`QueueClaimed`, and a queue the bundle no longer lists is released;
* :func:`release_claim` (on deletion) drops the claim and, by ``ON DELETE CASCADE``, its queues;
  a resource that does not hold the claim releases and deletes nothing;
* rows of a bundle name nobody claims (written before claims existed, or left by
  ``deletionPolicy: Orphan``) are *unowned*: no deletion removes them, and the first resource
  that claims the name adopts them (its passes update and sweep them as its own);
* a claim whose holder is gone (checked by the controller against the apiserver, same cluster
  id only) is released with :func:`release_stale_claim` for the next claimant to take;
  what the operator cannot decide (another cluster id) an administrator settles with
  ``taskhandler-operator db claims list|release`` (:func:`list_claims`, :func:`admin_release`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Executable, Text, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.engine import connection, translate_errors
from taskhandler_operator.db.tables import bundle_claim_table, queue_claim_table
from taskhandler_operator.db.write_statements import advisory_lock_statement, bundle_lock_key
from taskhandler_operator.records import BundleOwner


class ClaimError(Exception):
    """A write refused because another resource owns what it would write. Not retryable:
    it lasts until the owner is deleted or one of the two changes its spec."""

    retryable = False


class BundleClaimed(ClaimError):
    def __init__(self, bundle_name: str, owner: BundleOwner, claimed_at: datetime) -> None:
        self.bundle_name = bundle_name
        self.owner = owner
        self.claimed_at = claimed_at
        super().__init__(
            f"bundle name {bundle_name!r} belongs to {owner.describe()} (claimed "
            f"{claimed_at:%Y-%m-%d %H:%M:%S %Z}); nothing was written: delete that resource or "
            "choose another bundleName; if that resource is gone for good (e.g. its cluster), "
            f"free the name with: {release_command(bundle_name, owner)}"
        )


class QueueClaimed(ClaimError):
    def __init__(self, queue: str, holder_bundle: str, owner: BundleOwner) -> None:
        self.queue = queue
        self.holder_bundle = holder_bundle
        self.owner = owner
        super().__init__(
            f"queue {queue!r} is served by bundle {holder_bundle!r} of {owner.describe()}; "
            "nothing was written: remove the queue from one of the two resources; if that "
            "resource is gone for good (e.g. its cluster), free it with: "
            f"{release_command(holder_bundle, owner)}"
        )


def release_command(bundle_name: str, owner: BundleOwner) -> str:
    """The administrator's command that frees ``bundle_name`` from ``owner`` (and only from it:
    the uid guards against releasing a claim someone took meanwhile)."""
    return f"taskhandler-operator db claims release {bundle_name} --uid {owner.uid}"


class ClaimOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    taken: bool = False
    queues_claimed: int = 0
    queues_released: int = 0
    statements: int = 0


class StoredClaim(BaseModel):
    model_config = ConfigDict(frozen=True)

    bundle_name: str
    owner: BundleOwner
    claimed_at: datetime
    queues: tuple[str, ...] = ()


# Not named like the columns: an INSERT/UPDATE reserves those names for its own parameters.
_NAME = bindparam("claim_bundle", type_=Text())
_QUEUES = bindparam("queues", type_=ARRAY(Text()))


def _owner_of(row: Any) -> BundleOwner:
    return BundleOwner(
        cluster_id=row.cluster_id, namespace=row.namespace, name=row.name, uid=row.uid
    )


def read_claim_statement() -> Executable:
    c = bundle_claim_table
    return select(c.c.cluster_id, c.c.namespace, c.c.name, c.c.uid, c.c.claimed_at).where(
        c.c.bundle_name == _NAME
    )


def insert_claim_statement() -> Executable:
    c = bundle_claim_table
    return (
        pg_insert(c)
        .values(
            bundle_name=_NAME,
            cluster_id=bindparam("claim_cluster_id", type_=Text()),
            namespace=bindparam("claim_namespace", type_=Text()),
            name=bindparam("claim_name", type_=Text()),
            uid=bindparam("claim_uid", type_=Text()),
        )
        .on_conflict_do_nothing(index_elements=[c.c.bundle_name])
        .returning(c.c.bundle_name)
    )


def adopt_claim_statement() -> Executable:
    """The same resource, recreated: it inherits the claim under its new uid."""
    c = bundle_claim_table
    return (
        update(c)
        .where(c.c.bundle_name == _NAME)
        .values(uid=bindparam("claim_uid", type_=Text()), claimed_at=func.now())
    )


def claim_queues_statement() -> Executable:
    q = queue_claim_table
    wanted = func.unnest(_QUEUES).table_valued("queue").render_derived(name="wanted")
    return (
        pg_insert(q)
        .from_select(["queue", "bundle_name"], select(wanted.c.queue, _NAME))
        .on_conflict_do_nothing(index_elements=[q.c.queue])
        .returning(q.c.queue)
    )


def queues_held_elsewhere_statement() -> Executable:
    q = queue_claim_table
    c = bundle_claim_table
    return (
        select(q.c.queue, q.c.bundle_name, c.c.cluster_id, c.c.namespace, c.c.name, c.c.uid)
        .join(c, c.c.bundle_name == q.c.bundle_name)
        .where(q.c.queue == _QUEUES.any_(), q.c.bundle_name != _NAME)
        .order_by(q.c.queue)
    )


def release_queues_statement() -> Executable:
    q = queue_claim_table
    return (
        delete(q).where(q.c.bundle_name == _NAME, q.c.queue != _QUEUES.all_()).returning(q.c.queue)
    )


def _owner_params(owner: BundleOwner) -> dict[str, str]:
    return {
        "claim_cluster_id": owner.cluster_id,
        "claim_namespace": owner.namespace,
        "claim_name": owner.name,
        "claim_uid": owner.uid,
    }


async def hold_claim(
    conn: AsyncConnection,
    bundle_name: str,
    owner: BundleOwner,
    queues: Sequence[str] | None = None,
) -> ClaimOutcome:
    """Make sure ``owner`` holds ``bundle_name`` (and ``queues``, when given) in this transaction.

    The caller holds the bundle's advisory lock. Raises :class:`BundleClaimed` or
    :class:`QueueClaimed` before anything else is written; the caller's transaction then rolls
    back, so a refused pass leaves no trace.
    """
    params = {"claim_bundle": bundle_name, **_owner_params(owner)}
    statements = 1
    taken = False
    row = (await conn.execute(read_claim_statement(), params)).first()
    if row is None:
        statements += 1
        taken = (await conn.execute(insert_claim_statement(), params)).first() is not None
        if not taken:  # only a writer that skipped the advisory lock could get here first
            statements += 1
            row = (await conn.execute(read_claim_statement(), params)).one()
    if row is not None:
        holder = _owner_of(row)
        if holder != owner:
            if not holder.same_resource(owner):
                raise BundleClaimed(bundle_name, holder, row.claimed_at)
            statements += 1
            await conn.execute(adopt_claim_statement(), params)
            taken = True
    if queues is None:
        return ClaimOutcome(taken=taken, statements=statements)

    queue_params = {"claim_bundle": bundle_name, "queues": sorted(set(queues))}
    # Sorted, so two bundles claiming overlapping queues lock them in the same order.
    claimed = (await conn.execute(claim_queues_statement(), queue_params)).all()
    held = (await conn.execute(queues_held_elsewhere_statement(), queue_params)).first()
    if held is not None:
        raise QueueClaimed(held.queue, held.bundle_name, _owner_of(held))
    released = (await conn.execute(release_queues_statement(), queue_params)).all()
    return ClaimOutcome(
        taken=taken,
        queues_claimed=len(claimed),
        queues_released=len(released),
        statements=statements + 3,
    )


async def release_claim_in(conn: AsyncConnection, bundle_name: str, owner: BundleOwner) -> bool:
    """Drop ``owner``'s claim on ``bundle_name`` and its queue claims; False when none was held.

    Raises :class:`BundleClaimed` when another resource holds it: deleting this resource must not
    free a name it never owned. The caller holds the bundle's advisory lock.
    """
    params = {"claim_bundle": bundle_name}
    row = (await conn.execute(read_claim_statement(), params)).first()
    if row is None:
        return False
    holder = _owner_of(row)
    if not holder.same_resource(owner):
        raise BundleClaimed(bundle_name, holder, row.claimed_at)
    c = bundle_claim_table
    await conn.execute(delete(c).where(c.c.bundle_name == _NAME), params)
    return True


async def release_claim(engine: AsyncEngine, bundle_name: str, owner: BundleOwner) -> bool:
    """:func:`release_claim_in` in its own transaction, under the bundle's advisory lock."""
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(advisory_lock_statement(), {"lock_key": bundle_lock_key(bundle_name)})
        return await release_claim_in(conn, bundle_name, owner)


async def read_claim(engine: AsyncEngine | AsyncConnection, bundle_name: str) -> StoredClaim | None:
    """The stored claim on ``bundle_name`` with its queues, or None."""
    q = queue_claim_table
    async with connection(engine) as conn:
        row = (await conn.execute(read_claim_statement(), {"claim_bundle": bundle_name})).first()
        if row is None:
            return None
        queues = (
            await conn.execute(
                select(q.c.queue).where(q.c.bundle_name == _NAME).order_by(q.c.queue),
                {"claim_bundle": bundle_name},
            )
        ).scalars()
        return StoredClaim(
            bundle_name=bundle_name,
            owner=_owner_of(row),
            claimed_at=row.claimed_at,
            queues=tuple(queues),
        )


async def check_claim(
    engine: AsyncEngine | AsyncConnection,
    bundle_name: str,
    owner: BundleOwner,
    queues: Sequence[str] = (),
) -> None:
    """Raise :class:`BundleClaimed` or :class:`QueueClaimed` when the write would be refused;
    changes nothing. A pass asks before it probes, so a later claimant creates no probe Job;
    the write still decides under the lock (a claim may change in between)."""
    params = {"claim_bundle": bundle_name, "queues": sorted(set(queues))}
    async with connection(engine) as conn:
        row = (await conn.execute(read_claim_statement(), params)).first()
        if row is not None and not _owner_of(row).same_resource(owner):
            raise BundleClaimed(bundle_name, _owner_of(row), row.claimed_at)
        if queues:
            held = (await conn.execute(queues_held_elsewhere_statement(), params)).first()
            if held is not None:
                raise QueueClaimed(held.queue, held.bundle_name, _owner_of(held))


def _held_by(holder: BundleOwner) -> Any:
    c = bundle_claim_table
    return (
        (c.c.bundle_name == _NAME)
        & (c.c.cluster_id == holder.cluster_id)
        & (c.c.namespace == holder.namespace)
        & (c.c.name == holder.name)
        & (c.c.uid == holder.uid)
    )


async def release_stale_claim(engine: AsyncEngine, bundle_name: str, holder: BundleOwner) -> bool:
    """Drop ``holder``'s claim on ``bundle_name`` (and its queues), and only if ``holder`` — that
    exact uid — still holds it: the caller found the holder gone. False when the claim changed
    meanwhile. The rows stay, unowned, for the next claimant to adopt."""
    c = bundle_claim_table
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(advisory_lock_statement(), {"lock_key": bundle_lock_key(bundle_name)})
        gone = await conn.execute(
            delete(c).where(_held_by(holder)).returning(c.c.bundle_name),
            {"claim_bundle": bundle_name},
        )
        return gone.first() is not None
