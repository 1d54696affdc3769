"""Fixtures for the database tests, built on the shared ``pg_url`` (Airflow's real schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.db.engine import create_engine, create_sync_engine
from taskhandler_operator.db.migrate import upgrade


@pytest.fixture
def db_url(pg_url: str) -> str:
    """A fresh Airflow database with the operator's migrations applied."""
    upgrade(pg_url)
    return pg_url


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    async_engine = create_engine(db_url)
    try:
        yield async_engine
    finally:
        await async_engine.dispose()


@pytest.fixture
def sync_engine(db_url: str) -> Iterator[Engine]:
    engine = create_sync_engine(db_url)
    try:
        yield engine
    finally:
        engine.dispose()
