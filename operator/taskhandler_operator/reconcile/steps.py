"""One reconcile pass of one TaskHandlerBundle, as named steps.

Start here to read what the operator does. DESIGN.md §1's diagram, step by step::

    sync ─► list ─► plan ─► probe ─► validate ─► write ─► summarize

============  ==================================================  ===========================
step          does                                                I/O (passed in)
============  ==================================================  ===========================
sync          source → immutable revision folder                  ``Syncer``
list          candidates by marker and stored digest; no hashing  file system, in a thread
plan          cached / probe / rejected against stored answers    ``Store.known_artifacts``
probe         each changed artifact's declarations, in parallel   ``Prober``, ``Clock``
validate      the stubs on the bundle's queues vs declarations    ``Store.stub_inventory``
write         one transaction, under the bundle's claim           ``Store.write``
summarize     what the status, events and metrics are built from  ``Clock``
============  ==================================================  ===========================

Every step is a function with typed inputs and outputs (:mod:`.models`) and raises only
:class:`~taskhandler_operator.reconcile.errors.PassError` through :func:`run_pass`. Work that
would block the event loop (listing, planning a large bundle, building records from large
answers, validation, building the write's input) runs in worker threads, so one operator
process reconciles many bundles at once. Nothing is kept between passes except what the caller
chooses to keep (the shared stub inventory inside the store, a listing cache per bundle).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pydantic import ValidationError

from taskhandler_operator.artifacts.listing import ListingCache, list_candidates
from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.artifacts.planner import plan_probes
from taskhandler_operator.db.write_models import BundlePass, PassResult
from taskhandler_operator.reconcile.errors import PassError, classify
from taskhandler_operator.reconcile.models import (
    ArtifactIssue,
    BundleSpec,
    Listed,
    PassCounts,
    PassSummary,
    Planned,
    ProbeAccepted,
    Probed,
    ProbeFailed,
    ProbeOutcome,
    ProbeRequest,
    StepName,
    SyncedRevision,
    Validated,
)
from taskhandler_operator.reconcile.ports import Clock, Prober, Syncer, SystemClock
from taskhandler_operator.reconcile.store import KnownArtifacts, Store
from taskhandler_operator.records import ArtifactRecord, TaskHandlerArtifact
from taskhandler_operator.validation import BrokenCandidate, validate_bundle

#: Probes of one bundle running at once, unless the caller says otherwise.
DEFAULT_PROBE_PARALLELISM = 4

T = TypeVar("T")


# --- the steps ---------------------------------------------------------------------------------


async def sync(syncer: Syncer, spec: BundleSpec) -> SyncedRevision:
    """The bundle's source as a revision folder."""
    return await syncer(spec)


async def list_bundle(
    spec: BundleSpec, synced: SyncedRevision, cache: ListingCache | None = None
) -> Listed:
    """The candidates under the revision folder. ``cache`` belongs to this bundle alone (it is
    not safe to share between bundles listed at the same time)."""
    listing = await asyncio.to_thread(list_candidates, synced.root, spec.language, cache)
    return Listed(
        candidates=tuple(listing.candidates),
        problems=tuple(listing.problems),
        stats=listing.stats,
    )


async def plan(store: KnownArtifacts, spec: BundleSpec, listed: Listed) -> Planned:
    """Which candidates reuse a stored answer, which are probed, which are rejected."""
    known = await store.known_artifacts(spec.bundle_name)
    probe_plan = await asyncio.to_thread(plan_probes, listed.candidates, known, spec.bundle_name)
    return Planned(plan=probe_plan, known=len(known))


