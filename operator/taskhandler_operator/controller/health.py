"""``/metrics``, ``/healthz`` and ``/readyz`` on one small aiohttp server.

Liveness (``/healthz``) is built on heartbeats, not on "the HTTP server answers": kopf's own
liveness endpoint only proves its probing task runs, while a watch stream that died silently
(nolar/kopf#1276) leaves the operator alive and deaf. So each loop that must keep running bumps
a :class:`Heartbeat` (a monotonic timestamp) and ``/healthz`` fails (503) once any *armed*
heartbeat is older than its ``max_age``; the kubelet then restarts the pod. The elector's
heartbeat is armed from the start (a standby's election loop can die too); the operator's
watch/daemon heartbeat is armed only while this replica leads, because a standby runs no
watchers.

Readiness (``/readyz``) is true only while this replica is the leader, its startup finished and
it is live. A standby is deliberately *not ready*: the Service in front of the artifact server
then routes probe pods' downloads only to the leader, which holds the revisions. The cost: with
more than one replica, ``kubectl rollout status`` and ``helm --wait`` count the standby as
unavailable; the chart's default is one replica with the ``Recreate`` strategy, where this does
not arise. ``readiness=Readiness.STARTED`` (ready once started and live, leader or not) is there
for deployments that do want standbys counted as available.

Both endpoints answer JSON naming every check, so ``kubectl describe pod`` events and a
``curl`` show which heartbeat went stale.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler


class Heartbeat:
    """A monotonic timestamp bumped by a loop that must keep running."""

    def __init__(
        self,
        name: str,
        max_age: float,
        *,
        armed: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_age <= 0:
            raise ValueError(f"heartbeat {name!r}: max_age must be positive, got {max_age}")
        self.name = name
        self.max_age = max_age
        self._clock = clock
        self._armed = armed
        self._last = clock()

    def beat(self) -> None:
        self._last = self._clock()

    def arm(self) -> None:
        """Start checking (and count from now, so a long idle period is not held against it)."""
        self._last = self._clock()
        self._armed = True

    def disarm(self) -> None:
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def age(self) -> float:
        return self._clock() - self._last

    def fresh(self) -> bool:
        return not self._armed or self.age() <= self.max_age


class Readiness(enum.Enum):
    LEADER = "leader"
    """Ready while started, live and leading (the default)."""
    STARTED = "started"
    """Ready while started and live, leader or standby."""


@dataclass
class HealthState:
    """What the endpoints report; the operator updates it, the endpoints only read it."""

    heartbeats: list[Heartbeat] = field(default_factory=list)
    readiness: Readiness = Readiness.LEADER
    started: bool = False
    """Set once startup finished (database reachable, caches filled, watchers running)."""
    leading: Callable[[], bool] = lambda: False
    """Usually ``LeaderElector.is_leader`` (a property getter bound to the elector)."""

    def add(self, heartbeat: Heartbeat) -> Heartbeat:
        self.heartbeats.append(heartbeat)
        return heartbeat

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        checks = {
            hb.name: {
                "ok": hb.fresh(),
                "armed": hb.armed,
                "ageSeconds": round(hb.age(), 3),
                "maxAgeSeconds": hb.max_age,
            }
            for hb in self.heartbeats
        }
        return all(check["ok"] for check in checks.values()), checks

    def readiness_report(self) -> tuple[bool, dict[str, Any]]:
        live, checks = self.liveness()
        leading = self.leading()
        ready = live and self.started
        if self.readiness is Readiness.LEADER:
            ready = ready and leading
        report = {
            "live": live,
            "started": self.started,
            "leader": leading,
            "policy": self.readiness.value,
            "heartbeats": checks,
        }
        return ready, report


def build_app(state: HealthState, registry: CollectorRegistry) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, checks = state.liveness()
        return web.json_response(
            {"status": "ok" if ok else "stale", "heartbeats": checks}, status=200 if ok else 503
        )

    async def readyz(_: web.Request) -> web.Response:
        ok, report = state.readiness_report()
        report["status"] = "ready" if ok else "not ready"
        return web.json_response(report, status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app


class HealthServer:
    """Serves :func:`build_app` on ``host:port`` (port 0 picks a free one, see ``port``)."""

    def __init__(
        self, state: HealthState, registry: CollectorRegistry, *, host: str, port: int
    ) -> None:
        # No default host: in a pod it must be all interfaces (the kubelet probes the pod IP),
        # in tests and on a laptop loopback; the caller decides.
        self._runner = web.AppRunner(build_app(state, registry), access_log=None)
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise OSError(
                exc.errno, f"health endpoint cannot listen on {self._host}:{self._port}: {exc}"
            ) from None
        address = self._runner.addresses[0]
        self.port = int(address[1])
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()
