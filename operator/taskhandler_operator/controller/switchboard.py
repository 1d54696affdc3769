"""The kopf handlers: the only module that imports kopf. Each is a guard and one call.

* ``startup``: kopf's settings (standalone, no scanning, our finalizer and annotation prefix,
  watch timeouts, Event reporting component, server-side label selectors: bundles of this
  shard only, probe Jobs and pods of every shard).
* ``login``: explicit kubeconfig or service-account login (never kopf's piggy-backing); the
  service-account login talks to ``$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` like
  client-go's in-cluster config, not kopf's fixed ``kubernetes.default.svc`` (which needs
  cluster DNS: a host-network pod or a node without it cannot resolve the name).
  kopf is given its HTTP session with a bounded connection pool (:func:`bounded_session`).
* ``reconcile`` (a daemon per TaskHandlerBundle): :func:`~.bundle.run_bundle`, the bundle's
  only reconciler, so its work is serialized while bundles proceed in parallel.
* ``create``/``update``/``resume``: wake the daemon (a spec change, the reconcile-now
  annotation, an operator restart).
* ``probe_jobs``/``probe_pods``: kopf indices of probe Jobs and their pods (small views of
  each, :func:`~taskhandler_operator.kube.probe_job.job_view`/``pod_view``), which the prober
  reads instead of polling the API (:class:`~.probing.JobSignals`, attached at start-up).
* ``job_event``/``pod_event``: a probe Job or its pod changed: wake the coroutine waiting for
  it, or the owner bundle when its Job finished.
* ``delete``: :func:`~.bundle.delete_bundle` (deletionPolicy), then kopf drops the finalizer.
* ``probe``: the heartbeats behind the liveness endpoint.

Handlers return None, so kopf writes nothing into status; its own bookkeeping goes to
annotations under ``kopf.langsdk.dev``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import kopf

from taskhandler_operator.controller.bundle import (
    BundleInputs,
    delete_bundle,
    run_bundle,
    slim_managed_fields,
)
from taskhandler_operator.controller.holds import run_held
from taskhandler_operator.controller.runtime import OperatorRuntime
from taskhandler_operator.controller.shardsync import bundle_deleted, bundle_selector
from taskhandler_operator.db.engine import DatabaseError
from taskhandler_operator.kube import names
from taskhandler_operator.kube.probe_job import job_view, pod_job_name, pod_view

__all__ = [
    "SwitchboardConfig",
    "bounded_session",
    "build_registry",
    "bundle_selector",
    "configure",
]

log = logging.getLogger(__name__)

JOB_SELECTOR = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
#: Probe Jobs and their pods carry both labels; the watches ask the apiserver for those only.
PROBE_LABELS = {names.LABEL_MANAGED_BY: names.MANAGER, names.LABEL_NAME: names.PROBE_APP}
PROBE_SELECTOR = ",".join(f"{key}={value}" for key, value in PROBE_LABELS.items())
JOBS = ("batch", "v1", "jobs")
PODS = ("v1", "pods")
BUNDLES = (names.GROUP, names.VERSION, names.PLURAL)
FINALIZER = f"{names.GROUP}/finalizer"
#: Seconds between attempts of a deletion whose database cleanup failed.
CLEANUP_RETRY = 15
REQUESTED_AT = names.ANNOTATION_RECONCILE_REQUESTED_AT
KOPF_PREFIX = f"kopf.{names.GROUP}"

#: Connections kopf's requests (patches, Events) share besides its watch streams. kopf's own
#: session has no limit and asyncio gives every TLS connection a 256 KiB read buffer: at
#: start-up kopf patches every bundle at once (finalizer, then its annotations), one connection
#: each, which cost about 0.3 MiB of peak RSS per bundle (docs/operations.md). Requests beyond
#: the limit wait for a free connection instead.
KOPF_REQUEST_CONNECTIONS = 16
#: kopf's watch streams per watched namespace (or for the whole cluster): bundles, Jobs, pods.
KOPF_WATCHES_PER_SCOPE = 3


@dataclass(frozen=True)
class SwitchboardConfig:
    runtime: OperatorRuntime
    kubeconfig: str | None = None  # None: in-cluster service account
    daemon_stop_seconds: float = 10.0


def configure(settings: kopf.OperatorSettings, shard: str = "") -> None:
    """kopf's settings for this operator (docs/operator.md explains each)."""
    settings.peering.standalone = True  # leader election is ours (the Lease), not peering
    settings.scanning.disabled = True  # the RBAC grants no CRD/namespace listing
    settings.persistence.finalizer = FINALIZER
    # kopf's own bookkeeping under a sub-prefix: kopf leaves annotations under its storage
    # prefix out of every diff, which would hide langsdk.dev/reconcile-requested-at.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=KOPF_PREFIX, v1=False
    )
    # The shard label is left out of the diff: moving a bundle to another shard changes nothing
    # a pass reads, and as a diff it would cost the new shard an update handler and a write of
    # this annotation per moved bundle, all at its start (docs/operator.md, "Shards").
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX,
        key="last-handled-configuration",
        v1=False,
        ignored_fields=[("metadata", "labels", names.LABEL_SHARD)],
    )
    settings.posting.reporting_component = names.MANAGER
    settings.posting.level = logging.WARNING  # our Events are posted by the reconciler
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 310
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.watching.label_selectors["batch", "jobs"] = JOB_SELECTOR
    settings.watching.label_selectors[PODS] = PROBE_SELECTOR
    # The apiserver filters the bundles: a bundle of another shard is never sent, decoded or
    # kept in kopf's memory here. A relabelled bundle leaves the old shard's watch as DELETED.
    # Probe Jobs and pods stay unfiltered by shard: a shard that takes a bundle over adopts the
    # Jobs the previous shard created (docs/operator.md, "Shards").
    settings.watching.label_selectors[BUNDLES] = bundle_selector(shard)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The apiserver URL a pod is given (client-go's ``rest.InClusterConfig``); None without
    ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"


def build_registry(config: SwitchboardConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    runtime = config.runtime
    bundles = BUNDLES

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        configure(settings, runtime.settings.shard)
        # kopf's live indices (passed by their ids); it fills them from its watches before
        # any resource handler runs.
        runtime.signals.attach(kwargs["probe_jobs"], kwargs["probe_pods"])

    @kopf.index(*JOBS, registry=registry, id="probe_jobs", labels=PROBE_LABELS)
    async def probe_jobs(
        body: kopf.Body, namespace: str | None, name: str | None, **_: Any
    ) -> dict[Any, Any] | None:
        if not namespace or not name:
            return None
        return {(namespace, name): job_view(body)}

    @kopf.index(*PODS, registry=registry, id="probe_pods", labels=PROBE_LABELS)
    async def probe_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, Any] | None:
        job = pod_job_name(body)
        if not namespace or job is None:
            return None
        return {(namespace, job): pod_view(body)}

    @kopf.on.event(*PODS, registry=registry, id="pod_event", labels=PROBE_LABELS)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        pod = event.get("object") or {}
        namespace = (pod.get("metadata") or {}).get("namespace")
        job = pod_job_name(pod)
        if namespace and job:
            runtime.signals.changed(namespace, job)

    # The watch streams hold their connections for good, so the limit is on top of them.
    connections = KOPF_REQUEST_CONNECTIONS + KOPF_WATCHES_PER_SCOPE * max(
        1, len(runtime.settings.namespaces)
    )

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
        info: kopf.ConnectionInfo | None
        if config.kubeconfig is None:
            info = kopf.login_with_service_account(**kwargs)
            server = in_cluster_server(os.environ)
            if info is not None and server is not None:
                info = dataclasses.replace(info, server=server)
        else:
            info = kopf.login_with_kubeconfig(**kwargs)
        return None if info is None else bounded_session(info, connections)

    @kopf.daemon(
        *bundles,
        registry=registry,
        id="reconcile",
        cancellation_timeout=config.daemon_stop_seconds,
    )
    async def reconcile(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        namespace, name = body.metadata.namespace or "", body.metadata.name or ""
        hold = runtime.holds.take(namespace, name)
        # kopf's live view; each pass copies only what it reads (BundleInputs.from_body).
        await run_held(runtime.holds, hold, run_bundle(lambda: body, runtime, stopped.is_set))
        if hold.released.is_set() and not runtime.holds.holds(namespace, name):
            # Handed over to another shard: its series and Event memory go with it. Its
            # revisions stay: a probe Job the new holder adopts may still download from here.
            runtime.metrics.remove_bundle(namespace, name)
            runtime.kube.forget_events(namespace, name)

    @kopf.on.create(*bundles, registry=registry, id="wake-create")
    @kopf.on.update(*bundles, registry=registry, id="wake-update")
    @kopf.on.resume(*bundles, registry=registry, id="wake-resume")
    async def wake(namespace: str | None, name: str, reason: str, **_: Any) -> None:
        runtime.wakeups.wake(namespace or "", name, f"bundle {reason}")

    @kopf.on.event(*bundles, registry=registry, id="wake-on-vanish")
    async def vanished(event: kopf.RawEvent, **_: Any) -> None:
        # The event's own metadata (kopf's RawMeta is a TypedDict), edited in place below.
        meta = cast("dict[str, Any]", (event.get("object") or {}).get("metadata") or {})
        # kopf's event handlers run first, and kopf's daemon keeps this very object as the
        # bundle's live body until the next event: keep only the managedFields a pass reads
        # (a thousand bundles' full managedFields are about 16 MiB).
        slim_managed_fields(meta)
        if event.get("type") != "DELETED":
            return
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        # Gone from this shard's watch: deleted, or relabelled to another shard. kopf stops
        # the daemon of a deleted bundle only (controller/holds.py): stop a moved one here.
        if runtime.holds.release(namespace, name):
            log.info(
                "TaskHandlerBundle %s/%s left shard %s (deleted, or now another shard's)",
                namespace,
                name,
                runtime.settings.shard_name,
            )
        # A deleted bundle released its claims (or, gone without its finalizer running,
        # released nothing, but a claimant stalled on its claim may now take it over): let
        # every bundle look now. A relabelled one released nothing: wake none.
        if await bundle_deleted(runtime.kube, meta):
            runtime.wakeups.wake_all(f"{namespace}/{name} is gone")

    @kopf.on.event(
        "batch",
        "v1",
        "jobs",
        registry=registry,
        id="job_event",
        labels={names.LABEL_MANAGED_BY: names.MANAGER},
    )
    async def job_event(event: kopf.RawEvent, **_: Any) -> None:
        job = event.get("object") or {}
        meta = job.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not namespace or not name:
            return
        if runtime.signals.changed(namespace, name):
            return
        owner = meta.get("labels", {}).get(names.LABEL_BUNDLE)
        if not owner or not runtime.holds.holds(namespace, owner):
            # Every shard sees every probe Job (they are not filtered by shard): only the
            # shard holding the bundle counts its slots and wakes it.
            return
        finished = _finished(job)
        if finished or event.get("type") == "DELETED":
            # A Job no pass waits for (adopted after a restart, or left running by an earlier
            # pass) gives back the slot the pass's JobSlots.observe counted for it.
            runtime.slots.release((namespace, owner), name)
        if finished:
            runtime.wakeups.wake(namespace, owner, f"probe Job {name} finished")

    @kopf.on.delete(*bundles, registry=registry, id="deletion-policy")
    async def delete(body: kopf.Body, **_: Any) -> None:
        try:
            what = await delete_bundle(BundleInputs.from_body(body), runtime)
        except DatabaseError as exc:
            # Soon enough that a skip-cleanup annotation added meanwhile is acted on quickly.
            raise kopf.TemporaryError(
                f"database cleanup failed: {exc}", delay=CLEANUP_RETRY
            ) from exc
        log.info(
            "TaskHandlerBundle %s/%s deleted: %s", body.metadata.namespace, body.metadata.name, what
        )

    @kopf.on.probe(registry=registry, id="heartbeats")
    async def heartbeats(**_: Any) -> dict[str, Any]:
        live, checks = runtime.health.liveness()
        if not live:
            raise kopf.PermanentError(f"stale heartbeats: {checks}")
        return {name: check["ageSeconds"] for name, check in checks.items()}

    return registry


def bounded_session(info: kopf.ConnectionInfo, connections: int) -> kopf.AiohttpSession:
    """The session kopf would make from ``info`` (its TLS context, headers, proxy), but with at
    most ``connections`` connections open at once. Call it in the event loop."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


def _finished(job: Mapping[str, Any]) -> bool:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True
    return False
