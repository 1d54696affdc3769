"""Retry delays, per-bundle wake-ups and the operator-wide probe-Job cap.

Pure scheduling helpers for the per-bundle reconciler (one long-lived coroutine per bundle):

* :class:`Backoff` computes capped exponential delays with jitter. Jitter matters because many
  bundles tend to fail together (the database restarts, a git host goes down); without it they
  all retry in the same second and fail together again.
* :class:`Wakeup` lets event handlers wake a sleeping reconciler early (spec change, Job event,
  reconcile-now annotation) without losing a wake-up that arrives while a pass is running.
* :class:`PassGate` lets at most a few whole passes run at once (the first pass of every
  bundle after a start, passes after a change); the unchanged pass never waits for it.
* :class:`JobSlots` counts probe Jobs against a global and a per-bundle cap. Jobs outlive the
  coroutine that created them (and the operator process), so the cap counts Jobs observed in
  the cluster rather than holding an ``asyncio.Semaphore`` across a Job's life.

Randomness and time are injected so the unit tests are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

BundleKey = tuple[str, str]
"""(namespace, name) of a TaskHandlerBundle."""


#: The generator of every jitter unless a caller injects its own: the draws need no streams of
#: their own, and a ``random.Random`` holds 2.5 KB of state (three per bundle were 7.5 MB at
#: 1,000 bundles).
SHARED_RANDOM = random.Random()  # noqa: S311 - jitter, not crypto


class Jitter(enum.Enum):
    FULL = "full"
    """``uniform(0, min(cap, base * factor**attempt))``: spreads retries widest."""
    DECORRELATED = "decorrelated"
    """``min(cap, uniform(base, previous * 3))``: never below ``base``, grows from the last one."""


@dataclass(frozen=True)
class Backoff:
    """A retry policy: ``base`` and ``cap`` in seconds."""

    base: float = 5.0
    cap: float = 300.0
    factor: float = 2.0
    jitter: Jitter = Jitter.DECORRELATED

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"back-off needs 0 < base <= cap, got base={self.base} cap={self.cap}")
        if self.factor < 1:
            raise ValueError(f"back-off factor must be at least 1, got {self.factor}")

    def ceiling(self, attempt: int) -> float:
        """The un-jittered delay of the ``attempt``-th retry (0-based), capped."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        try:
            return min(self.cap, self.base * self.factor**attempt)
        except OverflowError:  # a bundle failing for days: the cap was reached long ago
            return self.cap

    def delay(self, attempt: int, previous: float | None, rand: random.Random) -> float:
        """The delay before retry number ``attempt`` (0-based).

        ``previous`` is the delay returned for the attempt before (decorrelated jitter grows
        from it); None for the first retry.
        """
        if self.jitter is Jitter.FULL:
            return rand.uniform(0.0, self.ceiling(attempt))
        last = self.base if previous is None else max(previous, self.base)
        return min(self.cap, rand.uniform(self.base, last * 3.0))

    def start(self, rand: random.Random | None = None) -> RetryState:
        return RetryState(self, rand or SHARED_RANDOM)


@dataclass
class RetryState:
    """The retry counter of one bundle: ``next_delay()`` after a failure, ``reset()`` on success."""

    policy: Backoff
    rand: random.Random
    attempt: int = 0
    previous: float | None = None

    def next_delay(self) -> float:
        delay = self.policy.delay(self.attempt, self.previous, self.rand)
        self.attempt += 1
        self.previous = delay
        return delay

    def reset(self) -> None:
        self.attempt = 0
        self.previous = None

    @property
    def failing(self) -> bool:
        return self.attempt > 0


def jittered(interval: float, rand: random.Random, spread: float = 0.2) -> float:
    """``interval`` scaled by ``uniform(1 - spread, 1 + spread)``.

    Used for the resync interval, so bundles created together (a Helm install, an operator
    restart) do not all resync in the same second forever after.
    """
    if interval < 0:
        raise ValueError(f"interval must be >= 0, got {interval}")
    if not 0 <= spread < 1:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    return interval * rand.uniform(1.0 - spread, 1.0 + spread)


class Wakeup:
    """Wakes one bundle's reconciler early, remembering why.

    A wake-up that arrives while the reconciler is busy (not sleeping) is kept: the next
    :meth:`sleep_or_wake` returns at once, so no event is lost between two passes. Reasons
    accumulate (deduplicated, in arrival order) until the reconciler collects them. Use from
    the event loop's thread only (asyncio.Event is not thread-safe).
    """

    MAX_REASONS = 32
    """Bound on remembered reasons; a flood of Job events should not grow memory."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._reasons: dict[str, None] = {}
        self._dropped = 0

    def wake(self, reason: str) -> None:
        if reason not in self._reasons:
            if len(self._reasons) < self.MAX_REASONS:
                self._reasons[reason] = None
            else:
                self._dropped += 1
        self._event.set()

    @property
    def pending(self) -> bool:
        return self._event.is_set()

    def collect(self) -> tuple[str, ...]:
        """The reasons since the last collect (empty when none), clearing them."""
        reasons = tuple(self._reasons)
        if self._dropped:
            reasons += (f"and {self._dropped} more",)
        self._reasons.clear()
        self._dropped = 0
        self._event.clear()
        return reasons

    async def sleep_or_wake(self, seconds: float) -> tuple[str, ...]:
        """Sleep up to ``seconds``; return the wake reasons, or () when the time ran out."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=max(seconds, 0.0))
        return self.collect()


