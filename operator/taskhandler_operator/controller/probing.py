"""The ``Prober`` port in a cluster: one probe Job per artifact, read back when it finishes.

For each artifact the pass wants probed, :class:`JobProber`:

1. signs URLs on the artifact server for the files the probe pod downloads (the artifact; for
   Java every ``*.jar`` of the revision, the bundle's classpath), each with its sha256;
2. builds the Job with :func:`~taskhandler_operator.kube.probe_job.build_probe_job` (its name
   is deterministic and hashes the pod template, so a restarted operator adopts the Job it
   created before, and a changed spec gets a new Job);
3. takes a slot (at most ``probe.parallelism`` Jobs of the bundle, and the operator-wide cap of
   :class:`~taskhandler_operator.controller.backoff.JobSlots`), creates the Job or adopts the
   one of that name, only when it was built from the same template and owner
   (:func:`~taskhandler_operator.kube.probe_job.adoptable`);
4. follows it through kopf's watches of probe Jobs and their pods (:class:`JobSignals` reads
   the two indices the switchboard registers; their events wake the waiting coroutine): no
   request while it runs, one read of the Job if no event came for :data:`RESYNC_SECONDS`, and
   one list of its pods only when the Job's end arrives before its pod's;
5. reads the probe container's termination message (from the pod) and its log once, streamed
   with a cap, keeping only the result line (:class:`~taskhandler_operator.protocol.summary.
   ResultScanner`), and accepts the result only when it hashes to the summary's sha256; a
   failed Job becomes a ``ProbeFailed`` with :func:`~taskhandler_operator.kube.probe_job.
   job_outcome`'s reason.

A failure that says nothing about the artifact (``retryable``: a fetch that failed, a lost pod,
an apiserver or kubelet that failed while the Job was created or its log read —
``TransientApiError``) is not final: with ``retries`` (the bundle's :class:`~taskhandler_operator.
controller.backoff.ProbeRetries`) the artifact is probed again only after a capped, jittered
back-off, and its message says when. A transient failure keeps the finished Job, so the next
attempt adopts it and reads its log again rather than probing again.

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
from typing import Any, Final

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.controller.backoff import BundleKey, JobSlots, ProbeRetries, Waiting
from taskhandler_operator.controller.kubeapi import (
    ApiUnavailable,
    KubeApi,
    KubeApiError,
    NotFound,
)
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.kube import names
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
    adoptable,
    build_probe_job,
    job_outcome,
    job_view,
    pod_settled,
    pod_view,
    probe_job_selector,
)
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec
from taskhandler_operator.kube.status import MAX_ITEM_MESSAGE_CHARS, shorten
from taskhandler_operator.protocol.summary import (
    ProbeSummary,
    ResultRejected,
    ResultScanner,
    accept_result_line,
)
from taskhandler_operator.reconcile.models import ProbeAccepted, ProbeFailed, ProbeRequest
from taskhandler_operator.sources.server import ArtifactServer

__all__ = ["JobProber", "JobSignals", "waiting_message"]

log = logging.getLogger(__name__)

#: Seconds between reads of a running Job when there is no watch (tests, or before kopf's
#: indices are attached).
POLL_SECONDS = 10.0
#: With the watch: seconds without any event about a running Job after which it is read once
#: (a safety net; kopf re-establishes broken watches itself).
RESYNC_SECONDS = 300.0
#: Seconds a finished Job waits for its pod's end to arrive on the pod watch before the pod is
#: listed once instead.
POD_GRACE_SECONDS = 10.0
#: Most of a probe log read (streamed: only the result line is kept, see RESULT_LINE_LIMIT).
RESULT_LOG_LIMIT = 64 * 1024 * 1024
#: Longest result line kept when the summary does not say its size (a result is one frame).
RESULT_LINE_LIMIT = 32 * 1024 * 1024
#: Lines of a failed probe's log quoted in its message.
FAILURE_TAIL_LINES = 20
FAILURE_TAIL_BYTES = 1024 * 1024
#: Failures that say nothing about the artifact: the Job is deleted so a later pass retries
#: (after the bundle's back-off for that artifact).
TRANSIENT = {
    ProbeFailure.POD_LOST.value,
    ProbeFailure.EVICTED.value,
    ProbeFailure.FETCH_FAILED.value,
    ProbeFailure.JOB_DELETED.value,
}
#: Failures of the operator's own calls, also retried after the back-off; the Job is kept (a
#: finished one is adopted by the next attempt, which reads it again).
API_FAILURES = {
    ProbeFailure.TRANSIENT_API_ERROR.value,
    ProbeFailure.LOG_UNREADABLE.value,
    ProbeFailure.JOB_CONFLICT.value,
}


class JobSignals:
    """Probe Jobs as the watch sees them, and the wake-ups of the coroutines waiting for them.

    The switchboard registers kopf indices of probe Jobs (``(namespace, name)`` → a
    :func:`~taskhandler_operator.kube.probe_job.job_view`) and of their pods (``(namespace,
    job name)`` → :func:`~taskhandler_operator.kube.probe_job.pod_view`), hands them over with
    :meth:`attach`, and calls :meth:`changed` on every event of either. Without indices (unit
    tests) :attr:`watching` is False and the prober polls.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self.freed = asyncio.Event()  # set whenever a probe slot may have freed up
        self._jobs: Mapping[Any, Any] | None = None
        self._pods: Mapping[Any, Any] | None = None

    def attach(self, jobs: Mapping[Any, Any], pods: Mapping[Any, Any]) -> None:
        """kopf's live indices (read-only mappings of key → store of values)."""
        self._jobs, self._pods = jobs, pods

    @property
    def watching(self) -> bool:
        return self._jobs is not None and self._pods is not None

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job as last seen by the watch, None when the watch has not (or no longer) seen it."""
        store = (self._jobs or {}).get((namespace, name))
        return next(iter(store), None) if store else None

    def jobs_of(self, namespace: str, bundle_uid: str) -> list[dict[str, Any]]:
        """The bundle's probe Jobs as last seen by the watch (its bundle-uid label)."""
        found: list[dict[str, Any]] = []
        for (job_namespace, _), store in (self._jobs or {}).items():
            if job_namespace != namespace:
                continue
            for view in store:
                labels = (view.get("metadata") or {}).get("labels") or {}
                if labels.get(names.LABEL_BUNDLE_UID) == bundle_uid:
                    found.append(view)
        return found

    def pod(self, namespace: str, job_name: str) -> dict[str, Any] | None:
        """The newest pod of the Job as last seen by the watch (with ``backoffLimit: 0`` there
        is one, unless one was deleted and replaced)."""
        store = (self._pods or {}).get((namespace, job_name))
        if not store:
            return None
        newest: dict[str, Any] = max(
            store, key=lambda p: str(p["metadata"].get("creationTimestamp") or "")
        )
        return newest

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

    async def wait(self, namespace: str, name: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait for an event about the Job (or its pod); False when ``timeout`` passed first."""
        event = self._events.setdefault((namespace, name), asyncio.Event())
        woken = True
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            woken = False
        event.clear()
        return woken

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
            job = await self._create_or_adopt(name, rel, manifest)
            if isinstance(job, ProbeFailed):
                return job
            limit = active_deadline_seconds(job_request) + 120
            self._count_running(+1)
            try:
                return await self._await_result(name, rel, limit, job)
            except ApiUnavailable as exc:
                return self._transient(rel, exc)
            finally:
                self._count_running(-1)
        finally:
            self.slots.release(self.key, name)
            self.signals.forget(self.bundle.namespace, name)
            self.signals.freed.set()

    async def _create_or_adopt(
        self, name: str, rel: str, manifest: dict[str, Any]
    ) -> dict[str, Any] | ProbeFailed:
        """The Job as created, or the existing one of that name when it may be adopted."""
        namespace = self.bundle.namespace
        try:
            created = await self.kube.create_job(namespace, manifest)
            if not created.created and not adoptable(created.job, manifest):
                # Same name, other template or owner: never read its answer as this one's. Ours
                # (our owner) goes; someone else's is left alone and reported.
                if _owned_by(created.job, self.bundle.uid):
                    log.info("probe Job %s was built from another template: replacing it", name)
                    await self.kube.delete_job(namespace, name)
                    created = await self.kube.create_job(namespace, manifest)
                if not created.created:
                    return self._fail(
                        rel,
                        ProbeFailure.JOB_CONFLICT.value,
                        f"a Job named {name} exists but was not built by this bundle from "
                        "this probe template; it will be tried again (delete that Job if "
                        "it is not this operator's)",
                        retryable=True,
                    )
        except ApiUnavailable as exc:
            return self._transient(rel, exc)
        if created.created:
            self.jobs_created.append(name)
            log.info("probe Job %s created for %s", name, rel)
        else:
            log.info("probe Job %s adopted for %s", name, rel)
        return job_view(created.job)

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
        Listed from the apiserver only when the Job watch's index shows one to count.
        Those this pass does not wait for give their slot back when their Job finishes
        (the Job watch, controller/switchboard.py)."""
        async with self._observing:
            if self._observed:
                return
            self._observed = True
            if self.signals.watching:
                # kopf fills its indices from each watch's first listing before it runs any
                # other handler (the bundles' loops included), then follows the watch's events,
                # so a Job the index does not show is not running. One it shows may be gone (a
                # watch restarted after 410 Gone lists again, without deletions): the list
                # below, the authority, is made only when the index shows one to count.
                shown = self.signals.jobs_of(self.bundle.namespace, self.bundle.uid)
                if not {_name(job) for job in shown if _running(job)} - self.slots.held(self.key):
                    return
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

    async def _await_result(
        self, name: str, rel: str, limit: float, created: dict[str, Any]
    ) -> ProbeAccepted | ProbeFailed:
        namespace = self.bundle.namespace
        loop = asyncio.get_running_loop()
        give_up = loop.time() + limit
        last: dict[str, Any] | None = created  # the Job as last known
        seen = False  # the watch has shown this Job
        quiet = False  # the last wait ended without any event
        pod_grace: float | None = None
        while True:
            if self.signals.watching:
                job = self.signals.job(namespace, name)
                if job is not None and not quiet:
                    seen, last = True, job
                elif seen or quiet:
                    # Gone from the watch, or no news for a long while: read it once.
                    job = await self._read_job(name)
                    last = job
                else:
                    job = last  # created a moment ago; the watch has not shown it yet
                pod = self.signals.pod(namespace, name) if job is not None else None
            else:
                job = await self._read_job(name)
                pod = await self._list_pod(name) if job is not None else None
            outcome = job_outcome(job, pod)
            if outcome.finished and job is not None and not pod_settled(job, pod):
                if self.signals.watching and pod_grace is None:
                    pod_grace = loop.time() + POD_GRACE_SECONDS
                if pod_grace is not None and loop.time() < pod_grace:
                    await self.signals.wait(namespace, name, pod_grace - loop.time())
                    continue
                pod = await self._list_pod(name)
                outcome = job_outcome(job, pod)
            if outcome.phase is ProbePhase.SUCCEEDED:
                assert outcome.summary is not None and pod is not None
                return await self._accept(rel, pod, outcome.summary)
            if outcome.phase is ProbePhase.FAILED:
                if pod is not None:
                    outcome = job_outcome(job, pod, await self._tail(pod))
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
            wait = RESYNC_SECONDS if self.signals.watching else self.poll_seconds
            wait = min(wait, max(give_up - loop.time(), 0.0))
            quiet = not await self.signals.wait(namespace, name, wait)

    async def _read_job(self, name: str) -> dict[str, Any] | None:
        try:
            return job_view(await self.kube.get_job(self.bundle.namespace, name))
        except NotFound:
            return None

    async def _list_pod(self, job_name: str) -> dict[str, Any] | None:
        pods = await self.kube.list_pods(self.bundle.namespace, f"job-name={job_name}")
        if not pods:
            return None
        # The newest pod: with backoffLimit 0 there is one, unless one was deleted and replaced.
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        return pod_view(pods[-1])

    async def _accept(
        self, rel: str, pod: Mapping[str, Any], summary: ProbeSummary
    ) -> ProbeAccepted | ProbeFailed:
        """Read the log once, streamed and bounded, keeping only the result line."""
        namespace = self.bundle.namespace
        pod_name = str((pod.get("metadata") or {}).get("name") or "")
        cap = summary.result_bytes if summary.result_bytes is not None else RESULT_LINE_LIMIT
        scanner = ResultScanner(max(1, min(cap, RESULT_LINE_LIMIT)))
        try:
            read = await self.kube.stream_container_log(
                namespace, pod_name, PROBE_CONTAINER, scanner.feed, limit_bytes=RESULT_LOG_LIMIT
            )
        except ApiUnavailable as exc:
            return self._transient(rel, exc, what="reading the probe's log")
        except NotFound as exc:
            # Its pod went (deleted, or the Job expired) before the log was read.
            return self._fail(
                rel,
                ProbeFailure.POD_LOST.value,
                f"the probe's log could not be read, its pod is gone ({exc}); it will be "
                "probed again",
                retryable=True,
            )
        except KubeApiError as exc:
            return self._fail(
                rel,
                ProbeFailure.LOG_UNREADABLE.value,
                f"the operator may not read the probe's log ({exc}); the artifact is not at "
                "fault; it will be tried again",
                retryable=True,
            )
        found = scanner.finish()
        try:
            if found is None and scanner.found_too_long:
                raise ResultRejected(f"the logged result is longer than the {cap} bytes expected")
            if found is None and read >= RESULT_LOG_LIMIT:
                raise ResultRejected(
                    f"no result in the first {RESULT_LOG_LIMIT} bytes of the probe's log"
                )
            line = None if found is None else found.decode("utf-8", "replace")
            result = await asyncio.to_thread(accept_result_line, line, summary)
        except ResultRejected as exc:
            return self._fail(rel, ProbeFailure.RESULT_REJECTED.value, str(exc))
        self.metrics.count_probe(namespace, self.bundle.name, "accepted")
        return ProbeAccepted(rel, result, summary=summary)

    async def _tail(self, pod: Mapping[str, Any]) -> str | None:
        """The end of a failed probe's log, quoted in its message; None when it cannot be read
        (the failure stands on the pod's state alone)."""
        name = str((pod.get("metadata") or {}).get("name") or "")
        try:
            text = await self.kube.read_container_log(
                self.bundle.namespace,
                name,
                PROBE_CONTAINER,
                # The apiserver cuts the tail's start at the limit: room for 20 long lines.
                limit_bytes=FAILURE_TAIL_BYTES,
                tail_lines=FAILURE_TAIL_LINES,
            )
        except KubeApiError as exc:
            log.info("cannot read the log of probe pod %s: %s", name, exc)
            return None
        return text.text

    def _transient(
        self, rel: str, exc: KubeApiError, what: str = "following the probe Job"
    ) -> ProbeFailed:
        return self._fail(
            rel,
            ProbeFailure.TRANSIENT_API_ERROR.value,
            f"{what} failed for a transient reason ({exc}); the artifact is not at fault and "
            "will be probed again",
            retryable=True,
        )

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


def _owned_by(job: Mapping[str, Any], uid: str) -> bool:
    refs = (job.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


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
