"""Every wait on the real PostgreSQL is bounded: the server's own timeouts (statement, lock, idle
in transaction), the TCP parameters, and the client's bound when the server never answers
(every process of the test cluster stopped with SIGSTOP: the port accepts, nothing answers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.db.engine import (
    ANSWER_MARGIN,
    DatabaseTimeouts,
    DatabaseUnavailable,
    connection,
    create_engine,
    translate_errors,
)

pytestmark = pytest.mark.integration

TIMEOUTS = DatabaseTimeouts(
    connect=2,
    statement=2.0,
    lock=1.0,
    idle_in_transaction=1.0,
    tcp_user_timeout=13.0,
    keepalives_idle=17,
)


@pytest.fixture
async def bounded(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, timeouts=TIMEOUTS)
    try:
        yield engine
    finally:
        await engine.dispose()


async def show(engine: AsyncEngine, name: str) -> str:
    async with connection(engine) as conn:
        return str((await conn.execute(sa.text(f"SHOW {name}"))).scalar_one())


async def test_each_session_gets_the_timeouts_and_the_tcp_parameters(bounded: AsyncEngine) -> None:
    assert await show(bounded, "statement_timeout") == "2s"
    assert await show(bounded, "lock_timeout") == "1s"
    assert await show(bounded, "idle_in_transaction_session_timeout") == "1s"
    async with bounded.connect() as conn:
        raw = await conn.get_raw_connection()
        params = raw.driver_connection.info.get_parameters()  # type: ignore[union-attr]
        await conn.rollback()  # a rolled-back transaction keeps the session's settings
        assert (await conn.execute(sa.text("SHOW statement_timeout"))).scalar_one() == "2s"
    assert params["keepalives"] == "1"
    assert params["keepalives_idle"] == "17"
    assert params["tcp_user_timeout"] == "13000"
    assert params["connect_timeout"] == "2"


async def test_a_connection_option_in_the_url_wins_over_the_setting(db_url: str) -> None:
    engine = create_engine(f"{db_url}?keepalives_idle=5", timeouts=TIMEOUTS)
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            params = raw.driver_connection.info.get_parameters()  # type: ignore[union-attr]
        assert params["keepalives_idle"] == "5"
    finally:
        await engine.dispose()


async def test_a_long_statement_a_lock_wait_and_an_idle_transaction_are_cut_off(
    bounded: AsyncEngine, engine: AsyncEngine
) -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="statement timeout"):
        async with connection(bounded) as conn:
            await conn.execute(sa.text("SELECT pg_sleep(30)"))
    assert time.monotonic() - started < 10

    async with engine.begin() as holder:  # an unbounded engine holds the bundle lock
        await holder.execute(sa.text("SELECT pg_advisory_xact_lock(4242)"))
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="lock timeout"):
            async with translate_errors(), bounded.begin() as conn:
                await conn.execute(sa.text("SELECT pg_advisory_xact_lock(4242)"))
        assert time.monotonic() - started < 10

    with pytest.raises(DatabaseUnavailable):
        async with translate_errors(), bounded.begin() as conn:
            await conn.execute(sa.text("SELECT 1"))
            await asyncio.sleep(2.5)  # idle inside the transaction: the server ends the session
            await conn.execute(sa.text("SELECT 1"))
    assert await show(bounded, "lock_timeout") == "1s"  # the pool replaced the connection


async def test_a_frozen_server_is_unavailable_within_the_bound_and_heals(
    bounded: AsyncEngine, pg_server: PostgresServer
) -> None:
    assert await show(bounded, "statement_timeout") == "2s"  # a pooled connection is open
    bound = TIMEOUTS.statement + ANSWER_MARGIN + TIMEOUTS.connect
    with pg_server.frozen() as stopped:
        assert len(stopped) > 1, stopped  # the postmaster and its backends
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            async with connection(bounded) as conn:  # the pooled connection: its ping hangs
                await conn.execute(sa.text("SELECT 1"))
        first = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):  # a new connection: accepted, never answered
            async with connection(bounded) as conn:
                await conn.execute(sa.text("SELECT 1"))
        second = time.monotonic() - started
    assert first < bound + 5, first
    assert second < bound + 5, second
    # Thawed: the same engine works again.
    assert await show(bounded, "statement_timeout") == "2s"
