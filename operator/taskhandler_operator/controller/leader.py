"""Leader election on a coordination.k8s.io/v1 Lease, asyncio-native.

Only the leader reconciles; other replicas wait as standbys. kopf's peering is not leader
election (it pauses peers and freezes both when priorities tie), and the official client's
``kubernetes.leaderelection`` is a blocking loop that never releases the Lease on shutdown, so
this is client-go's algorithm written for asyncio, with client-go's defaults:

* **Acquire**: every ``retry_period`` read the Lease; take it when it is free (no holder), ours,
  or expired. A write carries the ``resourceVersion`` read, so of two candidates only one
  succeeds; the other gets 409 and tries again later.
* **Expiry is judged on this process's monotonic clock**: a Lease is expired when its record has
  not changed for ``leaseDurationSeconds`` since *we* saw it change. Clocks of other hosts
  (``renewTime``) are never compared with ours.
* **Renew**: the leader rewrites ``renewTime`` every ``retry_period``. If it cannot renew
  within ``renew_deadline`` of the last successful renewal it stops leading: the work is
  cancelled and ``on_stopped`` runs. Because ``renew_deadline < lease_duration``, a partitioned
  leader stops before any standby may take over.
* **Release**: on a graceful stop the work is stopped first (the Lease is still renewed while it
  winds down), then the Lease is written with no holder and ``leaseDurationSeconds: 1`` (guarded
  by its resourceVersion), so a standby takes over at its next retry instead of after the lease
  duration. After SIGKILL there is no release; the standby waits out the lease duration.

* **Step down**: :meth:`LeaderElector.step_down` ends leadership as a lost Lease does (work
  cancelled, ``on_stopped``, no release): the operator calls it when the database's leader fence
  refuses its term (``db/fence.py``), which the Lease alone cannot notice after a stall.

:attr:`LeaderElector.term` is the Lease's uid, holder and ``leaseTransitions`` while leading:
the token the fence records and every write checks.

Lease calls go through a :class:`~taskhandler_operator.controller.kubeapi.KubeApi` of its own
(own executor, short timeouts), so reconcile traffic cannot delay a renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient

from taskhandler_operator.controller.kubeapi import (
    Conflict,
    KubeApi,
    KubeApiError,
    micro_time,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
JITTER = 1.2  # client-go's JitterFactor: acquire retries wait retry_period * [1, 1.2)


def default_identity(pod_name: str | None = None) -> str:
    """``<pod name>_<random>``: the pod name (downward API ``POD_NAME``, else the host name)
    says who leads; the suffix keeps a restarted pod with the same name from mistaking the
    previous incarnation's Lease for its own."""
    base = pod_name or os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{secrets.token_hex(4)}"


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    name: str = "taskhandler-operator"
    identity: str = field(default_factory=default_identity)
    lease_duration: int = 15
    """Seconds a standby waits after the record last changed (the Lease stores whole seconds)."""
    renew_deadline: float = 10.0
    """Seconds the leader keeps trying to renew before it gives up leading."""
    retry_period: float = 2.0
    """Seconds between attempts (acquire and renew)."""
    stop_grace: float = 30.0
    """Seconds a graceful stop waits for the work to end before giving up on the release."""

    def __post_init__(self) -> None:
        if not self.namespace or not self.name or not self.identity:
            raise ValueError("leader election needs a namespace, a Lease name and an identity")
        if isinstance(self.lease_duration, bool) or not isinstance(self.lease_duration, int):
            raise ValueError(f"lease duration must be whole seconds, got {self.lease_duration!r}")
        if self.retry_period <= 0 or self.stop_grace <= 0:
            raise ValueError("retry period and stop grace must be positive")
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(
                f"lease duration ({self.lease_duration}s) must be longer than the renew "
                f"deadline ({self.renew_deadline}s), or a standby could take over while the "
                "leader still believes it leads"
            )
        if not self.renew_deadline > JITTER * self.retry_period:
            raise ValueError(
                f"renew deadline ({self.renew_deadline}s) must be longer than "
                f"{JITTER} x retry period ({self.retry_period}s)"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says about its holder (the part compared to detect a change)."""

    holder: str
    duration: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def of(cls, lease: Obj) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


def held_by_other(record: LeaseRecord, me: str, observed_at: float, now: float) -> bool:
    """True while someone else validly holds the Lease (so we must not take it)."""
    if not record.holder or record.holder == me:
        return False
    return now < observed_at + record.duration


@dataclass(frozen=True)
class LeaseTerm:
    """One holder's tenure of one Lease object: what the leader fence records."""

    lease_uid: str
    holder: str
    transitions: int


class Outcome(enum.Enum):
    NEVER_LED = "never_led"
    """Stopped while still a standby."""
    RELEASED = "released"
    """Stopped gracefully: the work ended, then the Lease was released."""
    LOST = "lost"
    """Could not renew within the renew deadline (or someone else took the Lease)."""
    WORK_ENDED = "work_ended"
    """The work returned by itself; the Lease was released."""
    ABANDONED = "abandoned"
    """Stopped, but the work did not end within the stop grace: the Lease is left to expire."""


class LeaderElector:
    """Runs ``work`` only while holding the Lease. One ``run`` per instance."""

    def __init__(
        self,
        api: KubeApi,
        config: ElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_tick: Callable[[], None] | None = None,
        on_leading: Callable[[bool], None] | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self._clock = clock
        self._on_tick = on_tick
        self._on_leading = on_leading
        self._leading = False
        self._stop = asyncio.Event()
        self._lease: Obj | None = None  # the Lease as we last wrote it
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._last_error: str | None = None
        self._reported_holder: str | None = None
        self._owns_api = False
        self._deposed: str | None = None

    @classmethod
    def on_client(
        cls, api_client: ApiClient, config: ElectionConfig, **kwargs: Any
    ) -> LeaderElector:
        """An elector with a :class:`KubeApi` of its own (closed when :meth:`run` ends): two
        threads and requests bounded by half the renew deadline, so reconcile traffic never
        queues ahead of a renewal and a hung call leaves time for another attempt."""
        api = KubeApi(
            api_client,
            max_workers=2,
            request_timeout=config.renew_deadline / 2,
            thread_name="leader-election",
        )
        elector = cls(api, config, **kwargs)
        elector._owns_api = True
        return elector

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def term(self) -> LeaseTerm | None:
        """The term this replica leads in (the Lease as last written by us); None unless
        leading."""
        if not self._leading or self._lease is None:
            return None
        meta = self._lease.get("metadata") or {}
        record = LeaseRecord.of(self._lease)
        return LeaseTerm(str(meta.get("uid") or ""), record.holder, record.transitions)

    def stop(self) -> None:
        """Ask :meth:`run` to stop gracefully (work first, then release). Safe to call twice."""
        self._stop.set()

    def step_down(self, why: str) -> None:
        """Stop leading at once, as on a lost Lease: the work is cancelled, ``on_stopped`` runs
        and the Lease is not released (someone else holds it). Safe to call twice."""
        if self._deposed is None:
            self._deposed = why
        self._stop.set()

    async def run(
        self,
        work: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]] | None = None,
    ) -> Outcome:
        """Wait to lead, run ``work`` while leading, and tell how leadership ended.

        ``on_stopped`` runs whenever leadership that had started ends. When the Lease is lost
        it runs at once, before the cancelled work has finished unwinding: the operator uses
        it to exit, because it must never keep reconciling without the Lease. If ``work``
        raises, the Lease is released and the exception propagates.
        """
        try:
            return await self._run(work, on_stopped)
        finally:
            if self._owns_api:
                await self.api.aclose()

    async def _run(
        self,
        work: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]] | None,
    ) -> Outcome:
        if not await self._acquire():
            return Outcome.NEVER_LED
        self._set_leading(True)
        log.info("leader election: %s leads (Lease %s)", self.identity, self._lease_name)
        task = asyncio.create_task(_call(work), name="leader-work")
        try:
            outcome = await self._lead(task)
        except asyncio.CancelledError:
            # run() itself was cancelled (the process is going down): treat as a stop.
            self._stop.set()
            await self._shutdown(task, Outcome.RELEASED, on_stopped)
            raise
        result = await self._shutdown(task, outcome, on_stopped)
        if result is Outcome.WORK_ENDED and not task.cancelled():
            error = task.exception()
            if error is not None:
                raise error
        return result

    # --- phases --------------------------------------------------------------------------------

    async def _acquire(self) -> bool:
        log.info("leader election: %s is a candidate for Lease %s", self.identity, self._lease_name)
        while not self._stop.is_set():
            self._tick()
            if await self._attempt(self.config.renew_deadline):
                return True
            # Spread candidates' retries like client-go's JitterUntil.
            delay = self.config.retry_period * (1 + (JITTER - 1) * _uniform())
            if await self._sleep(delay):
                return False
        return False

    async def _lead(self, task: asyncio.Task[None]) -> Outcome:
        """Renew until the work ends, a stop is asked for, or renewal fails for too long."""
        while True:
            self._tick()
            deadline = self._renewed_at + self.config.renew_deadline
            if self._deposed is not None:
                return self._lost(self._deposed)
            if self._stop.is_set():
                return Outcome.RELEASED
            if task.done():
                return Outcome.WORK_ENDED
            pause = self.config.retry_period
            if self._last_error is not None:  # failing: do not sleep past the deadline
                pause = max(0.0, min(pause, deadline - self._clock()))
            if await self._sleep(pause, task):
                continue  # stop asked or work ended: handled at the top
            started = self._clock()
            if started >= deadline:
                why = self._last_error or "no successful renewal"
                return self._lost(f"not renewed within {self.config.renew_deadline}s: {why}")
            if not await self._attempt(deadline - started) and self._lost_to_other():
                holder = self._observed.holder if self._observed else "?"
                return self._lost(f"the Lease is now held by {holder}")

    async def _shutdown(
        self,
        task: asyncio.Task[None],
        outcome: Outcome,
        on_stopped: Callable[[], Awaitable[None]] | None,
    ) -> Outcome:
        if outcome is Outcome.LOST:
            # Not ours any more: stop the work now and tell the operator at once.
            self._set_leading(False)
            task.cancel()
            await _notify(on_stopped)
            await _wait(task, self.config.stop_grace)
            return outcome
        if not task.done():
            task.cancel()
            if not await self._renew_while_waiting(task):
                self._set_leading(False)
                log.error(
                    "leader election: the work did not stop within %ss; leaving the Lease to "
                    "expire instead of releasing it",
                    self.config.stop_grace,
                )
                await _notify(on_stopped)
                return Outcome.ABANDONED
        self._set_leading(False)
        await self._release()
        await _notify(on_stopped)
        return outcome

    async def _renew_while_waiting(self, task: asyncio.Task[None]) -> bool:
        """Keep the Lease while the work winds down; True when it ended within the grace."""
        give_up = self._clock() + self.config.stop_grace
        while not task.done():
            self._tick()
            now = self._clock()
            if now >= give_up:
                return False
            await asyncio.wait({task}, timeout=min(self.config.retry_period, give_up - now))
            if not task.done():
                budget = self._renewed_at + self.config.renew_deadline - self._clock()
                await self._attempt(max(budget, self.config.retry_period))
        return True

    async def _release(self) -> None:
        """Hand the Lease back: no holder, 1 s duration, only if it is still as we wrote it."""
        if self._lease is None:
            return
        lease = copy.deepcopy(self._lease)
        spec = lease.setdefault("spec", {})
        spec.pop("holderIdentity", None)
        now = micro_time()
        spec.update(leaseDurationSeconds=1, acquireTime=now, renewTime=now)
        try:
            async with asyncio.timeout(self.config.renew_deadline):
                await self.api.replace_lease(self.config.namespace, lease)
        except Conflict:
            log.info("leader election: Lease changed since our last renewal; not released")
        except (KubeApiError, TimeoutError) as exc:
            log.warning("leader election: could not release the Lease (it will expire): %s", exc)
        else:
            log.info("leader election: %s released Lease %s", self.identity, self._lease_name)
        self._lease = None

    # --- one attempt -----------------------------------------------------------------------------

    async def _attempt(self, budget: float) -> bool:
        """One acquire-or-renew, bounded by ``budget`` seconds; False on any failure."""
        started = self._clock()
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                ok = await self._try_acquire_or_renew()
        except (KubeApiError, TimeoutError) as exc:
            self._last_error = str(exc) or f"no answer within {budget:.1f}s"
            log.warning("leader election: %s", self._last_error)
            return False
        if ok:
            # The attempt's start, not its end: the leader's own view of its deadline must err
            # on the early side.
            self._renewed_at = started
            self._last_error = None
        elif self._last_error is None:
            self._last_error = "the Lease was held or written by someone else"
        return ok

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now = micro_time()
        lease = await self.api.get_lease(cfg.namespace, cfg.name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": cfg.identity,
                    "leaseDurationSeconds": cfg.lease_duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                self._lease = await self.api.create_lease(cfg.namespace, body)
            except Conflict:
                return False  # another candidate created it first
            self._observe(LeaseRecord.of(self._lease))
            return True

        record = LeaseRecord.of(lease)
        self._observe(record)
        if held_by_other(record, cfg.identity, self._observed_at, self._clock()):
            self._report_holder(record.holder)
            return False
        spec = dict(lease.get("spec") or {})
        spec.update(
            holderIdentity=cfg.identity, leaseDurationSeconds=cfg.lease_duration, renewTime=now
        )
        if record.holder != cfg.identity:
            spec.update(acquireTime=now, leaseTransitions=record.transitions + 1)
        updated = {**lease, "spec": spec}
        try:
            self._lease = await self.api.replace_lease(cfg.namespace, updated)
        except Conflict:
            return False  # someone wrote in between; re-read next time
        self._observe(LeaseRecord.of(self._lease))
        return True

    def _observe(self, record: LeaseRecord) -> None:
        # The time we first saw this exact record, taken after the read returned: later than
        # the holder's write, so expiry judged from it errs on the late (safe) side.
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()

    def _lost_to_other(self) -> bool:
        record = self._observed
        return record is not None and bool(record.holder) and record.holder != self.identity

    def _lost(self, why: str) -> Outcome:
        log.error("leader election: %s stops leading: %s", self.identity, why)
        return Outcome.LOST

    # --- helpers -------------------------------------------------------------------------------

    @property
    def _lease_name(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    def _report_holder(self, holder: str) -> None:
        if holder != self._reported_holder:
            self._reported_holder = holder
            log.info("leader election: Lease %s is held by %s; waiting", self._lease_name, holder)

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            if self._on_leading is not None:
                self._on_leading(leading)

    def _tick(self) -> None:
        if self._on_tick is not None:
            self._on_tick()

    async def _sleep(self, seconds: float, task: asyncio.Task[None] | None = None) -> bool:
        """Sleep; True when woken early by a stop request (or by ``task`` ending)."""
        stop = asyncio.ensure_future(self._stop.wait())
        waiting: set[asyncio.Future[Any]] = {stop}
        if task is not None:
            waiting.add(task)
        try:
            done, _ = await asyncio.wait(waiting, timeout=seconds, return_when="FIRST_COMPLETED")
        finally:
            stop.cancel()
        return bool(done)


def _uniform() -> float:
    return secrets.randbelow(1_000_000) / 1_000_000


async def _call(work: Callable[[], Awaitable[None]]) -> None:
    await work()


async def _notify(on_stopped: Callable[[], Awaitable[None]] | None) -> None:
    if on_stopped is None:
        return
    try:
        await on_stopped()
    except Exception:
        log.exception("leader election: on_stopped failed")


async def _wait(task: asyncio.Task[None], grace: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait({task}, timeout=grace)
