"""Stored artifacts read back as the fast path's known artifacts."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.artifacts.planner import plan_probes
from taskhandler_operator.db.known_artifacts import load_known_artifacts, load_stored_artifacts
from taskhandler_operator.db.writer import ArtifactRecord, record_artifacts
from taskhandler_operator.records import TaskHandlerDeclaration, TaskHandlerParam
from tests.integration.db.helpers import PROBED_AT, artifact, owner

pytestmark = pytest.mark.integration


async def test_round_trip_and_planner_input(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    declared = artifact(
        "java",
        "lib/etl.jar",
        {
            "etl": [
                TaskHandlerDeclaration(
                    task_id="load",
                    binding="named",
                    params=[TaskHandlerParam(name="Table", exact_name=True)],
                ),
                TaskHandlerDeclaration(task_id="ping", params=None),
            ]
        },
    )
    reused = artifact("java", "lib/old.jar", {})
    await record_artifacts(
        engine,
        "java",
        [
            ArtifactRecord(artifact=declared, probed_at=PROBED_AT, revision="abc"),
            ArtifactRecord(artifact=reused),
        ],
        owner=owner("java"),
    )
    await record_artifacts(
        engine, "go", [ArtifactRecord(artifact=artifact("go", "x", {}))], owner=owner("go")
    )
    async with engine.begin() as conn:
        # A row some other tool wrote that no longer validates is skipped, not fatal.
        await conn.execute(
            sa.text(
                "INSERT INTO lang_sdk_task_handler_artifact VALUES (gen_random_uuid(), 'java', "
                "'lib/bad.jar', md5('lib/bad.jar'), 1, NULL, '{\"etl\": 5}', now())"
            )
        )
    with caplog.at_level(logging.WARNING):
        stored = await load_stored_artifacts(engine, "java")
    assert [s.artifact.relative_fileloc for s in stored] == ["lib/etl.jar", "lib/old.jar"]
    assert stored[0].artifact == declared
    assert (stored[0].last_probed_at, stored[0].revision) == (PROBED_AT, "abc")
    assert stored[1].revision is None
    assert "ignoring stored artifact lib/bad.jar" in caplog.text

    known = await load_known_artifacts(engine, "java")
    candidates = [
        Candidate(rel_path="lib/etl.jar", size_bytes=100, cache_digest=declared.cache_digest),
        Candidate(rel_path="lib/old.jar", size_bytes=101, cache_digest=reused.cache_digest),
    ]
    plan = plan_probes(candidates, known, "java")
    assert [(c.rel_path, k.relative_fileloc) for c, k in plan.cached] == [
        ("lib/etl.jar", "lib/etl.jar")
    ]
    assert [c.rel_path for c in plan.probe] == ["lib/old.jar"]  # size changed
