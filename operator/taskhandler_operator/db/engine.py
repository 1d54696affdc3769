"""Engine factories and the typed errors callers retry on.

Every database call of the operator goes through :func:`translate_errors`, which turns the
driver's and SQLAlchemy's exceptions into three kinds a caller can act on:

* :class:`DatabaseUnavailable`: the server could not be reached, or the connection was lost
  mid-transaction. The transaction did not commit; retry later with backoff.
* :class:`TransactionConflict`: PostgreSQL aborted the transaction to resolve a deadlock or a
  serialization failure. Nothing was committed; retrying at once is fine.
* :class:`PermissionDenied`: the role lacks a grant (or does not own a table it alters); not
  retryable, the message names what was refused.
* :class:`DatabaseRefused`: the server answered but refused for a reason retrying cannot fix
  (the database does not exist, authentication failed, no privilege). Not retryable.
* anything else propagates unchanged: a bug or a schema problem, retrying will not help.

Every wait is bounded (:class:`DatabaseTimeouts`, from the operator's settings): the server
cancels a statement after ``statement_timeout`` and a lock wait after ``lock_timeout``, and ends a
session left idle in a transaction after ``idle_in_transaction_session_timeout`` (set per session
when the connection is made, so they also work behind a pooler that refuses libpq ``options``);
TCP keepalives and ``tcp_user_timeout`` notice a dead peer, ``connect_timeout`` an unanswered
connection. A server that accepts but never answers (stopped, or a half-open connection whose
kernel still acknowledges) cancels nothing itself, so the async engine's connections also give
up on the client side when an answer takes longer than the statement timeout plus a margin: the
connection is closed and the call fails with :class:`DatabaseUnavailable`.

URLs are checked up front (:func:`normalize_url`): a malformed or unsupported URL is an
:class:`InvalidDatabaseUrl` with a one-line message that never shows the password, instead of
an error from deep inside the driver (or, for a NUL byte, a silently different connection).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
import sqlalchemy.exc
from sqlalchemy import Engine
from sqlalchemy import create_engine as create_sync_engine_sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

DRIVER = "postgresql+psycopg"
DEFAULT_CONNECT_TIMEOUT = 10
APPLICATION_NAME = "taskhandler-operator"
#: Seconds the client waits for an answer beyond the statement timeout before it gives up on
#: the connection: long enough for a live server's own cancel to arrive first.
ANSWER_MARGIN = 5.0

# SQLSTATEs for "PostgreSQL rolled the transaction back to let another one proceed".
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
# undefined_table: a table is gone (an Airflow downgrade dropped it).
_SCHEMA_SQLSTATES = frozenset({"42P01"})
# insufficient_privilege: a missing grant, or an ALTER by a role that does not own the table.
_PRIVILEGE_SQLSTATE = "42501"
# SQLSTATEs that say the configuration is wrong: retrying with the same URL cannot help.
# 28xxx invalid authorization (bad password, no pg_hba entry), 3D000 no such database,
# 42501 insufficient privilege, 3F000 no such schema.
_PERMANENT_SQLSTATE_CLASSES = ("28",)
_PERMANENT_SQLSTATES = frozenset({"3D000", "42501", "3F000"})
# A refusal while connecting carries no SQLSTATE (libpq reports it as text), so these are
# recognised by the server's (English) message: the same refusals as above, plus TLS demands
# the server cannot meet.
_PERMANENT_CONNECT_FAILURE = re.compile(
    r'FATAL:\s+(?:database "[^"]*" does not exist|role "[^"]*" does not exist'
    r"|password authentication failed|no pg_hba\.conf entry|\w+ authentication failed"
    r"|permission denied for database)"
    r"|fe_sendauth: no password supplied|server does not support SSL, but SSL was required"
)

# libpq connection parameters a URL query may carry, with the values each accepts (None: any).
# An unknown key would otherwise fail deep in the driver on every connection attempt.
_QUERY_OPTIONS: dict[str, frozenset[str] | None] = {
    "sslmode": frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}),
    "gssencmode": frozenset({"disable", "prefer", "require"}),
    "channel_binding": frozenset({"disable", "prefer", "require"}),
    "target_session_attrs": frozenset(
        {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}
    ),
    "load_balance_hosts": frozenset({"disable", "random"}),
    "sslnegotiation": frozenset({"postgres", "direct"}),
    "connect_timeout": None,
    "application_name": None,
    "options": None,
    "sslcert": None,
    "sslkey": None,
    "sslrootcert": None,
    "sslcrl": None,
    "sslcrldir": None,
    "sslpassword": None,
    "sslsni": frozenset({"0", "1"}),
    "ssl_min_protocol_version": None,
    "ssl_max_protocol_version": None,
    "keepalives": frozenset({"0", "1"}),
    "keepalives_idle": None,
    "keepalives_interval": None,
    "keepalives_count": None,
    "tcp_user_timeout": None,
    "passfile": None,
    "service": None,
    "krbsrvname": None,
    "host": None,
    "hostaddr": None,
    "port": None,
    "client_encoding": None,
    "require_auth": None,
}
_INTEGER_OPTIONS = frozenset(
    {
        "connect_timeout",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)
_MAX_SHOWN = 40


class DatabaseError(Exception):
    """Base of the operator's database errors. ``retryable`` says whether to try again."""

    retryable = False


