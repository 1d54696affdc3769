"""The write path: one transaction per bundle pass.

A pass hands over the bundle's current artifacts and a verdict per Dag it concerns
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
   rest (a Dag of the inventory without a verdict counts as validated with no binding: see
   ``BundlePass.inventory_dags``); a ``(dag_id, task_id)`` whose row points at another
   bundle's artifact is a conflict: reported, never overwritten;
4. leave every row of a Dag with problems untouched;
5. sweep this bundle's artifact rows that are no longer listed and that nothing references;
6. replace the bundle's problem rows (unchanged problems are not rewritten).

Every update is guarded by ``IS DISTINCT FROM``, so writing the same state twice changes no row.

This module is the executor; the inputs and results are in :mod:`.write_models`, the SQL in
:mod:`.write_statements` (both re-exported here for callers of the write path).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, Text, bindparam, delete, select
from sqlalchemy.engine import Result
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.claims import hold_claim, release_claim_in
from taskhandler_operator.db.engine import translate_errors
from taskhandler_operator.db.fence import Fence
from taskhandler_operator.db.publications import (
    PublishedState,
    artifact_digests,
    clear_held,
    load_publication_in,
    read_published,
    record_publication,
    save_held,
)
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
    restore_params,
    sweep_artifacts_statement,
    upsert_artifacts_statement,
    upsert_bindings_statement,
    upsert_probes_statement,
)
from taskhandler_operator.publication.changes import (
    BindingRow,
    ChangeSet,
    compute_change,
    proposed_rows,
    same_placement,
)
from taskhandler_operator.publication.history import (
    Publication,
    PublicationKind,
    PublishOutcome,
    Refusal,
)
from taskhandler_operator.publication.policy import ANNOTATION_APPROVE_REVISION, hold_reason
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
        # What is published now, read before this pass's artifact rows change under it.
        self.result.statements += 1
        state = await read_published(self.conn, p.bundle_name, params.reconciled_dag_ids)
        # Under the bundle's lock: a row another pass of the bundle wrote is not missed.
        unjudged = p.unjudged(r.dag_id for r in state.rows)
        if unjudged:
            params = dataclasses.replace(
                params, reconciled_dag_ids=[*params.reconciled_dag_ids, *unjudged]
            )
        await self._write_artifacts(params)
        proposed, change = await asyncio.to_thread(_propose, state, params)
        publisher = _Publisher(self, state, proposed, change)
        if await publisher.publishes():
            await self._replace_bindings(
                params.reconciled_dag_ids, params.bindings, params.bindings
            )
        await publisher.finish()
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
        outcomes: dict[str, DagOutcome] = {v.dag_id: _outcome(v, conflicted) for v in p.verdicts}
        outcomes.update((dag_id, "reconciled") for dag_id in unjudged)
        self.result.dag_outcomes = dict(sorted(outcomes.items()))
        return self.result

    async def _replace_bindings(
        self,
        dag_ids: Sequence[str],
        keep: dict[str, list[Any]],
        rows: dict[str, list[Any]],
    ) -> None:
        """Delete this bundle's rows of ``dag_ids`` not in ``keep``; upsert ``rows``."""
        deleted = await self._execute(
            delete_vanished_bindings_statement(),
            {
                "reconciled_dag_ids": list(dag_ids),
                "keep_dag_id": keep["bind_dag_id"],
                "keep_task_id": keep["bind_task_id"],
            },
        )
        self.result.bindings_deleted += len(deleted.all())
        upserted = (await self._execute(upsert_bindings_statement(), rows)).all()
        inserted = sum(1 for row in upserted if row.inserted)
        self.result.bindings_inserted += inserted
        self.result.bindings_updated += len(upserted) - inserted

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


def _propose(state: PublishedState, params: PassParams) -> tuple[list[BindingRow], ChangeSet]:
    """The rows this pass would leave published and what that changes (in a worker thread)."""
    proposed = proposed_rows(
        state.rows, params.reconciled_dag_ids, params.wanted, state.held_elsewhere
    )
    return proposed, compute_change(state.rows, proposed)


#: Entries of a change shown in a status, an Event, a condition.
SUMMARY_ENTRIES = 5


