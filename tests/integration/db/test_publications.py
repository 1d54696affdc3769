"""Publication under control on the real schema: history, trimming, hold, approval, rollback."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.db.publications import (
    list_publications,
    load_publication,
    pending_change,
)
from taskhandler_operator.publication.policy import PublishControl, PublishPolicy
from tests.integration.db.helpers import (
    add_dags,
    artifact,
    bindings,
    count,
    declaration,
    reconcile,
    row_versions,
)

pytestmark = pytest.mark.integration

BUNDLE = "java"


def etl(*tasks: str) -> dict[str, Any]:
    return dag_document("etl", [stub_task(t, queue=BUNDLE) for t in tasks])


def jars(*, load_in: str = "etl.jar", size: int = 100) -> list[Any]:
    """extract in etl.jar; load in ``load_in``; a third task in etl.jar."""
    handlers: dict[str, dict[str, list[Any]]] = {"etl.jar": {"etl": []}, "more.jar": {"etl": []}}
    handlers["etl.jar"]["etl"] += [declaration("extract"), declaration("ship")]
    handlers[load_in]["etl"].append(declaration("load"))
    return [
        artifact(BUNDLE, "etl.jar", handlers["etl.jar"], size=size),
        artifact(BUNDLE, "more.jar", handlers["more.jar"]),
    ]


def control(revision: str, **fields: Any) -> PublishControl:
    return PublishControl(revision=revision, operator="operator-0", **fields)


async def test_each_publication_is_recorded_with_its_change_and_an_unchanged_pass_adds_none(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl("extract", "load"))
    _, first = await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1"))
    assert first.publication is not None and first.publication.recorded is not None
    assert first.publication.recorded.counts.added == 2
    assert first.publications_written == 1

    before = await row_versions(engine)
    _, same = await reconcile(engine, BUNDLE, [BUNDLE], jars(), probed=False, publish=control("r1"))
    assert same.rows_written == 0 and same.publication is not None
    assert same.publication.recorded is None and not same.publication.held
    assert await row_versions(engine) == before
    assert await count(engine, "thop_publication") == 1

    _, moved = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(load_in="more.jar"), publish=control("r2")
    )
    assert moved.publication is not None and moved.publication.change is not None
    assert moved.publication.change.counts.moved == 1
    assert moved.publication.change.first == (
        "moved etl/load: etl.jar @digest-etl.jar-100 -> more.jar @digest-more.jar-100",
    )
    history = await list_publications(engine, BUNDLE)
    assert [(p.revision, p.kind, p.counts.added, p.counts.moved) for p in history] == [
        ("r2", "published", 0, 1),
        ("r1", "published", 2, 0),
    ]
    assert history[0].operator == "operator-0"
    latest = await load_publication(engine, BUNDLE)
    assert latest is not None and latest.change is not None and latest.bindings is not None
    assert [c.line() for c in latest.change.changes] == list(moved.publication.change.first)
    assert {(b.task_id, b.artifact_path) for b in latest.bindings} == {
        ("extract", "etl.jar"),
        ("load", "more.jar"),
    }


async def test_the_history_keeps_the_newest_publications_per_bundle(engine: AsyncEngine) -> None:
    await add_dags(engine, etl("extract", "load"))
    for n in range(1, 5):
        await reconcile(
            engine, BUNDLE, [BUNDLE], jars(size=100 + n), publish=control(f"r{n}", history_limit=2)
        )
    history = await list_publications(engine, BUNDLE)
    assert [p.revision for p in history] == ["r4", "r3"]
    assert history[0].counts.changed == 2  # new content of etl.jar under both tasks
    assert await count(engine, "thop_publication") == 2


async def test_no_removal_holds_a_removal_until_approved_and_refuses_a_stale_approval(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl("extract", "load"))
    policy = PublishPolicy.NO_REMOVAL
    await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1", policy=policy))
    published = await bindings(engine)

    # A harmless change is published under NoRemoval.
    await add_dags(engine, etl("extract", "load", "ship"))
    _, added = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), publish=control("r2", policy=policy)
    )
    assert added.publication is not None and not added.publication.held
    assert len(await bindings(engine)) == 3
    published = await bindings(engine)

    # The Dag drops `load`: its binding would go. Held: the rows stay.
    await add_dags(engine, etl("extract", "ship"))
    _, held = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), publish=control("r3", policy=policy)
    )
    outcome = held.publication
    assert outcome is not None and outcome.held and outcome.pending_change is not None
    assert outcome.pending_change.counts.removed == 1
    assert outcome.held_reason is not None and "etl/load" in outcome.held_reason
    assert await bindings(engine) == published
    pending = await pending_change(engine, BUNDLE)
    assert pending is not None and pending.revision == "r3" and pending.change is not None
    assert [c.line() for c in pending.change.changes] == [
        "removed etl/load: was etl.jar @digest-etl.jar-100"
    ]

    # Held again by the next pass: nothing rewritten.
    _, again = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), probed=False, publish=control("r3", policy=policy)
    )
    assert again.rows_written == 0 and again.publication is not None and again.publication.held

    # An approval of another revision is refused; the change stays held.
    _, stale = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(),
        probed=False,
        publish=control("r3", policy=policy, approve_revision="r2", approved_by="alice"),
    )
    assert stale.publication is not None and stale.publication.refused is not None
    assert stale.publication.refused.reason == "ApprovalRefused"
    assert "r2" in stale.publication.refused.message and "r3" in stale.publication.refused.message
    assert await bindings(engine) == published

    # The approval of the pending revision publishes it, recorded with who approved.
    _, approved = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(),
        probed=False,
        publish=control("r3", policy=policy, approve_revision="r3", approved_by="alice"),
    )
    assert approved.publication is not None and not approved.publication.held
    assert approved.bindings_deleted == 1
    assert ("etl", "load") not in await bindings(engine)
    assert await pending_change(engine, BUNDLE) is None
    latest = (await list_publications(engine, BUNDLE, limit=1))[0]
    assert (latest.kind, latest.revision, latest.approved_by, latest.counts.removed) == (
        "approved",
        "r3",
        "alice",
        1,
    )


async def test_manual_holds_every_change_and_a_change_gone_drops_the_hold(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl("extract", "load"))
    manual = PublishPolicy.MANUAL
    _, first = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), publish=control("r1", policy=manual)
    )
    assert first.publication is not None and first.publication.held
    assert await bindings(engine) == {}
    assert await list_publications(engine, BUNDLE) == []

    _, approved = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(),
        probed=False,
        publish=control("r1", policy=manual, approve_revision="r1", approved_by="bob"),
    )
    assert approved.bindings_inserted == 2
    # The annotation left in place approves nothing else: a new change is held again.
    await add_dags(engine, etl("extract", "load", "ship"))
    left = control("r2", policy=manual, approve_revision="r1", approved_by="bob")
    _, added = await reconcile(engine, BUNDLE, [BUNDLE], jars(), probed=False, publish=left)
    assert added.publication is not None and added.publication.held
    assert added.publication.refused is not None
    assert added.publication.pending_change is not None
    assert added.publication.pending_change.first == (
        "added etl/ship: etl.jar @digest-etl.jar-100",
    )
    assert ("etl", "ship") not in await bindings(engine)
    # The Dag drops the task again: nothing is pending any more, and nothing is published.
    await add_dags(engine, etl("extract", "load"))
    _, back = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), probed=False, publish=control("r3", policy=manual)
    )
    assert back.publication is not None and not back.publication.held
    assert back.publication.recorded is None and back.publications_written == 1
    assert await pending_change(engine, BUNDLE) is None


async def test_a_rollback_restores_the_recorded_rows_and_holds_until_the_annotation_goes(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl("extract", "load"))
    await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1"))
    r1_rows = await bindings(engine)
    await reconcile(engine, BUNDLE, [BUNDLE], jars(load_in="more.jar"), publish=control("r2"))
    assert await bindings(engine) != r1_rows

    # Roll back to r1 while the source still says r2: the r1 rows, no probe needed.
    _, rolled = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(load_in="more.jar"),
        probed=False,
        publish=control("r2", rollback_to="r1", approved_by="carol"),
    )
    outcome = rolled.publication
    assert outcome is not None and outcome.rolled_back_to == "r1"
    assert outcome.recorded is not None and outcome.recorded.kind == "rolled_back"
    assert await bindings(engine) == r1_rows
    assert outcome.held and outcome.pending_change is not None
    assert outcome.pending_change.counts.moved == 1  # r2's change waits
    history = await list_publications(engine, BUNDLE)
    assert [(p.kind, p.revision) for p in history] == [
        ("rolled_back", "r1"),
        ("published", "r2"),
        ("published", "r1"),
    ]

    # Still annotated: the bundle stays at r1, nothing more written.
    _, kept = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(load_in="more.jar"),
        probed=False,
        publish=control("r2", rollback_to="r1"),
    )
    assert kept.rows_written == 0 and await bindings(engine) == r1_rows

    # Annotation removed: r2 is published again.
    _, forward = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(load_in="more.jar"), probed=False, publish=control("r2")
    )
    assert forward.publication is not None and forward.publication.recorded is not None
    assert (await bindings(engine))[("etl", "load")][1] == "more.jar"


async def test_a_rollback_is_refused_for_an_unknown_revision_or_gone_artifacts(
    engine: AsyncEngine,
) -> None:
    await add_dags(engine, etl("extract", "load"))
    await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1"))
    rows = await bindings(engine)
    _, unknown = await reconcile(
        engine, BUNDLE, [BUNDLE], jars(), probed=False, publish=control("r1", rollback_to="r0")
    )
    assert unknown.publication is not None and unknown.publication.refused is not None
    assert unknown.publication.refused.reason == "RollbackRefused"
    assert "no publication of it" in unknown.publication.refused.message

    # r2 renames etl.jar: once r2 is published, etl.jar's row is swept and r1 cannot come back.
    renamed = [
        artifact(BUNDLE, "etl-v2.jar", {"etl": [declaration("extract"), declaration("load")]}),
        jars()[1],
    ]
    await reconcile(engine, BUNDLE, [BUNDLE], renamed, publish=control("r2"))
    r2_rows = await bindings(engine)
    assert r2_rows != rows
    _, gone = await reconcile(
        engine, BUNDLE, [BUNDLE], renamed, probed=False, publish=control("r2", rollback_to="r1")
    )
    assert gone.publication is not None and gone.publication.refused is not None
    assert "etl.jar is gone" in gone.publication.refused.message
    assert await bindings(engine) == r2_rows
