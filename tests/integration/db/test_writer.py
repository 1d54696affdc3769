"""The write path on the real schema: reconcile semantics, idempotence, conflicts, races."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import (
    dag_document,
    delete_dag,
    insert_dag,
    literal_arg,
    move_dag,
    stub_task,
    xcom_arg,
)
from taskhandler_operator.db.engine import DatabaseUnavailable
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.tables import fileloc_hash
from taskhandler_operator.db.writer import (
    ArtifactRecord,
    BundlePass,
    delete_bundle_rows,
    write_pass,
    write_pass_in,
)
from taskhandler_operator.records import BundleProblem
from taskhandler_operator.validation import DagVerdict
from tests.integration.db.helpers import (
    PROBED_AT,
    add_dags,
    artifact,
    bindings,
    bundle_pass,
    count,
    declaration,
    owner,
    reconcile,
    row_versions,
)

pytestmark = pytest.mark.integration

INT = {"type": "integer"}
STR = {"type": "string"}


def etl_document(**kwargs: Any) -> dict[str, Any]:
    return dag_document(
        "etl",
        [
            stub_task("extract", queue="java", arg_bindings=[literal_arg("region", "emea", STR)]),
            stub_task("load", queue="java", arg_bindings=[xcom_arg("rows", "extract")]),
            stub_task("ship", queue="go"),
        ],
        **kwargs,
    )


def java_artifacts(extract_schema: dict[str, Any] = STR) -> list[Any]:
    return [
        artifact(
            "java",
            "etl.jar",
            {"etl": [declaration("extract", extract_schema), declaration("load", None)]},
        ),
        artifact("java", "other.jar", {"reports": [declaration("publish")]}),
    ]


async def test_first_pass_binds_and_the_same_state_twice_changes_no_row(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl_document())
    _, first = await reconcile(engine, "java", ["java"], java_artifacts())
    assert (first.artifacts_inserted, first.bindings_inserted, first.probes_written) == (2, 2, 2)
    assert first.dag_outcomes == {"etl": "reconciled"}
    assert await bindings(engine) == {
        ("etl", "extract"): ("java", "etl.jar", "etl.py"),
        ("etl", "load"): ("java", "etl.jar", "etl.py"),
    }
    before = await row_versions(engine)
    _, second = await reconcile(engine, "java", ["java"], java_artifacts())
    assert second.rows_written == 0
    assert await row_versions(engine) == before  # not even rewritten with equal values


async def test_fast_path_reuse_keeps_last_probed_at(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    _, reused = await reconcile(engine, "java", ["java"], java_artifacts(), probed=False)
    assert reused.rows_written == 0
    async with engine.connect() as conn:
        stamps = (
            await conn.execute(sa.text("SELECT last_probed_at FROM lang_sdk_task_handler_artifact"))
        ).scalars()
        assert set(stamps) == {PROBED_AT}


async def test_statement_count_does_not_grow_with_the_pass(engine: AsyncEngine) -> None:
    issued: list[str] = []

    def count_statement(*args: Any) -> None:
        issued.append(args[2])

    event.listen(engine.sync_engine, "before_cursor_execute", count_statement)

    async def statements_for(n: int) -> int:
        bundle = f"b{n}"
        docs = [
            dag_document(f"d{n}_{i}", [stub_task(f"t{j}", queue=bundle) for j in range(3)])
            for i in range(n)
        ]
        await add_dags(engine, *docs)
        arts = [
            artifact(bundle, f"a{i}.jar", {f"d{n}_{i}": [declaration(f"t{j}") for j in range(3)]})
            for i in range(n)
        ]
        issued.clear()
        _, written = await reconcile(engine, bundle, [bundle], arts)
        assert written.bindings_inserted == 3 * n
        writes = [s for s in issued if "serialized_dag" not in s]
        assert len(writes) == written.statements
        return written.statements

    small, large = await statements_for(2), await statements_for(200)
    # 11 for the rows, 5 for the claims (read and take the bundle's; take, check, release queues),
    # 2 for the publication history (read what is published; record this first publication)
    assert small == large == 18


async def test_dag_with_problems_keeps_its_rows(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    before = await bindings(engine)
    # The handler now takes an integer where the stub passes a string: a validation error.
    result, written = await reconcile(engine, "java", ["java"], java_artifacts(INT))
    (verdict,) = result.verdicts
    assert verdict.bindings is None
    assert written.dag_outcomes == {"etl": "kept"}
    assert (written.bindings_deleted, written.bindings_updated) == (0, 0)
    assert await bindings(engine) == before
    async with engine.connect() as conn:
        messages = (
            await conn.execute(sa.text("SELECT message FROM thop_bundle_problem"))
        ).scalars()
        assert list(messages) == [
            "Dag 'etl', task 'extract': argument 'region' is string, the task handler takes integer"
        ]
    # fixed again: the problem row goes away
    _, fixed = await reconcile(engine, "java", ["java"], java_artifacts())
    assert fixed.problems_deleted == 1
    assert await count(engine, "thop_bundle_problem") == 0


async def test_none_empty_and_list_semantics(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    records = tuple(ArtifactRecord(artifact=a) for a in java_artifacts())

    def pass_with(bindings_value: Any) -> BundlePass:
        verdict = DagVerdict(
            dag_id="etl",
            bundle_name="dags-folder",
            relative_fileloc="etl.py",
            bindings=bindings_value,
        )
        return bundle_pass("java", ["java"], artifacts=records, verdicts=(verdict,))

    # None: not evaluated, nothing changes
    untouched = await write_pass(engine, pass_with(None))
    assert untouched.rows_written == 0 and len(await bindings(engine)) == 2
    # a list: reconcile to exactly it ("load" vanished)
    keep = (await reconcile(engine, "java", ["java"], java_artifacts()))[0].verdicts[0].bindings
    assert keep is not None
    only_extract = tuple(b for b in keep if b.task_id == "extract")
    reconciled = await write_pass(engine, pass_with(only_extract))
    assert reconciled.bindings_deleted == 1
    assert set(await bindings(engine)) == {("etl", "extract")}
    # []: evaluated, nothing bound here any more: this bundle's rows of the Dag go
    emptied = await write_pass(engine, pass_with(()))
    assert emptied.bindings_deleted == 1
    assert await bindings(engine) == {}


async def test_reconcile_by_dag_id_leaves_other_bundles_rows(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    go = [artifact("go", "bin/etl", {"etl": [declaration("ship")]})]
    await reconcile(engine, "go", ["go"], go)
    assert len(await bindings(engine)) == 3
    # the go bundle's next pass reconciles Dag "etl" but must not touch java's rows
    _, again = await reconcile(engine, "go", ["go"], go)
    assert again.rows_written == 0
    assert len(await bindings(engine)) == 3


async def test_dag_moving_to_another_file_updates_its_rows(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    inventory = StubInventory()
    await reconcile(engine, "java", ["java"], java_artifacts(), inventory=inventory)
    async with engine.begin() as conn:
        await conn.run_sync(move_dag, "etl", "pipelines/etl_v2.py")
        await conn.run_sync(
            lambda c: insert_dag(c, etl_document(relative_fileloc="pipelines/etl_v2.py"))
        )
    _, moved = await reconcile(engine, "java", ["java"], java_artifacts(), inventory=inventory)
    assert moved.bindings_updated == 2 and moved.bindings_inserted == 0
    assert {v[2] for v in (await bindings(engine)).values()} == {"pipelines/etl_v2.py"}
    async with engine.connect() as conn:
        hashes = (
            await conn.execute(
                sa.text("SELECT DISTINCT dag_relative_fileloc_hash FROM lang_sdk_task_handler")
            )
        ).scalars()
        assert list(hashes) == [fileloc_hash("pipelines/etl_v2.py")]


async def test_deleting_the_dag_cascades_its_bindings(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    assert len(await bindings(engine)) == 2
    async with engine.begin() as conn:
        await conn.run_sync(delete_dag, "etl")
    assert await bindings(engine) == {}
    assert await count(engine, "lang_sdk_task_handler_artifact") == 2  # artifacts are a cache


async def test_a_narrowed_pass_removes_the_rows_of_a_dag_without_a_verdict(
    engine: AsyncEngine,
) -> None:
    """A pass validates only the Dags of its queues: its rows of a Dag of the inventory that
    has no stub on them any more go (as a verdict without bindings did); its rows of a Dag
    Airflow no longer has stay (as they did: no verdict); other bundles' rows are not touched."""
    await add_dags(engine, etl_document(), dag_document("gone", [stub_task("t", queue="java")]))
    gone = artifact("java", "gone.jar", {"gone": [declaration("t")]})
    await reconcile(engine, "java", ["java"], [*java_artifacts(), gone])
    go = [artifact("go", "bin/etl", {"etl": [declaration("ship")]})]
    await reconcile(engine, "go", ["go"], go)
    assert len(await bindings(engine)) == 4
    async with engine.begin() as conn:
        # etl's java stubs move to queue "scala"; "gone" goes stale (Airflow keeps its rows).
        await conn.run_sync(
            lambda c: insert_dag(
                c, dag_document("etl", [stub_task("extract", queue="scala"), stub_task("ship")])
            )
        )
        await conn.execute(sa.text("UPDATE dag SET is_stale = true WHERE dag_id = 'gone'"))

    result, written = await reconcile(engine, "java", ["java"], [*java_artifacts(), gone])

    assert result.verdicts == ()  # no Dag of the inventory has a stub on "java"
    assert written.bindings_deleted == 2 and written.dag_outcomes == {"etl": "reconciled"}
    assert await bindings(engine) == {
        ("etl", "ship"): ("go", "bin/etl", "etl.py"),
        ("gone", "t"): ("java", "gone.jar", "gone.py"),
    }
    _, again = await reconcile(engine, "java", ["java"], [*java_artifacts(), gone])
    assert again.rows_written == 0