class _Publisher:
    """Applies the pass's publish control (policy, approval, rollback) to its change.

    :meth:`publishes` says whether the pass writes its bindings; :meth:`finish` records the
    publication, saves or drops the held change, or rolls back, and sets the outcome.
    """

    def __init__(
        self,
        writer: _PassWriter,
        state: PublishedState,
        proposed: list[BindingRow],
        change: ChangeSet,
    ) -> None:
        self.writer = writer
        self.state = state
        self.proposed = proposed
        self.change = change
        self.control = writer.bundle_pass.publish
        self.hold: str | None = None
        self.refused: Refusal | None = None
        self.approved = False

    async def publishes(self) -> bool:
        control, change = self.control, self.change
        if control.rollback_to is not None:
            return False  # the rollback decides the bindings (finish)
        self.hold = hold_reason(control.policy, change, set(control.failed_paths))
        if self.hold is None or control.approve_revision is None:
            return self.hold is None
        pending = self.state.held.revision if self.state.held is not None else None
        if control.approve_revision == control.revision and pending in (None, control.revision):
            self.approved, self.hold = True, None
            return True
        current = pending or control.revision
        self.refused = Refusal(
            reason="ApprovalRefused",
            message=(
                f"approval of revision {control.approve_revision} refused: the pending change "
                f"is of revision {current}; set {ANNOTATION_APPROVE_REVISION}={current} to "
                "publish it"
            ),
        )
        return False

    def _count(self, n: int = 1) -> None:
        self.writer.result.statements += n
        self.writer.result.publications_written += n

    async def finish(self) -> None:
        w = self.writer
        conn, p, control = w.conn, w.bundle_pass, self.control
        if control.rollback_to is not None:
            await self._rollback()
            return
        outcome: dict[str, Any] = {"refused": self.refused}
        if self.hold is None:
            if self.change:
                kind: PublicationKind = "approved" if self.approved else "published"
                # An approval publishes the change a person saw (a later pass no longer sees
                # content changes of the artifact rows the held pass already wrote).
                shown = self._held_change() if self.approved else None
                change = shown or self.change
                recorded = await record_publication(
                    conn,
                    p.bundle_name,
                    kind=kind,
                    revision=control.revision,
                    operator=control.operator,
                    change=change,
                    bindings=self.proposed,
                    approved_by=control.approved_by if self.approved else None,
                    limit=control.history_limit,
                )
                self._count()
                outcome.update(recorded=recorded, change=change.summary(SUMMARY_ENTRIES))
            elif self.state.held is not None:
                w.result.statements += 1
                if await clear_held(conn, p.bundle_name):
                    w.result.publications_written += 1
        else:
            held = await self._save_held(self.hold)
            outcome.update(
                pending=held,
                pending_change=(held.change or self.change).summary(SUMMARY_ENTRIES),
                held_reason=self.hold,
                published_bindings=len(self.state.rows),
            )
        w.result.publication = PublishOutcome(**outcome)

    def _held_change(self) -> ChangeSet | None:
        """The saved held change, while it still describes this pass's (same revision, and
        every entry of this pass's change among its own)."""
        held = self.state.held
        if held is None or held.change is None or held.revision != self.control.revision:
            return None
        return held.change if self.change.keys() <= held.change.keys() else None

    async def _save_held(self, reason: str) -> Publication:
        kept = self._held_change()
        held = self.state.held
        if kept is not None and held is not None and held.reason == reason:
            return held  # unchanged: nothing written
        self._count()
        saved = await save_held(
            self.writer.conn,
            self.writer.bundle_pass.bundle_name,
            revision=self.control.revision,
            operator=self.control.operator,
            change=kept or self.change,
            bindings=self.proposed,
            reason=reason,
        )
        return saved.model_copy(update={"change": kept or self.change})

    async def _rollback(self) -> None:
        w = self.writer
        conn, p, control = w.conn, w.bundle_pass, self.control
        target_revision = control.rollback_to
        assert target_revision is not None
        w.result.statements += 1
        recorded = await load_publication_in(conn, p.bundle_name, target_revision)
        refusal: str | None = None
        changed: list[str] = []
        if recorded is None or recorded.bindings is None:
            refusal = (
                f"rollback to revision {target_revision} refused: the publication history of "
                f"bundle {p.bundle_name!r} has no publication of it (see "
                "`taskhandler-operator diff`)"
            )
        else:
            w.result.statements += 1
            stored = await artifact_digests(conn, p.bundle_name)
            paths = {r.artifact_path: r.artifact_digest for r in recorded.bindings}
            gone = sorted(path for path in paths if path not in stored)
            if gone:
                more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
                refusal = (
                    f"rollback to revision {target_revision} refused: the answers of its "
                    f"artifacts are no longer known ({gone[0]}{more} is gone from the bundle); "
                    "remove the annotation, or roll back to a later revision"
                )
            changed = sorted(
                path for path, digest in paths.items() if path in stored and stored[path] != digest
            )
        if refusal is not None or recorded is None or recorded.bindings is None:
            reason = refusal or "rollback refused"
            held = await self._save_held(reason) if self.change else None
            w.result.publication = PublishOutcome(
                pending=held,
                pending_change=self.change.summary(SUMMARY_ENTRIES) if held else None,
                held_reason=reason,
                refused=Refusal(reason="RollbackRefused", message=reason),
                published_bindings=len(self.state.rows),
            )
            return
        target = sorted(recorded.bindings, key=lambda r: r.key)
        restore = compute_change(self.state.rows, target)
        outcome: dict[str, Any] = {
            "rolled_back_to": target_revision,
            "published_bindings": len(target),
        }
        if not same_placement(self.state.rows, target):
            rows = restore_params(target)
            dag_ids = sorted({r.dag_id for r in (*self.state.rows, *target)})
            await w._replace_bindings(dag_ids, rows, rows)
            published = await record_publication(
                conn,
                p.bundle_name,
                kind="rolled_back",
                revision=target_revision,
                operator=control.operator,
                change=restore,
                bindings=target,
                approved_by=control.approved_by,
                reason=f"rollback to publication {recorded.id} of revision {target_revision}"
                + (
                    f"; {', '.join(changed[:3])} changed content since (the binding rows are "
                    "restored; the artifact is the one of the bundle version workers run)"
                    if changed
                    else ""
                ),
                limit=control.history_limit,
            )
            self._count()
            outcome.update(recorded=published, change=restore.summary(SUMMARY_ENTRIES))
            # What the pass wanted is now a change against the restored rows.
            self.state = PublishedState(
                rows=tuple(target), held_elsewhere=self.state.held_elsewhere, held=None
            )
        pending = compute_change(self.state.rows, self.proposed)
        self.change = pending
        reason = f"rolled back to revision {target_revision}"
        if pending:
            held = await self._save_held(reason)
            outcome.update(
                pending=held,
                pending_change=(held.change or pending).summary(SUMMARY_ENTRIES),
                held_reason=reason,
            )
        w.result.publication = PublishOutcome(**outcome)


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
