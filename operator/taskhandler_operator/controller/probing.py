"""The ``Prober`` port in a cluster: one probe Job per artifact, read back when it finishes.

For each artifact the pass wants probed, :class:`JobProber`:

1. signs URLs on the artifact server for the files the probe pod downloads (the artifact; for
   Java every ``*.jar`` of the revision, the bundle's classpath), each with its sha256;
2. builds the Job with :func:`~taskhandler_operator.kube.probe_job.build_probe_job` (its name
   is deterministic, so a restarted operator adopts the Job it created before);
3. takes a slot (at most ``probe.parallelism`` Jobs of the bundle, and the operator-wide cap of
   :class:`~taskhandler_operator.controller.backoff.JobSlots`), creates or adopts the Job;
4. waits for it to finish, woken by Job events from the watch (:class:`JobSignals`) with a
   poll as the fallback, reads the probe container's termination message and log, and accepts
   the result only through :func:`~taskhandler_operator.protocol.summary.accept_result` (the
   log's result must hash to the summary's sha256); a failed Job becomes a ``ProbeFailed``
   with :func:`~taskhandler_operator.kube.probe_job.job_outcome`'s reason.

A failure that says nothing about the artifact (``retryable``: a fetch that failed, a lost pod)
is not final: with ``retries`` (the bundle's :class:`~taskhandler_operator.controller.backoff.
ProbeRetries`) the artifact is probed again only after a capped, jittered back-off, and its
message says when.

``codes`` keeps the CamelCase reason of each failure (the port's ``ProbeFailed`` carries only
the sentence), for the status' artifact list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.controller.backoff import BundleKey, JobSlots, ProbeRetries, Waiting
from taskhandler_operator.controller.kubeapi import KubeApi, KubeApiError, NotFound
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.kube.probe_job import (
    PROBE_CONTAINER,
    BundleIdentity,
    FetchFile,
    ProbeFailure,
    ProbeJobRequest,
    ProbePhase,
    ProbePodSettings,
    ProbeTarget,
    active_deadline_seconds,
    build_probe_job,
    job_outcome,
    probe_job_selector,
)
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec
from taskhandler_operator.kube.status import MAX_ITEM_MESSAGE_CHARS, shorten
from taskhandler_operator.protocol.summary import ResultRejected, accept_result
from taskhandler_operator.reconcile.models import ProbeAccepted, ProbeFailed, ProbeRequest
from taskhandler_operator.sources.server import ArtifactServer

__all__ = ["JobProber", "JobSignals", "waiting_message"]

log = logging.getLogger(__name__)

#: Seconds between reads of a running Job when no watch event arrives (the fallback).
POLL_SECONDS = 10.0
#: Largest probe log read (the result is one line of it; limits.py bounds results lower).
RESULT_LOG_LIMIT = 32 * 1024 * 1024
#: Failures that say nothing about the artifact: the Job is deleted so a later pass retries
#: (after the bundle's back-off for that artifact).
TRANSIENT = {
    ProbeFailure.POD_LOST.value,
    ProbeFailure.EVICTED.value,
    ProbeFailure.FETCH_FAILED.value,
    ProbeFailure.JOB_DELETED.value,
}


class JobSignals:
    """Wakes the coroutines waiting for a Job: the watch handler calls :meth:`changed`."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self.freed = asyncio.Event()  # set whenever a probe slot may have freed up

    def changed(self, namespace: str, name: str) -> bool:
        """Wake the pass waiting for this Job; False when none waits (an older Job)."""
        event = self._events.get((namespace, name))
        if event is None:
            return False
        event.set()
        return True

    def expect(self, namespace: str, name: str) -> None:
        """Register interest before the Job exists, so its first event is not missed."""
        self._events.setdefault((namespace, name), asyncio.Event())

    async def wait(self, namespace: str, name: str, timeout: float) -> None:  # noqa: ASYNC109
        event = self._events.setdefault((namespace, name), asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    def forget(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._events)


@dataclass
class JobProber:
    """Probes one bundle's artifacts with Jobs (one instance per pass)."""

    kube: KubeApi
    artifacts: ArtifactServer
    slots: JobSlots
    signals: JobSignals
    metrics: Metrics
    bundle: BundleIdentity
    spec: TaskHandlerBundleSpec
    operator_image: str
    runtime_images: Mapping[Language, str]
    pod_settings: ProbePodSettings = field(default_factory=ProbePodSettings)
    poll_seconds: float = POLL_SECONDS
    codes: dict[str, str] = field(default_factory=dict)
    jobs_created: list[str] = field(default_factory=list)
    running: int = 0
    """Jobs created or adopted by this pass whose result is awaited (the running-Jobs gauge)."""
    retries: ProbeRetries | None = None
    """The bundle's per-artifact back-off of retryable failures (kept between passes)."""
    _observing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _observed: bool = field(default=False, repr=False)

    @property
    def key(self) -> BundleKey:
        return (self.bundle.namespace, self.bundle.name)

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        rel, digest = request.candidate.rel_path, request.candidate.cache_digest
        if self.retries is not None:
            waiting = self.retries.waiting(rel, digest, time.monotonic())
            if waiting is not None:
                self.codes[rel] = waiting.code
                return ProbeFailed(rel, waiting_message(waiting), retryable=True)
        # The revision's files stay while its probe pod may download them.
        with self.artifacts.store.hold(self.bundle.namespace, self.bundle.name, request.revision):
            outcome = await self._probe(request)
        if self.retries is None:
            return outcome
        if isinstance(outcome, ProbeFailed) and outcome.retryable:
            entry = self.retries.failed(
                rel,
                digest,
                self.codes.get(rel, ""),
                outcome.reason,
                time.monotonic(),
                datetime.now(UTC),
            )
            log.info("%s: probe retrying in %.1fs (attempt %d)", rel, entry.delay, entry.attempts)
            return dataclasses.replace(outcome, reason=waiting_message(entry))
        self.retries.settled(rel)
        return outcome

    async def _probe(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        rel = request.candidate.rel_path
        try:
            files = await self._files(request)
        except (OSError, ValueError) as exc:
            return self._fail(
                rel,
                ProbeFailure.ARTIFACT_UNAVAILABLE.value,
                f"cannot serve the artifact: {exc}",
            )
        target = ProbeTarget(rel, request.candidate.size_bytes, request.candidate.cache_digest)
        try:
            job_request = ProbeJobRequest.for_bundle(
                self.bundle,
                self.spec,
                target,
                files,
                operator_image=self.operator_image,
                runtime_images=self.runtime_images,
                settings=self.pod_settings,
                dag_ids=request.dag_ids,
            )
            manifest = build_probe_job(job_request)
        except ValueError as exc:
            return self._fail(rel, ProbeFailure.NO_PROBE_IMAGE.value, str(exc))
        name = str(manifest["metadata"]["name"])
        await self._take_slot(name)
        self.signals.expect(self.bundle.namespace, name)
        try:
            created = await self.kube.create_job(self.bundle.namespace, manifest)
            if created.created:
                self.jobs_created.append(name)
                log.info("probe Job %s created for %s", name, rel)
            else:
                log.info("probe Job %s adopted for %s", name, rel)
            limit = active_deadline_seconds(job_request) + 120
            self._count_running(+1)
            try:
                return await self._await_result(name, rel, limit)
            finally:
                self._count_running(-1)
        finally:
            self.slots.release(self.key, name)
            self.signals.forget(self.bundle.namespace, name)
            self.signals.freed.set()

    def _count_running(self, step: int) -> None:
        self.running += step
        self.metrics.set_jobs_running(self.bundle.namespace, self.bundle.name, self.running)

    # --- steps ---------------------------------------------------------------------------------

    async def _files(self, request: ProbeRequest) -> list[FetchFile]:
        rels = [request.candidate.rel_path]
        if request.language is Language.JAVA:
            jars = await asyncio.to_thread(_jars, request.bundle_root)
            rels = sorted(set(rels) | set(jars))
        files: list[FetchFile] = []
        for rel in rels:
            entry = await self.artifacts.manifest_entry(
                self.bundle.namespace,
                self.bundle.name,
                request.revision,
                rel,
                expires_in=float(self.pod_settings.deadline_allowance_seconds + 3600),
            )
            files.append(
                FetchFile(entry["path"], entry["url"], entry["sha256"], int(entry["size"]))
            )
        return files

    async def _observe_running(self) -> None:
        """Count the bundle's probe Jobs running in the cluster against the caps, once per pass
        before its first slot: Jobs a restarted operator adopts, or an earlier pass left
        running (their artifact changed since), take slots as the ones this pass creates do.
        Those this pass does not wait for give their slot back when their Job finishes
        (the Job watch, controller/switchboard.py)."""
        async with self._observing:
            if self._observed:
                return
            self._observed = True
            try:
                jobs = await self.kube.list_jobs(
                    self.bundle.namespace, probe_job_selector(self.bundle)
                )
            except KubeApiError as exc:
                log.info("cannot list the running probe Jobs: %s", exc)
                return
            running = {_name(job) for job in jobs if _running(job)}
            self.slots.observe(self.key, running | self.slots.held(self.key))

    async def _take_slot(self, name: str) -> None:
        await self._observe_running()
        while not self.slots.acquire(self.key, name, self.spec.probe.parallelism):
            self.signals.freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.signals.freed.wait(), self.poll_seconds)

    async def _await_result(self, name: str, rel: str, limit: float) -> ProbeAccepted | ProbeFailed:
        namespace = self.bundle.namespace
        loop = asyncio.get_running_loop()
        give_up = loop.time() + limit
        while True:
            try:
                job: dict[str, object] | None = await self.kube.get_job(namespace, name)
            except NotFound:
                job = None
            pod = await self._pod(name) if job is not None else None
            outcome = job_outcome(job, pod)
            if outcome.finished and outcome.phase is ProbePhase.FAILED and pod is not None:
                tail = await self._log(pod, tail_lines=20)
                outcome = job_outcome(job, pod, tail)
            if outcome.phase is ProbePhase.SUCCEEDED:
                assert outcome.summary is not None and pod is not None
                text = await self._log(pod)
                try:
                    result = await asyncio.to_thread(accept_result, text, outcome.summary)
                except ResultRejected as exc:
                    return self._fail(rel, ProbeFailure.RESULT_REJECTED.value, str(exc))
                self.metrics.count_probe(namespace, self.bundle.name, "accepted")
                return ProbeAccepted(rel, result, summary=outcome.summary)
            if outcome.phase is ProbePhase.FAILED:
                if outcome.reason in TRANSIENT and job is not None:
                    with contextlib.suppress(KubeApiError):
                        await self.kube.delete_job(namespace, name)
                return self._fail(
                    rel,
                    outcome.reason,
                    outcome.message,
                    summary=outcome.summary,
                    retryable=outcome.reason in TRANSIENT,
                )
            if loop.time() >= give_up:
                with contextlib.suppress(KubeApiError):
                    await self.kube.delete_job(namespace, name)
                return self._fail(
                    rel,
                    ProbeFailure.DEADLINE_EXCEEDED.value,
                    f"the probe Job {name} did not finish within {limit:g}s ({outcome.message})",
                    retryable=True,
                )
            await self.signals.wait(namespace, name, self.poll_seconds)

    async def _pod(self, job_name: str) -> dict[str, object] | None:
        pods = await self.kube.list_pods(self.bundle.namespace, f"job-name={job_name}")
        if not pods:
            return None
        # The newest pod: with backoffLimit 0 there is one, unless one was deleted and replaced.
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        return pods[-1]

    async def _log(self, pod: Mapping[str, object], tail_lines: int | None = None) -> str:
        meta = pod.get("metadata")
        name = str(meta.get("name")) if isinstance(meta, dict) else ""
        try:
            text = await self.kube.read_container_log(
                self.bundle.namespace,
                name,
                PROBE_CONTAINER,
                limit_bytes=RESULT_LOG_LIMIT,
                tail_lines=tail_lines,
            )
        except KubeApiError as exc:
            log.info("cannot read the log of probe pod %s: %s", name, exc)
            return ""
        return text.text

    def _fail(
        self,
        rel: str,
        code: str,
        message: str,
        *,
        summary: object = None,
        retryable: bool = False,
    ) -> ProbeFailed:
        self.codes[rel] = code
        outcome = _OUTCOMES.get(code, "failed")
        self.metrics.count_probe(self.bundle.namespace, self.bundle.name, outcome)
        return ProbeFailed(rel, message, retryable=retryable, summary=summary)  # type: ignore[arg-type]


# The probes counter's outcome per failure code; the rest are "failed".
_OUTCOMES: Final = {
    ProbeFailure.ARTIFACT_REFUSED.value: "rejected",
    ProbeFailure.DEADLINE_EXCEEDED.value: "timed_out",
}


def waiting_message(entry: Waiting) -> str:
    """The failure's sentence and when the artifact is tried again; the same on every pass of
    one wait, so a pass that skips the artifact does not rewrite the status."""
    when = entry.due_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    suffix = f" (attempt {entry.attempts}; next attempt after {when})"
    # The status cuts long messages at the end: shorten the sentence so the suffix stays.
    return shorten(entry.message, MAX_ITEM_MESSAGE_CHARS - len(suffix)) + suffix


def _jars(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.jar")
        if p.is_file() and not p.is_symlink()
    )


def _name(job: Mapping[str, object]) -> str:
    meta = job.get("metadata")
    return str(meta.get("name")) if isinstance(meta, dict) else ""


def _running(job: Mapping[str, object]) -> bool:
    """Neither finished (Complete or Failed) nor being deleted."""
    meta = job.get("metadata")
    if isinstance(meta, dict) and meta.get("deletionTimestamp"):
        return False
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions or ():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return False
    return True
