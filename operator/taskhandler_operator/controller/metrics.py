"""The operator's Prometheus metrics, on an injectable registry.

Every metric is created on the :class:`~prometheus_client.CollectorRegistry` given to
:class:`Metrics` (tests pass a fresh one; the operator passes its own, served by
``controller.health``), never on the library's global default registry, so two operators in one
test process do not collide.

Label values are checked: ``outcome``/``kind``/``source`` must be short snake_case words from
the caller's fixed vocabulary, never free text such as an error message, which would create one
time series per distinct message. A deleted bundle's series are dropped by
:meth:`Metrics.remove_bundle`, so the metric set does not grow with every bundle ever seen.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "taskhandler_operator"

# Reconciles range from a cached pass (tens of ms) to a pass that waits for probe Jobs (minutes).
RECONCILE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

_WORD = re.compile(r"[a-z][a-z0-9_]{0,31}")

BUNDLE_LABELS = ("namespace", "name")


def _word(label: str, value: str) -> str:
    if not _WORD.fullmatch(value):
        raise ValueError(
            f"metric label {label}={value!r} must be a short snake_case word (at most 32 "
            "characters), not free text"
        )
    return value


class Metrics:
    """The metric families; one instance per operator process."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
        shard: str = "default",
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        r = self.registry
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one reconcile pass of a TaskHandlerBundle, by outcome.",
            [*BUNDLE_LABELS, "outcome"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.probes = Counter(
            f"{PREFIX}_probes",
            "Probe Jobs finished, by outcome (accepted, rejected, failed, timed_out, ...).",
            [*BUNDLE_LABELS, "outcome"],
            registry=r,
        )
        self.jobs_running = Gauge(
            f"{PREFIX}_probe_jobs_running",
            "Probe Jobs of the bundle currently running (created or adopted, not finished).",
            BUNDLE_LABELS,
            registry=r,
        )
        self.ready = Gauge(
            f"{PREFIX}_bundle_ready",
            "1 while the bundle's Ready condition is True, else 0 (suspended, stalled, failing).",
            BUNDLE_LABELS,
            registry=r,
        )
        self.bindings = Gauge(
            f"{PREFIX}_bindings",
            "Binding rows (dag_id, task_id) -> artifact the bundle has published.",
            BUNDLE_LABELS,
            registry=r,
        )
        self.last_success = Gauge(
            f"{PREFIX}_last_successful_sync_timestamp_seconds",
            "Unix time of the bundle's last reconcile pass that published successfully.",
            BUNDLE_LABELS,
            registry=r,
        )
        self.source_errors = Counter(
            f"{PREFIX}_source_errors",
            "Failed source syncs, by source type (git, http, s3, volume) and error kind.",
            [*BUNDLE_LABELS, "source", "kind"],
            registry=r,
        )
        self.artifact_requests = Counter(
            f"{PREFIX}_artifact_server_requests",
            "Requests to the artifact server, by outcome (ok, not_found, forbidden, ...).",
            ["outcome"],
            registry=r,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica holds its shard's leader Lease, else 0 (shard: the shard's "
            "name, default for the default shard).",
            ["shard"],
            registry=r,
        )
        # One series from the start (0 until elected), so a standby reports its shard.
        self._leader = self.leader.labels(shard)
        self._leader.set(0)
        self.tracked = Gauge(
            f"{PREFIX}_tracked_entries",
            "Entries the operator keeps in memory or on disk per bundle or Job, by structure; "
            "back at the live bundles' count after deletions (a leak shows as growth).",
            ["structure"],
            registry=r,
        )
        self.publications = Counter(
            f"{PREFIX}_publications",
            "Publications of the bundle's bindings, by kind (published, approved, rolled_back).",
            [*BUNDLE_LABELS, "kind"],
            registry=r,
        )
        self.publication_held = Gauge(
            f"{PREFIX}_publication_held",
            "1 while the bundle's publish policy holds a change (or a rollback keeps one "
            "back), else 0.",
            BUNDLE_LABELS,
            registry=r,
        )
        self.publication_held_since = Gauge(
            f"{PREFIX}_publication_held_since_timestamp_seconds",
            "Unix time the change held now was first held; 0 when none is held.",
            BUNDLE_LABELS,
            registry=r,
        )
        self._per_bundle: tuple[Counter | Gauge | Histogram, ...] = (
            self.reconcile_duration,
            self.probes,
            self.jobs_running,
            self.ready,
            self.bindings,
            self.last_success,
            self.source_errors,
            self.publications,
            self.publication_held,
            self.publication_held_since,
        )

    def observe_reconcile(self, namespace: str, name: str, outcome: str, seconds: float) -> None:
        labels = (namespace, name, _word("outcome", outcome))
        self.reconcile_duration.labels(*labels).observe(seconds)

    def count_probe(self, namespace: str, name: str, outcome: str) -> None:
        self.probes.labels(namespace, name, _word("outcome", outcome)).inc()

    def set_jobs_running(self, namespace: str, name: str, count: int) -> None:
        self.jobs_running.labels(namespace, name).set(count)

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        self.ready.labels(namespace, name).set(1 if ready else 0)

    def set_bindings(self, namespace: str, name: str, count: int) -> None:
        self.bindings.labels(namespace, name).set(count)

    def mark_synced(self, namespace: str, name: str, at: float | None = None) -> None:
        self.last_success.labels(namespace, name).set(self._clock() if at is None else at)

    def count_source_error(self, namespace: str, name: str, source: str, kind: str) -> None:
        labels = (namespace, name, _word("source", source), _word("kind", kind))
        self.source_errors.labels(*labels).inc()

    def count_publication(self, namespace: str, name: str, kind: str) -> None:
        self.publications.labels(namespace, name, _word("kind", kind)).inc()

    def set_publication_held(self, namespace: str, name: str, since: float | None) -> None:
        """A change is held since ``since`` (Unix time), or none (None)."""
        self.publication_held.labels(namespace, name).set(0 if since is None else 1)
        self.publication_held_since.labels(namespace, name).set(since or 0)

    def count_artifact_request(self, outcome: str) -> None:
        self.artifact_requests.labels(_word("outcome", outcome)).inc()

    def set_leader(self, leading: bool) -> None:
        self._leader.set(1 if leading else 0)

    def track(self, structure: str, size: Callable[[], float]) -> None:
        """Report ``size()`` (read at every scrape) as the tracked entries of ``structure``."""
        self.tracked.labels(_word("structure", structure)).set_function(size)

    def bundle_series(self) -> int:
        """Per-bundle time series currently exported (all per-bundle metrics together)."""
        return sum(
            len({tuple(sample.labels[k] for k in BUNDLE_LABELS) for sample in family.samples})
            for metric in self._per_bundle
            for family in metric.collect()
        )

    def remove_bundle(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted bundle (all outcomes, kinds and sources)."""
        for metric in self._per_bundle:
            metric.remove_by_labels({"namespace": namespace, "name": name})
