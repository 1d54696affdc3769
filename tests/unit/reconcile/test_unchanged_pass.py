"""The unchanged pass: when a pass may keep the last outcome, and every change that must not.

In-memory ports around the real listing and validation (as in test_steps.py); the store below
counts its reads and writes and answers a watermark that moves with every row it changes. The
same on real PostgreSQL is tests/integration/test_unchanged_pass.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskhandler_devenv.packers import write_typescript_bundle
from taskhandler_operator.airflow.serialized import DagStubs, StubTask
from taskhandler_operator.controller.bundle import BundleMemory
from taskhandler_operator.controller.report import Observation, bundle_status, previous_status
from taskhandler_operator.db.engine import DatabaseUnavailable
from taskhandler_operator.db.watermark import RowsWatermark
from taskhandler_operator.db.write_models import BundlePass, PassResult
from taskhandler_operator.reconcile.errors import DatabaseFailed, SourceFailed
from taskhandler_operator.reconcile.local import LocalFolderSyncer
from taskhandler_operator.reconcile.models import BundleSpec, SyncedRevision
from taskhandler_operator.reconcile.steps import (
    PassInputs,
    PassMemory,
    PassOutcome,
    PassPorts,
    keeps,
    queue_dags,
    run_pass,
)
from taskhandler_operator.records import TaskHandlerArtifact
from tests.unit.reconcile.test_steps import SPEC, FakeClock, FakeProber, handler

ANSWERS = {
    "extract.min.mjs": {"etl": [handler("extract")]},
    "load.min.mjs": {"etl": [handler("load")]},
}


def inventory(*task_ids: str, queue: str = "typescript") -> Mapping[str, DagStubs]:
    stubs = tuple(StubTask(task_id=t, queue=queue, arg_bindings=()) for t in task_ids)
    other = (StubTask(task_id="x", queue="elsewhere", arg_bindings=()),)
    return {
        "etl": DagStubs(dag_id="etl", bundle_name="dags", relative_fileloc="etl.py", stubs=stubs),
        "other": DagStubs(dag_id="other", bundle_name="dags", relative_fileloc="o.py", stubs=other),
    }


class CountingStore:
    """Rows as a set of (kind, key, value); a write changes only what differs, like the real
    writer, and every change moves the watermark."""

    def __init__(self, dags: Mapping[str, DagStubs]) -> None:
        self.dags = dags
        self.known: list[TaskHandlerArtifact] = []
        self.rows: frozenset[tuple[str, str, str]] = frozenset()
        self.version = 0
        self.loads = self.writes = self.watermarks = 0
        self.fail_watermark: Exception | None = None

    async def known_artifacts(self, bundle_name: str) -> list[TaskHandlerArtifact]:
        self.loads += 1
        return list(self.known)

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        return {}

    async def stub_inventory(self) -> Mapping[str, DagStubs]:
        return self.dags

    async def recent_stub_inventory(self) -> Mapping[str, DagStubs]:
        return self.dags

    async def write(self, bundle_pass: BundlePass) -> PassResult:
        self.writes += 1
        rows = frozenset(
            {
                ("artifact", r.artifact.relative_fileloc, r.artifact.cache_digest or "")
                for r in bundle_pass.artifacts
            }
            | {
                ("binding", f"{b.dag_id}.{b.task_id}", b.artifact_rel_path)
                for v in bundle_pass.verdicts
                for b in v.bindings or ()
            }
        )
        changed = len(rows ^ self.rows)
        if changed:
            self.version += 1
        self.rows = rows
        self.known = [r.artifact for r in bundle_pass.artifacts]
        return PassResult(
            bundle_name=bundle_pass.bundle_name,
            bindings_inserted=changed,
            dag_outcomes={v.dag_id: "reconciled" for v in bundle_pass.verdicts},
        )

    async def rows_watermark(
        self, bundle_name: str, dag_ids: Sequence[str], queues: Sequence[str]
    ) -> RowsWatermark:
        self.watermarks += 1
        if self.fail_watermark is not None:
            raise self.fail_watermark
        return (len(self.rows), self.version)


class FlakySyncer:
    """A folder syncer that fails when told to."""

    def __init__(self, root: Path) -> None:
        self.inner = LocalFolderSyncer(root)
        self.fail = False

    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        if self.fail:
            raise OSError("the source is down")
        return await self.inner(spec)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_typescript_bundle(root / "extract.min.mjs", b"export const extract = 1;\n")
    write_typescript_bundle(root / "load.min.mjs", b"export const load = 2;\n")
    return root


def ports_for(
    folder: Path, store: CountingStore, memory: PassMemory, prober: FakeProber | None = None
) -> PassPorts:
    return PassPorts(
        FlakySyncer(folder),
        prober or FakeProber(ANSWERS),
        store,
        clock=FakeClock(),
        memory=memory,
        watermarks=store,
    )


async def settle(spec: BundleSpec, ports: PassPorts) -> PassOutcome:
    """The first pass probes and writes, the second writes nothing and is remembered."""
    await run_pass(spec, ports)
    second = await run_pass(spec, ports)
    assert second.written.rows_written == 0 and not second.summary.reused
    assert ports.memory is not None and ports.memory.inputs is not None
    return second


async def test_an_unchanged_pass_keeps_the_outcome_without_loading_or_writing(
    folder: Path,
) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    remembered = await settle(SPEC, ports)
    loads, writes = store.loads, store.writes

    kept = await run_pass(SPEC, ports)

    assert (store.loads, store.writes) == (loads, writes)  # nothing loaded, nothing written
    assert kept.summary.reused and memory.kept == 1
    assert kept.summary.counts == remembered.summary.counts
    # The kept outcome holds no bindings (they are in the database; the summary counts them).
    assert remembered.validated.result.bindings and not kept.validated.result.bindings
    assert kept.summary.counts.bindings == len(remembered.validated.result.bindings)
    assert kept.summary.started_at != remembered.summary.started_at
    assert set(kept.summary.step_seconds) == {"sync", "list", "inventory", "watermark"}
    # Only the Dag with a stub on the bundle's queues was validated ("other" is on another).
    assert [v.dag_id for v in remembered.validated.result.verdicts] == ["etl"]
    assert kept.validated.result.verdicts == ()  # "etl" validated without a problem
    assert set(kept.summary.dag_outcomes) == set(kept.written.dag_outcomes) == {"etl"}
    assert kept.validated.result.problems == remembered.validated.result.problems


async def test_a_changed_stub_inventory_takes_the_whole_path(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    await settle(SPEC, ports)

    store.dags = inventory("extract")  # Airflow's Dag lost its `load` stub
    changed = await run_pass(SPEC, ports)

    assert not changed.summary.reused and store.writes == 3
    assert {b.task_id for b in changed.validated.result.bindings} == {"extract"}
    assert changed.written.rows_written > 0 and memory.inputs is None  # wrote: not kept


async def test_an_equal_but_new_inventory_snapshot_is_not_trusted(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    await settle(SPEC, ports)

    store.dags = dict(store.dags)  # same content, another object: compared by identity
    again = await run_pass(SPEC, ports)

    assert not again.summary.reused and store.writes == 3


async def test_a_row_changed_by_another_writer_takes_the_whole_path(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    await settle(SPEC, ports)

    store.version += 1  # e.g. Airflow's Dag processor rewrote an artifact row
    again = await run_pass(SPEC, ports)

    assert not again.summary.reused and (store.loads, store.writes) == (3, 3)
    assert memory.inputs is not None  # nothing to write: remembered with the new watermark
    assert (await run_pass(SPEC, ports)).summary.reused


async def test_a_new_revision_or_spec_takes_the_whole_path(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    await settle(SPEC, ports)

    other_queue = SPEC.model_copy(update={"queues": ("typescript", "more")})
    assert not (await run_pass(other_queue, ports)).summary.reused
    assert (await run_pass(other_queue, ports)).summary.reused

    write_typescript_bundle(folder / "new.min.mjs", b"export const fresh = 3;\n")
    prober = FakeProber({**ANSWERS, "new.min.mjs": {"etl": [handler("fresh")]}})
    ports = dataclasses.replace(ports, prober=prober)
    new_revision = await run_pass(other_queue, ports)
    assert not new_revision.summary.reused
    assert [r.candidate.rel_path for r in prober.requests] == ["new.min.mjs"]


async def test_after_a_failure_the_next_pass_takes_the_whole_path(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    ports = ports_for(folder, store, memory)
    await settle(SPEC, ports)
    syncer = ports.syncer
    assert isinstance(syncer, FlakySyncer)

    syncer.fail = True
    with pytest.raises(SourceFailed):
        await run_pass(SPEC, ports)
    syncer.fail = False
    after_source = await run_pass(SPEC, ports)
    assert not after_source.summary.reused and store.writes == 3

    store.fail_watermark = DatabaseUnavailable("database unavailable: gone")
    with pytest.raises(DatabaseFailed) as failed:
        await run_pass(SPEC, ports)
    assert failed.value.retryable and memory.inputs is None
    store.fail_watermark = None
    assert not (await run_pass(SPEC, ports)).summary.reused


async def test_a_probe_failure_is_never_kept(folder: Path) -> None:
    store, memory = CountingStore(inventory("extract", "load")), PassMemory()
    prober = FakeProber({**ANSWERS, "load.min.mjs": "the runtime crashed"})
    ports = ports_for(folder, store, memory, prober)

    for _ in range(3):
        outcome = await run_pass(SPEC, ports)
        assert not outcome.summary.reused and memory.inputs is None
    # Each pass asks again about the artifact without an answer.
    assert [r.candidate.rel_path for r in prober.requests].count("load.min.mjs") == 3


def test_keeps_only_a_pass_that_probed_nothing_and_wrote_nothing() -> None:
    class Plan:
        def __init__(self, probe: tuple[object, ...]) -> None:
            self.probe = probe

    dags = inventory("extract")

    def outcome(probe: tuple[object, ...], rows: int, validated_dags: object) -> PassOutcome:
        return PassOutcome(
            synced=None,  # type: ignore[arg-type]
            listed=None,  # type: ignore[arg-type]
            planned=type("P", (), {"plan": Plan(probe)})(),
            probed=None,  # type: ignore[arg-type]
            validated=type("V", (), {"dags": validated_dags})(),
            written=PassResult(bundle_name="ts", bindings_updated=rows),
            summary=None,  # type: ignore[arg-type]
        )

    seen = PassInputs(SPEC, "r1", (), (), dags, ("etl",), (1, 2))
    assert keeps(outcome((), 0, dags), seen)
    assert not keeps(outcome(("a.min.mjs",), 0, dags), seen)  # probed
    assert not keeps(outcome((), 1, dags), seen)  # wrote a row
    assert not keeps(outcome((), 0, dict(dags)), seen)  # validated another snapshot


def test_same_inputs_compare_every_part() -> None:
    dags = inventory("extract")
    base = PassInputs(SPEC, "r1", (), (), dags, ("etl",), (1, 2))
    assert base.same_as(dataclasses.replace(base))
    for change in (
        {"revision": "r2"},
        {"rows": (1, 3)},
        {"dags": dict(dags)},
        {"spec": SPEC.model_copy(update={"queues": ("other",)})},
        {"problems": (object(),)},
    ):
        assert not base.same_as(dataclasses.replace(base, **change)), change


def test_queue_dags_names_the_dags_with_a_stub_on_the_queues() -> None:
    dags = inventory("extract")
    assert queue_dags(dags, ["typescript"]) == ("etl",)
    assert queue_dags(dags, ["elsewhere", "typescript"]) == ("etl", "other")
    assert queue_dags(dags, ["nobody"]) == ()


def test_a_new_generation_or_reconcile_now_request_forgets_the_last_pass() -> None:
    memory = BundleMemory()
    remembered = memory.pass_memory(1, None)

    def remember() -> None:
        remembered.inputs = PassInputs(SPEC, "r1", (), (), {}, (), ())
        remembered.outcome = object()  # type: ignore[assignment]

    remember()
    assert memory.pass_memory(1, None).inputs is not None  # the same trigger: kept
    assert memory.pass_memory(2, None).inputs is None  # the spec changed
    remember()
    assert memory.pass_memory(2, "2026-12-01T04:00:00Z").inputs is None  # reconcile now
    remember()
    assert memory.pass_memory(2, "2026-12-01T04:00:00Z") is remembered
    assert remembered.inputs is not None


async def test_the_kept_slim_outcome_gives_the_same_status(folder: Path) -> None:
    write_typescript_bundle(folder / "broken.min.mjs", b"x")
    (folder / "broken.min.mjs").write_bytes(b"//# airflowBundle={broken\n")
    store, memory = CountingStore(inventory("extract", "load", "missing")), PassMemory()
    ports = ports_for(folder, store, memory)
    full = await settle(SPEC, ports)
    kept = await run_pass(SPEC, ports)
    assert kept.summary.reused and kept.probed.records == ()  # the answers were dropped

    now = datetime(2026, 12, 1, 5, 0, tzinfo=UTC)
    old = previous_status(None)
    statuses = [
        bundle_status(old, Observation(generation=3, now=now, outcome=o, synced_revision="r"))
        for o in (full, kept)
    ]
    assert statuses[0].to_body() == statuses[1].to_body()
    body = statuses[0].to_body()
    assert {a["path"]: a.get("handlers") for a in body["artifacts"]} == {
        "broken.min.mjs": None,
        "extract.min.mjs": 1,
        "load.min.mjs": 1,
    }
    assert any(p["kind"] == "unbound" for p in body["problems"])