async def test_conflict_between_two_bundles_is_reported_on_both(engine: AsyncEngine) -> None:
    # Two bundles serve different queues, yet both register etl.extract.
    await add_dags(engine, dag_document("etl", [stub_task("extract", queue="java")]))
    java = [artifact("java", "etl.jar", {"etl": [declaration("extract")]})]
    await reconcile(engine, "java", ["java"], java)
    async with engine.begin() as conn:
        await conn.run_sync(
            lambda c: insert_dag(c, dag_document("etl", [stub_task("extract", queue="scala")]))
        )
    scala = [artifact("scala", "etl-scala.jar", {"etl": [declaration("extract")]})]
    _, claimant = await reconcile(engine, "scala", ["scala"], scala)
    assert [
        (c.dag_id, c.task_id, c.holder_bundle, c.holder_rel_path) for c in claimant.conflicts
    ] == [("etl", "extract", "java", "etl.jar")]
    assert claimant.dag_outcomes == {"etl": "conflict"}
    assert claimant.bindings_inserted == claimant.bindings_updated == 0
    assert await bindings(engine) == {("etl", "extract"): ("java", "etl.jar", "etl.py")}
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.text("SELECT bundle_name, kind, other_bundle, message FROM thop_bundle_problem")
            )
        ).one()
    assert tuple(row) == (
        "scala",
        "conflict",
        "java",
        "Dag 'etl', task 'extract': already bound to an artifact of bundle 'java' "
        "('etl.jar'); bundle 'scala' also registers it, so the binding was not changed",
    )
    # the holder sees it too on its next pass (its stub moved away, so it now drops the row)
    _, holder = await reconcile(engine, "java", ["java"], java)
    assert [(c.claimant_bundle, c.holder_bundle) for c in holder.held_conflicts] == [
        ("scala", "java")
    ]
    assert holder.bindings_deleted == 1
    # and once java let go, scala's next pass binds it
    _, settled = await reconcile(engine, "scala", ["scala"], scala)
    assert settled.bindings_inserted == 1 and settled.conflicts == ()
    assert await bindings(engine) == {("etl", "extract"): ("scala", "etl-scala.jar", "etl.py")}
    assert await count(engine, "thop_bundle_problem") == 0


