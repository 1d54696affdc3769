"""The per-bundle loop (controller/bundle.py: run_bundle) keeps nothing of the object between
passes: a thousand bundles' loops sleep at once, so a body copy held over a sleep costs its size
once per bundle (docs/operations.md, the RSS bullet)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from taskhandler_operator.controller import bundle
from taskhandler_operator.controller.backoff import PassGate
from taskhandler_operator.controller.bundle import (
    BundleInputs,
    BundleMemory,
    PassReport,
    run_bundle,
)
from taskhandler_operator.controller.health import PassWatch
from taskhandler_operator.kube.status import TaskHandlerBundleStatus


class Tracked(dict[str, Any]):
    """A part of the body; ``copy.deepcopy`` keeps the type, so live copies can be counted."""


def live_tracked() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Tracked)


def make_body() -> dict[str, Any]:
    return {
        "metadata": Tracked(
            namespace="ns",
            name="b",
            uid="u",
            generation=3,
            annotations=Tracked({"langsdk.dev/reconcile-requested-at": "t1"}),
            managedFields=[Tracked(manager="kubectl", fieldsV1=Tracked(f={}))],
        ),
        "spec": Tracked(bundleName="b", queues=["q"]),
        "status": Tracked(artifacts=[Tracked(path="a.mjs", state="Cached")]),
    }


class FakeWakeup:
    def __init__(self, passes: int, during_sleep: list[int]) -> None:
        self.left = passes
        self.during_sleep = during_sleep

    def collect(self) -> None:
        pass

    async def sleep_or_wake(self, seconds: float) -> tuple[str, ...]:
        self.during_sleep.append(live_tracked())
        self.left -= 1
        return ()


def fake_runtime(wakeup: FakeWakeup) -> Any:
    nothing = SimpleNamespace(forget=lambda key: None)
    return SimpleNamespace(
        wakeups=SimpleNamespace(get=lambda ns, name: wakeup, discard=lambda ns, name: None),
        reconciler_heartbeat=PassWatch("reconcilers", 60.0),
        whole_passes=PassGate(),
        poller=nothing,
        slots=nothing,
    )


def test_no_copy_of_the_body_outlives_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    body = make_body()
    originals = live_tracked()
    read: list[tuple[int, str | None, str, bool]] = []
    in_pass: list[int] = []

    async def fake_reconcile(
        inputs: BundleInputs, runtime: Any, memory: BundleMemory
    ) -> PassReport:
        status_copied = inputs.status is not body["status"] and inputs.status == body["status"]
        read.append(
            (inputs.generation, inputs.requested_at, inputs.spec["bundleName"], status_copied)
        )
        in_pass.append(live_tracked())
        return PassReport(TaskHandlerBundleStatus(), written=False, retry_in=None, interval=60.0)

    monkeypatch.setattr(bundle, "reconcile_bundle", fake_reconcile)
    during_sleep: list[int] = []
    wakeup = FakeWakeup(passes=2, during_sleep=during_sleep)

    def get_body() -> Mapping[str, Any]:
        return body

    asyncio.run(run_bundle(get_body, fake_runtime(wakeup), lambda: wakeup.left <= 0))

    # Each pass read its own copy of what it uses.
    assert read == [(3, "t1", "b", True), (3, "t1", "b", True)]
    assert all(n > originals for n in in_pass)
    # While the loop sleeps, no copy of any part of the body is alive.
    assert during_sleep == [originals, originals]


def test_inputs_copy_spec_status_and_annotations_but_not_managed_fields() -> None:
    body = make_body()
    originals = live_tracked()
    inputs = BundleInputs.from_body(body)
    body["spec"]["queues"].append("changed later")
    body["status"]["artifacts"][0]["state"] = "Failed"
    assert inputs.spec["queues"] == ["q"]
    assert inputs.status is not None and inputs.status["artifacts"][0]["state"] == "Cached"
    # Of the tracked parts only the status's artifact is copied (spec, status and annotations
    # are copied as plain dicts); metadata, its managedFields and their fieldsV1 are not.
    assert live_tracked() - originals == 1
    assert not hasattr(inputs, "body")


def test_what_a_bundle_keeps_between_passes_starts_small() -> None:
    # Its retry and probe-retry back-offs draw from the shared generator: a random.Random of
    # their own held 2.5 KB of state each (the loop's jitter a third), 7.5 MB at 1,000 bundles.
    BundleMemory()  # first-use allocations (caches, interned names) out of the count
    tracemalloc.start()
    try:
        memories = [BundleMemory() for _ in range(100)]
        size = tracemalloc.get_traced_memory()[0] / len(memories)
    finally:
        tracemalloc.stop()
    assert size < 2_000
