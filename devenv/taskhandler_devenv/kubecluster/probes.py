"""Container probes and restart back-off as the kubelet runs them (pure; clock values passed in).

The pod runner owns the I/O (:mod:`.probeexec` runs one probe) and asks this module when each
probe is due, what its verdict is, whether the container is started, ready or must be killed,
and how long to wait before the next restart:

* ``startupProbe`` runs first; until it succeeds the container is not ``started`` and the other
  two probes do not run. ``failureThreshold`` consecutive failures kill the container.
* ``livenessProbe`` counts as passing until it fails ``failureThreshold`` times in a row; then
  the container is killed (and restarted as ``restartPolicy`` says).
* ``readinessProbe`` counts as failing until it succeeds ``successThreshold`` times in a row; it
  sets the container's ``ready`` and the Pod's ``Ready``/``ContainersReady``. A container
  without one is ready once started.

The first probe runs ``initialDelaySeconds`` after the container started, then every
``periodSeconds``; each probe may take ``timeoutSeconds``. Defaults are the API's: period 10,
timeout 1, success 1, failure 3. Unlike the kubelet no random jitter delays the first probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

STARTUP = "startup"
LIVENESS = "liveness"
READINESS = "readiness"
KINDS = (STARTUP, LIVENESS, READINESS)
HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")

#: The kubelet's CrashLoopBackOff: the first restart at once, then 10 s doubling up to 5 min;
#: a container that ran for twice the cap starts over.
RESTART_BACKOFF_SECONDS = 10.0
RESTART_BACKOFF_MAX_SECONDS = 300.0


@dataclass(frozen=True)
class ProbeSpec:
    kind: str
    handler: str
    action: Obj
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    grace: float | None = None
    """The probe's own ``terminationGracePeriodSeconds`` (None: the pod's)."""

    @classmethod
    def of(cls, container: Obj, kind: str) -> ProbeSpec | None:
        """The container's ``<kind>Probe``, or None when it has none (or no handler the node
        runs: ``grpc`` is reported as a failing probe by :func:`.probeexec.run_probe`)."""
        probe = container.get(f"{kind}Probe")
        if not probe:
            return None
        handler = next((h for h in HANDLERS if probe.get(h) is not None), None)
        if handler is None:
            return None
        grace = probe.get("terminationGracePeriodSeconds")
        return cls(
            kind=kind,
            handler=handler,
            action=dict(probe[handler]),
            initial_delay=float(probe.get("initialDelaySeconds") or 0),
            period=float(probe.get("periodSeconds") or 10),
            timeout=float(probe.get("timeoutSeconds") or 1),
            # The API forces 1 for liveness and startup probes; so do we.
            success_threshold=1 if kind != READINESS else int(probe.get("successThreshold") or 1),
            failure_threshold=int(probe.get("failureThreshold") or 3),
            grace=None if grace is None else float(grace),
        )


@dataclass
class ProbeState:
    """One probe of one run of a container: when it is due and its current verdict."""

    spec: ProbeSpec
    next_at: float
    result: bool
    successes: int = 0
    failures: int = 0
    message: str = ""

    @classmethod
    def begin(cls, spec: ProbeSpec, started_at: float) -> ProbeState:
        # Liveness passes until proven otherwise; readiness and startup fail until they pass.
        return cls(spec, started_at + spec.initial_delay, result=spec.kind == LIVENESS)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float, message: str = "") -> bool:
        """Count one probe's outcome; True when the verdict changed."""
        self.next_at = max(self.next_at + self.spec.period, now)
        self.message = message
        before = self.result
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.spec.success_threshold:
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.spec.failure_threshold:
                self.result = False
        return self.result != before


@dataclass
class ContainerProbes:
    """The probes of one run of one container (a restart starts a new one)."""

    probes: dict[str, ProbeState] = field(default_factory=dict)
    started: bool = False

    @classmethod
    def begin(cls, container: Obj, started_at: float) -> ContainerProbes:
        probes: dict[str, ProbeState] = {}
        for kind in KINDS:
            spec = ProbeSpec.of(container, kind)
            if spec is not None:
                probes[kind] = ProbeState.begin(spec, started_at)
        return cls(probes, started=STARTUP not in probes)

    def due(self, now: float) -> list[ProbeState]:
        """The probes to run now: the startup probe until it passed, then the other two."""
        if not self.started:
            kinds: tuple[str, ...] = (STARTUP,)
        else:
            kinds = (LIVENESS, READINESS)
        return [p for k in kinds if (p := self.probes.get(k)) is not None and p.due(now)]

    def record(self, kind: str, ok: bool, now: float, message: str = "") -> None:
        state = self.probes[kind]
        state.record(ok, now, message)
        if kind == STARTUP and state.result:
            self.started = True
            # The others start counting now (their initial delay runs from here, as in the
            # kubelet, whose workers skip until the container is started).
            for other in (LIVENESS, READINESS):
                if other in self.probes:
                    self.probes[other] = ProbeState.begin(self.probes[other].spec, now)

    @property
    def ready(self) -> bool:
        readiness = self.probes.get(READINESS)
        return self.started and (readiness is None or readiness.result)

    def kill_reason(self) -> ProbeState | None:
        """The probe whose failures mean the container must be killed, if any."""
        startup = self.probes.get(STARTUP)
        if (
            startup is not None
            and not self.started
            and startup.failures >= (startup.spec.failure_threshold)
        ):
            return startup
        liveness = self.probes.get(LIVENESS)
        if self.started and liveness is not None and not liveness.result:
            return liveness
        return None


@dataclass
class RestartBackoff:
    """Delays between restarts of each container (the kubelet's CrashLoopBackOff)."""

    initial: float = RESTART_BACKOFF_SECONDS
    cap: float = RESTART_BACKOFF_MAX_SECONDS
    _state: dict[str, tuple[float, float]] = field(default_factory=dict)

    def next_delay(self, key: str, now: float) -> float:
        """Seconds to wait before restarting ``key``, which just exited at ``now``."""
        current, last = self._state.get(key, (0.0, now))
        if now - last > 2 * self.cap:
            current = 0.0  # ran long enough since the last crash: forgiven
        self._state[key] = (min(self.cap, max(self.initial, current * 2)), now)
        return current
