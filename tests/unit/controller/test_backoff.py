"""Back-off delays, wake-ups and the probe-Job cap, with seeded randomness."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest

from taskhandler_operator.controller.backoff import (
    Backoff,
    BundleKey,
    Jitter,
    JobSlots,
    ProbeRetries,
    Wakeup,
    Wakeups,
    jittered,
)

A: BundleKey = ("ns", "a")
B: BundleKey = ("ns", "b")
C: BundleKey = ("other", "c")


# --- Backoff ---------------------------------------------------------------------------------


def test_ceiling_doubles_then_stays_at_the_cap() -> None:
    policy = Backoff(base=1, cap=30, factor=2)
    assert [policy.ceiling(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_ceiling_of_a_huge_attempt_is_the_cap_not_an_overflow() -> None:
    assert Backoff(base=5, cap=300).ceiling(100_000) == 300


def test_full_jitter_stays_within_zero_and_the_ceiling() -> None:
    policy = Backoff(base=1, cap=30, jitter=Jitter.FULL)
    rand = random.Random(7)
    for attempt in range(12):
        for _ in range(50):
            assert 0 <= policy.delay(attempt, None, rand) <= policy.ceiling(attempt)


def test_full_jitter_spreads_retries_of_many_bundles() -> None:
    # Twenty bundles failing together must not retry together.
    policy = Backoff(base=10, cap=300, jitter=Jitter.FULL)
    rand = random.Random(1)
    delays = [policy.delay(3, None, rand) for _ in range(20)]
    assert len({round(d) for d in delays}) > 10


def test_decorrelated_jitter_never_below_base_and_never_above_cap() -> None:
    state = Backoff(base=5, cap=60).start(random.Random(3))
    delays = [state.next_delay() for _ in range(200)]
    assert all(5 <= d <= 60 for d in delays)
    assert max(delays) == 60  # the cap is reached and holds


def test_decorrelated_delay_grows_from_the_previous_one() -> None:
    policy = Backoff(base=1, cap=1000)

    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b  # the largest value the jitter allows

    rand = Top()
    assert policy.delay(0, None, rand) == 3
    assert policy.delay(1, 3, rand) == 9
    assert policy.delay(2, 900, rand) == 1000


def test_retry_state_counts_and_resets() -> None:
    state = Backoff(base=2, cap=10).start(random.Random(0))
    assert not state.failing
    first = state.next_delay()
    state.next_delay()
    assert state.failing and state.attempt == 2
    state.reset()
    assert not state.failing and state.previous is None
    assert 2 <= first <= 6


def test_same_seed_same_delays() -> None:
    a = Backoff().start(random.Random(42))
    b = Backoff().start(random.Random(42))
    assert [a.next_delay() for _ in range(10)] == [b.next_delay() for _ in range(10)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": 0}, "0 < base <= cap"),
        ({"base": 10, "cap": 5}, "0 < base <= cap"),
        ({"factor": 0.5}, "factor must be at least 1"),
    ],
)
def test_bad_policy_is_refused_with_one_line(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 0"):
        Backoff().ceiling(-1)


def test_jittered_interval_within_spread() -> None:
    rand = random.Random(5)
    values = [jittered(300, rand, spread=0.2) for _ in range(100)]
    assert all(240 <= v <= 360 for v in values)
    assert len(set(values)) == 100


@pytest.mark.parametrize(("interval", "spread"), [(-1, 0.2), (10, 1.0), (10, -0.1)])
def test_jittered_refuses_bad_arguments(interval: float, spread: float) -> None:
    with pytest.raises(ValueError):
        jittered(interval, random.Random(), spread)


# --- Wakeup ------------------------------------------------------------------------------------


async def test_sleep_times_out_with_no_reasons() -> None:
    assert await Wakeup().sleep_or_wake(0.01) == ()


async def test_wake_while_busy_is_not_lost() -> None:
    wakeup = Wakeup()
    wakeup.wake("spec changed")  # arrives while the reconciler is mid-pass
    wakeup.wake("job finished")
    wakeup.wake("spec changed")
    assert wakeup.pending
    # A long sleep returns at once with both reasons, deduplicated, in arrival order.
    assert await asyncio.wait_for(wakeup.sleep_or_wake(3600), 5) == (
        "spec changed",
        "job finished",
    )
    assert not wakeup.pending


async def test_wake_during_sleep_ends_it() -> None:
    wakeup = Wakeup()
    sleeper = asyncio.create_task(wakeup.sleep_or_wake(3600))
    await asyncio.sleep(0)
    assert not sleeper.done()
    wakeup.wake("reconcile requested")
    assert await asyncio.wait_for(sleeper, 5) == ("reconcile requested",)


async def test_reasons_are_bounded() -> None:
    wakeup = Wakeup()
    for n in range(Wakeup.MAX_REASONS + 10):
        wakeup.wake(f"job-{n} finished")
    reasons = await wakeup.sleep_or_wake(0)
    assert len(reasons) == Wakeup.MAX_REASONS + 1
    assert reasons[-1] == "and 10 more"


async def test_wakeups_registry_holds_running_reconcilers_only() -> None:
    wakeups = Wakeups()
    wakeups.wake("ns", "a", "created")  # before the daemon started: its first pass covers it
    assert len(wakeups) == 0
    wakeup = wakeups.get("ns", "a")
    wakeups.wake("ns", "a", "spec changed")
    assert await wakeup.sleep_or_wake(0) == ("spec changed",)
    wakeups.wake_all("stub inventory changed")
    assert await wakeups.get("ns", "a").sleep_or_wake(0) == ("stub inventory changed",)
    wakeups.discard("ns", "a")
    assert len(wakeups) == 0


def test_waking_a_deleted_bundle_leaves_no_entry_behind() -> None:
    """delete_bundle wakes the bundle (so its loop notices the stop), a late Job event wakes
    the owner: after the reconciler exited, neither may re-create its entry."""
    wakeups = Wakeups()
    for i in range(1000):
        wakeups.get("ns", f"b{i}")
        wakeups.discard("ns", f"b{i}")  # the reconciler exits
        wakeups.wake("ns", f"b{i}", "deleted")
        wakeups.wake("ns", f"b{i}", "probe Job x finished")
    assert len(wakeups) == 0


# --- JobSlots ----------------------------------------------------------------------------------


def test_slots_respect_global_and_bundle_caps() -> None:
    slots = JobSlots(capacity=3)
    assert slots.acquire(A, "a-1", bundle_limit=2)
    assert slots.acquire(A, "a-2", bundle_limit=2)
    assert not slots.acquire(A, "a-3", bundle_limit=2)  # bundle limit
    assert slots.acquire(B, "b-1", bundle_limit=5)
    assert not slots.acquire(B, "b-2", bundle_limit=5)  # global cap
    assert slots.in_use == 3 and slots.available == 0


def test_acquire_is_idempotent_per_job_name() -> None:
    slots = JobSlots(capacity=1)
    assert slots.acquire(A, "a-1", 1)
    assert slots.acquire(A, "a-1", 1)
    assert slots.in_use == 1


def test_observed_jobs_replace_the_count_and_adopted_jobs_may_exceed_it() -> None:
    slots = JobSlots(capacity=2)
    # A restarted operator finds three Jobs of A still running: they all count.
    slots.observe(A, ["a-1", "a-2", "a-3"])
    assert slots.in_use == 3 and slots.available == 0
    assert not slots.acquire(B, "b-1", 5)
    slots.observe(A, ["a-3"])
    assert slots.held(A) == {"a-3"}
    assert slots.acquire(B, "b-1", 5)


def test_freed_slots_wake_every_refused_bundle_in_order() -> None:
    woken: list[BundleKey] = []
    slots = JobSlots(capacity=1, on_freed=woken.append)
    assert slots.acquire(A, "a-1", 1)
    assert not slots.acquire(B, "b-1", 1)
    assert not slots.acquire(C, "c-1", 1)
    assert not slots.acquire(B, "b-2", 1)  # asking twice queues once
    slots.release(A, "a-1")
    assert woken == [B, C]
    slots.release(A, "a-1")  # nothing held: nobody is woken again
    assert woken == [B, C]


def test_a_bundle_refused_by_its_own_limit_is_not_queued() -> None:
    woken: list[BundleKey] = []
    slots = JobSlots(capacity=5, on_freed=woken.append)
    assert slots.acquire(A, "a-1", 1)
    assert not slots.acquire(A, "a-2", 1)
    slots.release(A, "a-1")
    assert woken == []  # its own Job's event wakes it, not the slot pool


def test_forget_frees_a_deleted_bundles_slots() -> None:
    woken: list[BundleKey] = []
    slots = JobSlots(capacity=1, on_freed=woken.append)
    slots.observe(A, ["a-1"])
    assert not slots.acquire(B, "b-1", 1)
    slots.forget(A)
    assert woken == [B]
    assert slots.acquire(B, "b-1", 1)


def test_observe_fewer_jobs_wakes_waiters() -> None:
    woken: list[BundleKey] = []
    slots = JobSlots(capacity=1, on_freed=woken.append)
    slots.observe(A, ["a-1"])
    assert not slots.acquire(B, "b-1", 1)
    slots.observe(A, [])
    assert woken == [B]


def test_zero_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        JobSlots(capacity=0)


# --- ProbeRetries ----------------------------------------------------------------------------

WALL = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class _Top(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_retryable_probe_failure_waits_and_the_wait_grows() -> None:
    retries = ProbeRetries(Backoff(base=5, cap=60), _Top())
    first = retries.failed("a.bin", "d1", "FetchFailed", "download refused", 100.0, WALL)
    assert (first.attempts, first.delay, first.due) == (1, 15.0, 115.0)
    assert first.due_at == WALL + timedelta(seconds=15)
    assert retries.waiting("a.bin", "d1", 114.9) == first
    assert retries.waiting("a.bin", "d1", 115.0) is None  # due: probe it
    second = retries.failed("a.bin", "d1", "FetchFailed", "download refused", 115.0, WALL)
    assert (second.attempts, second.delay) == (2, 45.0)
    third = retries.failed("a.bin", "d1", "PodLost", "pod gone", 160.0, WALL)
    assert (third.attempts, third.delay, third.code) == (3, 60.0, "PodLost")  # capped


def test_a_changed_artifact_or_an_answer_ends_the_wait() -> None:
    retries = ProbeRetries(Backoff(base=5, cap=60), _Top())
    retries.failed("a.bin", "d1", "FetchFailed", "x", 0.0, WALL)
    assert retries.waiting("a.bin", "d2", 1.0) is None  # new content: probe at once
    again = retries.failed("a.bin", "d2", "FetchFailed", "x", 1.0, WALL)
    assert again.attempts == 1  # and its back-off starts over
    retries.settled("a.bin")
    assert retries.waiting("a.bin", "d2", 2.0) is None and len(retries) == 0


def test_next_due_is_the_earliest_future_wait_and_ignores_stale_entries() -> None:
    retries = ProbeRetries(Backoff(base=5, cap=60), _Top())
    assert retries.next_due(0.0) is None
    retries.failed("a", "d", "FetchFailed", "x", 0.0, WALL)  # due 15
    retries.failed("b", "d", "FetchFailed", "x", 10.0, WALL)  # due 25
    assert retries.next_due(5.0) == 10.0
    # "a" is due and no longer listed (never probed again): it must not keep waking the bundle.
    assert retries.next_due(20.0) == 5.0
    assert retries.next_due(30.0) is None


def test_entries_are_bounded_oldest_first() -> None:
    retries = ProbeRetries(Backoff(base=5, cap=60), _Top(), limit=3)
    for name in "abcd":
        retries.failed(name, "d", "FetchFailed", "x", 0.0, WALL)
    assert len(retries) == 3
    assert retries.waiting("a", "d", 1.0) is None
    assert retries.waiting("d", "d", 1.0) is not None
