"""The write path: one transaction per bundle pass.

A pass hands over the bundle's current artifacts and one verdict per Dag
(:mod:`taskhandler_operator.validation`). In one transaction, with a fixed number of statements
whatever the number of artifacts or bindings (every row set travels as one array parameter per
column and is expanded with ``unnest``):

1. take a per-bundle advisory lock, so two passes of the same bundle serialize; with a
   :class:`~taskhandler_operator.db.fence.Fence`, refuse a deposed leader (its term is no longer
   the Lease's newest); hold the bundle name's claim (:mod:`~taskhandler_operator.db.claims`):
   a pass whose owner does not hold it is refused before it writes anything;
2. upsert the artifact rows (``INSERT ... ON CONFLICT`` on ``(bundle_name,
   relative_fileloc_hash)``: a concurrent writer of the same artifact, ours or Airflow's,
   neither fails nor duplicates), then the revision each freshly probed artifact came from;
3. for the Dags that validated, delete this bundle's rows whose task vanished and upsert the
   rest; a ``(dag_id, task_id)`` whose row points at another bundle's artifact is a conflict:
   reported, never overwritten;
4. leave every row of a Dag with problems untouched;
5. sweep this bundle's artifact rows that are no longer listed and that nothing references;
6. replace the bundle's problem rows (unchanged problems are not rewritten).

Every update is guarded by ``IS DISTINCT FROM``, so writing the same state twice changes no row.

This module is the executor; the inputs and results are in :mod:`.write_models`, the SQL in
:mod:`.write_statements` (both re-exported here for callers of the write path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, Text, bindparam, delete, select
from sqlalchemy.engine import Result
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.claims import hold_claim, release_claim_in
from taskhandler_operator.db.engine import translate_errors
from taskhandler_operator.db.fence import Fence
from taskhandler_operator.db.tables import (
    artifact_table,
    binding_table,
    probe_table,
    problem_table,
)
from taskhandler_operator.db.write_models import (
    ArtifactCounts,
    ArtifactRecord,
    BindingConflict,
    BundlePass,
    BundleRowsDeleted,
    DagOutcome,
    PassResult,
)
from taskhandler_operator.db.write_statements import (
    PassParams,
    advisory_lock_statement,
    bundle_lock_key,
    delete_stale_problems_statement,
    delete_vanished_bindings_statement,
    held_conflicts_statement,
    held_elsewhere_statement,
    insert_problems_statement,
    prepare_params,
    problem_key,
    problem_params,
    sweep_artifacts_statement,
    upsert_artifacts_statement,
    upsert_bindings_statement,
    upsert_probes_statement,
)
from taskhandler_operator.records import BundleOwner, BundleProblem
from taskhandler_operator.validation import DagVerdict

__all__ = [
    "ArtifactCounts",
    "ArtifactRecord",
    "BindingConflict",
    "BundlePass",
    "BundleRowsDeleted",
    "DagOutcome",
    "PassResult",
    "bundle_lock_key",
    "delete_bundle_rows",
    "delete_rows_in",
    "problem_key",
    "record_artifacts",
    "record_artifacts_in",
    "write_pass",
    "write_pass_in",
]


async def write_pass(
    engine: AsyncEngine, bundle_pass: BundlePass, *, fence: Fence | None = None
) -> PassResult:
    """Write one bundle pass in its own transaction; nothing is committed on any error
    (:class:`~taskhandler_operator.db.fence.FencedOut` included)."""
    await _record_term(engine, fence)
    async with translate_errors(), engine.begin() as conn:
        return await write_pass_in(conn, bundle_pass, fence=fence)


async def write_pass_in(
    conn: AsyncConnection, bundle_pass: BundlePass, *, fence: Fence | None = None
) -> PassResult:
    """The statements of a pass on a connection whose transaction the caller owns."""
    return await _PassWriter(conn, bundle_pass, fence).run()


async def record_artifacts(
    engine: AsyncEngine,
    bundle_name: str,
    records: Sequence[ArtifactRecord],
    *,
    owner: BundleOwner,
    fence: Fence | None = None,
) -> ArtifactCounts:
    """Upsert artifact rows (and their probe revisions) on their own, e.g. as soon as probe
    answers arrive; no binding is touched. Like every write it holds the bundle's claim (under
    the bundle lock); the upsert itself still tolerates any other writer of the same artifacts,
    Airflow's included."""
    await _record_term(engine, fence)
    async with translate_errors(), engine.begin() as conn:
        return await record_artifacts_in(conn, bundle_name, records, owner=owner, fence=fence)