async def probe(
    prober: Prober,
    clock: Clock,
    spec: BundleSpec,
    synced: SyncedRevision,
    planned: Planned,
    *,
    parallelism: int = DEFAULT_PROBE_PARALLELISM,
) -> Probed:
    """Probe every planned candidate (at most ``parallelism`` at once) and add the fresh answers
    to the reused ones. An artifact without an answer is a :class:`ProbeFailed` in the result,
    not an error; only a prober that raises fails the step."""
    if parallelism < 1:
        raise ValueError("probe parallelism must be at least 1")
    gate = asyncio.Semaphore(parallelism)

    async def one(candidate: Candidate) -> tuple[ProbeOutcome, datetime]:
        request = ProbeRequest(
            bundle_name=spec.bundle_name,
            language=spec.language,
            bundle_root=synced.root,
            candidate=candidate,
            revision=synced.revision,
        )
        async with gate:
            outcome = await prober(request)
        return outcome, clock.now()

    results = await asyncio.gather(*(one(c) for c in planned.plan.probe), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    answered = [r for r in results if not isinstance(r, BaseException)]
    records, accepted, refused = await asyncio.to_thread(
        _records_of, answered, planned, spec.bundle_name, synced.revision
    )
    failures = [o for o, _when in answered if isinstance(o, ProbeFailed)] + refused
    return Probed(
        records=tuple(sorted(records, key=lambda r: r.artifact.relative_fileloc)),
        accepted=tuple(accepted),
        failures=tuple(sorted(failures, key=lambda f: f.rel_path)),
    )


def _records_of(
    answered: Sequence[tuple[ProbeOutcome, datetime]],
    planned: Planned,
    bundle_name: str,
    revision: str,
) -> tuple[list[ArtifactRecord], list[ProbeAccepted], list[ProbeFailed]]:
    """Reused and accepted answers as records; runs in a worker thread (answers may be large).
    An answer the database could not store (a NUL character, a path too long) fails its
    artifact only."""
    by_path = {c.rel_path: c for c in planned.plan.probe}
    records = [ArtifactRecord(artifact=record) for _candidate, record in planned.plan.cached]
    accepted: list[ProbeAccepted] = []
    refused: list[ProbeFailed] = []
    for outcome, probed_at in answered:
        if not isinstance(outcome, ProbeAccepted):
            continue
        candidate = by_path[outcome.rel_path]
        try:
            artifact = TaskHandlerArtifact(
                bundle_name=bundle_name,
                relative_fileloc=candidate.rel_path,
                size_bytes=candidate.size_bytes,
                cache_digest=candidate.cache_digest,
                task_handlers=outcome.result.task_handlers,
            )
            records.append(
                ArtifactRecord(artifact=artifact, probed_at=probed_at, revision=revision)
            )
        except ValidationError as exc:
            reason = str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, ")
            refused.append(ProbeFailed(rel_path=outcome.rel_path, reason=reason))
            continue
        accepted.append(outcome)
    return records, accepted, refused


async def validate(store: Store, spec: BundleSpec, planned: Planned, probed: Probed) -> Validated:
    """Every Dag's stubs on the bundle's queues against the bundle's answers. Artifacts without
    an answer are named in "no artifact registers it" problems, since they may be why."""
    dags = await store.stub_inventory()
    broken = [
        BrokenCandidate(rel_path=c.rel_path, reason=c.error or "unreadable")
        for c in planned.plan.rejected
    ] + [BrokenCandidate(rel_path=f.rel_path, reason=f.reason) for f in probed.failures]
    result = await asyncio.to_thread(
        validate_bundle,
        bundle_name=spec.bundle_name,
        queues=spec.queues,
        dags=list(dags.values()),
        artifacts=[r.artifact for r in probed.records],
        broken=broken,
    )
    return Validated(result=result, dags=dags)


async def write(store: Store, spec: BundleSpec, probed: Probed, validated: Validated) -> PassResult:
    """One transaction: artifacts, bindings of the Dags that validated, problems; refused
    (``BundleClaimed``/``QueueClaimed``) unless the spec's owner holds the bundle's claim."""
    bundle_pass = await asyncio.to_thread(
        BundlePass,
        bundle_name=spec.bundle_name,
        owner=spec.owner,
        queues=spec.queues,
        artifacts=probed.records,
        verdicts=validated.result.verdicts,
    )
    return await store.write(bundle_pass)


def summarize(
    spec: BundleSpec,
    synced: SyncedRevision,
    listed: Listed,
    planned: Planned,
    probed: Probed,
    validated: Validated,
    written: PassResult,
    *,
    started_at: datetime,
    step_seconds: dict[str, float] | None = None,
) -> PassSummary:
    """What the pass observed and did, in the terms of the bundle's status."""
    issues = [
        ArtifactIssue(rel_path=p.rel_path, kind="listing", reason=p.message)
        for p in listed.problems
    ]
    issues += [
        ArtifactIssue(rel_path=c.rel_path, kind="rejected", reason=c.error or "unreadable")
        for c in planned.plan.rejected
    ]
    issues += [
        ArtifactIssue(rel_path=f.rel_path, kind="probe_failed", reason=f.reason)
        for f in probed.failures
    ]
    counts = PassCounts(
        candidates=len(listed.candidates),
        cached=len(planned.plan.cached),
        probed=len(probed.accepted),
        rejected=len(planned.plan.rejected),
        failed=len(probed.failures),
        handlers=sum(
            len(declarations)
            for record in probed.records
            for declarations in record.artifact.task_handlers.values()
        ),
        bindings=len(validated.result.bindings),
    )
    return PassSummary(
        bundle_name=spec.bundle_name,
        revision=synced.revision,
        started_at=started_at,
        counts=counts,
        artifact_issues=tuple(issues),
        problems=validated.result.problems,
        dag_outcomes=dict(written.dag_outcomes),
        rows_written=written.rows_written,
        statements=written.statements,
        step_seconds=dict(step_seconds or {}),
    )


# --- the whole pass ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PassPorts:
    """The I/O one pass uses; the controller keeps one per bundle (a listing cache is
    per bundle; the store's stub inventory is shared)."""

    syncer: Syncer
    prober: Prober
    store: Store
    clock: Clock = field(default_factory=SystemClock)
    probe_parallelism: int = DEFAULT_PROBE_PARALLELISM
    listing_cache: ListingCache | None = None


@dataclass(frozen=True)
class PassOutcome:
    """Every step's output, for a caller that shows more than the summary."""

    synced: SyncedRevision
    listed: Listed
    planned: Planned
    probed: Probed
    validated: Validated
    written: PassResult
    summary: PassSummary


async def run_pass(spec: BundleSpec, ports: PassPorts) -> PassOutcome:
    """sync → list → plan → probe → validate → write → summarize; raises one
    :class:`~taskhandler_operator.reconcile.errors.PassError` naming the step that failed."""
    clock = ports.clock
    started_at = clock.now()
    seconds: dict[str, float] = {}

    async def step(name: StepName, work: Awaitable[T]) -> T:
        began = clock.monotonic()
        try:
            return await work
        except PassError:
            raise
        except Exception as exc:
            raise classify(name, exc) from exc
        finally:
            seconds[name] = clock.monotonic() - began

    synced = await step("sync", sync(ports.syncer, spec))
    listed = await step("list", list_bundle(spec, synced, ports.listing_cache))
    planned = await step("plan", plan(ports.store, spec, listed))
    probed = await step(
        "probe",
        probe(ports.prober, clock, spec, synced, planned, parallelism=ports.probe_parallelism),
    )
    validated = await step("validate", validate(ports.store, spec, planned, probed))
    written = await step("write", write(ports.store, spec, probed, validated))
    began = clock.monotonic()
    summary = summarize(
        spec, synced, listed, planned, probed, validated, written, started_at=started_at
    )
    seconds["summarize"] = clock.monotonic() - began
    summary = summary.model_copy(update={"step_seconds": seconds})
    return PassOutcome(synced, listed, planned, probed, validated, written, summary)


__all__ = [
    "DEFAULT_PROBE_PARALLELISM",
    "PassOutcome",
    "PassPorts",
    "list_bundle",
    "plan",
    "probe",
    "run_pass",
    "summarize",
    "sync",
    "validate",
    "write",
]