class RetryableDatabaseError(DatabaseError):
    retryable = True


class DatabaseUnavailable(RetryableDatabaseError):
    """The database could not be reached or the connection broke; nothing was committed."""


class TransactionConflict(RetryableDatabaseError):
    """A deadlock or serialization failure aborted the transaction; nothing was committed."""


class InvalidDatabaseUrl(DatabaseError, ValueError):
    """The URL does not name a PostgreSQL database."""


class DatabaseRefused(DatabaseError):
    """The server refused for a reason retrying cannot fix (no such database, bad login)."""


class SchemaMissing(DatabaseRefused):
    """A table or column the operator needs is not there (dropped by an Airflow downgrade, or
    changed by another migration): ``db upgrade`` puts it back. Not retryable until then."""


class PermissionDenied(DatabaseRefused):
    """The role lacks a privilege the statement needs; retrying will not help."""


def _shown(value: str) -> str:
    """A short, escaped rendering of a URL part for a message (never the password)."""
    text = value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…"
    return repr(text)


def _parse_url(url: str | URL) -> URL:
    if isinstance(url, str) and "\x00" in url:
        # make_url keeps a raw NUL, and libpq would cut the string there.
        raise InvalidDatabaseUrl("not a database URL: it contains a NUL character")
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise InvalidDatabaseUrl(f"not a database URL: {exc}") from None
    except ValueError:
        # make_url's own int() of the port: a non-numeric port, or an unclosed IPv6 bracket
        # whose text after the last ':' is taken for one.
        raise InvalidDatabaseUrl(
            "not a database URL: the port is not a number, or an IPv6 host misses its ']'"
        ) from None
    _check_parts(parsed)
    return parsed


def _check_parts(parsed: URL) -> None:
    for what, value in (
        ("user name", parsed.username),
        ("password", parsed.password),
        ("host", parsed.host),
        ("database name", parsed.database),
    ):
        if isinstance(value, str) and "\x00" in value:
            raise InvalidDatabaseUrl(f"not a database URL: the {what} contains a NUL character")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidDatabaseUrl(
            f"not a database URL: port {parsed.port} is out of range (1-65535)"
        )
    if parsed.host is not None and parsed.host.startswith("[") != parsed.host.endswith("]"):
        raise InvalidDatabaseUrl(f"not a database URL: host {_shown(parsed.host)} is malformed")


