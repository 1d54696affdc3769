"""The bounds of database waits as the engine factories turn them into connection settings."""

from __future__ import annotations

from taskhandler_operator.db.engine import (
    ANSWER_MARGIN,
    TCP_ONLY,
    DatabaseTimeouts,
    _connect_args,
    normalize_url,
)


def test_the_server_timeouts_are_sent_in_milliseconds_and_zero_means_unset() -> None:
    timeouts = DatabaseTimeouts(statement=1.5, lock=0, idle_in_transaction=60)
    assert timeouts.session_settings() == {
        "statement_timeout": "1500",
        "idle_in_transaction_session_timeout": "60000",
    }
    assert timeouts.answer == 1.5 + ANSWER_MARGIN
    assert TCP_ONLY.session_settings() == {}
    assert TCP_ONLY.answer is None  # migrations: no client bound on one answer


def test_tcp_parameters_are_libpqs_and_the_url_query_wins() -> None:
    timeouts = DatabaseTimeouts(connect=4, tcp_user_timeout=2.5, keepalives_idle=9)
    args = _connect_args(normalize_url("postgresql://u@h/db"), timeouts, "app")
    assert args == {
        "connect_timeout": 4,
        "application_name": "app",
        "keepalives": 1,
        "keepalives_idle": 9,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        "tcp_user_timeout": 2500,
    }
    url = normalize_url("postgresql://u@h/db?keepalives_idle=5&connect_timeout=2")
    chosen = _connect_args(url, timeouts, "app")
    assert "keepalives_idle" not in chosen and "connect_timeout" not in chosen