class Wakeups:
    """The :class:`Wakeup` of every running reconciler, keyed by (namespace, name).

    The reconciler creates its entry with :meth:`get` when it starts and removes it with
    :meth:`discard` when it exits. :meth:`wake` never creates one: a reconciler that has not
    started yet begins with a pass of the object as it is then, so an earlier wake-up has
    nothing to add, and one for a bundle that is gone (its deletion, a late Job event) would
    otherwise leave an entry behind for good.
    """

    def __init__(self) -> None:
        self._by_bundle: dict[BundleKey, Wakeup] = {}

    def get(self, namespace: str, name: str) -> Wakeup:
        return self._by_bundle.setdefault((namespace, name), Wakeup())

    def wake(self, namespace: str, name: str, reason: str) -> None:
        wakeup = self._by_bundle.get((namespace, name))
        if wakeup is not None:
            wakeup.wake(reason)

    def wake_all(self, reason: str) -> None:
        for wakeup in self._by_bundle.values():
            wakeup.wake(reason)

    def discard(self, namespace: str, name: str) -> None:
        self._by_bundle.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._by_bundle)


#: Whole passes at once (:class:`PassGate`). Each holds its listing, the recorded answers and the
#: validation of every Dag of the inventory until it writes, and CPython keeps the arenas they
#: grew: at start-up a thousand of them at once set the process's peak RSS. A few at a time keep
#: the event loop, the worker threads and the database pool (5 connections plus 10) busy.
WHOLE_PASSES = 8


@dataclass
class GateTicket:
    """One pass's place at the :class:`PassGate`; :meth:`release` gives it back early (a pass
    that starts waiting for probe Jobs must not hold up every other bundle). Idempotent."""

    semaphore: asyncio.Semaphore | None = None
    held: bool = False

    def release(self) -> None:
        if self.held and self.semaphore is not None:
            self.held = False
            self.semaphore.release()

    async def reacquire(self) -> None:
        """Take the place (again): after giving it back for a wait that is not the pass's own
        work (its source sync), or first when a pass expected to keep its outcome finds its
        inputs changed; a gate with no limit has none to take."""
        if self.semaphore is not None and not self.held:
            await self.semaphore.acquire()
            self.held = True


class PassGate:
    """At most ``limit`` whole passes at once; a pass expected to keep its last outcome (the
    unchanged pass) passes without waiting, with a ticket it can still take the place with
    (:meth:`GateTicket.reacquire`) once it finds its inputs changed. ``limit`` 0: no limit."""

    def __init__(self, limit: int = WHOLE_PASSES) -> None:
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit) if limit > 0 else None

    @contextlib.asynccontextmanager
    async def hold(self, whole: bool = True) -> AsyncIterator[GateTicket]:
        ticket = GateTicket(self._semaphore)
        if whole and ticket.semaphore is not None:
            await ticket.semaphore.acquire()
            ticket.held = True
        try:
            yield ticket
        finally:
            ticket.release()