def _check_postgres_parts(parsed: URL) -> None:
    if not parsed.database:
        raise InvalidDatabaseUrl(
            "the URL names no database; add it after the host, e.g. "
            "postgresql://user@host:5432/airflow"
        )
    for key, raw in parsed.query.items():
        values = raw if isinstance(raw, tuple) else (raw,)
        if key not in _QUERY_OPTIONS:
            raise InvalidDatabaseUrl(
                f"unknown connection option {_shown(key)} in the URL (known: "
                f"{', '.join(sorted(_QUERY_OPTIONS))})"
            )
        allowed = _QUERY_OPTIONS[key]
        for value in values:
            if "\x00" in value:
                raise InvalidDatabaseUrl(f"connection option {key!r} contains a NUL character")
            if allowed is not None and value not in allowed:
                raise InvalidDatabaseUrl(
                    f"connection option {key}={_shown(value)} is not one of "
                    f"{', '.join(sorted(allowed))}"
                )
            if key in _INTEGER_OPTIONS and not (value.isascii() and value.isdigit()):
                raise InvalidDatabaseUrl(
                    f"connection option {key}={_shown(value)} is not a whole number"
                )


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
    _check_postgres_parts(parsed)
    return parsed.set(drivername=DRIVER)


def describe(url: str | URL) -> str:
    """``host:port/database`` for messages, never the password."""
    parsed = _parse_url(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.host or 'localhost'}{port}/{parsed.database or ''}"


@dataclass(frozen=True)
class DatabaseTimeouts:
    """How long any wait on the database may last, in seconds (docs/settings.md).

    ``statement``, ``lock`` and ``idle_in_transaction`` are the server's session settings (0
    leaves the server's own value); the others are libpq's connection parameters. ``answer`` is
    the client's own bound on one round trip (see the module docstring).
    """

    connect: int = DEFAULT_CONNECT_TIMEOUT
    statement: float = 60.0
    lock: float = 30.0
    idle_in_transaction: float = 60.0
    tcp_user_timeout: float = 30.0
    keepalives_idle: int = 30
    keepalives_interval: int = 10
    keepalives_count: int = 3

    @property
    def answer(self) -> float | None:
        """Seconds to wait for one answer before closing the connection; None: no bound."""
        return self.statement + ANSWER_MARGIN if self.statement > 0 else None

    def session_settings(self) -> dict[str, str]:
        """The server settings each new session gets, in milliseconds (0: not set)."""
        wanted = {
            "statement_timeout": self.statement,
            "lock_timeout": self.lock,
            "idle_in_transaction_session_timeout": self.idle_in_transaction,
        }
        return {name: str(round(s * 1000)) for name, s in wanted.items() if s > 0}


#: The migration and CLI engines: TCP liveness only. A migration legitimately runs long
#: statements and waits on the migration lock for another migrator.
TCP_ONLY = DatabaseTimeouts(statement=0, lock=0, idle_in_transaction=0)


def _connect_args(url: URL, timeouts: DatabaseTimeouts, application_name: str) -> dict[str, Any]:
    """libpq parameters; one the URL's query names already is the user's choice and wins."""
    args: dict[str, Any] = {
        "connect_timeout": timeouts.connect,
        "application_name": application_name,
        "keepalives": 1,
        "keepalives_idle": timeouts.keepalives_idle,
        "keepalives_interval": timeouts.keepalives_interval,
        "keepalives_count": timeouts.keepalives_count,
        "tcp_user_timeout": round(timeouts.tcp_user_timeout * 1000),
    }
    return {key: value for key, value in args.items() if key not in url.query}


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the client's bound; the connection was closed."""


