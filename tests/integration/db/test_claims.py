"""Bundle and queue ownership on the real PostgreSQL: one writer per bundle name and per queue."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.db.claims import (
    BundleClaimed,
    QueueClaimed,
    check_claim,
    read_claim,
    release_claim,
    release_stale_claim,
)
from taskhandler_operator.db.claims_admin import ClaimMismatch, admin_release, list_claims
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.write_models import ArtifactRecord, BundlePass, PassResult
from taskhandler_operator.db.writer import delete_bundle_rows, write_pass
from taskhandler_operator.records import BundleOwner, TaskHandlerArtifact
from taskhandler_operator.validation import validate_bundle
from tests.integration.db.helpers import (
    PROBED_AT,
    add_dags,
    artifact,
    bindings,
    count,
    declaration,
    owner,
    row_versions,
)

pytestmark = pytest.mark.integration

TEAM_A = owner("java", namespace="team-a")
TEAM_B = owner("java", namespace="team-b", cluster_id="other-cluster")


async def pass_of(
    engine: AsyncEngine,
    claimant: BundleOwner,
    artifacts: list[TaskHandlerArtifact],
    *,
    bundle: str = "java",
    queues: tuple[str, ...] = ("java",),
) -> BundlePass:
    inventory = StubInventory()
    await inventory.refresh(engine)
    result = validate_bundle(
        bundle_name=bundle, queues=queues, dags=inventory.dags.values(), artifacts=artifacts
    )
    return BundlePass(
        bundle_name=bundle,
        owner=claimant,
        queues=queues,
        artifacts=tuple(ArtifactRecord(artifact=a, probed_at=PROBED_AT) for a in artifacts),
        verdicts=result.verdicts,
    )


def build(bundle: str, path: str) -> TaskHandlerArtifact:
    return artifact(bundle, path, {"etl": [declaration("extract"), declaration("load")]})


@pytest.fixture
async def etl(engine: AsyncEngine) -> None:
    await add_dags(
        engine,
        dag_document("etl", [stub_task("extract", queue="java"), stub_task("load", queue="java")]),
    )


async def artifact_paths(engine: AsyncEngine, bundle: str = "java") -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT relative_fileloc FROM lang_sdk_task_handler_artifact WHERE bundle_name=:b"
            ),
            {"b": bundle},
        )
        return set(rows.scalars())


@pytest.mark.usefixtures("etl")
async def test_two_claimants_racing_exactly_one_wins(engine: AsyncEngine, db_url: str) -> None:
    passes = {
        TEAM_A: await pass_of(engine, TEAM_A, [build("java", "team-a.jar")]),
        TEAM_B: await pass_of(engine, TEAM_B, [build("java", "team-b.jar")]),
    }
    engines = {claimant: create_engine(db_url) for claimant in passes}
    try:
        outcomes = await asyncio.gather(
            *(write_pass(engines[c], p) for c, p in passes.items()), return_exceptions=True
        )
    finally:
        for own in engines.values():
            await own.dispose()

    won = [c for c, o in zip(passes, outcomes, strict=True) if isinstance(o, PassResult)]
    refused = [o for o in outcomes if isinstance(o, BundleClaimed)]
    assert len(won) == 1 and len(refused) == 1, outcomes
    [winner] = won
    [loser] = [c for c in passes if c != winner]
    assert refused[0].owner == winner
    assert str(refused[0]).startswith(
        f"bundle name 'java' belongs to TaskHandlerBundle {winner.namespace}/java in cluster "
        f"{winner.cluster_id!r} (claimed "
    )
    winner_jar = f"{winner.namespace}.jar"
    assert await artifact_paths(engine) == {winner_jar}
    assert {ref[1] for ref in (await bindings(engine)).values()} == {winner_jar}
    claim = await read_claim(engine, "java")
    assert claim is not None and claim.owner == winner and claim.queues == ("java",)

    # The loser trying again touches no row of the winner's.
    before = await row_versions(engine)
    with pytest.raises(BundleClaimed):
        await write_pass(engine, passes[loser])
    assert await row_versions(engine) == before


@pytest.mark.usefixtures("etl")
async def test_a_recreated_resource_inherits_its_claim(engine: AsyncEngine) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    recreated = TEAM_A.model_copy(update={"uid": "a-new-uid"})
    written = await write_pass(engine, await pass_of(engine, recreated, [build("java", "a.jar")]))
    assert written.claim_taken and written.rows_written == 1
    claim = await read_claim(engine, "java")
    assert claim is not None and claim.owner == recreated


@pytest.mark.usefixtures("etl")
async def test_deletion_releases_the_claim_for_the_next_owner(engine: AsyncEngine) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    with pytest.raises(BundleClaimed):
        await delete_bundle_rows(engine, "java", owner=TEAM_B)
    assert await artifact_paths(engine) == {"a.jar"}

    deleted = await delete_bundle_rows(engine, "java", owner=TEAM_A)
    assert deleted.claim_released and (deleted.artifacts, deleted.bindings) == (1, 2)
    assert await read_claim(engine, "java") is None
    assert await count(engine, "thop_queue_claim") == 0

    written = await write_pass(engine, await pass_of(engine, TEAM_B, [build("java", "b.jar")]))
    assert written.claim_taken and written.bindings_inserted == 2


@pytest.mark.usefixtures("etl")
async def test_orphaning_releases_the_claim_and_keeps_the_rows(engine: AsyncEngine) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    assert not await release_claim(engine, "python", TEAM_A)  # never held: nothing to do
    with pytest.raises(BundleClaimed):
        await release_claim(engine, "java", TEAM_B)
    assert await release_claim(engine, "java", TEAM_A)
    assert await read_claim(engine, "java") is None
    assert len(await bindings(engine)) == 2


@pytest.mark.usefixtures("etl")
async def test_a_queue_served_by_another_bundle_is_refused(engine: AsyncEngine) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    rival = owner("java-rival", namespace="team-b")
    attempt = await pass_of(engine, rival, [build("java-rival", "b.jar")], bundle="java-rival")
    with pytest.raises(QueueClaimed) as caught:
        await write_pass(engine, attempt)
    assert str(caught.value) == (
        "queue 'java' is served by bundle 'java' of TaskHandlerBundle team-a/java in cluster "
        "'test-cluster'; nothing was written: remove the queue from one of the two resources; "
        "if that resource is gone for good (e.g. its cluster), free it with: "
        "taskhandler-operator db claims release java --uid uid-team-a-java"
    )
    assert await artifact_paths(engine, "java-rival") == set()
    assert await read_claim(engine, "java-rival") is None  # the refused pass left no claim


@pytest.mark.usefixtures("etl")
async def test_a_queue_no_longer_listed_is_released(engine: AsyncEngine) -> None:
    jar = [build("java", "a.jar")]
    first = await write_pass(engine, await pass_of(engine, TEAM_A, jar, queues=("java", "jvm")))
    assert (first.claim_taken, first.queues_claimed) == (True, 2)
    again = await write_pass(engine, await pass_of(engine, TEAM_A, jar, queues=("java", "jvm")))
    assert again.rows_written == 0
    narrowed = await write_pass(engine, await pass_of(engine, TEAM_A, jar, queues=("java",)))
    assert (narrowed.queues_claimed, narrowed.queues_released) == (0, 1)
    claim = await read_claim(engine, "java")
    assert claim is not None and claim.queues == ("java",)


@pytest.mark.usefixtures("etl")
async def test_a_resource_without_the_claim_deletes_nothing(engine: AsyncEngine) -> None:
    """Issue 20: an orphaned bundle's rows survive the deletion of any resource naming it
    (today `delete_bundle_rows` deleted by name when no claim was held), and the next
    claimant adopts them."""
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    assert await release_claim(engine, "java", TEAM_A)  # deletionPolicy Orphan
    intruder = owner("intruder", namespace="default")
    deleted = await delete_bundle_rows(engine, "java", owner=intruder)
    assert deleted.model_dump() == {
        "bindings": 0,
        "artifacts": 0,
        "problems": 0,
        "claim_released": False,
    }
    assert {ref[1] for ref in (await bindings(engine)).values()} == {"a.jar"}
    [listed] = await list_claims(engine)
    assert (listed.bundle_name, listed.owner, listed.artifacts, listed.bindings) == (
        "java",
        None,
        1,
        2,
    )

    # The first claimant adopts the unowned rows: its pass rebinds and sweeps them as its own.
    written = await write_pass(engine, await pass_of(engine, TEAM_B, [build("java", "b.jar")]))
    assert written.claim_taken
    assert await artifact_paths(engine) == {"b.jar"}
    deleted = await delete_bundle_rows(engine, "java", owner=TEAM_B)
    assert (deleted.claim_released, deleted.artifacts, deleted.bindings) == (True, 1, 2)


@pytest.mark.usefixtures("etl")
async def test_rows_from_before_claims_are_unowned(engine: AsyncEngine) -> None:
    """Rows written before thop0003 have no claim: no deletion removes them."""
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    async with engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM thop_bundle_claim"))
    for anyone in (TEAM_A, TEAM_B):
        assert not (await delete_bundle_rows(engine, "java", owner=anyone)).claim_released
    assert await artifact_paths(engine) == {"a.jar"}


@pytest.mark.usefixtures("etl")
async def test_the_claim_check_refuses_without_writing(engine: AsyncEngine) -> None:
    await check_claim(engine, "java", TEAM_A, ("java",))  # free: the write will take it
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    before = await row_versions(engine)
    await check_claim(engine, "java", TEAM_A.model_copy(update={"uid": "new"}), ("java",))
    with pytest.raises(BundleClaimed) as caught:
        await check_claim(engine, "java", TEAM_B, ())
    assert caught.value.owner == TEAM_A
    assert str(caught.value).endswith(
        "free the name with: taskhandler-operator db claims release java --uid uid-team-a-java"
    )
    with pytest.raises(QueueClaimed):
        await check_claim(engine, "other", owner("other"), ("java",))
    assert await row_versions(engine) == before


@pytest.mark.usefixtures("etl")
async def test_a_stale_claim_is_released_only_from_that_holder(engine: AsyncEngine) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_A, [build("java", "a.jar")]))
    newer = TEAM_A.model_copy(update={"uid": "someone-else"})
    assert not await release_stale_claim(engine, "java", newer)
    assert await read_claim(engine, "java") is not None
    assert await release_stale_claim(engine, "java", TEAM_A)
    assert await read_claim(engine, "java") is None
    assert await count(engine, "thop_queue_claim") == 0
    assert await artifact_paths(engine) == {"a.jar"}  # the rows wait for the next claimant


@pytest.mark.usefixtures("etl")
async def test_an_administrator_releases_a_name_with_or_without_its_rows(
    engine: AsyncEngine,
) -> None:
    await write_pass(engine, await pass_of(engine, TEAM_B, [build("java", "b.jar")]))
    with pytest.raises(ClaimMismatch, match="held by TaskHandlerBundle team-b/java"):
        await admin_release(engine, "java", uid="not-it")
    assert await read_claim(engine, "java") is not None

    done = await admin_release(engine, "java", uid=TEAM_B.uid)
    assert done.claim is not None and done.claim.owner == TEAM_B and done.rows is None
    assert await read_claim(engine, "java") is None
    assert await artifact_paths(engine) == {"b.jar"}

    cleaned = await admin_release(engine, "java", delete_rows=True)  # unowned: rows only
    assert cleaned.claim is None and cleaned.rows is not None
    assert (cleaned.rows.artifacts, cleaned.rows.bindings) == (1, 2)
    assert await list_claims(engine) == []
