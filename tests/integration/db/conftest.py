"""Fixtures for the database tests, built on the shared ``pg_url`` (Airflow's real schema)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.db.engine import create_engine, create_sync_engine
from taskhandler_operator.db.migrate import upgrade
from tests.fixtures.airflow_design_b import airflow_creates_binding_tables


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


@pytest.fixture
def airflow_ddl_url(pg_server: PostgresServer, airflow_template: str) -> Iterator[str]:
    """Another fresh Airflow database, where the binding tables were created by the stand-in
    for Airflow's own migration (the Design-B DDL, plain CREATE TABLE)."""
    name = f"thop_ddl_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name, template=airflow_template)
    try:
        url = pg_server.url(name)
        airflow_creates_binding_tables(url)
        yield url
    finally:
        pg_server.drop_database(name)
