"""The database side of a pass: the :class:`Store` port and its implementation over an engine.

Kept apart from :mod:`.ports` because it names the write path's types, which live in ``db``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.airflow.serialized import DagStubs
from taskhandler_operator.db.fence import Fence
from taskhandler_operator.db.inventory import InventoryDelta, StubInventory
from taskhandler_operator.db.known_artifacts import (
    load_known_artifacts,
    load_requested_dag_ids,
)
from taskhandler_operator.db.watermark import RowsWatermark, rows_watermark
from taskhandler_operator.db.write_models import BundlePass, PassResult
from taskhandler_operator.db.writer import write_pass
from taskhandler_operator.records import TaskHandlerArtifact


class KnownArtifacts(Protocol):
    async def known_artifacts(self, bundle_name: str) -> list[TaskHandlerArtifact]:
        """The stored answers of the bundle (the fast path's input)."""
        ...

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        """The ``dag_ids`` each stored answer was asked with, by path (missing: none)."""
        ...


class NothingKnown:
    """:class:`KnownArtifacts` before any answer is stored (a first pass without a database)."""

    async def known_artifacts(self, bundle_name: str) -> list[TaskHandlerArtifact]:
        return []

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        return {}


class Store(KnownArtifacts, Protocol):
    async def stub_inventory(self) -> Mapping[str, DagStubs]:
        """Every live Dag's stub tasks, refreshed: a snapshot no later refresh changes."""
        ...

    async def write(self, bundle_pass: BundlePass) -> PassResult:
        """One transaction; refuses a pass whose owner does not hold the bundle's claim."""
        ...


class Watermarks(Protocol):
    """What tells an unchanged pass from a changed one (beside the revision and listing)."""

    async def recent_stub_inventory(self) -> Mapping[str, DagStubs]:
        """The stub inventory, possibly from a refresh a moment ago (a change it misses wakes
        the bundle again when a refresh finds it)."""
        ...

    async def rows_watermark(
        self, bundle_name: str, dag_ids: Sequence[str], queues: Sequence[str]
    ) -> RowsWatermark:
        """A value that changes whenever a row the bundle's pass reads or writes changes."""
        ...


class DatabaseStore:
    """:class:`Store` on Airflow's metadata database.

    ``inventory`` is shared by every bundle of one operator (one cheap query per refresh, and
    only changed Dags parsed); it is safe to refresh from concurrent passes.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        inventory: StubInventory | None = None,
        *,
        fence: Fence | None = None,
    ) -> None:
        self.engine = engine
        self.inventory = inventory if inventory is not None else StubInventory()
        # A leader's writes are fenced (db/fence.py); None: unfenced (tools, tests).
        self.fence = fence
        # What the latest refresh found (for logs and metrics); None before the first.
        self.last_delta: InventoryDelta | None = None

    async def known_artifacts(self, bundle_name: str) -> list[TaskHandlerArtifact]:
        return await load_known_artifacts(self.engine, bundle_name)

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        return await load_requested_dag_ids(self.engine, bundle_name)

    async def stub_inventory(self) -> Mapping[str, DagStubs]:
        self.last_delta = await self.inventory.refresh(self.engine)
        return self.inventory.dags

    async def write(self, bundle_pass: BundlePass) -> PassResult:
        return await write_pass(self.engine, bundle_pass, fence=self.fence)

    async def recent_stub_inventory(self) -> Mapping[str, DagStubs]:
        return await self.stub_inventory()  # alone, nobody else refreshes it: always fresh

    async def rows_watermark(
        self, bundle_name: str, dag_ids: Sequence[str], queues: Sequence[str]
    ) -> RowsWatermark:
        return await rows_watermark(self.engine, bundle_name, dag_ids, queues)
