"""The stub inventory on real ``serialized_dag`` rows: versions, compression, increments."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import (
    add_stub_fields,
    dag_document,
    delete_dag,
    insert_dag,
    literal_arg,
    python_task,
    rewrite_latest,
    stub_task,
    xcom_arg,
)
from taskhandler_operator.airflow.serialized import DagReadProblem
from taskhandler_operator.db.inventory import StubInventory
from tests.integration.db.helpers import add_dags

pytestmark = pytest.mark.integration


def simple(dag_id: str, *task_ids: str, queue: str = "java") -> dict[str, object]:
    return dag_document(dag_id, [stub_task(t, queue=queue) for t in task_ids])


async def test_reads_plain_and_compressed_rows(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("plain", "a"))
    await add_dags(engine, simple("packed", "b"), compressed=True)
    inventory = StubInventory()
    delta = await inventory.refresh(engine)
    assert delta.changed == ("packed", "plain") and delta.removed == ()
    assert [s.task_id for s in inventory.dags["packed"].stubs] == ["b"]
    assert [s.task_id for s in inventory.dags["plain"].stubs] == ["a"]
    assert inventory.dags["plain"].bundle_name == "dags-folder"
    assert inventory.dags["plain"].relative_fileloc == "plain.py"


async def test_second_read_parses_only_what_changed(engine: AsyncEngine) -> None:
    await add_dags(engine, *(simple(f"d{i}", "t") for i in range(5)))
    inventory = StubInventory()
    first = await inventory.refresh(engine)
    assert first.parsed == 5

    nothing = await inventory.refresh(engine)
    assert (nothing.changed, nothing.removed, nothing.unchanged) == ((), (), 5)

    async with engine.begin() as conn:
        # d0: rewritten in place (same row, new hash); d1: a new Dag version;
        # d2: deleted; d9: new. d3's document is damaged *without* a new hash: an
        # incremental reader must not even look at it.
        await conn.run_sync(rewrite_latest, simple("d0", "t", "u"))
        await conn.run_sync(lambda c: insert_dag(c, simple("d1", "v")))
        await conn.run_sync(delete_dag, "d2")
        await conn.run_sync(lambda c: insert_dag(c, simple("d9", "t")))
        await conn.execute(
            sa.text("UPDATE serialized_dag SET data = '{}'::jsonb WHERE dag_id = 'd3'")
        )
    second = await inventory.refresh(engine)
    assert second.changed == ("d0", "d1", "d9")
    assert second.removed == ("d2",)
    assert second.unchanged == 2
    assert [s.task_id for s in inventory.dags["d0"].stubs] == ["t", "u"]
    assert [s.task_id for s in inventory.dags["d1"].stubs] == ["v"]
    assert "d2" not in inventory.dags
    assert inventory.dags["d3"].problems == ()  # not re-read


async def test_each_refresh_indexes_the_dags_by_queue(engine: AsyncEngine) -> None:
    """The queue index a pass reads its own Dags from follows every change a refresh finds:
    a stub moving queue, a Dag deleted, a Dag unreadable (which concerns every queue)."""
    await add_dags(engine, simple("a", "t"), simple("b", "t", queue="go"), simple("c", "t"))
    inventory = StubInventory()
    await inventory.refresh(engine)
    assert inventory.dags.with_stubs_on(["java"]) == ("a", "c")
    assert [d.dag_id for d in inventory.dags.concerning(["go"])] == ["b"]
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: insert_dag(c, simple("a", "t", queue="go")))
        await conn.run_sync(delete_dag, "b")
        await conn.execute(
            sa.text(
                "UPDATE serialized_dag SET data = '[]'::jsonb, dag_hash = 'x' WHERE dag_id = 'c'"
            )
        )
    await inventory.refresh(engine)
    assert inventory.dags.with_stubs_on(["java"]) == ()
    assert inventory.dags.with_stubs_on(["go"]) == ("a",)
    assert [d.dag_id for d in inventory.dags.concerning(["java"])] == ["c"]
    assert [d.dag_id for d in inventory.dags.concerning(["go"])] == ["a", "c"]


async def test_newest_version_wins(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("etl", "old"))
    await add_dags(engine, simple("etl", "new"))
    inventory = StubInventory()
    await inventory.refresh(engine)
    assert [s.task_id for s in inventory.dags["etl"].stubs] == ["new"]


async def test_moving_to_another_file_counts_as_a_change(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("etl", "t"))
    inventory = StubInventory()
    await inventory.refresh(engine)
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE dag SET relative_fileloc = 'sub/etl.py'"))
    delta = await inventory.refresh(engine)
    assert delta.changed == ("etl",)
    assert inventory.dags["etl"].relative_fileloc == "sub/etl.py"


async def test_stale_dags_leave_the_inventory(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("alive", "t"), simple("gone", "t"))
    inventory = StubInventory()
    await inventory.refresh(engine)
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE dag SET is_stale = true WHERE dag_id = 'gone'"))
    delta = await inventory.refresh(engine)
    assert delta.removed == ("gone",)
    assert list(inventory.dags) == ["alive"]


async def test_broken_rows_become_problems_and_others_proceed(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("good", "t"))
    async with engine.begin() as conn:
        await conn.run_sync(
            lambda c: insert_dag(c, None, dag_id="not_zlib", raw_data_compressed=b"garbage")
        )
        await conn.run_sync(
            lambda c: insert_dag(
                c, None, dag_id="not_json", raw_data_compressed=zlib.compress(b"{oops")
            )
        )
        await conn.run_sync(lambda c: insert_dag(c, {"__version": 3}, dag_id="no_dag"))
        odd = dag_document("odd_args", [stub_task("t", queue="java")])
        odd["dag"]["tasks"][0]["__var"]["_arg_bindings"] = [{"name": "x", "kind": "env"}]
        await conn.run_sync(lambda c: insert_dag(c, odd))
    inventory = StubInventory(fetch_chunk=2)
    delta = await inventory.refresh(engine)
    assert delta.parsed == 5
    problems = {dag_id: stubs.problems for dag_id, stubs in inventory.dags.items()}
    assert problems["good"] == ()
    assert problems["not_zlib"] == (
        DagReadProblem(
            message="data_compressed is not zlib data (Error -3 while decompressing data: "
            "incorrect header check)"
        ),
    )
    assert problems["not_json"][0].message.startswith("the serialized Dag is not JSON (")
    assert problems["no_dag"] == (DagReadProblem(message="the serialized Dag has no 'dag' object"),)
    assert problems["odd_args"] == (
        DagReadProblem(
            message="_arg_bindings[0] ('x') has unknown binding kind 'env', expected 'xcom' or "
            "'literal'",
            task_id="t",
            queue="java",
        ),
    )


async def test_connection_or_engine_both_work(engine: AsyncEngine) -> None:
    await add_dags(engine, simple("etl", "t"))
    inventory = StubInventory()
    async with engine.connect() as conn:
        delta = await inventory.refresh(conn)
    assert delta.changed == ("etl",)


def test_fetch_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError) as caught:
        StubInventory(fetch_chunk=0)
    assert str(caught.value) == "fetch_chunk must be at least 1"


ETL_PY = """
import pendulum
from airflow.sdk import dag, task