async def record_artifacts_in(
    conn: AsyncConnection,
    bundle_name: str,
    records: Sequence[ArtifactRecord],
    *,
    owner: BundleOwner,
    fence: Fence | None = None,
) -> ArtifactCounts:
    """:func:`record_artifacts` on a connection whose transaction the caller owns."""
    bundle_pass = BundlePass(
        bundle_name=bundle_name, owner=owner, queues=(), artifacts=tuple(records)
    )
    writer = _PassWriter(conn, bundle_pass, fence)
    await writer.write_artifacts()
    result = writer.result
    return ArtifactCounts(
        inserted=result.artifacts_inserted,
        updated=result.artifacts_updated,
        probes_written=result.probes_written,
    )


async def _record_term(engine: AsyncEngine, fence: Fence | None) -> None:
    """A leader records its term before its first write (a no-op after that)."""
    if fence is not None:
        await fence.record(engine)


# --- the pass ----------------------------------------------------------------------------------


def _outcome(verdict: DagVerdict, conflicted: set[str]) -> DagOutcome:
    if verdict.bindings is None:
        return "kept"
    return "conflict" if verdict.dag_id in conflicted else "reconciled"


class _PassWriter:
    def __init__(
        self, conn: AsyncConnection, bundle_pass: BundlePass, fence: Fence | None = None
    ) -> None:
        self.conn = conn
        self.bundle_pass = bundle_pass
        self.fence = fence
        self.result = PassResult(bundle_name=bundle_pass.bundle_name)

    async def _execute(self, statement: Executable, params: dict[str, Any]) -> Result[Any]:
        self.result.statements += 1
        return await self.conn.execute(
            statement, {"bundle_name": self.bundle_pass.bundle_name, **params}
        )

    async def run(self) -> PassResult:
        p = self.bundle_pass
        params = await asyncio.to_thread(prepare_params, p)
        await self._execute(advisory_lock_statement(), {"lock_key": params.lock_key})
        await self.check_fence()
        await self.hold_claim(p.queues)
        await self._write_artifacts(params)

        deleted = await self._execute(
            delete_vanished_bindings_statement(),
            {
                "reconciled_dag_ids": params.reconciled_dag_ids,
                "keep_dag_id": params.bindings["bind_dag_id"],
                "keep_task_id": params.bindings["bind_task_id"],
            },
        )
        self.result.bindings_deleted = len(deleted.all())
        upserted = (await self._execute(upsert_bindings_statement(), params.bindings)).all()
        self.result.bindings_inserted = sum(1 for row in upserted if row.inserted)
        self.result.bindings_updated = len(upserted) - self.result.bindings_inserted
        # Read after the upsert: a row another bundle committed meanwhile is seen here too.
        held = (await self._execute(held_elsewhere_statement(), params.bindings)).all()
        conflicts = tuple(
            BindingConflict(
                dag_id=row.dag_id,
                task_id=row.task_id,
                claimant_bundle=p.bundle_name,
                holder_bundle=row.bundle_name,
                holder_rel_path=row.relative_fileloc,
            )
            for row in held
        )
        self.result.conflicts = conflicts

        if p.sweep_orphans:
            swept = await self._execute(
                sweep_artifacts_statement(), {"listed_hashes": params.listed_hashes}
            )
            self.result.artifacts_deleted = len(swept.all())

        await self._write_problems(params, conflicts)
        held_rows = (await self._execute(held_conflicts_statement(), {})).all()
        self.result.held_conflicts = tuple(
            BindingConflict(
                dag_id=row.dag_id or "",
                task_id=row.task_id or "",
                claimant_bundle=row.bundle_name,
                holder_bundle=p.bundle_name,
            )
            for row in held_rows
        )
        conflicted = {c.dag_id for c in conflicts}
        self.result.dag_outcomes = {v.dag_id: _outcome(v, conflicted) for v in p.verdicts}
        return self.result

    async def check_fence(self) -> None:
        """Under the bundle lock, before any write: refuse a deposed leader (FencedOut)."""
        if self.fence is not None:
            self.result.statements += 1
            await self.fence.check(self.conn, f"write of bundle {self.bundle_pass.bundle_name!r}")

    async def hold_claim(self, queues: Sequence[str] | None) -> None:
        """Refuse (BundleClaimed, QueueClaimed) before writing anything unless the pass's owner
        holds the bundle name; take the claim when it is free."""
        p = self.bundle_pass
        claim = await hold_claim(self.conn, p.bundle_name, p.owner, queues)
        self.result.statements += claim.statements
        self.result.claim_taken = claim.taken
        self.result.queues_claimed = claim.queues_claimed
        self.result.queues_released = claim.queues_released

    async def write_artifacts(self) -> None:
        params = await asyncio.to_thread(prepare_params, self.bundle_pass)
        await self._execute(advisory_lock_statement(), {"lock_key": params.lock_key})
        await self.check_fence()
        await self.hold_claim(None)
        await self._write_artifacts(params)

    async def _write_artifacts(self, params: PassParams) -> None:
        for artifact_params, is_probed in ((params.probed, True), (params.reused, False)):
            rows = (
                await self._execute(
                    upsert_artifacts_statement(probed=is_probed, prefix="art"), artifact_params
                )
            ).all()
            inserted = sum(1 for row in rows if row.inserted)
            self.result.artifacts_inserted += inserted
            self.result.artifacts_updated += len(rows) - inserted
        written = await self._execute(upsert_probes_statement(), params.probes)
        self.result.probes_written = len(written.all())

    async def _write_problems(
        self, params: PassParams, conflicts: Sequence[BindingConflict]
    ) -> None:
        conflict_problems = [
            BundleProblem(
                severity="error",
                kind="conflict",
                message=c.message(),
                dag_id=c.dag_id,
                task_id=c.task_id,
                relative_fileloc=params.files.get(c.dag_id),
                other_bundle=c.holder_bundle,
            )
            for c in conflicts
        ]
        keys, rows = problem_params([*params.problems, *conflict_problems])
        gone = await self._execute(delete_stale_problems_statement(), {"problem_keys": keys})
        self.result.problems_deleted = len(gone.all())
        added = await self._execute(insert_problems_statement(), rows)
        self.result.problems_inserted = len(added.all())


