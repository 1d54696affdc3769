"""A released hold stops its reconciler at once; a new hold of the same bundle waits for it."""

from __future__ import annotations

import asyncio

from taskhandler_operator.controller.holds import Holds, run_held


async def test_a_release_cancels_the_pass_in_progress() -> None:
    holds = Holds()
    hold = holds.take("ns", "b")
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def reconciler() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)  # a pass waiting for its probe Job
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.create_task(run_held(holds, hold, reconciler()))
    await started.wait()
    assert holds.holds("ns", "b")
    assert holds.release("ns", "b")
    await asyncio.wait_for(running, 5)
    assert cancelled.is_set() and not holds.holds("ns", "b") and len(holds) == 0
    assert not holds.release("ns", "b")  # a second DELETED: nothing held


async def test_a_bundle_back_at_once_waits_for_its_old_reconciler() -> None:
    holds = Holds()
    order: list[str] = []
    first = holds.take("ns", "b")
    gate = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await gate.wait()  # still winding down (a cancelled pass's cleanup)
            order.append("old ended")

    async def fresh() -> None:
        order.append("new started")

    old = asyncio.create_task(run_held(holds, first, slow_to_stop()))
    await asyncio.sleep(0)
    holds.release("ns", "b")
    second = holds.take("ns", "b")  # relabelled back before the old one ended
    new = asyncio.create_task(run_held(holds, second, fresh()))
    await asyncio.sleep(0.05)
    assert order == []
    gate.set()
    await asyncio.wait_for(asyncio.gather(old, new), 5)
    assert order == ["old ended", "new started"]
    assert not holds.holds("ns", "b")


async def test_a_cancelled_daemon_cancels_its_reconciler() -> None:
    holds = Holds()
    hold = holds.take("ns", "b")
    cancelled = asyncio.Event()

    async def reconciler() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.create_task(run_held(holds, hold, reconciler()))
    await asyncio.sleep(0.01)
    running.cancel()  # kopf stopping the daemon (a deletion, the operator exiting)
    await asyncio.gather(running, return_exceptions=True)
    assert cancelled.is_set() and len(holds) == 0
