"""One TaskHandlerBundle: a reconcile pass, the loop that repeats it, and its deletion (no kopf).

:func:`reconcile_bundle` runs the reconcile steps (:func:`~taskhandler_operator.reconcile.steps.
run_pass`) with the cluster's ports — :class:`~.syncing.KubeSyncer`, :class:`~.probing.
JobProber`, the shared database store — and turns what it saw into the status
(:mod:`.report`), written only when it differs from the status as last read from the apiserver
(:class:`LiveStatus`: a status changed by anyone else is corrected by the next pass), with
Events only on transitions. A pass that probes first writes ``Reconciling=True`` (``Probing``).
A failing source or database keeps the last revision and bindings and is retried with capped,
jittered back-off; a failure only a person can fix is ``Stalled`` and waits for a change. No
exception escapes a pass: an unexpected one becomes ``Ready=False`` (``InternalError``, its
type in the message, the traceback in the log) and a retry with back-off.

:func:`run_bundle` is the per-bundle loop kopf's daemon calls: pass, sleep (the spec's
``interval`` with jitter, or the back-off), woken early by :class:`~.backoff.Wakeup`.
:func:`delete_bundle` applies ``deletionPolicy``.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from taskhandler_operator.artifacts.listing import ListingCache
from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.controller.backoff import (
    SHARED_RANDOM,
    Backoff,
    BundleKey,
    GateTicket,
    ProbeRetries,
    RetryState,
    jittered,
)
from taskhandler_operator.controller.health import PassWatch
from taskhandler_operator.controller.kubeapi import KubeApiError, NotFound
from taskhandler_operator.controller.logs import bundle_context, set_revision
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.controller.ownership import ClaimGuard
from taskhandler_operator.controller.probing import JobProber
from taskhandler_operator.controller.report import (
    Observation,
    bundle_status,
    internal_error,
    previous_status,
    probing_status,
    published_bindings,
    transition_events,
)
from taskhandler_operator.controller.runtime import BundleStore, OperatorRuntime
from taskhandler_operator.controller.syncing import (
    KubeSyncer,
    SourceSyncFailed,
    airflow_version,
    source_kind,
)
from taskhandler_operator.db.claims import BundleClaimed, release_claim, release_command
from taskhandler_operator.db.dag_bundle import DagBundleSync, dag_bundle_sync
from taskhandler_operator.db.engine import DatabaseError
from taskhandler_operator.db.fence import Fence
from taskhandler_operator.db.writer import delete_bundle_rows
from taskhandler_operator.kube import names
from taskhandler_operator.kube.conditions import (
    EventReason,
    Reason,
    Reasoned,
    find_condition,
    status_unchanged,
)
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.probe_job import BundleIdentity
from taskhandler_operator.kube.spec import DeletionPolicy, TaskHandlerBundleSpec
from taskhandler_operator.kube.status import ConditionType, TaskHandlerBundleStatus
from taskhandler_operator.publication.policy import PublishControl
from taskhandler_operator.reconcile.errors import Deposed, OwnershipConflict, PassError
from taskhandler_operator.reconcile.models import BundleSpec, SyncedRevision
from taskhandler_operator.reconcile.ports import Syncer
from taskhandler_operator.reconcile.steps import (
    PassMemory,
    PassOutcome,
    PassPorts,
    StatusKept,
    run_pass_or_keep,
)
from taskhandler_operator.records import BundleOwner

__all__ = [
    "BundleInputs",
    "BundleMemory",
    "LiveStatus",
    "PassReport",
    "delete_bundle",
    "reconcile_bundle",
    "retry_after",
    "run_bundle",
    "sleep_after",
]

log = logging.getLogger(__name__)

#: Retry policy of a failing source, database or prober (capped, jittered).
RETRY = Backoff(base=5.0, cap=300.0)


@dataclass(frozen=True)
class BundleInputs:
    """What a pass takes from the TaskHandlerBundle object: copies of its spec, status and
    annotations, never the whole body (its ``managedFields`` alone are as big as the status)."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any] | None
    annotations: Mapping[str, str]
    resource_version: str | None = None
    # The field manager that last set each publication-control annotation (managedFields).
    annotation_managers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> BundleInputs:
        """Copies, so a body kopf replaces or a caller edits during the pass changes nothing."""
        meta = body.get("metadata") or {}
        status = body.get("status")
        return cls(
            namespace=str(meta.get("namespace")),
            name=str(meta.get("name")),
            uid=str(meta.get("uid")),
            generation=int(meta.get("generation") or 0),
            spec=copy.deepcopy(dict(body.get("spec") or {})),
            status=None if status is None else copy.deepcopy(dict(status)),
            annotations=dict(meta.get("annotations") or {}),
            resource_version=meta.get("resourceVersion"),
            annotation_managers=annotation_managers(
                meta.get("managedFields") or (), CONTROL_ANNOTATIONS
            ),
        )

    def publish_control(self) -> tuple[str | None, str | None, str | None]:
        """(approve revision, who set it, rollback revision) from the annotations."""
        approve = (self.annotations.get(names.ANNOTATION_APPROVE_REVISION) or "").strip()
        rollback = (self.annotations.get(names.ANNOTATION_ROLLBACK_TO) or "").strip()
        key = names.ANNOTATION_ROLLBACK_TO if rollback else names.ANNOTATION_APPROVE_REVISION
        return approve or None, self.annotation_managers.get(key), rollback or None

    @property
    def requested_at(self) -> str | None:
        return self.annotations.get(names.ANNOTATION_RECONCILE_REQUESTED_AT)

    def reference(self) -> dict[str, str]:
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


