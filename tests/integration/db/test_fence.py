"""The leader fence on the real PostgreSQL: a deposed leader's writes are refused and roll back.

Two replicas' fences share one database; the Lease's history is played by hand (terms with
growing ``leaseTransitions``). What a write of a deposed term would have changed is compared
with the rows after it.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.db.fence import Fence, FencedOut, LeaderTerm, read_term
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.write_models import ArtifactRecord, BundlePass, PassResult
from taskhandler_operator.db.writer import (
    delete_bundle_rows,
    record_artifacts,
    write_pass,
    write_pass_in,
)
from taskhandler_operator.records import TaskHandlerArtifact
from taskhandler_operator.validation import validate_bundle
from tests.integration.db.helpers import (
    PROBED_AT,
    add_dags,
    artifact,
    bindings,
    count,
    declaration,
    owner,
)

pytestmark = pytest.mark.integration

OWNER = owner("java")


def fence_of(holder: str, transitions: int, *, deposed: list[str], uid: str = "lease-1") -> Fence:
    fence = Fence("test-cluster", on_deposed=deposed.append)
    fence.begin(
        lease_namespace="ops",
        lease_name="taskhandler-operator",
        lease_uid=uid,
        holder=holder,
        transitions=transitions,
    )
    return fence


def build(path: str, *tasks: str) -> TaskHandlerArtifact:
    return artifact("java", path, {"etl": [declaration(t) for t in tasks]})


async def prepared(engine: AsyncEngine, *artifacts: TaskHandlerArtifact) -> BundlePass:
    """A pass of bundle ``java`` (queue ``java``) as the controller builds it."""
    inventory = StubInventory()
    await inventory.refresh(engine)
    result = validate_bundle(
        bundle_name="java", queues=("java",), dags=inventory.dags.values(), artifacts=artifacts
    )
    return BundlePass(
        bundle_name="java",
        owner=OWNER,
        queues=("java",),
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in artifacts),
        verdicts=result.verdicts,
    )


async def reconcile(
    engine: AsyncEngine, fence: Fence, *artifacts: TaskHandlerArtifact
) -> PassResult:
    return await write_pass(engine, await prepared(engine, *artifacts), fence=fence)


@pytest.fixture
async def etl(engine: AsyncEngine) -> None:
    await add_dags(
        engine,
        dag_document("etl", [stub_task("extract", queue="java"), stub_task("load", queue="java")]),
    )


async def artifact_rows(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT relative_fileloc, size_bytes FROM lang_sdk_task_handler_artifact ORDER BY 1"
            )
        )
        return [tuple(r) for r in rows]


async def stored(engine: AsyncEngine, term: LeaderTerm) -> LeaderTerm | None:
    async with engine.connect() as conn:
        return await read_term(conn, term)


async def test_a_deposed_leaders_write_is_refused_rolled_back_and_it_steps_down(
    engine: AsyncEngine, etl: None
) -> None:
    deposed: list[str] = []
    old = fence_of("replica-a", 1, deposed=deposed)
    new = fence_of("replica-b", 2, deposed=deposed)
    both = build("both.jar", "extract", "load")

    first = await reconcile(engine, old, both)
    assert first.bindings_inserted == 2
    assert await stored(engine, old.term or pytest.fail()) == old.term

    # The standby takes over and writes another revision (only "extract" now).
    newer = build("extract.jar", "extract")
    await reconcile(engine, new, newer)
    after_new = (await bindings(engine), await artifact_rows(engine))
    assert deposed == []

    # The old leader wakes up and writes its older revision: refused, nothing changes.
    with pytest.raises(FencedOut, match="replica-b") as refused:
        await reconcile(engine, old, both)
    assert refused.value.stored == new.term and refused.value.mine == old.term
    assert (await bindings(engine), await artifact_rows(engine)) == after_new
    assert len(deposed) == 1 and "replica-a" in deposed[0]
    # Every later write of the old term is refused at once; artifact records and deletion too.
    record = ArtifactRecord(artifact=both, probed_at=PROBED_AT)
    with pytest.raises(FencedOut):
        await record_artifacts(engine, "java", [record], owner=OWNER, fence=old)
    with pytest.raises(FencedOut):
        await delete_bundle_rows(engine, "java", owner=OWNER, fence=old)
    assert (await bindings(engine), await artifact_rows(engine)) == after_new
    assert len(deposed) == 1  # stepped down once

    # The new leader keeps writing.
    await delete_bundle_rows(engine, "java", owner=OWNER, fence=new)
    assert await count(engine, "lang_sdk_task_handler") == 0


async def test_an_older_term_cannot_be_recorded_over_a_newer_one(engine: AsyncEngine) -> None:
    deposed: list[str] = []
    late = fence_of("replica-a", 4, deposed=deposed)  # took the Lease, stalled before recording
    newer = fence_of("replica-b", 5, deposed=deposed)
    await newer.record(engine)
    with pytest.raises(FencedOut, match="recording the leadership term"):
        await late.record(engine)
    assert late.refused is not None and len(deposed) == 1
    assert await stored(engine, newer.term or pytest.fail()) == newer.term
    # Recording one's own term again changes nothing.
    again = fence_of("replica-b", 5, deposed=deposed)
    await again.record(engine)
    # A Lease deleted and created again starts counting anew: its first term replaces the row.
    recreated = fence_of("replica-c", 0, deposed=deposed, uid="lease-2")
    await recreated.record(engine)
    assert await stored(engine, recreated.term or pytest.fail()) == recreated.term
    async with engine.connect() as conn:
        assert (await conn.execute(sa.text("SELECT count(*) FROM thop_leader_fence"))).scalar() == 1


async def test_a_fence_that_never_recorded_a_term_writes_nothing(
    engine: AsyncEngine, etl: None
) -> None:
    deposed: list[str] = []
    fence = Fence("test-cluster", on_deposed=deposed.append)  # no term: never led
    with pytest.raises(FencedOut, match="no recorded term"):
        await reconcile(engine, fence, build("a.jar", "extract"))
    assert await count(engine, "lang_sdk_task_handler_artifact") == 0
    assert deposed


async def test_a_write_that_checked_before_the_new_term_commits_before_the_new_leaders(
    engine: AsyncEngine, etl: None
) -> None:
    """The order argument of db/fence.py: the old leader's write holds the bundle lock from its
    check to its commit, so the new leader (recorded meanwhile) writes after it, never before."""
    deposed: list[str] = []
    old = fence_of("replica-a", 1, deposed=deposed)
    new = fence_of("replica-b", 2, deposed=deposed)
    await old.record(engine)
    stale = await prepared(engine, build("old.jar", "extract", "load"))
    fresh = await prepared(engine, build("new.jar", "extract", "load"))
    async with engine.begin() as conn:
        await write_pass_in(conn, stale, fence=old)  # checked and written, not committed
        await new.record(engine)  # the new term is recorded meanwhile
        racing = asyncio.create_task(write_pass(engine, fresh, fence=new))
        await asyncio.sleep(0.5)
        assert not racing.done()  # waits for the bundle lock the old write holds
    await racing
    assert {v[1] for v in (await bindings(engine)).values()} == {"new.jar"}
    assert deposed == []
    # And from now on the old term is refused.
    with pytest.raises(FencedOut):
        await write_pass(engine, stale, fence=old)
    assert {v[1] for v in (await bindings(engine)).values()} == {"new.jar"}
