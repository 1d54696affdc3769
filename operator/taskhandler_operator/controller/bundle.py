"""One TaskHandlerBundle: a reconcile pass, the loop that repeats it, and its deletion (no kopf).

:func:`reconcile_bundle` runs the reconcile steps (:func:`~taskhandler_operator.reconcile.steps.
run_pass`) with the cluster's ports — :class:`~.syncing.KubeSyncer`, :class:`~.probing.
JobProber`, the shared database store — and turns what it saw into the status
(:mod:`.report`), written only when it changed, with Events only on transitions. A failing
source or database keeps the last revision and bindings and is retried with capped, jittered
back-off; a conflict or an invalid spec is ``Stalled`` and waits for a change.

:func:`run_bundle` is the per-bundle loop kopf's daemon calls: pass, sleep (the spec's
``interval`` with jitter, or the back-off), woken early by :class:`~.backoff.Wakeup`.
:func:`delete_bundle` applies ``deletionPolicy``.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from taskhandler_operator.artifacts.listing import ListingCache
from taskhandler_operator.controller.backoff import (
    SHARED_RANDOM,
    Backoff,
    ProbeRetries,
    RetryState,
    jittered,
)
from taskhandler_operator.controller.kubeapi import KubeApiError, NotFound
from taskhandler_operator.controller.logs import bundle_context, set_revision
from taskhandler_operator.controller.probing import JobProber
from taskhandler_operator.controller.report import (
    Observation,
    bundle_status,
    previous_status,
    transition_events,
)
from taskhandler_operator.controller.runtime import BundleStore, OperatorRuntime
from taskhandler_operator.controller.syncing import (
    KubeSyncer,
    SourceSyncFailed,
    airflow_version,
    source_kind,
)
from taskhandler_operator.db.claims import BundleClaimed
from taskhandler_operator.db.dag_bundle import DagBundleSync, dag_bundle_sync
from taskhandler_operator.db.engine import DatabaseError
from taskhandler_operator.db.writer import delete_bundle_rows
from taskhandler_operator.kube import names
from taskhandler_operator.kube.conditions import (
    Reason,
    Reasoned,
    find_condition,
    status_unchanged,
)
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.probe_job import BundleIdentity
from taskhandler_operator.kube.spec import DeletionPolicy, TaskHandlerBundleSpec
from taskhandler_operator.kube.status import ConditionType, TaskHandlerBundleStatus
from taskhandler_operator.reconcile.errors import OwnershipConflict, PassError
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.reconcile.steps import PassMemory, PassOutcome, PassPorts, run_pass
from taskhandler_operator.records import BundleOwner

__all__ = [
    "BundleInputs",
    "BundleMemory",
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
        )

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


@dataclass
class BundleMemory:
    """Kept between passes of one bundle (and nothing else is)."""

    listing_cache: ListingCache = field(default_factory=ListingCache)
    retry: RetryState = field(default_factory=lambda: RETRY.start())
    probe_retries: ProbeRetries = field(default_factory=ProbeRetries)
    last_status: Mapping[str, Any] | None = None
    # The last pass that changed nothing, kept while (generation, reconcile-now) stay the same.
    unchanged: PassMemory = field(default_factory=PassMemory)
    trigger: tuple[int, str | None] | None = None

    def pass_memory(self, generation: int, requested_at: str | None) -> PassMemory:
        """The unchanged-pass memory, forgotten first on a spec change or a reconcile-now
        request (either asks for the whole path)."""
        if self.trigger != (generation, requested_at):
            self.unchanged.forget()
            self.trigger = (generation, requested_at)
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
    stored = memory.last_status if memory.last_status is not None else inputs.status
    old = previous_status(stored)
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
            inputs.generation, datetime.now(UTC), suspended=True, requested_at=inputs.requested_at
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
    ports = PassPorts(
        syncer=syncer,
        prober=prober,
        store=store,
        probe_parallelism=spec.probe.parallelism,
        listing_cache=memory.listing_cache,
        memory=memory.pass_memory(inputs.generation, inputs.requested_at),
        watermarks=store,
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
    )
    outcome: PassOutcome | None = None
    error: PassError | None = None
    try:
        outcome = await run_pass(pass_spec, ports)
    except PassError as exc:
        error = exc
    revision = syncer.last.id if syncer.last is not None else None
    set_revision(revision)
    in_sync: DagBundleSync | None = None
    if outcome is not None and syncer.last is not None:
        in_sync = await _dag_bundle_sync(runtime, spec.bundle_name, airflow_version(syncer.last))
    seen = Observation(
        generation=inputs.generation,
        now=datetime.now(UTC),
        outcome=outcome,
        error=error,
        codes=dict(prober.codes),
        requested_at=inputs.requested_at,
        synced_revision=revision,
        dag_bundle=in_sync,
    )
    new = bundle_status(old, seen)
    written = await _publish(inputs, runtime, memory, old, new)

    metrics = runtime.metrics
    seconds = time.monotonic() - started
    retry_in = retry_after(error, memory.retry)
    if error is None:
        assert outcome is not None
        metrics.observe_reconcile(inputs.namespace, inputs.name, "success", seconds)
        metrics.set_bindings(inputs.namespace, inputs.name, outcome.summary.counts.bindings)
        metrics.mark_synced(inputs.namespace, inputs.name)
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
) -> DagBundleSync | None:
    """Airflow's DagBundle against the published revision. Informational: a failed read (no
    ``dag_bundle`` table before Airflow 3, an outage) leaves the condition as it was."""
    try:
        return await dag_bundle_sync(runtime.engine, bundle_name, revision=version)
    except DatabaseError as exc:
        log.info("cannot read Airflow's DagBundle %r: %s", bundle_name, exc)
        return None


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
    stored = memory.last_status if memory.last_status is not None else inputs.status
    if status_unchanged(stored, new):
        return False
    body = new.to_body()
    try:
        await runtime.kube.patch_bundle_status(
            inputs.namespace, inputs.name, body, previous=dict(stored or {})
        )
    except NotFound:
        return False  # deleted meanwhile
    except KubeApiError as exc:
        log.warning("cannot write the status: %s", exc)
        return False
    memory.last_status = body
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
            with runtime.reconciler_heartbeat.busy((namespace, name)):
                sleep = await _one_pass(get_body, runtime, memory, rand)
            if stopped():
                return
            reasons = await wakeup.sleep_or_wake(sleep)
            if reasons:
                log.debug("%s/%s woken: %s", namespace, name, ", ".join(reasons))
    finally:
        runtime.wakeups.discard(namespace, name)
        runtime.poller.forget((namespace, name))
        runtime.slots.forget((namespace, name))


def _object_name(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


async def _one_pass(
    get_body: Callable[[], Mapping[str, Any]],
    runtime: OperatorRuntime,
    memory: BundleMemory,
    rand: random.Random,
) -> float:
    """One pass of :func:`run_bundle`; the seconds to sleep after it."""
    inputs = BundleInputs.from_body(get_body())
    try:
        report = await reconcile_bundle(inputs, runtime, memory)
    except (DatabaseError, KubeApiError, OSError) as exc:
        # Not a pass error (the status write, an Event): retry later, never crash.
        delay = memory.retry.next_delay()
        log.warning(
            "reconcile of %s/%s failed: %s; retry in %.0fs",
            inputs.namespace,
            inputs.name,
            exc,
            delay,
        )
        return delay
    return sleep_after(report, rand)


async def delete_bundle(inputs: BundleInputs, runtime: OperatorRuntime) -> str:
    """Apply ``deletionPolicy``: Delete removes the bundle's rows and releases its claim, Orphan
    keeps the rows (the claim is released either way so another resource may take over); then
    the bundle's revisions go. Probe Jobs go with the bundle by garbage collection. Returns a
    line for the log."""
    spec_name = inputs.spec.get("bundleName")
    policy = inputs.spec.get("deletionPolicy") or DeletionPolicy.DELETE.value
    owner = BundleOwner(
        cluster_id=runtime.options.cluster_id,
        namespace=inputs.namespace,
        name=inputs.name,
        uid=inputs.uid,
    )
    what = "nothing to remove"
    if isinstance(spec_name, str) and spec_name:
        from taskhandler_operator.db.claims import release_claim

        try:
            if policy == DeletionPolicy.DELETE.value:
                deleted = await delete_bundle_rows(runtime.engine, spec_name, owner=owner)
                what = (
                    f"removed {deleted.bindings} bindings, {deleted.artifacts} artifacts and "
                    f"{deleted.problems} problems of bundle {spec_name!r}"
                )
            else:
                await release_claim(runtime.engine, spec_name, owner)
                what = f"kept the rows of bundle {spec_name!r} (deletionPolicy Orphan)"
        except BundleClaimed:
            what = f"bundle name {spec_name!r} belongs to another resource; nothing removed"
    await runtime.revisions.delete_bundle(inputs.namespace, inputs.name)
    runtime.metrics.remove_bundle(inputs.namespace, inputs.name)
    runtime.kube.forget_events(inputs.namespace, inputs.name)
    runtime.wakeups.wake(inputs.namespace, inputs.name, "deleted")
    # A claim was released: a bundle stalled on it may take over now.
    runtime.wakeups.wake_all(f"{inputs.namespace}/{inputs.name} was deleted")
    return what
