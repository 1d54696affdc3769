"""The unchanged pass on real PostgreSQL with Airflow's schema: a pass whose inputs did not
change keeps its outcome and sends only its two reads (the stub inventory's cheap query and the
rows' watermark); a binding deleted behind the operator's back, or a stub task Airflow dropped,
still takes the whole path and rebinds.

The artifacts are real packed TypeScript runtimes whose answers are recorded beforehand, as
Airflow's Dag processor records them (so no probe runs; the real probe driver is wired in and
counted to prove it). The decision rules alone are tests/unit/reconcile/test_unchanged_pass.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from benchmarks._operator_env import handler_spec, typescript_artifact
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.artifacts.listing import list_candidates
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.controller import runtime
from taskhandler_operator.controller.backoff import Wakeups
from taskhandler_operator.controller.runtime import BundleStore, InventoryPoller
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.db.tables import BINDING_TABLE
from taskhandler_operator.db.writer import record_artifacts
from taskhandler_operator.reconcile.local import LocalFolderSyncer
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.reconcile.steps import (
    PassMemory,
    PassOutcome,
    PassPorts,
    StatusKept,
    run_pass,
    run_pass_or_keep,
)
from taskhandler_operator.reconcile.store import DatabaseStore
from taskhandler_operator.records import ArtifactRecord, BundleOwner, TaskHandlerArtifact
from tests.integration.test_reconcile_pass import CountingProber

pytestmark = [pytest.mark.integration]

DAG = "orders_etl"
TASKS = ("extract", "transform", "load")
OWNER = BundleOwner(cluster_id="it", namespace="orders", name="orders-ts", uid="uid-1")
SPEC = BundleSpec(
    bundle_name="orders-ts", language=Language.TYPESCRIPT, queues=("ts",), owner=OWNER
)


def seed_dag(url: str, tasks: tuple[str, ...]) -> None:
    """Airflow's Dag processor writing (a new version of) the Dag."""
    sync = sa.create_engine(url)
    try:
        with sync.begin() as conn:
            insert_dag(conn, dag_document(DAG, [stub_task(t, queue="ts") for t in tasks]))
    finally:
        sync.dispose()


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    upgrade(pg_url)
    seed_dag(pg_url, TASKS)
    own = create_engine(pg_url)
    try:
        yield own
    finally:
        await own.dispose()


@pytest.fixture
async def folder(tmp_path: Path, engine: AsyncEngine) -> Path:
    """One artifact per task, its answer recorded under the bundle's claim."""
    root = tmp_path / "bundle"
    root.mkdir()
    for task in TASKS:
        (root / f"{task}.min.mjs").write_bytes(typescript_artifact(handler_spec(DAG, [task])))
    listing = list_candidates(root, Language.TYPESCRIPT)
    records = [
        ArtifactRecord(
            artifact=TaskHandlerArtifact(
                bundle_name=SPEC.bundle_name,
                relative_fileloc=c.rel_path,
                size_bytes=c.size_bytes,
                cache_digest=c.cache_digest,
                task_handlers=handler_spec(DAG, [c.rel_path.removesuffix(".min.mjs")]),
            ),
            probed_at=datetime.now(UTC),
        )
        for c in listing.candidates
    ]
    await record_artifacts(engine, SPEC.bundle_name, records, owner=OWNER)
    return root


