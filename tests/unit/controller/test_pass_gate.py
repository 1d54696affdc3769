"""The whole-pass gate (controller/backoff.py: PassGate, used by controller/bundle.py:
run_bundle): a start's first passes run a few at a time, not a thousand at once (their peak RSS,
docs/operations.md); a pass that keeps its last outcome never waits; a pass that starts probing
gives its place back."""

from __future__ import annotations

import asyncio
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from taskhandler_operator.controller import bundle
from taskhandler_operator.controller.backoff import PassGate
from taskhandler_operator.controller.bundle import (
    BundleInputs,
    BundleMemory,
    PassReport,
    StatusProgress,
    SyncOutsideGate,
    WholePathGate,
    run_bundle,
    stored_key,
)
from taskhandler_operator.controller.health import PassWatch
from taskhandler_operator.kube import names
from taskhandler_operator.kube.status import TaskHandlerBundleStatus


class Wakeup:
    def __init__(self, passes: int) -> None:
        self.left = passes

    def collect(self) -> None:
        pass

    async def sleep_or_wake(self, seconds: float) -> tuple[str, ...]:
        self.left -= 1
        await asyncio.sleep(0)
        return ()


def runtime(gate: PassGate, wakeups: dict[str, Wakeup]) -> Any:
    nothing = SimpleNamespace(forget=lambda key: None)
    return SimpleNamespace(
        wakeups=SimpleNamespace(get=lambda ns, name: wakeups[name], discard=lambda ns, n: None),
        reconciler_heartbeat=PassWatch("reconcilers", 60.0),
        whole_passes=gate,
        poller=nothing,
        slots=nothing,
    )


