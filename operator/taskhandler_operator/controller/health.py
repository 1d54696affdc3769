"""``/metrics``, ``/healthz`` and ``/readyz`` on one small aiohttp server.

Liveness (``/healthz``) means "a loop of this process is stuck", never "no bundle was reconciled
lately": an idle leader with no bundles, or with every bundle's interval longer than any limit,
stays live for good. Each loop that must keep running is watched by a check that the loop itself
keeps fresh, and ``/healthz`` fails (503) once any *armed* check is older than its limit; the
kubelet then restarts the pod:

* ``event-loop``: :func:`tick` beats a :class:`Heartbeat` every second from a task on the
  operator's event loop. The server answers from its own thread and event loop, so a blocked
  operator loop reads as a named 503, not as a probe timeout.
* ``leader-election``: the elector's loop beats on every round (a standby's too).
* ``inventory``: the stub-inventory poller beats after every poll, failed or not.
* ``reconcilers``: a :class:`PassWatch`, armed while this replica leads. A bundle's daemon is
  stuck when one pass has run longer than the limit; a daemon that sleeps (its interval, a
  back-off) is by definition not stuck, however long it sleeps.

kopf's watch streams need no check of their own: kopf (>= 1.45) asks for bookmarks and
reconnects a stream that brought neither an event nor a bookmark for 70 s
(``settings.watching.inactivity_timeout``), which heals the silently dead stream of
nolar/kopf#1276 inside the process.

Every limit is a setting (``THOP_LIVENESS_*``, docs/settings.md).

Readiness (``/readyz``) is true only while this replica is the leader, its startup finished and
it is live. A standby is deliberately *not ready*: the Service in front of the artifact server
then routes probe pods' downloads only to the leader, which holds the revisions. The cost: with
more than one replica, ``kubectl rollout status`` and ``helm --wait`` count the standby as
unavailable; the chart's default is one replica with the ``Recreate`` strategy, where this does
not arise. ``readiness=Readiness.STARTED`` (ready once started and live, leader or not) is there
for deployments that do want standbys counted as available.

Both endpoints answer JSON naming every check, so ``kubectl describe pod`` events and a
``curl`` show which check went stale.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry

from taskhandler_operator.controller.exposition import encode_in_slices


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


class Check(Protocol):
    """What ``/healthz`` reads of a heartbeat-like check."""

    name: str
    max_age: float

    @property
    def armed(self) -> bool: ...

    def age(self) -> float: ...

    def fresh(self) -> bool: ...


_C = TypeVar("_C", bound=Check)


async def tick(heartbeat: Heartbeat, period: float = 1.0) -> None:
    """Beat ``heartbeat`` every ``period`` seconds for as long as the event loop runs this task
    (a blocked or starved loop stops beating). Cancel it to stop."""
    while True:
        heartbeat.beat()
        await asyncio.sleep(period)


class PassWatch:
    """The bundle daemons' check: each daemon marks its passes with :meth:`busy`; the check is
    stale once one pass has run longer than ``max_age``. Sleeping daemons (or none) are fresh."""

    def __init__(
        self,
        name: str,
        max_age: float,
        *,
        armed: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_age <= 0:
            raise ValueError(f"check {name!r}: max_age must be positive, got {max_age}")
        self.name = name
        self.max_age = max_age
        self._clock = clock
        self._armed = armed
        self._since: dict[Hashable, float] = {}

    @contextlib.contextmanager
    def busy(self, key: Hashable) -> Iterator[None]:
        """Mark one pass of the daemon ``key`` (a pass of the same key never overlaps)."""
        self._since[key] = self._clock()
        try:
            yield
        finally:
            self._since.pop(key, None)

    @contextlib.contextmanager
    def waiting(self, key: Hashable) -> Iterator[None]:
        """Inside :meth:`busy`: the pass of ``key`` waits for its turn (the whole-pass gate),
        which is not a pass that hangs; its age counts again from the end of the wait."""
        self._since.pop(key, None)
        try:
            yield
        finally:
            self._since[key] = self._clock()

    def arm(self) -> None:
        self._armed = True

    def disarm(self) -> None:
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    @property
    def running(self) -> int:
        """Passes running now."""
        return len(self._since)

    def age(self) -> float:
        """How long the oldest running pass has run (0 when none runs)."""
        oldest = min(self._since.values(), default=None)
        return 0.0 if oldest is None else self._clock() - oldest

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

    heartbeats: list[Check] = field(default_factory=list)
    readiness: Readiness = Readiness.LEADER
    started: bool = False
    """Set once startup finished (database reachable, caches filled, watchers running)."""
    leading: Callable[[], bool] = lambda: False
    """Usually ``LeaderElector.is_leader`` (a property getter bound to the elector)."""

    def add(self, check: _C) -> _C:
        self.heartbeats.append(check)
        return check

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

    async def metrics(request: web.Request) -> web.StreamResponse:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        # prometheus-client's name[] filter: only the families named (the benchmarks use it).
        names = request.query.getall("name[]", [])
        source = registry.restricted_registry(names) if names else registry
        content_type, pieces = encode_in_slices(source, accept)
        response = web.StreamResponse(headers={hdrs.CONTENT_TYPE: content_type})
        response.enable_compression()  # gzip when the scraper accepts it (Prometheus does)
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        return response

    app.router.add_get("/metrics", metrics)
    return app


class HealthServer:
    """Serves :func:`build_app` on ``host:port`` (port 0 picks a free one, see ``port``) from a
    thread with its own event loop, so it answers (503, naming ``event-loop``) while the
    operator's loop is blocked; it only reads :class:`HealthState` and the metrics registry."""

    def __init__(
        self, state: HealthState, registry: CollectorRegistry, *, host: str, port: int
    ) -> None:
        # No default host: in a pod it must be all interfaces (the kubelet probes the pod IP),
        # in tests and on a laptop loopback; the caller decides.
        self._state = state
        self._registry = registry
        self._host = host
        self._port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port: int | None = None

    async def start(self) -> int:
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name=f"health-{self._port}", daemon=True
        )
        self._thread.start()
        self.port = await asyncio.wrap_future(ready)
        return self.port

    def _serve(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run(loop, ready))
        except BaseException as exc:  # a failed start is raised by start()
            if not ready.done():
                ready.set_exception(exc)
        finally:
            loop.close()

    async def _run(
        self, loop: asyncio.AbstractEventLoop, ready: concurrent.futures.Future[int]
    ) -> None:
        runner = web.AppRunner(build_app(self._state, self._registry), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            try:
                await site.start()
            except OSError as exc:
                raise OSError(
                    exc.errno, f"health endpoint cannot listen on {self._host}:{self._port}: {exc}"
                ) from None
            self._stop = asyncio.Event()
            self._loop = loop
            ready.set_result(int(runner.addresses[0][1]))
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
