"""The reconcile pass end to end on real parts: PostgreSQL with Airflow's schema, the real probe
driver as a subprocess (``taskhandler-operator probe``), and the Go, Java and TypeScript test
runtimes built with their toolchains. Three bundles reconcile at once over one shared stub
inventory, then again with nothing changed, then a second owner of one bundle name is refused.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.inventory import StubInventory
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.reconcile.errors import OwnershipConflict
from taskhandler_operator.reconcile.local import LocalFolderSyncer, SubprocessProber
from taskhandler_operator.reconcile.models import (
    BundleSpec,
    ProbeAccepted,
    ProbeFailed,
    ProbeRequest,
)
from taskhandler_operator.reconcile.steps import PassOutcome, PassPorts, run_pass
from taskhandler_operator.reconcile.store import DatabaseStore
from taskhandler_operator.records import BundleInfo, BundleOwner, TaskHandlerArtifactRef
from taskhandler_operator.scheduler import resolve_task_handlers
from tests.fixtures.runtimes_plugin import RuntimeFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = {"go": "extract", "java": "orders-transform.jar", "typescript": "publish.min.mjs"}
TASKS = {"go": "extract", "java": "transform", "typescript": "publish"}


def spec_for(language: str, namespace: str = "orders") -> BundleSpec:
    return BundleSpec(
        bundle_name=f"orders-{language}",
        language=Language(language),
        queues=(language,),
        owner=BundleOwner(
            cluster_id="it", namespace=namespace, name=f"orders-{language}", uid=f"{namespace}-1"
        ),
    )


class CountingProber:
    def __init__(self) -> None:
        self.inner = SubprocessProber()
        self.calls = 0

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        self.calls += 1
        return await self.inner(request)


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    upgrade(pg_url)
    own = create_engine(pg_url)
    sync = sa.create_engine(pg_url)
    document = dag_document(
        "orders_etl", [stub_task(task, queue=lang) for lang, task in TASKS.items()]
    )
    with sync.begin() as conn:
        insert_dag(conn, document)
    sync.dispose()
    try:
        yield own
    finally:
        await own.dispose()


@pytest.fixture
def bundles(tmp_path: Path, runtime_factory: RuntimeFactory) -> dict[str, Path]:
    """One bundle folder per language, each holding one artifact declaring its stub."""
    roots: dict[str, Path] = {}
    for language, rel_path in ARTIFACTS.items():
        spec = {"orders_etl": [{"task_id": TASKS[language], "binding": "named", "params": []}]}
        built = runtime_factory(language, spec=spec)
        root = tmp_path / language
        root.mkdir()
        shutil.copy2(built, root / rel_path)  # copy2 keeps the Go artifact's execute bit
        roots[language] = root
    return roots


async def reconcile_all(
    engine: AsyncEngine, bundles: dict[str, Path], prober: CountingProber, inventory: StubInventory
) -> dict[str, PassOutcome]:
    store = DatabaseStore(engine, inventory)
    outcomes = await asyncio.gather(
        *(
            run_pass(spec_for(language), PassPorts(LocalFolderSyncer(root), prober, store))
            for language, root in bundles.items()
        )
    )
    return dict(zip(bundles, outcomes, strict=True))


async def test_three_bundles_reconcile_concurrently_and_idempotently(
    engine: AsyncEngine, bundles: dict[str, Path]
) -> None:
    prober = CountingProber()
    inventory = StubInventory()

    first = await reconcile_all(engine, bundles, prober, inventory)

    assert prober.calls == 3
    for language, outcome in first.items():
        summary = outcome.summary
        counts = summary.counts.model_dump()
        assert counts == {
            "candidates": 1,
            "cached": 0,
            "probed": 1,
            "rejected": 0,
            "failed": 0,
            "handlers": 1,
            "bindings": 1,
        }, (language, summary.artifact_issues)
        assert summary.dag_outcomes == {"orders_etl": "reconciled"}
        [accepted] = outcome.probed.accepted
        assert accepted.summary is not None and accepted.summary.status == "ok"
        assert accepted.command[:2] == ("probe", str(bundles[language] / ARTIFACTS[language]))
    refs = await resolve_task_handlers(engine, [("orders_etl", task) for task in TASKS.values()])
    assert refs == {
        ("orders_etl", TASKS[lang]): TaskHandlerArtifactRef(
            bundle_info=BundleInfo(name=f"orders-{lang}"), rel_path=ARTIFACTS[lang]
        )
        for lang in TASKS
    }

    second = await reconcile_all(engine, bundles, prober, inventory)
    assert prober.calls == 3  # nothing changed: every answer reused
    for outcome in second.values():
        assert (outcome.summary.counts.cached, outcome.summary.rows_written) == (1, 0)


async def test_a_second_owner_of_a_bundle_name_writes_nothing(
    engine: AsyncEngine, bundles: dict[str, Path]
) -> None:
    prober = CountingProber()
    store = DatabaseStore(engine)
    root = bundles["go"]
    await run_pass(spec_for("go"), PassPorts(LocalFolderSyncer(root), prober, store))
    before = await _rows(engine)

    with pytest.raises(OwnershipConflict) as caught:
        await run_pass(
            spec_for("go", namespace="intruders"),
            PassPorts(LocalFolderSyncer(root), prober, store),
        )
    assert (caught.value.step, caught.value.reason, caught.value.retryable) == (
        "write",
        "BundleClaimed",
        False,
    )
    assert "TaskHandlerBundle orders/orders-go in cluster 'it'" in str(caught.value)
    assert await _rows(engine) == before


async def _rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        result = await conn.execute(
            sa.text(
                "SELECT 'artifact', ctid::text, xmin::text FROM lang_sdk_task_handler_artifact "
                "UNION ALL SELECT 'binding', ctid::text, xmin::text FROM lang_sdk_task_handler "
                "ORDER BY 1, 2"
            )
        )
        return [tuple(row) for row in result]


async def test_the_subprocess_prober_reports_a_refused_artifact(tmp_path: Path) -> None:
    """The real driver refuses an artifact whose code no longer matches its layout hash: a
    ProbeFailed with the driver's reason and summary, not an error."""
    from taskhandler_devenv.packers import write_typescript_bundle
    from taskhandler_operator.artifacts.listing import list_candidates

    bundle = tmp_path / "bundle"
    artifact = write_typescript_bundle(bundle / "a.min.mjs", b"export const a = 1;\n")
    artifact.write_bytes(artifact.read_bytes().replace(b"a = 1", b"a = 2"))
    [candidate] = list_candidates(bundle, Language.TYPESCRIPT).candidates
    request = ProbeRequest("ts", Language.TYPESCRIPT, bundle, candidate, "rev")

    outcome = await SubprocessProber(answer_timeout=10)(request)

    assert isinstance(outcome, ProbeFailed) and not outcome.retryable
    assert outcome.summary is not None and outcome.summary.error_kind == "artifact_refused"
    assert outcome.reason == outcome.summary.error
    assert outcome.reason.startswith(
        "a.min.mjs: code region SHA-256 does not match the layout line (layout "
    )


async def test_a_missing_bundle_folder_fails_the_sync_step(tmp_path: Path) -> None:
    from taskhandler_operator.reconcile.errors import SourceFailed
    from taskhandler_operator.reconcile.store import NothingKnown

    ports = PassPorts(
        LocalFolderSyncer(tmp_path / "absent"),
        CountingProber(),
        # The pass stops at sync, before it needs a whole store.
        NothingKnown(),  # type: ignore[arg-type]
    )
    with pytest.raises(SourceFailed) as caught:
        await run_pass(spec_for("go"), ports)
    assert str(caught.value) == f"sync: bundle folder {tmp_path / 'absent'} does not exist"
