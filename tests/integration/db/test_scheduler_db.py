"""The scheduler read path against real rows: one round trip, the primary key, reasons."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.db.engine import DatabaseUnavailable, create_engine
from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef
from taskhandler_operator.scheduler import (
    attach_task_handlers,
    explain_unbound,
    explain_unbound_sync,
    resolve_task_handlers,
    resolve_task_handlers_sync,
    routed_queues_from_config,
)
from tests.integration.db.helpers import (
    add_dags,
    artifact,
    declaration,
    plan_nodes,
    reconcile,
    resolve_plan,
    seed_bindings,
)

pytestmark = pytest.mark.integration


async def _bound_world(engine: AsyncEngine) -> None:
    await add_dags(
        engine,
        dag_document(
            "etl",
            [
                stub_task("extract", queue="java"),
                stub_task("load", queue="java"),
                stub_task("orphan", queue="java"),
            ],
        ),
    )
    arts = [
        artifact("java", "jobs/etl.jar", {"etl": [declaration("extract"), declaration("load")]})
    ]
    await reconcile(engine, "java", ["java"], arts, revision="abc123")
    # "orphan" has no handler, so the Dag kept nothing; bind its two good tasks anyway by
    # validating a Dag without the orphan stub.
    await add_dags(
        engine,
        dag_document("etl", [stub_task("extract", queue="java"), stub_task("load", queue="java")]),
    )
    await reconcile(engine, "java", ["java"], arts, revision="abc123")
    await add_dags(engine, dag_document("report", [stub_task("publish", queue="java")]))
    await reconcile(engine, "java", ["java"], arts, revision="abc123")


EXPECTED = TaskHandlerArtifactRef(bundle_info=BundleInfo(name="java"), rel_path="jobs/etl.jar")
PAIRS = [("etl", "extract"), ("etl", "load"), ("report", "publish"), ("nope", "x")]


async def test_resolve_async_and_sync_agree(engine: AsyncEngine, sync_engine: Engine) -> None:
    await _bound_world(engine)
    resolved = await resolve_task_handlers(engine, [*PAIRS, ("etl", "load")])
    assert resolved == {("etl", "extract"): EXPECTED, ("etl", "load"): EXPECTED}
    with Session(sync_engine) as session:
        assert resolve_task_handlers_sync(session, PAIRS) == resolved
    with sync_engine.connect() as conn:
        assert resolve_task_handlers_sync(conn, PAIRS, chunk_size=1) == resolved
    async with engine.connect() as conn:
        assert await resolve_task_handlers(conn, PAIRS, chunk_size=3) == resolved
    assert await resolve_task_handlers(engine, []) == {}


async def test_routed_queues_filter_as_airflows_scheduler_does(
    engine: AsyncEngine, sync_engine: Engine
) -> None:
    """Bound rows exist for all three stubs; only routed queues are looked up."""
    await add_dags(
        engine,
        dag_document(
            "mixed",
            [
                stub_task("on_java", queue="java"),
                stub_task("on_default"),  # no queue key: Airflow's default queue
                stub_task("on_go", queue="go"),
            ],
        ),
    )
    handlers = {"mixed": [declaration("on_java"), declaration("on_default"), declaration("on_go")]}
    await reconcile(
        engine, "all", ["java", "default", "go"], [artifact("all", "mixed.jar", handlers)]
    )
    tasks = [("mixed", "on_java", "java"), ("mixed", "on_default", None), ("mixed", "on_go", "go")]
    everything = await resolve_task_handlers(engine, tasks)
    assert set(everything) == {("mixed", "on_java"), ("mixed", "on_default"), ("mixed", "on_go")}
    routed = routed_queues_from_config('{"java": "jdk-17"}')
    assert set(await resolve_task_handlers(engine, tasks, routed_queues=routed)) == {
        ("mixed", "on_java")
    }
    with Session(sync_engine) as session:
        with_default = resolve_task_handlers_sync(session, tasks, routed_queues={"java", "default"})
        assert set(with_default) == {("mixed", "on_java"), ("mixed", "on_default")}
        # queue_to_coordinator unset: Airflow resolves no stub at all.
        assert resolve_task_handlers_sync(session, tasks, routed_queues=frozenset()) == {}


async def test_pinned_version_is_the_probe_revision(engine: AsyncEngine) -> None:
    await _bound_world(engine)
    resolved = await resolve_task_handlers(engine, PAIRS[:1], pin_version=True)
    assert resolved[("etl", "extract")].bundle_info == BundleInfo(name="java", version="abc123")


async def test_unbound_stubs_get_their_reason(engine: AsyncEngine, sync_engine: Engine) -> None:
    await _bound_world(engine)
    workloads: list[dict[str, Any]] = [
        {"ti": {"dag_id": d, "task_id": t}, "dag_rel_path": f"{d}.py"} for d, t in PAIRS
    ]
    refs = await resolve_task_handlers(engine, PAIRS)
    result = attach_task_handlers(workloads, refs, stub_keys=set(PAIRS))
    assert result.unbound == [("report", "publish"), ("nope", "x")]
    reasons = await explain_unbound(engine, result.unbound)
    assert reasons == {
        ("report", "publish"): "Dag 'report', task 'publish': no artifact in Dag bundle 'java' "
        "registers it",
        ("nope", "x"): "Dag 'nope', task 'x': no task handler binding is recorded; no "
        "TaskHandlerBundle serves the stub's queue, or its bundle has not been reconciled "
        "since the Dag changed",
    }
    with Session(sync_engine) as session:
        assert explain_unbound_sync(session, result.unbound) == reasons


async def test_a_stub_kept_unbound_by_its_dags_other_problems_says_so(
    engine: AsyncEngine, sync_engine: Engine
) -> None:
    # 'extract' validates, but 'orphan' in the same Dag has no handler, so the whole Dag kept
    # its (absent) rows; 'broken' Dag has a Dag-level read problem and a good stub.
    not_an_operator: Any = "not an operator"
    await add_dags(
        engine,
        dag_document(
            "etl", [stub_task("extract", queue="java"), stub_task("orphan", queue="java")]
        ),
        dag_document("broken", [stub_task("good", queue="java"), not_an_operator]),
    )
    arts = [
        artifact(
            "java",
            "jobs/etl.jar",
            {"etl": [declaration("extract")], "broken": [declaration("good")]},
        )
    ]
    await reconcile(engine, "java", ["java"], arts)
    pairs = [("etl", "extract"), ("etl", "orphan"), ("broken", "good")]
    assert await resolve_task_handlers(engine, pairs) == {}
    reasons = await explain_unbound(engine, pairs)
    assert reasons == {
        ("etl", "extract"): "Dag 'etl', task 'extract': no task handler binding is recorded; "
        "the Dag's bindings are left unchanged until its problems are fixed: Dag 'etl', task "
        "'orphan': no artifact in Dag bundle 'java' registers it",
        ("etl", "orphan"): "Dag 'etl', task 'orphan': no artifact in Dag bundle 'java' "
        "registers it",
        ("broken", "good"): "Dag 'broken', task 'good': no task handler binding is recorded; "
        "the Dag's bindings are left unchanged until its problems are fixed: Dag 'broken': "
        "tasks[1] is a string, expected an operator",
    }
    with Session(sync_engine) as session:
        assert explain_unbound_sync(session, pairs) == reasons


async def test_ten_thousand_pairs_resolve_through_the_primary_key(sync_engine: Engine) -> None:
    with sync_engine.begin() as conn:
        seed_bindings(conn, dags=5_000, tasks=4)
    pairs = [(f"seed_{k // 4}", f"t{k % 4}") for k in range(0, 20_000, 2)]
    with sync_engine.connect() as conn:
        plan = resolve_plan(conn, pairs)
        resolved = resolve_task_handlers_sync(conn, pairs)
    assert len(resolved) == len(pairs) == 10_000
    on_bindings = [n for n in plan_nodes(plan) if n.get("Relation Name") == "lang_sdk_task_handler"]
    assert on_bindings, plan
    for node in on_bindings:
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), node["Node Type"]
        assert node["Index Name"] == "lang_sdk_task_handler_pkey"


async def test_unreachable_database_is_a_typed_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{port}/x", connect_timeout=2)
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await resolve_task_handlers(engine, PAIRS)
    finally:
        await engine.dispose()
    assert str(caught.value).startswith("database unavailable: connection failed: ")