@dataclass
class JobSlots:
    """Probe Jobs counted against a per-operator ``capacity`` and a per-bundle limit.

    Level-triggered like the reconciler: each pass reports the Jobs it observes running for its
    bundle with :meth:`observe` (so a restarted operator counts the Jobs it adopts), asks for a
    slot per Job it wants to create with :meth:`acquire`, and Jobs that finished leave the count
    at the next :meth:`observe` or by :meth:`release`. A bundle that was refused a slot is
    told when one frees up, through ``on_freed`` (typically ``Wakeups.wake``), so no bundle
    waits for its interval while slots sit idle. Every refused bundle is told (in the order they
    were refused), not just as many as slots freed: one that no longer needs a slot must not
    leave it idle while another waits; the ones refused again simply wait again.
    """

    capacity: int
    on_freed: Callable[[BundleKey], None] | None = None
    _held: dict[BundleKey, set[str]] = field(default_factory=dict)
    _waiting: dict[BundleKey, None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"the probe Job cap must be at least 1, got {self.capacity}")

    @property
    def in_use(self) -> int:
        return sum(len(jobs) for jobs in self._held.values())

    @property
    def available(self) -> int:
        return max(self.capacity - self.in_use, 0)

    @property
    def bundles(self) -> int:
        """Bundles holding a slot or waiting for one."""
        return len(self._held.keys() | self._waiting.keys())

    def held(self, bundle: BundleKey) -> frozenset[str]:
        return frozenset(self._held.get(bundle, ()))

    def observe(self, bundle: BundleKey, running: Iterable[str]) -> None:
        """Make ``bundle``'s count exactly the Jobs observed running (may exceed the caps:
        adopted Jobs run whatever the limit, they only block new ones)."""
        before = self.in_use
        jobs = set(running)
        if jobs:
            self._held[bundle] = jobs
        else:
            self._held.pop(bundle, None)
        if self.in_use < before:
            self._notify()

    def acquire(self, bundle: BundleKey, job: str, bundle_limit: int) -> bool:
        """Take a slot for ``job``; True when it may be created. Idempotent per Job name."""
        jobs = self._held.get(bundle, set())
        if job in jobs:
            return True
        if len(jobs) >= bundle_limit:
            return False  # the bundle's own Jobs will wake it when they finish
        if self.in_use >= self.capacity:
            self._waiting.setdefault(bundle, None)
            return False
        self._held.setdefault(bundle, set()).add(job)
        self._waiting.pop(bundle, None)
        return True

    def release(self, bundle: BundleKey, job: str) -> None:
        jobs = self._held.get(bundle)
        if jobs is None or job not in jobs:
            return
        jobs.discard(job)
        if not jobs:
            del self._held[bundle]
        self._notify()

    def forget(self, bundle: BundleKey) -> None:
        """The bundle is gone: free its slots and stop waiting for it."""
        self._waiting.pop(bundle, None)
        if self._held.pop(bundle, None):
            self._notify()

    def _notify(self) -> None:
        if not self.available or self.on_freed is None:
            return
        waiting = list(self._waiting)
        self._waiting.clear()
        for bundle in waiting:
            self.on_freed(bundle)


@dataclass(frozen=True)
class Waiting:
    """An artifact whose last probe failed for a reason outside it, not probed again before
    ``due`` (monotonic seconds); ``due_at`` is the same moment on the wall clock, for messages."""

    digest: str | None
    attempts: int
    due: float
    due_at: datetime
    code: str
    message: str
    delay: float


@dataclass
class ProbeRetries:
    """Per-artifact back-off of retryable probe failures (a fetch that failed, a lost pod, a log
    that could not be read).

    Such a failure is not stored as the artifact's answer, so without this every pass would
    probe it again at once; and the failed Job's own events wake the bundle, so a fault that
    persists became a loop of Jobs created about every second. An entry is keyed by the
    artifact's path and holds its cache digest: a changed artifact is probed at once. An accepted
    or a final (non-retryable) answer clears it. At most ``limit`` entries are kept (the oldest
    go first), so a bundle that renames failing artifacts cannot grow memory.
    """

    policy: Backoff = field(default_factory=lambda: Backoff(base=5.0, cap=600.0))
    rand: random.Random = field(default_factory=lambda: SHARED_RANDOM)
    limit: int = 10_000
    _entries: dict[str, Waiting] = field(default_factory=dict)
    _states: dict[str, RetryState] = field(default_factory=dict)

    def waiting(self, rel_path: str, digest: str | None, now: float) -> Waiting | None:
        """The entry when ``rel_path`` (still at ``digest``) must not be probed before its due."""
        entry = self._entries.get(rel_path)
        if entry is None or entry.digest != digest or now >= entry.due:
            return None
        return entry

    def failed(
        self, rel_path: str, digest: str | None, code: str, message: str, now: float, wall: datetime
    ) -> Waiting:
        """Record a retryable failure; returns the entry with its next due time."""
        state = self._states.get(rel_path)
        old = self._entries.get(rel_path)
        if state is None or old is None or old.digest != digest:
            state = RetryState(self.policy, self.rand)
        delay = state.next_delay()
        entry = Waiting(
            digest=digest,
            attempts=state.attempt,
            due=now + delay,
            due_at=wall + timedelta(seconds=delay),
            code=code,
            message=message,
            delay=delay,
        )
        self._entries.pop(rel_path, None)  # re-insert: the dict's order is the eviction order
        self._entries[rel_path] = entry
        self._states[rel_path] = state
        while len(self._entries) > self.limit:
            oldest = next(iter(self._entries))
            del self._entries[oldest]
            self._states.pop(oldest, None)
        return entry

    def settled(self, rel_path: str) -> None:
        """The artifact got an answer (accepted, or failed for a reason of its own)."""
        self._entries.pop(rel_path, None)
        self._states.pop(rel_path, None)

    def next_due(self, now: float) -> float | None:
        """Seconds until the earliest entry still in the future is due; None when none is.

        An entry already due was either probed by the pass that just ran (and replaced or
        cleared) or belongs to an artifact no longer listed: it must not keep waking the bundle.
        """
        ahead = [e.due for e in self._entries.values() if e.due > now]
        return min(ahead) - now if ahead else None

    def __len__(self) -> int:
        return len(self._entries)