async def test_orphan_artifacts_are_swept_unless_referenced(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    # other.jar disappears from the bundle: nothing references it, so it goes
    _, swept = await reconcile(engine, "java", ["java"], java_artifacts()[:1])
    assert swept.artifacts_deleted == 1
    # etl.jar disappears while its Dag cannot be validated: its rows and the artifact stay
    _, kept = await reconcile(engine, "java", ["java"], [])
    assert kept.dag_outcomes == {"etl": "kept"} and kept.artifacts_deleted == 0
    assert await count(engine, "lang_sdk_task_handler_artifact") == 1


async def test_delete_bundle_rows(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    await reconcile(engine, "java", ["java"], java_artifacts())
    await reconcile(
        engine, "go", ["go"], [artifact("go", "bin/etl", {"etl": [declaration("ship")]})]
    )
    deleted = await delete_bundle_rows(engine, "java", owner=owner("java"))
    assert (deleted.bindings, deleted.artifacts) == (2, 2)
    assert set(await bindings(engine)) == {("etl", "ship")}
    assert await count(engine, "thop_artifact_probe") == 1  # go's; java's cascaded


async def test_a_dag_deleted_before_the_write_is_skipped(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    inventory = StubInventory()
    await inventory.refresh(engine)
    async with engine.begin() as conn:
        await conn.run_sync(delete_dag, "etl")
    # the inventory still lists the Dag: its bindings must not break the pass (FK)
    from taskhandler_operator.validation import validate_bundle

    result = validate_bundle(
        bundle_name="java",
        queues=["java"],
        dags=inventory.dags.values(),
        artifacts=java_artifacts(),
    )
    records = tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in java_artifacts())
    written = await write_pass(
        engine, bundle_pass("java", ["java"], artifacts=records, verdicts=result.verdicts)
    )
    assert written.bindings_inserted == 0 and written.artifacts_inserted == 2


# --- concurrency -------------------------------------------------------------------------------


async def _wait_until_blocked(engine: AsyncEngine, application_name: str) -> int:
    """The pid of the backend of ``application_name`` once it waits on a lock (bounded)."""
    query = sa.text(
        "SELECT pid FROM pg_stat_activity WHERE application_name = :name "
        "AND wait_event_type = 'Lock'"
    )
    for _ in range(500):
        async with engine.connect() as conn:
            pid = (await conn.execute(query, {"name": application_name})).scalar()
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{application_name} never blocked on a lock")


async def test_two_writers_racing_on_one_artifact(engine: AsyncEngine, db_url: str) -> None:
    """Another writer of the same artifact row (Airflow's own, which takes none of our locks)
    holds its insert open: ours waits on the unique key, then updates instead of failing."""
    from taskhandler_operator.db.engine import create_engine
    from taskhandler_operator.db.tables import artifact_table
    from taskhandler_operator.db.writer import record_artifacts

    second_version = artifact("java", "etl.jar", {"etl": [declaration("load")]}, size=200)
    racer = create_engine(db_url, application_name="thop-racer")
    try:
        async with engine.begin() as conn:
            # T1 inserts the artifact and holds its transaction open ...
            await conn.execute(
                artifact_table.insert().values(
                    id=uuid.uuid4(),
                    bundle_name="java",
                    relative_fileloc="etl.jar",
                    relative_fileloc_hash=fileloc_hash("etl.jar"),
                    size_bytes=100,
                    task_handlers={},
                    last_probed_at=PROBED_AT,
                )
            )
            # ... while T2 inserts the same (bundle, path): it must wait on the unique key.
            second = asyncio.create_task(
                record_artifacts(
                    racer,
                    "java",
                    [ArtifactRecord(artifact=second_version, probed_at=PROBED_AT)],
                    owner=owner("java"),
                )
            )
            await _wait_until_blocked(engine, "thop-racer")
        # T1 committed; T2 resumes into ON CONFLICT and updates instead of failing.
        counts = await asyncio.wait_for(second, timeout=30)
        assert (counts.inserted, counts.updated) == (0, 1)
    finally:
        await racer.dispose()
    async with engine.connect() as conn:
        rows = (
            await conn.execute(sa.text("SELECT size_bytes FROM lang_sdk_task_handler_artifact"))
        ).scalars()
        assert list(rows) == [200]


async def test_concurrent_passes_of_one_bundle(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    inventory = StubInventory()
    await inventory.refresh(engine)
    from taskhandler_operator.validation import validate_bundle

    result = validate_bundle(
        bundle_name="java",
        queues=["java"],
        dags=inventory.dags.values(),
        artifacts=java_artifacts(),
    )
    java_pass = bundle_pass(
        "java",
        ["java"],
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in java_artifacts()),
        verdicts=result.verdicts,
    )
    results = await asyncio.gather(*(write_pass(engine, java_pass) for _ in range(4)))
    assert sum(r.artifacts_inserted for r in results) == 2
    assert sum(r.bindings_inserted for r in results) == 2
    assert sorted(r.rows_written for r in results)[:3] == [0, 0, 0]
    assert await count(engine, "lang_sdk_task_handler_artifact") == 2


async def test_losing_the_connection_mid_pass_writes_nothing(
    engine: AsyncEngine, db_url: str
) -> None:
    from taskhandler_operator.db.engine import create_engine

    await add_dags(engine, etl_document())
    inventory = StubInventory()
    await inventory.refresh(engine)
    from taskhandler_operator.validation import validate_bundle

    result = validate_bundle(
        bundle_name="java",
        queues=["java"],
        dags=inventory.dags.values(),
        artifacts=java_artifacts(),
    )
    java_pass = bundle_pass(
        "java",
        ["java"],
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in java_artifacts()),
        verdicts=result.verdicts,
    )
    writer = create_engine(db_url, application_name="thop-doomed-writer")
    try:
        async with engine.connect() as blocker:
            # Hold the problem table so the pass stops after writing artifacts and bindings.
            await blocker.execute(sa.text("BEGIN"))
            await blocker.execute(
                sa.text("LOCK TABLE thop_bundle_problem IN ACCESS EXCLUSIVE MODE")
            )
            doomed = asyncio.create_task(write_pass(writer, java_pass))
            pid = await _wait_until_blocked(engine, "thop-doomed-writer")
            async with engine.connect() as admin:
                await admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DatabaseUnavailable) as caught:
                await asyncio.wait_for(doomed, timeout=30)
            await blocker.execute(sa.text("ROLLBACK"))
    finally:
        await writer.dispose()
    assert str(caught.value).startswith("database unavailable: ")
    assert caught.value.retryable
    assert await count(engine, "lang_sdk_task_handler_artifact") == 0
    assert await count(engine, "lang_sdk_task_handler") == 0
    # and the retry succeeds
    retried = await write_pass(engine, java_pass)
    assert retried.bindings_inserted == 2


async def test_write_pass_in_shares_the_callers_transaction(engine: AsyncEngine) -> None:
    await add_dags(engine, etl_document())
    java_pass = bundle_pass(
        "java",
        ["java"],
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in java_artifacts()),
    )
    async with engine.connect() as conn:
        await conn.begin()
        written = await write_pass_in(conn, java_pass)
        assert written.artifacts_inserted == 2
        await conn.rollback()
    assert await count(engine, "lang_sdk_task_handler_artifact") == 0


async def test_a_problem_quoting_a_nul_character_is_stored_escaped(engine: AsyncEngine) -> None:
    # Probe failure reasons may quote runtime output; a text column cannot hold NUL.
    problem = BundleProblem(severity="error", kind="unreadable", message="runtime wrote a\x00b")
    java_pass = bundle_pass("java", ["java"], problems=(problem,))
    first = await write_pass(engine, java_pass)
    assert first.problems_inserted == 1
    again = await write_pass(engine, java_pass)
    assert again.rows_written == 0
    async with engine.connect() as conn:
        stored = (await conn.execute(sa.text("SELECT message FROM thop_bundle_problem"))).scalar()
    assert stored == "runtime wrote a\\x00b"