class BoundedConnection(psycopg.AsyncConnection[Any]):
    """A psycopg connection that never waits longer than ``answer_timeout`` for one answer.

    psycopg funnels every round trip of an async connection (query, commit, rollback, the
    pool's ping) through :meth:`wait`; a server that never answers would otherwise hold the
    caller for ever (cancelling the caller makes psycopg send a cancel request that the same
    server never answers either).
    """

    answer_timeout: float | None = None

    async def wait(
        self,
        gen: Any,
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109 - psycopg's signature
    ) -> Any:
        bound = timeout if timeout is not None else self.answer_timeout
        try:
            return await super().wait(gen, interval=interval, timeout=bound)
        except psycopg.errors._WaitTimeout:  # psycopg's own (internal) timeout error
            if timeout is not None:
                raise
            # Mid-protocol: the connection's state is unknown, never reuse it.
            self.pgconn.finish()
            raise NoAnswer(
                f"no answer from the database within {bound:.0f}s; connection closed"
            ) from None


def _connector(
    timeouts: DatabaseTimeouts,
) -> Callable[..., Awaitable[BoundedConnection]]:
    settings = timeouts.session_settings()
    calls = ", ".join(f"set_config('{name}', %s, false)" for name in settings)

    async def connect(*args: Any, **kwargs: Any) -> BoundedConnection:
        conn = await BoundedConnection.connect(*args, **kwargs)
        conn.answer_timeout = timeouts.answer
        if settings:
            try:
                # Per session (not libpq ``options``, which PgBouncer refuses), committed so a
                # later rollback keeps them.
                await conn.execute(f"SELECT {calls}", list(settings.values()))
                await conn.commit()
            except BaseException:
                await conn.close()
                raise
        return conn

    return connect


def create_engine(
    url: str | URL,
    *,
    timeouts: DatabaseTimeouts | None = None,
    connect_timeout: int | None = None,
    application_name: str = APPLICATION_NAME,
    pool_size: int = 5,
) -> AsyncEngine:
    """The async engine (psycopg 3) the operator's reconcile loop uses, every wait bounded by
    ``timeouts`` (``connect_timeout`` overrides its connect timeout)."""
    timeouts = timeouts or DatabaseTimeouts()
    if connect_timeout is not None:
        timeouts = dataclasses.replace(timeouts, connect=connect_timeout)
    parsed = normalize_url(url)
    return create_async_engine(
        parsed,
        pool_size=pool_size,
        # A connection the server dropped while idle is replaced instead of failing a pass.
        pool_pre_ping=True,
        # The pool's own wait for a free connection is bounded too.
        pool_timeout=timeouts.answer or 30.0,
        connect_args={
            **_connect_args(parsed, timeouts, application_name),
            "async_creator_fn": _connector(timeouts),
        },
    )


def create_sync_engine(
    url: str | URL,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    application_name: str = APPLICATION_NAME,
) -> Engine:
    """A sync engine, for migrations (Alembic is synchronous) and the sync read path: a bounded
    connect and TCP keepalives, no statement or lock timeout (see :data:`TCP_ONLY`)."""
    parsed = normalize_url(url)
    timeouts = dataclasses.replace(TCP_ONLY, connect=connect_timeout)
    return create_sync_engine_sa(
        parsed,
        pool_pre_ping=True,
        connect_args=_connect_args(parsed, timeouts, application_name),
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
        if sqlstate in _SCHEMA_SQLSTATES:
            return SchemaMissing(
                f"{detail}: the operator's tables are not what this version needs (an Airflow "
                "downgrade drops them, another migration may change them); `taskhandler-operator "
                "db check` names the differences and `taskhandler-operator db upgrade` "
                "creates what is missing"
            )
        if sqlstate == _PRIVILEGE_SQLSTATE:
            return PermissionDenied(
                f"{detail}: the database role lacks that privilege (docs/airflow.md lists what "
                "the migration role and the operator's role need)"
            )
        if isinstance(sqlstate, str) and (
            sqlstate in _PERMANENT_SQLSTATES or sqlstate.startswith(_PERMANENT_SQLSTATE_CLASSES)
        ):
            return DatabaseRefused(f"the database refused ({sqlstate}): {detail}")
        if sqlstate is None and _PERMANENT_CONNECT_FAILURE.search(detail):
            return DatabaseRefused(f"the database refused the connection: {detail}")
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