@pytest.fixture
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement the engine sends, as the driver gets it."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def bound(engine: AsyncEngine) -> dict[str, int]:
    """task_id -> the xmin of its binding row (a rewrite changes it)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(f"SELECT task_id, xmin::text::bigint FROM {BINDING_TABLE} WHERE dag_id = :d"),
            {"d": DAG},
        )
        return {task: int(xmin) for task, xmin in rows.all()}


async def test_an_unchanged_pass_skips_the_work_and_a_changed_inventory_rebinds(
    pg_url: str, engine: AsyncEngine, folder: Path, statements: list[str]
) -> None:
    prober = CountingProber()
    store = DatabaseStore(engine)
    memory = PassMemory()
    ports = PassPorts(LocalFolderSyncer(folder), prober, store, memory=memory, watermarks=store)

    async def one_pass() -> tuple[PassOutcome, list[str]]:
        statements.clear()
        outcome = await run_pass(SPEC, ports)
        return outcome, list(statements)

    first, _ = await one_pass()
    assert first.written.rows_written > 0 and first.summary.counts.bindings == 3
    second, full = await one_pass()
    assert second.written.rows_written == 0 and not second.summary.reused
    rows_before = await bound(engine)
    assert set(rows_before) == set(TASKS)
    snapshot = store.inventory.dags

    kept, sent = await one_pass()

    assert kept.summary.reused and memory.kept == 1 and prober.calls == 0
    assert kept.summary.counts == second.summary.counts
    assert store.inventory.dags is snapshot  # a refresh that found nothing kept the snapshot
    # Two reads (the inventory's cheap query and the watermark) instead of the whole pass's.
    assert len(sent) == 2 and len(full) > 10, (sent, full)
    assert all(s.upper().startswith(("SELECT", "WITH")) for s in sent), sent
    assert await bound(engine) == rows_before  # no row version written

    # An administrator deletes a binding: the watermark moves, the whole pass restores it.
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(f"DELETE FROM {BINDING_TABLE} WHERE dag_id = :d AND task_id = 'load'"),
            {"d": DAG},
        )
    restored, _ = await one_pass()
    assert not restored.summary.reused and restored.written.bindings_inserted == 1
    assert set(await bound(engine)) == set(TASKS)
    assert not (await one_pass())[0].summary.reused  # wrote last time: checked once more
    assert (await one_pass())[0].summary.reused

    # Airflow's Dag loses its `load` stub: a new inventory snapshot, the whole path, rebound.
    seed_dag(pg_url, ("extract", "transform"))
    rebound, _ = await one_pass()
    assert not rebound.summary.reused and store.inventory.dags is not snapshot
    assert rebound.written.bindings_deleted == 1
    assert set(await bound(engine)) == {"extract", "transform"}
    assert not (await one_pass())[0].summary.reused
    assert (await one_pass())[0].summary.reused
    assert prober.calls == 0


async def test_a_recent_inventory_is_reused_and_the_change_it_missed_wakes_the_bundle(
    pg_url: str, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Recent" made an hour, so a slow machine cannot make the second read a real refresh.
    monkeypatch.setattr(runtime, "INVENTORY_MAX_AGE_SECONDS", 3600.0)
    wakeups = Wakeups()
    poller = InventoryPoller(DatabaseStore(engine), wakeups)
    key = (OWNER.namespace, OWNER.name)
    poller.serve(key, frozenset(SPEC.queues))
    wakeups.get(*key)  # the bundle's loop exists (a wake-up for none is dropped)
    other = (OWNER.namespace, "another-bundle")
    poller.serve(other, frozenset(SPEC.queues))
    ours = BundleStore(poller, key)

    seen = await ours.recent_stub_inventory()
    assert poller.polls == 1 and {s.task_id for s in seen[DAG].stubs} == set(TASKS)

    seed_dag(pg_url, ("extract",))  # Airflow changes the Dag meanwhile
    assert await ours.recent_stub_inventory() is seen and poller.polls == 1  # not re-read yet

    # The next real refresh (another bundle's pass, or the poller's own round) finds the change
    # and wakes every other bundle serving the queue, so the stale read costs one wake-up.
    await BundleStore(poller, other).stub_inventory()
    assert poller.polls == 2 and poller.store.inventory.dags is not seen
    assert wakeups.get(*key).collect() == ("stub inventory changed",)


async def test_a_change_found_after_the_plan_wakes_the_bundle_that_found_it(
    pg_url: str, engine: AsyncEngine
) -> None:
    # A pass plans with the inventory it read first and validates with a fresh one. A stub Dag
    # added in between was in no probe's dag_ids, so this bundle needs another pass even though
    # its own refresh found the change (CI once saw such a Dag never bound).
    wakeups = Wakeups()
    poller = InventoryPoller(DatabaseStore(engine), wakeups)
    key = (OWNER.namespace, OWNER.name)
    poller.serve(key, frozenset(SPEC.queues))
    wakeup = wakeups.get(*key)
    ours = BundleStore(poller, key)

    await ours.recent_stub_inventory()  # the plan's read
    assert wakeup.collect() == ()
    seed_dag(pg_url, ("extract",))  # Airflow changes the Dag while the pass probes
    await ours.stub_inventory()  # the validate step's refresh
    assert wakeup.collect() == ("stub inventory changed",)

    # Nothing new: no wake-up, from either read.
    await ours.stub_inventory()
    assert await ours.recent_stub_inventory() is poller.store.inventory.dags
    assert wakeup.collect() == ()


async def test_a_new_process_keeps_the_stored_status_only_while_the_pass_key_matches(
    pg_url: str, engine: AsyncEngine, folder: Path, statements: list[str]
) -> None:
    prober = CountingProber()

    async def settled() -> PassOutcome:
        """The first process: a pass that binds, then one that changes nothing (keyed)."""
        store = DatabaseStore(engine)
        ports = PassPorts(
            LocalFolderSyncer(folder), prober, store, memory=PassMemory(), watermarks=store
        )
        first = await run_pass(SPEC, ports)
        if first.written.rows_written == 0:
            return first
        assert first.key is None  # it wrote rows: the watermark read before it is stale
        return await run_pass(SPEC, ports)

    async def new_process(key: str | None, spec: BundleSpec = SPEC) -> tuple[Any, int]:
        """A new process's first pass (its own store, inventory and memory), given ``key``
        as stored with the status; and how often it asked for the whole-pass gate."""
        gate: list[str] = []

        async def whole_path() -> None:
            gate.append("whole")

        store = DatabaseStore(engine)
        ports = PassPorts(
            LocalFolderSyncer(folder),
            prober,
            store,
            memory=PassMemory(),
            watermarks=store,
            stored_key=key,
            whole_path=whole_path,
        )
        return await run_pass_or_keep(spec, ports), len(gate)

    second = await settled()
    assert second.written.rows_written == 0 and second.key is not None
    rows_before = await bound(engine)

    statements.clear()
    kept, gated = await new_process(second.key)
    assert isinstance(kept, StatusKept) and kept.key == second.key and gated == 0
    # The inventory's and the watermark's reads only (a new process reads the inventory whole:
    # its fingerprint, its rows, the documents); no answer loaded, nothing written.
    assert all(s.upper().startswith(("SELECT", "WITH")) for s in statements), statements
    assert len(statements) == 4 and prober.calls == 0
    assert await bound(engine) == rows_before
    # Another leader term (the writer's identity) is not an input.
    other = SPEC.model_copy(
        update={"publish": SPEC.publish.model_copy(update={"operator": "pod-b/term-7"})}
    )
    assert isinstance((await new_process(second.key, other))[0], StatusKept)
    # No key stored, or another one: the whole path, through the gate.
    for stored in (None, "k1:" + "0" * 64):
        whole, gated = await new_process(stored)
        assert isinstance(whole, PassOutcome) and whole.key == second.key and gated == 1

    # A binding deleted while no operator ran: the rows' watermark moved, the whole path
    # restores the row, and its own key (after the write) differs from the stored one.
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(f"DELETE FROM {BINDING_TABLE} WHERE dag_id = :d AND task_id = 'load'"),
            {"d": DAG},
        )
    restored, gated = await new_process(second.key)
    assert isinstance(restored, PassOutcome) and gated == 1
    assert restored.written.bindings_inserted == 1 and restored.key is None
    assert set(await bound(engine)) == set(TASKS)
    again = await settled()
    assert again.key is not None and again.key != second.key  # new row versions
    assert isinstance((await new_process(again.key))[0], StatusKept)

    # Airflow's Dag loses a stub: the bundle's Dags are an input, so the key no longer holds.
    seed_dag(pg_url, ("extract", "transform"))
    rebound, _ = await new_process(again.key)
    assert isinstance(rebound, PassOutcome) and rebound.written.bindings_deleted == 1
    assert set(await bound(engine)) == {"extract", "transform"}
    assert prober.calls == 0
