"""Everything the operator's handlers share, built once from the settings (no kopf here).

:class:`OperatorRuntime` holds the database engine and store (with the one stub inventory every
bundle shares), the revision store and the artifact server probe pods download from, the
Kubernetes API wrapper, metrics and health endpoints, the per-bundle wake-ups, the operator-wide
probe-Job cap, and the :class:`InventoryPoller`: one cheap poll of Airflow's serialized Dags for
the whole operator that wakes only the bundles whose queues' stubs changed.

``async with OperatorRuntime.open(...)`` starts the servers and the poller and stops them in
reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.airflow.serialized import DagStubs
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.controller.backoff import BundleKey, JobSlots, PassGate, Wakeups
from taskhandler_operator.controller.health import (
    HealthServer,
    HealthState,
    Heartbeat,
    PassWatch,
    tick,
)
from taskhandler_operator.controller.holds import Holds
from taskhandler_operator.controller.kubeapi import KubeApi
from taskhandler_operator.controller.logs import Redactor
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.controller.probing import JobSignals
from taskhandler_operator.db.engine import DatabaseError, DatabaseTimeouts, create_engine
from taskhandler_operator.db.fence import Fence
from taskhandler_operator.db.inventory import InventoryDelta
from taskhandler_operator.db.watermark import RowsWatermark
from taskhandler_operator.kube.probe_job import ProbePodSettings
from taskhandler_operator.reconcile.store import DatabaseStore
from taskhandler_operator.settings import Settings
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.mirrors import mirror_dirs
from taskhandler_operator.sources.server import ArtifactServer
from taskhandler_operator.sources.signing import generate_key
from taskhandler_operator.sources.store import RevisionStore

__all__ = [
    "InventoryPoller",
    "OperatorRuntime",
    "RuntimeOptions",
    "affected_queues",
    "database_timeouts",
]

log = logging.getLogger(__name__)

#: Seconds between two polls of Airflow's serialized Dags.
INVENTORY_POLL_SECONDS = 15.0
#: How old the inventory an unchanged pass compares against may be: with a thousand bundles
#: passing every minute, one cheap query (a row per live Dag) a second instead of ~17.
INVENTORY_MAX_AGE_SECONDS = 1.0


@dataclass(frozen=True)
class RuntimeOptions:
    """What ``run`` knows beyond :class:`~taskhandler_operator.settings.Settings`."""

    cluster_id: str
    operator_image: str = "taskhandler-operator"
    health_host: str = "0.0.0.0"  # noqa: S104 - the kubelet probes the pod IP
    inventory_poll_seconds: float = INVENTORY_POLL_SECONDS
    pod_settings: ProbePodSettings = field(default_factory=ProbePodSettings)


def database_timeouts(settings: Settings) -> DatabaseTimeouts:
    """The bounds of every database wait, from the settings."""
    return DatabaseTimeouts(
        connect=settings.database_connect_timeout,
        statement=settings.database_statement_timeout,
        lock=settings.database_lock_timeout,
        idle_in_transaction=settings.database_idle_in_transaction_timeout,
        tcp_user_timeout=settings.database_tcp_user_timeout,
        keepalives_idle=settings.database_keepalives_idle,
    )


def affected_queues(
    delta: InventoryDelta, before: Mapping[str, DagStubs], after: Mapping[str, DagStubs]
) -> set[str]:
    """The stub queues of the Dags a refresh changed or removed (before and after the change:
    a stub moved from one queue to another concerns both)."""
    queues: set[str] = set()
    for dag_id in (*delta.changed, *delta.removed):
        for snapshot in (before, after):
            dag = snapshot.get(dag_id)
            if dag is not None:
                queues.update(stub.queue for stub in dag.stubs)
    return queues


class InventoryPoller:
    """Refreshes the shared stub inventory and wakes the bundles serving the changed queues.

    The store's own refreshes go through :meth:`refresh` too, so a change one pass notices
    still wakes the other bundles it concerns. Only the refresh a pass plans with spares its
    caller; the one it validates with, after the plan, wakes the caller as well.
    """

    def __init__(self, store: DatabaseStore, wakeups: Wakeups) -> None:
        self.store = store
        self.wakeups = wakeups
        self.queues_of: dict[BundleKey, frozenset[str]] = {}
        self.polls = 0
        self.refreshed_at: float | None = None  # monotonic time of the last refresh

    def serve(self, bundle: BundleKey, queues: frozenset[str]) -> None:
        self.queues_of[bundle] = queues

    def forget(self, bundle: BundleKey) -> None:
        self.queues_of.pop(bundle, None)

    async def refresh(
        self, caller: BundleKey | None = None, *, max_age: float = 0.0
    ) -> Mapping[str, DagStubs]:
        """The inventory, refreshed unless the last refresh is younger than ``max_age`` seconds
        (a change it misses is found by the next refresh, which wakes the bundles it concerns:
        the short cut of an unchanged pass reads it this way, the whole path never does)."""
        now = time.monotonic()
        if max_age > 0 and self.refreshed_at is not None and now - self.refreshed_at < max_age:
            return self.store.inventory.dags
        before = self.store.inventory.dags
        after = await self.store.stub_inventory()
        self.refreshed_at = now
        delta = self.store.last_delta
        self.polls += 1
        if delta is not None and (delta.changed or delta.removed) and before:
            changed = affected_queues(delta, before, after)
            for bundle, queues in self.queues_of.items():
                if bundle != caller and queues & changed:
                    self.wakeups.wake(*bundle, "stub inventory changed")
        return after

    async def run(self, interval: float, heartbeat: Heartbeat | None = None) -> None:
        while True:
            try:
                await self.refresh()
            except DatabaseError as exc:
                log.warning("stub inventory poll failed: %s", exc)
            if heartbeat is not None:
                heartbeat.beat()
            await asyncio.sleep(interval)


class BundleStore:
    """The reconcile ``Store`` of one bundle: the shared store, with inventory refreshes going
    through the poller (so they wake the other bundles a change concerns)."""

    def __init__(self, poller: InventoryPoller, bundle: BundleKey) -> None:
        self._poller = poller
        self._store = poller.store
        self._bundle = bundle

    async def known_artifacts(self, bundle_name: str) -> Any:
        return await self._store.known_artifacts(bundle_name)

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        return await self._store.requested_dag_ids(bundle_name)

    async def stub_inventory(self) -> Mapping[str, DagStubs]:
        # The validate step's refresh, after the plan chose which Dags probes are asked about:
        # a change it finds was not in the plan, so it wakes this bundle too (another pass
        # plans with it; the test runtimes that filter dag_ids showed a new Dag never probed).
        return await self._poller.refresh()

    async def write(self, bundle_pass: Any) -> Any:
        return await self._store.write(bundle_pass)

    async def recent_stub_inventory(self) -> Mapping[str, DagStubs]:
        return await self._poller.refresh(self._bundle, max_age=INVENTORY_MAX_AGE_SECONDS)

    async def rows_watermark(
        self, bundle_name: str, dag_ids: Sequence[str], queues: Sequence[str]
    ) -> RowsWatermark:
        return await self._store.rows_watermark(bundle_name, dag_ids, queues)


@dataclass
class OperatorRuntime:
    settings: Settings
    options: RuntimeOptions
    engine: AsyncEngine
    store: DatabaseStore
    revisions: RevisionStore
    artifacts: ArtifactServer
    kube: KubeApi
    metrics: Metrics
    health: HealthState
    wakeups: Wakeups
    slots: JobSlots
    signals: JobSignals
    poller: InventoryPoller
    redactor: Redactor
    reconciler_heartbeat: PassWatch
    """Armed while leading; each bundle daemon marks its passes with ``busy``."""
    fence: Fence
    volumes: VolumeAccess = field(default_factory=VolumeAccess)
    holds: Holds = field(default_factory=Holds)
    # Whole passes at once: a start's thousand first passes one after another, not all at once.
    whole_passes: PassGate = field(default_factory=PassGate)

    @property
    def runtime_images(self) -> dict[Language, str]:
        images = self.settings.runtime_images
        out = {
            Language.GO: images.go,
            Language.JAVA: images.java,
            Language.TYPESCRIPT: images.typescript,
        }
        return {lang: image for lang, image in out.items() if image}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        options: RuntimeOptions,
        api_client: ApiClient,
        *,
        redactor: Redactor | None = None,
        health: HealthState | None = None,
        metrics: Metrics | None = None,
    ) -> AsyncIterator[OperatorRuntime]:
        url = settings.resolved_database_url()
        if url is None:
            raise ValueError(
                "no database URL: set THOP_DATABASE_URL (--database-url) or "
                "THOP_DATABASE_URL_FILE (--database-url-file)"
            )
        redactor = redactor or Redactor()
        metrics = metrics or Metrics(shard=settings.shard_name)
        health = health or HealthState()
        wakeups = Wakeups()
        signals = JobSignals()

        def freed(bundle: BundleKey) -> None:
            signals.freed.set()
            wakeups.wake(*bundle, "probe slot free")

        slots = JobSlots(settings.probe_parallelism, on_freed=freed)
        engine = create_engine(url, timeouts=database_timeouts(settings))
        fence = Fence(options.cluster_id)
        store = DatabaseStore(engine, fence=fence)
        revisions = RevisionStore(Path(settings.revision_store), keep=settings.revisions_kept)
        await revisions.open()
        host, _, port = settings.artifact_server_bind.rpartition(":")
        public = str(settings.artifact_server_url) if settings.artifact_server_url else None
        artifacts = ArtifactServer(
            revisions,
            # A key from a file (a Secret) survives a restart, so the URLs in the Jobs a new
            # leader adopts stay valid; a generated one does not (adopted Jobs get 403).
            settings.resolved_signing_key() or generate_key(),
            host=host or "0.0.0.0",  # noqa: S104 - probe pods reach it over the pod network
            port=int(port),
            public_url=public,
            on_request=lambda outcome: metrics.count_artifact_request(outcome),
        )
        kube = KubeApi(api_client, max_workers=8, redactor=redactor)
        poller = InventoryPoller(store, wakeups)
        # A poll cycle must fit in the limit however short a test makes it.
        heartbeat = health.add(
            Heartbeat(
                "inventory",
                max(settings.liveness_inventory_seconds, options.inventory_poll_seconds * 2),
            )
        )
        loop_beat = health.add(Heartbeat("event-loop", settings.liveness_event_loop_seconds))
        reconciler = health.add(
            PassWatch("reconcilers", settings.liveness_pass_seconds, armed=False)
        )
        runtime = cls(
            settings=settings,
            options=options,
            engine=engine,
            store=store,
            revisions=revisions,
            artifacts=artifacts,
            kube=kube,
            metrics=metrics,
            health=health,
            wakeups=wakeups,
            slots=slots,
            signals=signals,
            poller=poller,
            redactor=redactor,
            reconciler_heartbeat=reconciler,
            fence=fence,
            volumes=VolumeAccess.for_operator(
                settings.volume_roots,
                store=revisions.root,
                secret_files=(settings.signing_key_file, settings.database_url_file),
            ),
        )
        _track(runtime)
        if settings.volume_roots:
            roots = ", ".join(str(r) for r in settings.volume_roots)
            log.info("volume sources may read below: %s", roots)
        else:
            log.info("no volume roots (THOP_VOLUME_ROOTS): volume sources are refused")
        servers: list[HealthServer] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            await artifacts.start()
            ports = dict.fromkeys((settings.health_port, settings.metrics_port))
            for port_number in ports:
                server = HealthServer(
                    health, metrics.registry, host=options.health_host, port=port_number
                )
                await server.start()
                servers.append(server)
            tasks.append(
                asyncio.create_task(
                    tick(loop_beat, min(1.0, settings.liveness_event_loop_seconds / 4)),
                    name="event-loop-ticker",
                )
            )
            tasks.append(
                asyncio.create_task(
                    poller.run(options.inventory_poll_seconds, heartbeat), name="inventory-poller"
                )
            )
            yield runtime
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            for server in servers:
                await server.stop()
            await artifacts.stop()
            await revisions.close()
            await kube.aclose()
            await engine.dispose()


def _track(runtime: OperatorRuntime) -> None:
    """What the operator keeps per bundle or per Job, as the ``tracked_entries`` gauge: each
    goes back to the live bundles' count when bundles are deleted (tests/e2e check it)."""
    metrics, revisions = runtime.metrics, runtime.revisions
    metrics.track("wakeups", lambda: len(runtime.wakeups))
    metrics.track("holds", lambda: len(runtime.holds))
    metrics.track("probe_slots", lambda: runtime.slots.in_use)
    metrics.track("probe_slot_bundles", lambda: runtime.slots.bundles)
    metrics.track("job_signals", lambda: len(runtime.signals))
    metrics.track("inventory_bundles", lambda: len(runtime.poller.queues_of))
    metrics.track("revision_locks", lambda: revisions.lock_count)
    metrics.track("revision_holds", lambda: revisions.hold_count)
    metrics.track("revision_removals", lambda: revisions.removal_count)
    metrics.track("event_memory", lambda: runtime.kube.events_remembered)
    metrics.track("bundle_series", lambda: metrics.bundle_series())
    metrics.track("git_mirrors", lambda: len(mirror_dirs(revisions.mirrors_dir)))
