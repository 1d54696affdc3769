"""One reconcile pass of one TaskHandlerBundle, as named steps.

Start here to read what the operator does. DESIGN.md §1's diagram, step by step::

    sync ─► list ─► plan ─► probe ─► validate ─► write ─► summarize

============  ==================================================  ===========================
step          does                                                I/O (passed in)
============  ==================================================  ===========================
sync          source → immutable revision folder                  ``Syncer``
list          candidates by marker and stored digest; no hashing  file system, in a thread
plan          the claim first (a later claimant stops here), then     ``ClaimCheck``,
              cached / probe / rejected against stored answers    ``Store.known_artifacts``
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
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pydantic import ValidationError

from taskhandler_operator.airflow.serialized import DagStubs
from taskhandler_operator.airflow.snapshot import InventorySnapshot
from taskhandler_operator.artifacts.listing import ListingCache, ListingProblem, list_candidates
from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.artifacts.planner import (
    plan_probes,
    recheck_coverage,
    request_dag_ids,
)
from taskhandler_operator.db.watermark import RowsWatermark
from taskhandler_operator.db.write_models import BundlePass, PassResult
from taskhandler_operator.reconcile.errors import PassError, PassTimedOut, classify
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
from taskhandler_operator.reconcile.passkey import pass_key
from taskhandler_operator.reconcile.ports import (
    ClaimCheck,
    Clock,
    Prober,
    Progress,
    Syncer,
    SystemClock,
)
from taskhandler_operator.reconcile.store import KnownArtifacts, Store, Watermarks
from taskhandler_operator.records import ArtifactRecord, BundleProblem, TaskHandlerArtifact
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


async def plan(
    store: KnownArtifacts, spec: BundleSpec, listed: Listed, wanted: Sequence[str] = ()
) -> Planned:
    """Which candidates reuse a stored answer, which are probed, which are rejected.

    ``wanted`` are the Dags with a stub on the bundle's queues: probes ask about them (as the
    request's ``dag_ids``), and a stored answer that was asked about fewer and may have been
    filtered by its runtime is probed again (docs/protocol.md, "dag_ids").
    """
    known = await store.known_artifacts(spec.bundle_name)
    probe_plan = await asyncio.to_thread(plan_probes, listed.candidates, known, spec.bundle_name)
    if probe_plan.cached and wanted:
        requested = await store.requested_dag_ids(spec.bundle_name)
        if requested:
            answered = {c.rel_path: tuple(r.task_handlers) for c, r in probe_plan.cached}
            probe_plan = recheck_coverage(probe_plan, requested, wanted, answered)
    dag_ids, problem = request_dag_ids(wanted)
    return Planned(plan=probe_plan, known=len(known), dag_ids=dag_ids, dag_ids_problem=problem)


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
            dag_ids=planned.dag_ids,
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
                ArtifactRecord(
                    artifact=artifact,
                    probed_at=probed_at,
                    revision=revision,
                    requested_dag_ids=planned.dag_ids,
                )
            )
        except ValidationError as exc:
            reason = str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, ")
            refused.append(ProbeFailed(rel_path=outcome.rel_path, reason=reason))
            continue
        accepted.append(outcome)
    return records, accepted, refused


async def validate(store: Store, spec: BundleSpec, planned: Planned, probed: Probed) -> Validated:
    """Every Dag's stubs on the bundle's queues against the bundle's answers. Artifacts without
    an answer are named in "no artifact registers it" problems, since they may be why. The
    stub inventory is refreshed here, after the probes (which may take minutes).

    Only the Dags that concern the bundle's queues get a verdict (read from the inventory's
    queue index): any other Dag's would be "no binding, no problem", which the writer applies
    itself to the Dags the bundle has rows of (``BundlePass.inventory_dags``). A pass so costs
    what its own Dags cost, not what all of Airflow's do."""
    dags = await store.stub_inventory()
    concerning = InventorySnapshot.of(dags).concerning(spec.queues)
    broken = [
        BrokenCandidate(rel_path=c.rel_path, reason=c.error or "unreadable")
        for c in planned.plan.rejected
    ] + [BrokenCandidate(rel_path=f.rel_path, reason=f.reason) for f in probed.failures]
    result = await asyncio.to_thread(
        validate_bundle,
        bundle_name=spec.bundle_name,
        queues=spec.queues,
        dags=concerning,
        artifacts=[r.artifact for r in probed.records],
        broken=broken,
    )
    if planned.dag_ids_problem is not None:
        problem = BundleProblem(severity="warning", kind="dag_ids", message=planned.dag_ids_problem)
        result = result.model_copy(
            update={"artifact_problems": (*result.artifact_problems, problem)}
        )
    return Validated(result=result, dags=dags)


