"""What liveness means (controller/health.py), on a fake clock: a stuck loop, never idleness.

The bug these pin down: the ``reconcilers`` heartbeat was beaten only after a pass, with a fixed
600 s limit, so a leader with no bundles (or only bundles with a long interval) answered 503 on
``/healthz`` after ten minutes and the kubelet restarted it forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from taskhandler_operator.controller import bundle
from taskhandler_operator.controller.backoff import PassGate
from taskhandler_operator.controller.bundle import BundleInputs, BundleMemory, PassReport
from taskhandler_operator.controller.health import HealthState, Heartbeat, PassWatch, tick
from taskhandler_operator.kube.status import TaskHandlerBundleStatus
from taskhandler_operator.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_pass_watch_is_live_for_ever() -> None:
    clock = Clock()
    watch = PassWatch("reconcilers", 600, clock=clock)
    state = HealthState()
    state.add(watch)
    clock.now += 10 * 86400  # ten days with no bundle, or every bundle asleep
    live, checks = state.liveness()
    assert live and checks["reconcilers"]["ageSeconds"] == 0.0


def test_a_pass_running_past_the_limit_is_stuck_until_it_ends() -> None:
    clock = Clock()
    watch = PassWatch("reconcilers", 600, clock=clock)
    with watch.busy(("ns", "quick")):
        clock.now += 30
    with watch.busy(("ns", "slow")):
        clock.now += 599
        assert watch.fresh() and watch.running == 1
        clock.now += 2
        assert not watch.fresh() and watch.age() == pytest.approx(601)
        watch.disarm()  # a standby runs no daemons: never held against it
        assert watch.fresh()
        watch.arm()
        assert not watch.fresh()
    assert watch.fresh() and watch.running == 0  # the pass ended: live again


def test_the_oldest_running_pass_counts() -> None:
    clock = Clock()
    watch = PassWatch("reconcilers", 100, clock=clock)
    with watch.busy("a"):
        clock.now += 60
        with watch.busy("b"):
            clock.now += 50
            assert watch.age() == pytest.approx(110) and not watch.fresh()
        assert not watch.fresh()
    assert watch.fresh()


def test_a_pass_that_raises_is_no_longer_counted() -> None:
    watch = PassWatch("reconcilers", 1)
    with pytest.raises(RuntimeError), watch.busy("a"):
        raise RuntimeError("boom")
    assert watch.running == 0


def test_bad_pass_watch_is_refused() -> None:
    with pytest.raises(ValueError, match="max_age must be positive"):
        PassWatch("x", -1)


def test_the_ticker_beats_while_the_loop_runs() -> None:
    clock = Clock()
    beat = Heartbeat("event-loop", 5, clock=clock)

    async def scenario() -> None:
        task = asyncio.create_task(tick(beat, 0.01))
        clock.now += 100
        assert not beat.fresh()  # nothing ran the ticker meanwhile: a blocked loop
        await asyncio.sleep(0.05)
        assert beat.fresh()  # the loop ran it again
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_limits_are_settings_with_safe_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings()
    assert defaults.liveness_event_loop_seconds == 30
    assert defaults.liveness_election_seconds == 60
    assert defaults.liveness_inventory_seconds == 120
    assert defaults.liveness_pass_seconds == 3 * 3600
    monkeypatch.setenv("THOP_LIVENESS_PASS_SECONDS", "2.5")
    monkeypatch.setenv("THOP_LIVENESS_EVENT_LOOP_SECONDS", "0.5")
    settings = Settings()
    assert (settings.liveness_pass_seconds, settings.liveness_event_loop_seconds) == (2.5, 0.5)


class FakeWakeup:
    def __init__(self, watch: PassWatch, passes: int) -> None:
        self.watch = watch
        self.left = passes
        self.running_while_asleep: list[int] = []

    def collect(self) -> None:
        pass

    async def sleep_or_wake(self, seconds: float) -> tuple[str, ...]:
        self.running_while_asleep.append(self.watch.running)
        self.left -= 1
        return ()


def test_a_bundle_daemon_counts_its_passes_not_its_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    watch = PassWatch("reconcilers", 600, clock=clock)
    during_pass: list[int] = []

    async def fake_reconcile(inputs: BundleInputs, runtime: Any, memory: BundleMemory) -> Any:
        during_pass.append(watch.running)
        return PassReport(TaskHandlerBundleStatus(), written=False, retry_in=None, interval=3600)

    monkeypatch.setattr(bundle, "reconcile_bundle", fake_reconcile)
    wakeup = FakeWakeup(watch, passes=3)
    nothing = SimpleNamespace(forget=lambda key: None)
    runtime: Any = SimpleNamespace(
        wakeups=SimpleNamespace(get=lambda ns, name: wakeup, discard=lambda ns, name: None),
        reconciler_heartbeat=watch,
        whole_passes=PassGate(),
        poller=nothing,
        slots=nothing,
    )
    body: Mapping[str, Any] = {
        "metadata": {"namespace": "ns", "name": "b", "uid": "u", "generation": 1},
        "spec": {"bundleName": "b", "queues": ["q"]},
    }
    asyncio.run(bundle.run_bundle(lambda: body, runtime, lambda: wakeup.left <= 0))
    assert during_pass == [1, 1, 1]
    assert wakeup.running_while_asleep == [0, 0, 0]
    clock.now += 86400  # a day of sleeping between passes: still live
    assert watch.fresh()