# --- removing a bundle -------------------------------------------------------------------------


async def delete_bundle_rows(
    engine: AsyncEngine, bundle_name: str, *, owner: BundleOwner, fence: Fence | None = None
) -> BundleRowsDeleted:
    """Remove everything a bundle wrote (``deletionPolicy: Delete``) and release its claim, in
    one transaction — only under a claim ``owner`` holds.

    Refused with :class:`~taskhandler_operator.db.claims.BundleClaimed` when another resource
    owns the name (its rows are not ours to delete). With no claim at all the rows are unowned
    (written before claims existed, or orphaned): nothing is deleted (``claim_released`` False),
    and ``taskhandler-operator db claims`` shows them to an administrator. Probe revisions are
    deleted with their artifacts (no foreign key: see ``thop0008``), queue claims go with the
    bundle's claim (``ON DELETE CASCADE``).
    """
    params = {"lock_key": bundle_lock_key(bundle_name)}
    await _record_term(engine, fence)
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(advisory_lock_statement(), params)
        if fence is not None:
            await fence.check(conn, f"deletion of bundle {bundle_name!r}")
        if not await release_claim_in(conn, bundle_name, owner):
            return BundleRowsDeleted(bindings=0, artifacts=0, problems=0, claim_released=False)
        deleted = await delete_rows_in(conn, bundle_name)
        return deleted.model_copy(update={"claim_released": True})


async def delete_rows_in(conn: AsyncConnection, bundle_name: str) -> BundleRowsDeleted:
    """Delete every row of ``bundle_name`` whoever owns it; the caller holds the bundle's lock
    and has decided it may (its claim, or an administrator's command)."""
    a = artifact_table
    b = binding_table
    p = problem_table
    pr = probe_table
    name = bindparam("bundle_name", type_=Text())
    params = {"bundle_name": bundle_name}
    ours = select(a.c.id).where(a.c.bundle_name == name)
    bindings = await conn.execute(
        delete(b).where(b.c.artifact_id.in_(ours)).returning(b.c.dag_id), params
    )
    await conn.execute(delete(pr).where(pr.c.artifact_id.in_(ours)), params)
    artifacts = await conn.execute(
        delete(a).where(a.c.bundle_name == name).returning(a.c.id), params
    )
    problems = await conn.execute(
        delete(p).where(p.c.bundle_name == name).returning(p.c.problem_key), params
    )
    return BundleRowsDeleted(
        bindings=len(bindings.all()),
        artifacts=len(artifacts.all()),
        problems=len(problems.all()),
    )