@dag(start_date=pendulum.datetime(2026, 1, 1), schedule=None, catchup=False)
def etl():
    @task(queue="java")
    def extract(region: str) -> dict:
        return {}

    @task
    def load(rows):
        pass

    load(extract("emea"))


etl()
"""


@pytest.mark.slow
async def test_rows_written_by_airflow_itself(
    engine: AsyncEngine,
    db_url: str,
    tmp_path: Path,
    reserialize_dags: Callable[[Path, str], None],
) -> None:
    (tmp_path / "etl.py").write_text(ETL_PY)
    reserialize_dags(tmp_path, db_url)
    inventory = StubInventory()
    await inventory.refresh(engine)
    first_read = inventory.dags["etl"]
    assert first_read.stubs == ()  # Airflow 3.3.2 has no stubs yet
    # Newer Airflow serializes these fields on a stub; add them to Airflow's own row.
    async with engine.begin() as conn:
        await conn.run_sync(
            lambda c: add_stub_fields(
                c,
                "etl",
                "extract",
                arg_bindings=[literal_arg("region", "emea", {"type": "string"})],
            )
        )
        await conn.run_sync(
            lambda c: add_stub_fields(c, "etl", "load", arg_bindings=[xcom_arg("rows", "extract")])
        )
    delta = await inventory.refresh(engine)
    assert delta.changed == ("etl",)
    stubs: dict[str, Any] = {stub.task_id: stub for stub in inventory.dags["etl"].stubs}
    assert stubs["extract"].queue == "java"
    assert stubs["load"].queue == "default"  # Airflow wrote no queue key for it
    assert stubs["load"].arg_bindings is not None
    assert stubs["load"].arg_bindings[0].name == "rows"
    assert inventory.dags["etl"].relative_fileloc == "etl.py"


async def test_python_tasks_are_ignored(engine: AsyncEngine) -> None:
    await add_dags(engine, dag_document("etl", [python_task("a", queue="java"), python_task("b")]))
    inventory = StubInventory()
    await inventory.refresh(engine)
    assert inventory.dags["etl"].stubs == () and inventory.dags["etl"].problems == ()


async def test_concurrent_refreshes_take_turns_and_keep_snapshots(engine: AsyncEngine) -> None:
    """One inventory shared by bundles reconciling at once: each Dag is parsed once, and a
    snapshot taken before a refresh never changes under its reader."""
    await add_dags(engine, *(simple(f"d{n}", "t") for n in range(20)))
    inventory = StubInventory()
    before = inventory.dags
    deltas = await asyncio.gather(*(inventory.refresh(engine) for _ in range(5)))
    assert sum(d.parsed for d in deltas) == 20  # the later callers found nothing new
    assert sorted(d.parsed for d in deltas) == [0, 0, 0, 0, 20]
    assert len(before) == 0 and len(inventory.dags) == 20
    snapshot = inventory.dags
    async with engine.begin() as conn:
        await conn.run_sync(delete_dag, "d0")
    await inventory.refresh(engine)
    assert "d0" in snapshot and "d0" not in inventory.dags
    with pytest.raises(TypeError):
        snapshot["x"] = snapshot["d1"]  # type: ignore[index]


async def test_a_refresh_that_finds_nothing_reads_one_row(engine: AsyncEngine) -> None:
    """Passes ask for a refresh up to once a second: with nothing new it reads the fingerprint
    (one row, whatever the number of Dags), not a row per Dag."""
    await add_dags(engine, *(simple(f"d{i}", "t") for i in range(30)))
    inventory = StubInventory()
    await inventory.refresh(engine)
    snapshot = inventory.dags
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        nothing = await inventory.refresh(engine)
        assert len(sent) == 1 and "hashtextextended" in sent[0], sent
        assert nothing.unchanged == 30 and inventory.dags is snapshot
        # A Dag's new version changes the fingerprint: the full comparison runs again.
        await add_dags(engine, simple("d3", "t", "u"))
        sent.clear()
        changed = await inventory.refresh(engine)
        assert changed.changed == ("d3",) and len(sent) == 3, sent  # fingerprint, rows, d3
    finally:
        sa.event.remove(engine.sync_engine, "before_cursor_execute", record)