#: Annotations that change what a pass publishes: a change of either asks for the whole path.
CONTROL_ANNOTATIONS = (names.ANNOTATION_APPROVE_REVISION, names.ANNOTATION_ROLLBACK_TO)


def annotation_managers(
    managed_fields: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> dict[str, str]:
    """Who last set each of ``keys``: the manager of the newest managedFields entry owning
    ``metadata.annotations[key]`` (its ``time`` is when that manager last changed it)."""
    found: dict[str, tuple[str, str]] = {}
    for entry in managed_fields:
        if not isinstance(entry, Mapping):
            continue
        owned = _owned_annotations(entry)
        when = str(entry.get("time") or "")
        manager = str(entry.get("manager") or "")
        for key in keys:
            if f"f:{key}" in owned and manager and when >= found.get(key, ("", ""))[0]:
                found[key] = (when, manager)
    return {key: manager for key, (_when, manager) in found.items()}


def _owned_annotations(entry: Any) -> Mapping[str, Any]:
    """The ``f:annotations`` a managedFields entry owns (empty for anything else)."""
    if not isinstance(entry, Mapping):
        return {}
    owned = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations")
    return owned if isinstance(owned, Mapping) else {}


def slim_managed_fields(
    meta: MutableMapping[str, Any], keys: Sequence[str] = CONTROL_ANNOTATIONS
) -> None:
    """Cut ``meta["managedFields"]`` down, in place, to what :func:`annotation_managers` reads.

    kopf keeps every bundle's last watched object for its daemon, and the managedFields are
    nearly half of it (about 16 KiB of Python objects for a bundle with 20 artifacts). Only the
    entries owning one of ``keys`` stay, each with its manager, time and those keys alone, so
    ``annotation_managers`` gives the same answer from what is left.
    """
    entries = meta.get("managedFields")
    if not isinstance(entries, list):
        return
    kept: list[dict[str, Any]] = []
    for entry in entries:
        owned = _owned_annotations(entry)
        mine: dict[str, Any] = {f"f:{key}": {} for key in keys if f"f:{key}" in owned}
        if mine:
            kept.append(
                {
                    "manager": entry.get("manager"),
                    "time": entry.get("time"),
                    "fieldsV1": {"f:metadata": {"f:annotations": mine}},
                }
            )
    meta["managedFields"] = kept


@dataclass
class LiveStatus:
    """The bundle's status as last read from the apiserver, whoever wrote it.

    kopf's watched object is the live view, but its watch may not have delivered the operator's
    own last write yet: while the object is still at a ``resourceVersion`` that write replaced
    (``superseded``), the write's answer is newer, and is used instead. Anything else (the
    write's own event, a later change by someone else: ``kubectl patch --subresource=status``,
    a late write of a deposed leader, a restore) is the watched object's status, so the next
    pass compares with, and corrects, what is really stored.
    """

    status: Mapping[str, Any] | None = None  # as our last write returned it
    version: str | None = None
    superseded: frozenset[str] = frozenset()

    def current(self, inputs: BundleInputs) -> tuple[Mapping[str, Any] | None, str | None]:
        """The freshest stored status known and its resourceVersion."""
        if self.status is not None and inputs.resource_version in self.superseded:
            return self.status, self.version
        # The watch has caught up with (or gone past) our write: nothing of ours to keep.
        self.status, self.version, self.superseded = None, None, frozenset()
        return inputs.status, inputs.resource_version

    def wrote(self, based_on: str | None, stored: Mapping[str, Any]) -> None:
        """A write based on the object at ``based_on`` returned ``stored``."""
        if based_on is not None:
            self.superseded = self.superseded | {based_on}
        status = stored.get("status")
        self.status = dict(status) if isinstance(status, Mapping) else {}
        version = (stored.get("metadata") or {}).get("resourceVersion")
        self.version = str(version) if version is not None else None


@dataclass
class BundleMemory:
    """Kept between passes of one bundle (and nothing else is)."""

    listing_cache: ListingCache = field(default_factory=ListingCache)
    retry: RetryState = field(default_factory=lambda: RETRY.start())
    probe_retries: ProbeRetries = field(default_factory=ProbeRetries)
    live: LiveStatus = field(default_factory=LiveStatus)
    # The last pass that changed nothing, kept while (generation, reconcile-now) stay the same.
    unchanged: PassMemory = field(default_factory=PassMemory)
    trigger: tuple[Any, ...] | None = None
    # The running pass's place at the whole-pass gate, given back when it starts probing.
    gate: GateTicket | None = None

    def pass_memory(
        self, generation: int, requested_at: str | None, *control: str | None
    ) -> PassMemory:
        """The unchanged-pass memory, forgotten first on a spec change, a reconcile-now
        request or a new approval or rollback annotation (each asks for the whole path)."""
        trigger = (generation, requested_at, *control)
        if self.trigger != trigger:
            self.unchanged.forget()
            self.trigger = trigger
        return self.unchanged


@dataclass(frozen=True)
class PassReport:
    status: TaskHandlerBundleStatus
    written: bool
    retry_in: float | None  # seconds until a retry (a failure), None: the interval
    interval: float
    jobs_created: tuple[str, ...] = ()
    probe_due: float | None = None  # seconds until an artifact's probe back-off ends


def _stalled_status(
    inputs: BundleInputs, old: TaskHandlerBundleStatus, why: Reasoned
) -> TaskHandlerBundleStatus:
    seen = Observation(
        generation=inputs.generation,
        now=datetime.now(UTC),
        stalled=why,
        requested_at=inputs.requested_at,
    )
    return bundle_status(old, seen)


@dataclass(frozen=True)
class SyncOutsideGate:
    """A whole pass's source sync runs without its place at the whole-pass gate: a source that
    answers slowly or hangs (until the bundle's ``spec.timeout``) is that bundle's problem and
    must not hold up every other bundle's whole pass. The place is taken again after the sync
    (a wait the liveness check does not count); a failed sync ends the pass without it."""

    syncer: Syncer
    memory: BundleMemory
    watch: PassWatch
    key: BundleKey

    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        ticket = self.memory.gate
        if ticket is None or not ticket.held:
            return await self.syncer(spec)
        ticket.release()
        revision = await self.syncer(spec)
        with self.watch.waiting(self.key):
            await ticket.reacquire()
        return revision


@dataclass(frozen=True)
class WholePathGate:
    """A pass expected to keep an outcome starts without its place at the whole-pass gate;
    when its inputs turn out changed, it waits for one before the whole path (a wait the
    liveness check does not count), so a change seen by every bundle at once (a new stub
    inventory, an upgrade that changes every key) still runs a few whole passes at a time."""

    memory: BundleMemory
    watch: PassWatch
    key: BundleKey

    async def __call__(self) -> None:
        ticket = self.memory.gate
        if ticket is None or ticket.held:
            return
        with self.watch.waiting(self.key):
            await ticket.reacquire()


def stored_key(inputs: BundleInputs, old: TaskHandlerBundleStatus) -> str | None:
    """The stored status's pass key when that status may stand for this pass: it describes
    this generation and the last reconcile-now request (a new one asks for the whole path)."""
    if old.pass_key is None or old.observed_generation != inputs.generation:
        return None
    if inputs.requested_at is not None and inputs.requested_at != old.last_handled_reconcile_at:
        return None
    return old.pass_key


def expects_kept(memory: BundleMemory, body: Mapping[str, Any]) -> bool:
    """Whether the next pass will likely keep an outcome (kept in memory, or a stored status
    with a pass key): such a pass starts without a place at the whole-pass gate."""
    if memory.unchanged.outcome is not None:
        return True
    status = body.get("status")
    return isinstance(status, Mapping) and bool(status.get("passKey"))


async def reconcile_bundle(
    inputs: BundleInputs, runtime: OperatorRuntime, memory: BundleMemory
) -> PassReport:
    """One pass of one bundle, its status written when it changed."""
    with bundle_context(inputs.namespace, inputs.name):
        return await _reconcile(inputs, runtime, memory)


async def _reconcile(
    inputs: BundleInputs, runtime: OperatorRuntime, memory: BundleMemory
) -> PassReport:
    started = time.monotonic()
    old = previous_status(memory.live.current(inputs)[0])
    key = (inputs.namespace, inputs.name)
    try:
        spec = TaskHandlerBundleSpec.model_validate(inputs.spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        why = Reasoned(Reason.INVALID_SPEC, f"spec.{where}: {first.get('msg')}")
        new = _stalled_status(inputs, old, why)
        written = await _publish(inputs, runtime, memory, old, new)
        return PassReport(new, written, None, 300.0)
    interval = parse_duration(spec.interval).total_seconds()
    if spec.suspend:
        seen = Observation(
            inputs.generation,
            datetime.now(UTC),
            suspended=True,
            requested_at=inputs.requested_at,
            queues=spec.queues,
        )
        new = bundle_status(old, seen)
        written = await _publish(inputs, runtime, memory, old, new)
        return PassReport(new, written, None, interval)

    runtime.poller.serve(key, frozenset(spec.queues))
    identity = BundleIdentity(inputs.namespace, inputs.name, inputs.uid, spec.bundle_name)
    syncer = KubeSyncer(
        runtime.kube,
        runtime.revisions,
        inputs.namespace,
        inputs.name,
        spec.source,
        timeout=parse_duration(spec.timeout).total_seconds(),
        volumes=runtime.volumes,
    )
    prober = JobProber(
        kube=runtime.kube,
        artifacts=runtime.artifacts,
        slots=runtime.slots,
        signals=runtime.signals,
        metrics=runtime.metrics,
        bundle=identity,
        spec=spec,
        operator_image=runtime.options.operator_image,
        runtime_images=runtime.runtime_images,
        pod_settings=runtime.options.pod_settings,
        retries=memory.probe_retries,
    )
    store = BundleStore(runtime.poller, key)
    progress = StatusProgress(inputs, runtime, memory, old, syncer, tuple(spec.queues))
    approve, approved_by, rollback = inputs.publish_control()
    ports = PassPorts(
        syncer=SyncOutsideGate(syncer, memory, runtime.reconciler_heartbeat, key),
        prober=prober,
        store=store,
        probe_parallelism=spec.probe.parallelism,
        listing_cache=memory.listing_cache,
        memory=memory.pass_memory(inputs.generation, inputs.requested_at, approve, rollback),
        watermarks=store,
        claims=ClaimGuard(
            runtime.kube, runtime.engine, runtime.options.cluster_id, inputs.reference()
        ),
        timeout=runtime.settings.pass_timeout,
        progress=progress,
        stored_key=stored_key(inputs, old),
        whole_path=WholePathGate(memory, runtime.reconciler_heartbeat, key),
    )
    pass_spec = BundleSpec(
        bundle_name=spec.bundle_name,
        language=spec.language,
        queues=tuple(spec.queues),
        owner=BundleOwner(
            cluster_id=runtime.options.cluster_id,
            namespace=inputs.namespace,
            name=inputs.name,
            uid=inputs.uid,
        ),
        publish=PublishControl(
            policy=spec.publish.policy,
            operator=_operator_identity(runtime),
            approve_revision=approve,
            approved_by=approved_by,
            rollback_to=rollback,
            history_limit=runtime.settings.publication_history,
        ),
    )
    outcome: PassOutcome | None = None
    kept: StatusKept | None = None
    error: PassError | None = None
    try:
        result = await run_pass_or_keep(pass_spec, ports)
    except PassError as exc:
        error = exc
    else:
        if isinstance(result, StatusKept):
            kept = result
        else:
            outcome = result
    if isinstance(error, Deposed):
        # Another replica leads: write nothing more, the status included (it reports).
        log.error("pass abandoned, this replica no longer leads: %s", error)
        return PassReport(old, False, None, interval)
    revision = syncer.last.id if syncer.last is not None else None
    set_revision(revision)
    in_sync: DagBundleSync | None = None
    in_sync_failed: Reasoned | None = None
    if (outcome is not None or kept is not None) and syncer.last is not None:
        checked = await _dag_bundle_sync(runtime, spec.bundle_name, airflow_version(syncer.last))
        if isinstance(checked, Reasoned):
            in_sync_failed = checked
        else:
            in_sync = checked
    seen = Observation(
        generation=inputs.generation,
        now=datetime.now(UTC),
        outcome=outcome,
        error=error,
        codes=dict(prober.codes),
        requested_at=inputs.requested_at,
        synced_revision=revision,
        source_revision=syncer.last.source if syncer.last is not None else None,
        queues=spec.queues,
        dag_bundle=in_sync,
        dag_bundle_error=in_sync_failed,
        kept=kept is not None,
    )
    base = progress.base()
    new = bundle_status(base, seen)
    written = await _publish(inputs, runtime, memory, base, new)

    metrics = runtime.metrics
    seconds = time.monotonic() - started
    retry_in = retry_after(error, memory.retry)
    if in_sync_failed is not None and retry_in is None:
        retry_in = memory.retry.next_delay()
    if kept is not None:
        metrics.observe_reconcile(inputs.namespace, inputs.name, "success", seconds)
        metrics.set_bindings(inputs.namespace, inputs.name, new.counts.bindings)
        metrics.mark_synced(inputs.namespace, inputs.name)
        pending = new.pending_change
        metrics.set_publication_held(
            inputs.namespace, inputs.name, None if pending is None else pending.since.timestamp()
        )
        log.info("revision %s unchanged since the stored status: kept it", kept.revision)
    elif error is None:
        assert outcome is not None
        metrics.observe_reconcile(inputs.namespace, inputs.name, "success", seconds)
        metrics.set_bindings(inputs.namespace, inputs.name, published_bindings(outcome))
        metrics.mark_synced(inputs.namespace, inputs.name)
        _publication_metrics(metrics, inputs, outcome)
        log.info(
            "reconciled revision %s: %d candidates, %d probed, %d cached, %d failed, %d bindings",
            outcome.summary.revision,
            outcome.summary.counts.candidates,
            outcome.summary.counts.probed,
            outcome.summary.counts.cached,
            outcome.summary.counts.failed + outcome.summary.counts.rejected,
            outcome.summary.counts.bindings,
        )
    else:
        label = "conflict" if isinstance(error, OwnershipConflict) else error.component
        metrics.observe_reconcile(inputs.namespace, inputs.name, label, seconds)
        if isinstance(error, SourceSyncFailed):
            metrics.count_source_error(
                inputs.namespace, inputs.name, source_kind(spec.source), error.kind
            )
        if retry_in is not None:
            log.warning("pass failed (%s), retrying in %.0fs: %s", error.reason, retry_in, error)
        else:
            log.warning("pass stopped (%s): %s", error.reason, error)
    return PassReport(
        new,
        written,
        retry_in,
        interval,
        tuple(prober.jobs_created),
        probe_due=memory.probe_retries.next_due(time.monotonic()),
    )


def _operator_identity(runtime: OperatorRuntime) -> str:
    """Who writes: the leader's identity (its pod and term), else this pod or host."""
    fence: Fence | None = getattr(runtime, "fence", None)  # a test's runtime may have none
    term = fence.term if fence is not None else None
    if term is not None:
        return term.holder
    return os.environ.get("POD_NAME") or socket.gethostname()


def _publication_metrics(metrics: Metrics, inputs: BundleInputs, outcome: PassOutcome) -> None:
    publication = outcome.written.publication
    if publication is None or outcome.summary.reused:
        return  # a kept outcome recorded nothing new
    recorded = publication.recorded
    if recorded is not None and recorded.kind != "held":
        metrics.count_publication(inputs.namespace, inputs.name, recorded.kind)
    pending = publication.pending
    metrics.set_publication_held(
        inputs.namespace,
        inputs.name,
        None if pending is None else pending.recorded_at.timestamp(),
    )


def retry_after(error: PassError | None, retry: RetryState) -> float | None:
    """Seconds until a retry after a pass that ended with ``error``; None: wait for the interval.

    A success resets the back-off; a retryable failure (source, database, prober) takes the
    next capped, jittered delay; a non-retryable one (a conflict) waits for a change or the
    interval, without growing the back-off.
    """
    if error is None:
        retry.reset()
        return None
    if error.retryable:
        return retry.next_delay()
    return None


def sleep_after(report: PassReport, rand: random.Random) -> float:
    """How long the loop sleeps after ``report``: the back-off when a retry is due, else the
    interval with jitter, or less when an artifact's probe back-off ends first (wake-ups end
    the sleep earlier either way)."""
    if report.retry_in is not None:
        return report.retry_in
    sleep = jittered(report.interval, rand)
    if report.probe_due is not None:
        sleep = min(sleep, report.probe_due)
    return sleep


async def _dag_bundle_sync(
    runtime: OperatorRuntime, bundle_name: str, version: str
) -> DagBundleSync | Reasoned | None:
    """Airflow's DagBundle against the published revision. Informational: a failed read (no
    ``dag_bundle`` table before Airflow 3, an outage) leaves the condition as it was; anything
    unexpected (a ``dag_bundle`` table of another shape, a bug) is ``InternalError`` on the
    condition, logged with its traceback, and the pass is retried with back-off."""
    try:
        return await dag_bundle_sync(runtime.engine, bundle_name, revision=version)
    except DatabaseError as exc:
        log.info("cannot read Airflow's DagBundle %r: %s", bundle_name, exc)
        return None
    except Exception as exc:
        log.error("checking Airflow's DagBundle %r failed", bundle_name, exc_info=exc)
        return internal_error(exc)


@dataclass
class StatusProgress:
    """The pass's :class:`~taskhandler_operator.reconcile.ports.Progress`: when it starts
    probing, the status says so (``Reconciling=True``, ``Probing``; the artifacts being probed
    as ``Probing``), so a bundle whose probe Jobs cannot start or run for minutes is not silent.
    """

    inputs: BundleInputs
    runtime: OperatorRuntime
    memory: BundleMemory
    old: TaskHandlerBundleStatus
    # The pass' source (its last revision's own spelling) and spec.queues, for the short
    # revision and the queues kubectl get shows.
    syncer: KubeSyncer | None = None
    queues: tuple[str, ...] | None = None
    written: TaskHandlerBundleStatus | None = None

    async def probing(self, revision: str, candidates: Sequence[Candidate]) -> None:
        if self.memory.gate is not None:
            self.memory.gate.release()  # Jobs take minutes: let other bundles' passes run
        # An artifact waiting out its probe back-off gets no Job in this pass: not news.
        now = time.monotonic()
        retries = self.memory.probe_retries
        paths = [
            c.rel_path
            for c in candidates
            if retries.waiting(c.rel_path, c.cache_digest, now) is None
        ]
        if not paths:
            return
        # No requested_at: lastHandledReconcileAt says a reconcile-now request was carried out,
        # which only the end of the pass can say (a user waits on it, as on Flux's).
        last = self.syncer.last if self.syncer is not None else None
        seen = Observation(
            generation=self.inputs.generation,
            now=datetime.now(UTC),
            synced_revision=revision,
            source_revision=last.source if last is not None and last.id == revision else None,
            queues=self.queues,
        )
        try:
            new = probing_status(self.old, seen, paths)
            await _publish(self.inputs, self.runtime, self.memory, self.old, new)
        except Exception as exc:  # a report must never fail the pass
            log.warning("cannot report the probing: %s", exc, exc_info=exc)
            return
        self.written = new

    def base(self) -> TaskHandlerBundleStatus:
        """What the pass's final status is built on: the probing status when one was written
        (its conditions are what is stored now), with the artifact list of before (the final
        status lists the answers; a failed pass keeps the last good list)."""
        if self.written is None:
            return self.old
        return self.written.model_copy(
            update={
                "artifacts": self.old.artifacts,
                "artifacts_omitted": self.old.artifacts_omitted,
            }
        )


async def _publish(
    inputs: BundleInputs,
    runtime: OperatorRuntime,
    memory: BundleMemory,
    old: TaskHandlerBundleStatus,
    new: TaskHandlerBundleStatus,
) -> bool:
    """Write ``new`` if it differs from the stored status; post the transitions' Events."""
    ready = find_condition(new.conditions, ConditionType.READY.value)
    runtime.metrics.set_ready(
        inputs.namespace, inputs.name, ready is not None and ready.status == "True"
    )
    # Compared with, and diffed against, what the apiserver holds: not what this process last
    # wrote, so a status someone else changed is rewritten.
    stored, based_on = memory.live.current(inputs)
    if status_unchanged(stored, new):
        return False
    body = new.to_body()
    try:
        written = await runtime.kube.patch_bundle_status(
            inputs.namespace, inputs.name, body, previous=dict(stored or {})
        )
    except NotFound:
        return False  # deleted meanwhile
    except KubeApiError as exc:
        log.warning("cannot write the status: %s", exc)
        return False
    memory.live.wrote(based_on, written)
    regarding = {**inputs.reference()}
    for event in transition_events(old, new):
        try:
            await runtime.kube.post_event(
                regarding, reason=event.reason, note=event.note, type=event.type
            )
        except (KubeApiError, ValueError) as exc:
            log.info("cannot post Event %s: %s", event.reason, exc)
    return True


async def run_bundle(
    get_body: Callable[[], Mapping[str, Any]],
    runtime: OperatorRuntime,
    stopped: Callable[[], bool],
    *,
    rand: random.Random | None = None,
) -> None:
    """Reconcile one bundle until ``stopped()``: a pass, then sleep until the interval (with
    jitter) or the back-off ends, or a wake-up (spec change, Job event, inventory change,
    reconcile-now annotation, free probe slot) comes earlier."""
    rand = rand or SHARED_RANDOM
    memory = BundleMemory()
    namespace, name = _object_name(get_body())
    wakeup = runtime.wakeups.get(namespace, name)
    try:
        while not stopped():
            wakeup.collect()
            # The pass's inputs and report live in _one_pass's frame only, so nothing of them
            # outlives the pass: this coroutine sleeps for most of its life, once per bundle.
            # Liveness counts a pass that never ends, never the sleep between passes.
            # A pass with no kept outcome (in memory or as the stored status's pass key)
            # takes the whole path: it waits for the gate first (outside the liveness mark:
            # waiting is not a pass that never ends); one that expected to keep it and finds
            # its inputs changed waits there before its whole path (WholePathGate).
            whole = not expects_kept(memory, get_body())
            async with runtime.whole_passes.hold(whole) as memory.gate:
                with runtime.reconciler_heartbeat.busy((namespace, name)):
                    sleep = await _one_pass(get_body, runtime, memory, rand)
            memory.gate = None
            if stopped():
                return
            reasons = await wakeup.sleep_or_wake(sleep)
            if reasons:
                log.debug("%s/%s woken: %s", namespace, name, ", ".join(reasons))
    finally:
        runtime.wakeups.discard(namespace, name)
        runtime.poller.forget((namespace, name))
        runtime.slots.forget((namespace, name))
        if (get_body().get("metadata") or {}).get("deletionTimestamp"):
            # kopf runs the deletion handler while this loop winds down: a pass that was still
            # running may have written a revision, a metric or an Event after it.
            await _forget_bundle(runtime, namespace, name)


def _object_name(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


async def _one_pass(
    get_body: Callable[[], Mapping[str, Any]],
    runtime: OperatorRuntime,
    memory: BundleMemory,
    rand: random.Random,
) -> float:
    """One pass of :func:`run_bundle`; the seconds to sleep after it.

    No exception ends the loop (kopf would restart the daemon a minute later, with no
    condition): whatever escapes the pass becomes ``InternalError`` and a retry with back-off.
    """
    inputs = BundleInputs.from_body(get_body())
    started = time.monotonic()
    try:
        report = await reconcile_bundle(inputs, runtime, memory)
    except Exception as exc:
        delay = memory.retry.next_delay()
        memory.unchanged.forget()  # the next pass takes the whole path
        log.error(
            "reconcile of %s/%s failed (%s), retry in %.0fs",
            inputs.namespace,
            inputs.name,
            type(exc).__name__,
            delay,
            exc_info=exc,
        )
        await _report_failure(inputs, runtime, memory, exc, time.monotonic() - started)
        return delay
    return sleep_after(report, rand)


async def _report_failure(
    inputs: BundleInputs,
    runtime: OperatorRuntime,
    memory: BundleMemory,
    exc: Exception,
    seconds: float,
) -> None:
    """Write ``Ready=False`` (``InternalError``) for a pass that raised; best effort."""
    try:
        with bundle_context(inputs.namespace, inputs.name):
            runtime.metrics.observe_reconcile(inputs.namespace, inputs.name, "operator", seconds)
            old = previous_status(memory.live.current(inputs)[0])
            seen = Observation(
                generation=inputs.generation, now=datetime.now(UTC), failed=internal_error(exc)
            )
            await _publish(inputs, runtime, memory, old, bundle_status(old, seen))
    except Exception as again:
        log.warning("cannot report the failed pass: %s", again, exc_info=again)


async def delete_bundle(inputs: BundleInputs, runtime: OperatorRuntime) -> str:
    """Apply ``deletionPolicy`` under the claim this resource holds: Delete removes the
    bundle's rows and releases its claim, Orphan keeps the rows (the claim is released either
    way so another resource may take over); a resource that holds no claim removes nothing.
    Then the bundle's revisions go. Probe Jobs go with the bundle by garbage collection.

    With the ``skip-cleanup`` annotation the database is not touched at all (it may be
    unreachable): a Warning Event names the ``db claims release`` command for later. Without
    it a database error propagates, and the finalizer stays until a retry succeeds.
    Returns a line for the log."""
    spec_name = inputs.spec.get("bundleName")
    policy = inputs.spec.get("deletionPolicy") or DeletionPolicy.DELETE.value
    owner = BundleOwner(
        cluster_id=runtime.options.cluster_id,
        namespace=inputs.namespace,
        name=inputs.name,
        uid=inputs.uid,
    )
    what = "nothing to remove"
    if isinstance(spec_name, str) and spec_name and skip_cleanup(inputs.annotations):
        what = (
            f"cleanup skipped ({names.ANNOTATION_SKIP_CLEANUP}): the rows and claim of bundle "
            f"{spec_name!r} stay; free them with `{release_command(spec_name, owner)}` "
            "(add --delete-rows to remove the rows)"
        )
        await _post_deletion_event(inputs, runtime, EventReason.CLEANUP_SKIPPED, what)
    elif isinstance(spec_name, str) and spec_name:
        try:
            if policy == DeletionPolicy.DELETE.value:
                deleted = await delete_bundle_rows(
                    runtime.engine, spec_name, owner=owner, fence=runtime.fence
                )
                if deleted.claim_released:
                    what = (
                        f"removed {deleted.bindings} bindings, {deleted.artifacts} artifacts "
                        f"and {deleted.problems} problems of bundle {spec_name!r}"
                    )
                else:
                    what = _NOT_HELD.format(name=spec_name)
            elif await release_claim(runtime.engine, spec_name, owner):
                what = f"kept the rows of bundle {spec_name!r} (deletionPolicy Orphan)"
            else:
                what = _NOT_HELD.format(name=spec_name)
        except BundleClaimed:
            what = f"bundle name {spec_name!r} belongs to another resource; nothing removed"
        except DatabaseError as exc:
            # The way out first: the API cuts a long note at 1 kB.
            note = (
                f"cannot clean up bundle {spec_name!r}, retrying; to let this resource go "
                "without touching the database, annotate it "
                f'{names.ANNOTATION_SKIP_CLEANUP}="true" '
                "(its rows and claim stay for `taskhandler-operator db claims release`). "
                f"Error: {exc}"
            )
            await _post_deletion_event(inputs, runtime, EventReason.CLEANUP_FAILED, note)
            raise
    await _forget_bundle(runtime, inputs.namespace, inputs.name)
    runtime.wakeups.wake(inputs.namespace, inputs.name, "deleted")
    # A claim was released: a bundle stalled on it may take over now.
    runtime.wakeups.wake_all(f"{inputs.namespace}/{inputs.name} was deleted")
    return what


_NOT_HELD = (
    "this resource holds no claim on bundle name {name!r}: its rows, if any, are not its own "
    "and stay (see `taskhandler-operator db claims list`); nothing removed"
)


def skip_cleanup(annotations: Mapping[str, str]) -> bool:
    """Whether the resource asks to be let go without touching the database."""
    return annotations.get(names.ANNOTATION_SKIP_CLEANUP, "").strip().lower() == "true"


async def _post_deletion_event(
    inputs: BundleInputs, runtime: OperatorRuntime, reason: str, note: str
) -> None:
    try:
        await runtime.kube.post_event(
            inputs.reference(), reason=reason, note=note, type="Warning", action="Delete"
        )
    except (KubeApiError, ValueError) as exc:
        log.info("cannot post Event %s: %s", reason, exc)


async def _forget_bundle(runtime: OperatorRuntime, namespace: str, name: str) -> None:
    """Drop what the operator keeps of a deleted bundle: its revisions (and its use of git
    mirrors), its metrics' series, its Events' dedupe memory. Idempotent."""
    await runtime.revisions.delete_bundle(namespace, name)
    runtime.metrics.remove_bundle(namespace, name)
    runtime.kube.forget_events(namespace, name)
