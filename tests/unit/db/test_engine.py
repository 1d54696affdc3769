"""URL handling and error classification (no server needed)."""

from __future__ import annotations

import pytest
import sqlalchemy.exc

from taskhandler_operator.db.engine import (
    DatabaseRefused,
    DatabaseUnavailable,
    InvalidDatabaseUrl,
    PermissionDenied,
    TransactionConflict,
    classify,
    describe,
    normalize_url,
)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@h:5432/airflow",
        "postgresql+psycopg2://u:p@h:5432/airflow",
        "postgresql+psycopg://u:p@h:5432/airflow",
        "postgres://u:p@h:5432/airflow",
    ],
)
def test_postgres_spellings_use_psycopg3(url: str) -> None:
    normalized = normalize_url(url)
    assert normalized.drivername == "postgresql+psycopg"
    assert (normalized.host, normalized.port, normalized.database) == ("h", 5432, "airflow")


def test_other_databases_are_refused() -> None:
    with pytest.raises(InvalidDatabaseUrl) as caught:
        normalize_url("mysql://u:secret@h/airflow")
    assert str(caught.value) == (
        "the operator needs PostgreSQL, got a 'mysql' URL (mysql://u:***@h/airflow)"
    )


def test_garbage_url_is_refused() -> None:
    with pytest.raises(InvalidDatabaseUrl) as caught:
        normalize_url("not a url")
    assert str(caught.value).startswith("not a database URL: ")


def test_describe_hides_the_password() -> None:
    assert describe("postgresql://u:secret@db:5433/airflow") == "db:5433/airflow"


class _Orig(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _dbapi(cls: type[sqlalchemy.exc.DBAPIError], message: str, sqlstate: str | None) -> Exception:
    return cls("SELECT 1", {}, _Orig(message, sqlstate))


def test_deadlock_and_serialization_failures_are_conflicts() -> None:
    for state in ("40001", "40P01"):
        typed = classify(
            _dbapi(sqlalchemy.exc.OperationalError, "deadlock detected\nDETAIL: x", state)
        )
        assert isinstance(typed, TransactionConflict)
        assert str(typed) == f"transaction aborted by PostgreSQL ({state}): deadlock detected"
        assert typed.retryable


def test_operational_errors_are_unavailability() -> None:
    typed = classify(_dbapi(sqlalchemy.exc.OperationalError, "connection refused", "08006"))
    assert isinstance(typed, DatabaseUnavailable)
    assert str(typed) == "database unavailable: connection refused"


def test_programming_errors_are_not_retryable() -> None:
    assert classify(_dbapi(sqlalchemy.exc.ProgrammingError, "syntax error", "42601")) is None
    assert classify(ValueError("x")) is None


def test_os_level_connection_errors_are_unavailability() -> None:
    assert isinstance(classify(ConnectionResetError("reset")), DatabaseUnavailable)


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "h", port 5432 failed: FATAL:  database '
        '"airflw" does not exist',
        'connection failed: connection to server at "h", port 5432 failed: FATAL:  role "x" does '
        "not exist",
        'connection failed: FATAL:  password authentication failed for user "airflow"',
        'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "a"',
        "connection failed: fe_sendauth: no password supplied",
        "connection failed: server does not support SSL, but SSL was required",
    ],
)
def test_refusals_while_connecting_are_permanent(message: str) -> None:
    typed = classify(_dbapi(sqlalchemy.exc.OperationalError, message, None))
    assert isinstance(typed, DatabaseRefused)
    assert not typed.retryable
    assert str(typed) == f"the database refused the connection: {message}"


@pytest.mark.parametrize("state", ["3D000", "28P01", "28000", "42501"])
def test_refusing_sqlstates_are_permanent(state: str) -> None:
    typed = classify(_dbapi(sqlalchemy.exc.OperationalError, "no", state))
    assert isinstance(typed, DatabaseRefused)
    assert not typed.retryable
    if state == "42501":  # a missing grant says which role needs what
        assert isinstance(typed, PermissionDenied)
        assert str(typed).startswith("no: the database role lacks that privilege")
    else:
        assert str(typed) == f"the database refused ({state}): no"


def test_a_server_that_is_starting_up_is_transient() -> None:
    message = "connection failed: FATAL:  the database system is starting up"
    typed = classify(_dbapi(sqlalchemy.exc.OperationalError, message, None))
    assert isinstance(typed, DatabaseUnavailable)