async def write(
    store: Store,
    spec: BundleSpec,
    probed: Probed,
    validated: Validated,
    revision: str | None = None,
    rejected: Sequence[str] = (),
) -> PassResult:
    """One transaction: artifacts, bindings of the Dags that validated (unless the publish
    policy holds the change), problems; refused (``BundleClaimed``/``QueueClaimed``) unless the
    spec's owner holds the bundle's claim. ``rejected`` are artifacts refused before a probe."""
    failed = sorted({*(f.rel_path for f in probed.failures), *rejected})
    publish = spec.publish.model_copy(update={"revision": revision, "failed_paths": tuple(failed)})
    bundle_pass = await asyncio.to_thread(
        BundlePass,
        bundle_name=spec.bundle_name,
        owner=spec.owner,
        queues=spec.queues,
        artifacts=probed.records,
        verdicts=validated.result.verdicts,
        inventory_dags=validated.dags.keys(),
        publish=publish,
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
    handlers = {
        record.artifact.relative_fileloc: sum(
            len(declarations) for declarations in record.artifact.task_handlers.values()
        )
        for record in probed.records
    }
    counts = PassCounts(
        candidates=len(listed.candidates),
        cached=len(planned.plan.cached),
        probed=len(probed.accepted),
        rejected=len(planned.plan.rejected),
        failed=len(probed.failures),
        handlers=sum(handlers.values()),
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
        handlers_by_path=handlers,
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
    # Both given: a pass whose inputs equal the last unchanged pass's keeps its outcome.
    memory: PassMemory | None = None
    watermarks: Watermarks | None = None
    # Given: the claim is checked before planning, so a later claimant probes nothing.
    claims: ClaimCheck | None = None
    # Seconds the whole pass may take; past it the running step is abandoned (PassTimedOut).
    timeout: float | None = None
    # Told before the probe step when there is anything to probe.
    progress: Progress | None = None
    # The key stored with the last status (``status.passKey``), when that status may stand for
    # this pass: equal to this pass's key, the pass keeps it (:class:`StatusKept`).
    stored_key: str | None = None
    # Awaited before the pass takes the whole path after expecting to keep an outcome: the
    # caller's place at its gate for whole passes is taken there, not for every pass.
    whole_path: Callable[[], Awaitable[None]] | None = None


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
    # The key of the inputs when a later pass with the same ones may keep this outcome (the
    # caller stores it with the status: a new process's first pass compares it).
    key: str | None = None


@dataclass(frozen=True)
class StatusKept:
    """A pass whose inputs gave the key stored with the last status: that status stands."""

    revision: str
    key: str


async def run_pass(spec: BundleSpec, ports: PassPorts) -> PassOutcome:
    """sync → list → plan → probe → validate → write → summarize; raises one
    :class:`~taskhandler_operator.reconcile.errors.PassError` naming the step that failed."""
    outcome = await run_pass_or_keep(spec, dataclasses.replace(ports, stored_key=None))
    assert isinstance(outcome, PassOutcome)  # no stored key: nothing to keep
    return outcome


async def run_pass_or_keep(spec: BundleSpec, ports: PassPorts) -> PassOutcome | StatusKept:
    """:func:`run_pass`, or :class:`StatusKept` when ``ports.stored_key`` is this pass's key."""
    clock = ports.clock
    started_at = clock.now()
    seconds: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    deadline = None if ports.timeout is None else loop.time() + ports.timeout

    async def step(name: StepName, work: Awaitable[T], label: str | None = None) -> T:
        began = clock.monotonic()
        try:
            return await _within(name, work, deadline, ports.timeout)
        except Exception as exc:
            if ports.memory is not None:
                ports.memory.forget()  # after a failure, retryable or not: the whole path
            if isinstance(exc, PassError):
                raise
            raise classify(name, exc) from exc
        finally:
            seconds[label or name] = clock.monotonic() - began

    synced = await step("sync", sync(ports.syncer, spec))
    listed = await step("list", list_bundle(spec, synced, ports.listing_cache))
    memory, seen = ports.memory, None
    if memory is not None and ports.watermarks is not None:
        # Read before anything the pass loads, so a row written later changes the next
        # watermark; a failure counts against the step that needs the read.
        dags = await step("validate", ports.watermarks.recent_stub_inventory(), "inventory")
        last = memory.inputs
        if last is not None and last.dags is dags and last.spec.queues == spec.queues:
            dag_ids = last.dag_ids  # the same inventory: no need to walk every Dag again
        else:
            dag_ids = queue_dags(dags, spec.queues)
        rows = await step(
            "plan",
            ports.watermarks.rows_watermark(spec.bundle_name, dag_ids, spec.queues),
            "watermark",
        )
        seen = PassInputs(
            spec, synced.revision, listed.candidates, listed.problems, dags, dag_ids, rows
        )
        kept = memory.recall(seen)
        if kept is not None:
            summary = kept.summary.model_copy(
                update={"started_at": started_at, "step_seconds": seconds, "reused": True}
            )
            return dataclasses.replace(kept, summary=summary)
        if memory.inputs is None and ports.stored_key is not None:
            # A new process (or one whose memory was forgotten): the stored status's key
            # stands in for the memory.
            key = seen.key()
            if key == ports.stored_key:
                return StatusKept(synced.revision, key)
        memory.forget()  # changed (or failing below): the next pass takes the whole path too
    if ports.whole_path is not None:
        await ports.whole_path()
    if ports.claims is not None:
        await step("plan", ports.claims(spec), "claim")
    if seen is not None:
        wanted = seen.dag_ids
    else:
        inventory = await step("validate", ports.store.stub_inventory(), "inventory")
        wanted = queue_dags(inventory, spec.queues)
    planned = await step("plan", plan(ports.store, spec, listed, wanted))
    if ports.progress is not None and planned.plan.probe:
        await ports.progress.probing(synced.revision, planned.plan.probe)
    probed = await step(
        "probe",
        probe(ports.prober, clock, spec, synced, planned, parallelism=ports.probe_parallelism),
    )
    validated = await step("validate", validate(ports.store, spec, planned, probed))
    rejected = [c.rel_path for c in planned.plan.rejected]
    written = await step(
        "write", write(ports.store, spec, probed, validated, synced.revision, rejected)
    )
    began = clock.monotonic()
    summary = summarize(
        spec, synced, listed, planned, probed, validated, written, started_at=started_at
    )
    seconds["summarize"] = clock.monotonic() - began
    summary = summary.model_copy(update={"step_seconds": seconds})
    outcome = PassOutcome(synced, listed, planned, probed, validated, written, summary)
    if memory is not None and seen is not None and keeps(outcome, seen):
        outcome = dataclasses.replace(outcome, key=seen.key())
        memory.remember(seen, outcome)
    elif memory is not None:
        memory.forget()
    return outcome


async def _within(
    name: StepName, work: Awaitable[T], deadline: float | None, budget: float | None
) -> T:
    """``work``, abandoned with :class:`PassTimedOut` at the pass's deadline (loop time);
    ``budget`` is the pass's whole timeout, for the message."""
    if deadline is None or budget is None:
        return await work
    limit = asyncio.timeout_at(deadline)
    try:
        async with limit:
            return await work
    except TimeoutError:
        if limit.expired():
            raise PassTimedOut(name, budget) from None
        raise


# --- the unchanged pass ------------------------------------------------------------------------


@dataclass(frozen=True)
class PassInputs:
    """Everything a pass's outcome depends on besides the prober: the spec, the revision and
    its listing, the stub inventory (by identity: a refresh that finds nothing new keeps the
    same snapshot) and the watermark of the database rows the pass reads and writes."""

    spec: BundleSpec
    revision: str
    candidates: tuple[Candidate, ...]
    problems: tuple[ListingProblem, ...]
    dags: Mapping[str, DagStubs]
    dag_ids: tuple[str, ...]  # the Dags with a stub on the bundle's queues
    rows: RowsWatermark

    def key(self) -> str:
        """The inputs' :func:`~taskhandler_operator.reconcile.passkey.pass_key`."""
        return pass_key(
            self.spec,
            self.revision,
            self.candidates,
            self.problems,
            self.dags,
            self.dag_ids,
            self.rows,
        )

    def same_as(self, other: PassInputs) -> bool:
        return (
            self.dags is other.dags
            and self.rows == other.rows
            and self.revision == other.revision
            and self.spec == other.spec
            and self.candidates == other.candidates
            and self.problems == other.problems
        )


def keeps(outcome: PassOutcome, seen: PassInputs) -> bool:
    """Whether a later pass with the same inputs may keep ``outcome``: it probed nothing (a
    probe's answer, or its failure, is news the next pass must not assume), validated against
    the inventory its inputs name, and wrote no row (so the watermark read before the pass
    still describes the rows after it)."""
    return (
        not outcome.planned.plan.probe
        and outcome.validated.dags is seen.dags
        and outcome.written.rows_written == 0
    )


@dataclass
class PassMemory:
    """The last pass of one bundle that changed nothing, kept by the caller between passes.

    A pass whose :class:`PassInputs` equal the remembered ones keeps the remembered outcome:
    no loading of the stored answers, no planning, validation or write. Anything else (a new
    revision, listing, spec, stub inventory or row, a pass that probed, wrote or failed) takes
    the whole path; ``forget`` makes the next one do so too (the caller forgets on a new
    generation or a reconcile-now request).
    """

    inputs: PassInputs | None = None
    outcome: PassOutcome | None = None
    kept: int = 0  # passes that kept the outcome, for tests and logs

    def recall(self, seen: PassInputs) -> PassOutcome | None:
        if self.inputs is None or self.outcome is None or not seen.same_as(self.inputs):
            return None
        self.kept += 1
        return self.outcome

    def remember(self, seen: PassInputs, outcome: PassOutcome) -> None:
        if keeps(outcome, seen):
            self.inputs, self.outcome = seen, slim(outcome)
        else:
            self.forget()

    def forget(self) -> None:
        self.inputs = self.outcome = None


#: Stands for a cached artifact's answer in a kept outcome (only the candidate is read).
_NO_ANSWER = TaskHandlerArtifact(
    bundle_name="-", relative_fileloc="(answer not kept)", size_bytes=0, task_handlers={}
)


def slim(outcome: PassOutcome) -> PassOutcome:
    """``outcome`` as worth keeping for a thousand bundles: the status reads the summary (with
    each answer's handler count), the candidates and the verdicts that concern the bundle.

    Dropped: the answers themselves (the reused records, and the cached artifacts' declarations,
    about 30 KiB for 20 artifacts), the verdicts without a problem (their bindings are in the
    database and counted in the summary: about 16 KiB for 20 bindings), and the outcomes of the
    Dags that have no binding or problem left (those whose rows the pass removed)."""
    result = outcome.validated.result
    concerned = {v.dag_id for v in result.verdicts if v.bindings != () or v.errors or v.warnings}
    verdicts = tuple(v for v in result.verdicts if v.errors or v.warnings)
    plan = outcome.planned.plan
    cached = [(c, _NO_ANSWER) for c, _answer in plan.cached]

    def only(outcomes: Mapping[str, T]) -> dict[str, T]:
        return {dag_id: o for dag_id, o in outcomes.items() if dag_id in concerned}

    return dataclasses.replace(
        outcome,
        planned=dataclasses.replace(outcome.planned, plan=dataclasses.replace(plan, cached=cached)),
        probed=dataclasses.replace(outcome.probed, records=()),
        validated=Validated(
            result.model_copy(update={"verdicts": verdicts}), outcome.validated.dags
        ),
        written=outcome.written.model_copy(
            update={"dag_outcomes": only(outcome.written.dag_outcomes)}
        ),
        summary=outcome.summary.model_copy(
            update={"dag_outcomes": only(outcome.summary.dag_outcomes)}
        ),
    )


def queue_dags(dags: Mapping[str, DagStubs], queues: Sequence[str]) -> tuple[str, ...]:
    """The Dags with a stub on one of ``queues``: the bindings a conflict may come from."""
    return InventorySnapshot.of(dags).with_stubs_on(queues)


__all__ = [
    "DEFAULT_PROBE_PARALLELISM",
    "PassInputs",
    "PassMemory",
    "PassOutcome",
    "PassPorts",
    "StatusKept",
    "keeps",
    "list_bundle",
    "plan",
    "probe",
    "queue_dags",
    "run_pass",
    "run_pass_or_keep",
    "slim",
    "summarize",
    "sync",
    "validate",
    "write",
]
