"""The DagBundle check of a pass (controller/bundle.py) against a real fault no step expects:
Airflow's ``dag_bundle`` table with a renamed column on the real PostgreSQL, which raises a
``ProgrammingError`` (not one of the operator's database errors). It becomes an
``InternalError`` answer, never an exception out of the pass, and the check answers again
once the table is fixed. (End to end, with the pass loop and its back-off:
tests/e2e/test_operator_health.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.controller import bundle
from taskhandler_operator.db.dag_bundle import DagBundleSync
from taskhandler_operator.kube.conditions import Reasoned

pytestmark = pytest.mark.integration


async def test_a_dag_bundle_table_of_another_shape_is_an_internal_error(
    engine: AsyncEngine, sync_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    runtime: Any = SimpleNamespace(engine=engine)
    before = await bundle._dag_bundle_sync(runtime, "orders", "rev1")
    assert isinstance(before, DagBundleSync) and before.reason == "UnknownDagBundle"

    with sync_engine.begin() as conn:
        conn.execute(text("ALTER TABLE dag_bundle RENAME COLUMN version TO version_moved"))
    broken = await bundle._dag_bundle_sync(runtime, "orders", "rev1")
    assert isinstance(broken, Reasoned)
    assert broken.reason == "InternalError"
    assert broken.message.startswith("ProgrammingError: "), broken.message
    assert "version" in broken.message
    logged = [r for r in caplog.records if "checking Airflow's DagBundle" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # with the traceback

    with sync_engine.begin() as conn:
        conn.execute(text("ALTER TABLE dag_bundle RENAME COLUMN version_moved TO version"))
    healed = await bundle._dag_bundle_sync(runtime, "orders", "rev1")
    assert isinstance(healed, DagBundleSync) and healed.reason == "UnknownDagBundle"