def body(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": name}, "spec": {}}


def report() -> PassReport:
    return PassReport(TaskHandlerBundleStatus(), written=False, retry_in=None, interval=60.0)


def test_at_most_the_limit_of_first_passes_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    running, most, done = [0], [0], []

    async def whole_pass(inputs: BundleInputs, rt: Any, memory: BundleMemory) -> PassReport:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        done.append(inputs.name)
        return report()

    monkeypatch.setattr(bundle, "reconcile_bundle", whole_pass)
    wakeups = {f"b{i}": Wakeup(1) for i in range(10)}
    rt = runtime(PassGate(3), wakeups)

    def stopped(name: str) -> bool:
        return wakeups[name].left <= 0

    async def main() -> None:
        await asyncio.gather(
            *(run_bundle(partial(body, n), rt, partial(stopped, n)) for n in wakeups)
        )

    asyncio.run(main())
    assert sorted(done) == sorted(wakeups)
    assert most[0] == 3


def test_a_pass_that_keeps_its_outcome_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = PassGate(1)
    passes: list[str] = []
    first: list[asyncio.Event] = []

    async def keeping_pass(inputs: BundleInputs, rt: Any, memory: BundleMemory) -> PassReport:
        passes.append("whole" if memory.gate is not None and memory.gate.held else "kept")
        memory.unchanged.outcome = object()  # type: ignore[assignment]  # what a kept pass leaves
        first[0].set()
        return report()

    monkeypatch.setattr(bundle, "reconcile_bundle", keeping_pass)
    wakeups = {"a": Wakeup(2)}

    async def main() -> None:
        first.append(asyncio.Event())
        loop = run_bundle(lambda: body("a"), runtime(gate, wakeups), lambda: wakeups["a"].left <= 0)
        task = asyncio.create_task(loop)
        await first[0].wait()
        # Someone else's whole pass holds the only place: the kept pass runs all the same.
        async with gate.hold():
            await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert passes == ["whole", "kept"]


def test_a_pass_that_starts_probing_gives_its_place_back() -> None:
    gate = PassGate(1)

    async def main() -> bool:
        async with gate.hold() as ticket:
            memory = BundleMemory(gate=ticket)
            inputs = BundleInputs.from_body(body("a"))
            progress = StatusProgress(inputs, None, memory, TaskHandlerBundleStatus())  # type: ignore[arg-type]
            await progress.probing("rev", ())
            # Another bundle's whole pass gets in while this one waits for its Jobs.
            async with asyncio.timeout(5), gate.hold() as other:
                return other.held and not ticket.held

    assert asyncio.run(main())


def test_no_limit() -> None:
    async def main() -> bool:
        gate = PassGate(0)
        async with gate.hold() as a, gate.hold() as b:
            return not a.held and not b.held

    assert asyncio.run(main())


def test_a_whole_pass_syncs_its_source_without_its_place() -> None:
    """A source that hangs (up to the bundle's spec.timeout) holds up only its own bundle: the
    place is given back during the sync and taken again after it, a wait liveness ignores."""
    gate = PassGate(1)
    watch = PassWatch("reconcilers", 60.0)
    key = ("ns", "slow")
    answer = asyncio.Event()

    async def hanging_source(spec: Any) -> str:
        await answer.wait()
        return "revision"

    async def main() -> tuple[bool, bool, Any, bool]:
        async with gate.hold() as ticket:
            memory = BundleMemory(gate=ticket)
            sync = SyncOutsideGate(hanging_source, memory, watch, key)  # type: ignore[arg-type]
            with watch.busy(key):
                syncing = asyncio.create_task(sync(None))  # type: ignore[arg-type]
                await asyncio.sleep(0)
                # Another bundle's whole pass runs while this one's source does not answer.
                async with asyncio.timeout(5), gate.hold() as other:
                    got_in = other.held and not ticket.held
                    answer.set()
                    await asyncio.sleep(0.01)
                    # The sync is over, but its pass waits for the place: not a hung pass.
                    waiting_not_counted = watch.running == 0
                revision = await asyncio.wait_for(syncing, 5)
                return got_in, waiting_not_counted, revision, ticket.held and watch.running == 1

    got_in, waiting_not_counted, revision, back = asyncio.run(main())
    assert got_in and waiting_not_counted and revision == "revision" and back


def test_an_unchanged_pass_syncs_as_before() -> None:
    gate = PassGate(1)
    calls: list[str] = []

    async def source(spec: Any) -> str:
        calls.append("sync")
        return "revision"

    async def main() -> Any:
        async with gate.hold(whole=False) as ticket:
            memory = BundleMemory(gate=ticket)
            watch = PassWatch("reconcilers", 60.0)
            return await SyncOutsideGate(source, memory, watch, ("ns", "a"))(None)  # type: ignore[arg-type]

    assert asyncio.run(main()) == "revision" and calls == ["sync"]


def test_a_stored_pass_key_starts_without_a_place_and_a_change_waits_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new process's first pass over a status with a pass key expects to keep it: it starts
    at once; if its inputs changed it takes a place before its whole path (WholePathGate),
    outside the liveness count, so a thousand changed keys still run a few at a time."""
    gate = PassGate(1)
    watch = PassWatch("reconcilers", 60.0)
    seen: list[tuple[str, bool]] = []
    changed = asyncio.Event()

    async def pass_finding_a_change(
        inputs: BundleInputs, rt: Any, memory: BundleMemory
    ) -> PassReport:
        ticket = memory.gate
        assert ticket is not None
        seen.append(("started", ticket.held))
        changed.set()
        await WholePathGate(memory, watch, ("ns", inputs.name))()
        seen.append(("whole path", ticket.held))
        return report()

    monkeypatch.setattr(bundle, "reconcile_bundle", pass_finding_a_change)
    wakeups = {"a": Wakeup(1)}
    keyed = body("a") | {"status": {"passKey": "k1:" + "0" * 64}}

    async def main() -> int:
        rt = runtime(gate, wakeups)
        rt.reconciler_heartbeat = watch
        async with gate.hold():  # another bundle's whole pass holds the only place
            task = asyncio.create_task(
                run_bundle(lambda: keyed, rt, lambda: wakeups["a"].left <= 0)
            )
            await asyncio.wait_for(changed.wait(), 5)
            await asyncio.sleep(0.05)
            waiting_uncounted = watch.running
        await asyncio.wait_for(task, 5)
        return waiting_uncounted

    assert asyncio.run(main()) == 0
    assert seen == [("started", False), ("whole path", True)]


def test_the_stored_key_stands_only_for_its_generation_and_reconcile_request() -> None:
    key = "k1:" + "1" * 64
    status = TaskHandlerBundleStatus(
        observed_generation=3, last_handled_reconcile_at="r1", pass_key=key
    )

    def inputs(generation: int, requested: str | None) -> BundleInputs:
        annotations = (
            {} if requested is None else {names.ANNOTATION_RECONCILE_REQUESTED_AT: requested}
        )
        meta = {"namespace": "ns", "name": "a", "uid": "u", "generation": generation}
        return BundleInputs.from_body({"metadata": meta | {"annotations": annotations}})

    assert stored_key(inputs(3, "r1"), status) == key
    assert stored_key(inputs(3, None), status) == key
    assert stored_key(inputs(4, "r1"), status) is None  # the spec changed since
    assert stored_key(inputs(3, "r2"), status) is None  # a reconcile-now asks for the whole path
    assert stored_key(inputs(3, "r1"), status.model_copy(update={"pass_key": None})) is None
