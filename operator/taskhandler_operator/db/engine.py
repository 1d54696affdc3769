"""Engine factories and the typed errors callers retry on.

Every database call of the operator goes through :func:`translate_errors`, which turns the
driver's and SQLAlchemy's exceptions into three kinds a caller can act on:

* :class:`DatabaseUnavailable`: the server could not be reached, or the connection was lost
  mid-transaction. The transaction did not commit; retry later with backoff.
* :class:`TransactionConflict`: PostgreSQL aborted the transaction to resolve a deadlock or a
  serialization failure. Nothing was committed; retrying at once is fine.
* :class:`PermissionDenied`: the role lacks a grant (or does not own a table it alters); not
  retryable, the message names what was refused.
* anything else propagates unchanged: a bug or a schema problem, retrying will not help.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import sqlalchemy.exc
from sqlalchemy import Engine
from sqlalchemy import create_engine as create_sync_engine_sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

DRIVER = "postgresql+psycopg"
DEFAULT_CONNECT_TIMEOUT = 10
APPLICATION_NAME = "taskhandler-operator"

# SQLSTATEs for "PostgreSQL rolled the transaction back to let another one proceed".
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
# insufficient_privilege: a missing grant, or an ALTER by a role that does not own the table.
_PRIVILEGE_SQLSTATE = "42501"


class DatabaseError(Exception):
    """Base of the operator's database errors. ``retryable`` says whether to try again."""

    retryable = False


class RetryableDatabaseError(DatabaseError):
    retryable = True


class DatabaseUnavailable(RetryableDatabaseError):
    """The database could not be reached or the connection broke; nothing was committed."""


class TransactionConflict(RetryableDatabaseError):
    """A deadlock or serialization failure aborted the transaction; nothing was committed."""


class PermissionDenied(DatabaseError):
    """The role lacks a privilege the statement needs; retrying will not help."""


class InvalidDatabaseUrl(DatabaseError, ValueError):
    """The URL does not name a PostgreSQL database."""


def _parse_url(url: str | URL) -> URL:
    try:
        return make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise InvalidDatabaseUrl(f"not a database URL: {exc}") from None


def normalize_url(url: str | URL) -> URL:
    """The URL with the psycopg 3 driver, whatever PostgreSQL spelling the caller used.

    Airflow configurations usually say ``postgresql+psycopg2://`` or ``postgresql://``; the
    operator ships psycopg 3 only, which speaks to the same servers.
    """
    parsed = _parse_url(url)
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise InvalidDatabaseUrl(
            f"the operator needs PostgreSQL, got a {backend!r} URL "
            f"({parsed.render_as_string(hide_password=True)})"
        )
    return parsed.set(drivername=DRIVER)


def describe(url: str | URL) -> str:
    """``host:port/database`` for messages, never the password."""
    parsed = _parse_url(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.host or 'localhost'}{port}/{parsed.database or ''}"


def _connect_args(connect_timeout: int, application_name: str) -> dict[str, Any]:
    return {"connect_timeout": connect_timeout, "application_name": application_name}


def create_engine(
    url: str | URL,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    application_name: str = APPLICATION_NAME,
    pool_size: int = 5,
) -> AsyncEngine:
    """The async engine (psycopg 3) the operator's reconcile loop uses."""
    return create_async_engine(
        normalize_url(url),
        pool_size=pool_size,
        # A connection the server dropped while idle is replaced instead of failing a pass.
        pool_pre_ping=True,
        connect_args=_connect_args(connect_timeout, application_name),
    )


def create_sync_engine(
    url: str | URL,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    application_name: str = APPLICATION_NAME,
) -> Engine:
    """A sync engine, for migrations (Alembic is synchronous) and the sync read path."""
    return create_sync_engine_sa(
        normalize_url(url),
        pool_pre_ping=True,
        connect_args=_connect_args(connect_timeout, application_name),
    )


def classify(exc: BaseException) -> DatabaseError | None:
    """The typed error for ``exc``, or None when it is not a transient database failure."""
    if isinstance(exc, DatabaseError):
        return exc
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None)
        detail = _first_line(exc.orig) if exc.orig is not None else _first_line(exc)
        if sqlstate in _CONFLICT_SQLSTATES:
            return TransactionConflict(f"transaction aborted by PostgreSQL ({sqlstate}): {detail}")
        if sqlstate == _PRIVILEGE_SQLSTATE:
            return PermissionDenied(
                f"{detail}: the database role lacks that privilege (docs/airflow.md lists what "
                "the migration role and the operator's role need)"
            )
        if exc.connection_invalidated or isinstance(
            exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError
        ):
            return DatabaseUnavailable(f"database unavailable: {detail}")
        return None
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        # The pool could not hand out a connection in time.
        return DatabaseUnavailable(f"database unavailable: {_first_line(exc)}")
    if isinstance(exc, ConnectionError | TimeoutError):
        return DatabaseUnavailable(f"database unavailable: {_first_line(exc)}")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Re-raise transient failures inside the block as :class:`RetryableDatabaseError`."""
    try:
        yield
    except Exception as exc:
        typed = classify(exc)
        if typed is None or typed is exc:
            raise
        raise typed from exc


@asynccontextmanager
async def connection(bind: AsyncEngine | AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """A connection to read on, with errors translated as by :func:`translate_errors`.

    An open connection is used as it is (so the read joins the caller's transaction); an
    engine lends one for the block.
    """
    async with translate_errors():
        if isinstance(bind, AsyncConnection):
            yield bind
        else:
            async with bind.connect() as conn:
                yield conn


@contextmanager
def translate_errors_sync() -> Iterator[None]:
    """The synchronous twin of :func:`translate_errors`."""
    try:
        yield
    except Exception as exc:
        typed = classify(exc)
        if typed is None or typed is exc:
            raise
        raise typed from exc
