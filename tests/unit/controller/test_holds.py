"""A released hold stops its reconciler at once; a new hold of the same bundle waits for it."""

from __future__ import annotations

import asyncio

from taskhandler_operator.controller.holds import Holds, absent, run_held


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


def test_absent_picks_the_held_bundles_a_listing_lacks() -> None:
    held = {("ns", "kept"): 0, ("ns", "moved"): 1, ("other", "moved"): 2}
    listed = {("ns", "kept"), ("ns", "never-held")}
    assert absent(held, listed, before=3) == [("ns", "moved"), ("other", "moved")]
    assert absent(held, set(), before=0) == []  # nothing held before the listing was sent


def test_absent_spares_holds_taken_after_the_listing_was_sent() -> None:
    # ("ns", "new") joined the shard after the LIST's snapshot: its reconciler started while
    # the LIST was under way (seq 5 >= the mark 5 taken before sending it).
    held = {("ns", "old"): 4, ("ns", "new"): 5}
    assert absent(held, set(), before=5) == [("ns", "old")]


async def test_holds_absent_compares_only_holds_taken_before_the_mark() -> None:
    holds = Holds()
    holds.take("ns", "a")
    holds.take("ns", "b")
    mark = holds.mark()
    holds.take("ns", "c")  # taken while the LIST was under way
    holds.take("ns", "a")  # "a" came back: a new hold, after the mark
    assert holds.absent({("ns", "x")}, mark) == [("ns", "b")]
    assert holds.absent({("ns", "b")}, mark) == []
    assert holds.absent(set(), holds.mark()) == [("ns", "a"), ("ns", "b"), ("ns", "c")]
