"""``taskhandler-operator db`` argument handling and failure exit codes (no server)."""

from __future__ import annotations

import socket

import pytest

from taskhandler_operator.cli import main


def test_upgrade_without_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("THOP_DATABASE_URL", raising=False)
    assert main(["db", "upgrade"]) == 2
    assert (
        capsys.readouterr().err == "error: no database URL: pass --url or set THOP_DATABASE_URL\n"
    )


def test_unreachable_database_exits_tempfail(capsys: pytest.CaptureFixture[str]) -> None:
    # A loopback port nobody listens on: bind, note it, close.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["db", "upgrade", "--url", f"postgresql://postgres@127.0.0.1:{port}/x"]) == 75
    err = capsys.readouterr().err
    assert err.startswith("error: database unavailable: connection failed: ")
    assert "Connection refused" in err


def test_non_postgres_url_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "check", "--url", "sqlite:///x.db"]) == 1
    assert capsys.readouterr().err == (
        "error: the operator needs PostgreSQL, got a 'sqlite' URL (sqlite:///x.db)\n"
    )


@pytest.mark.parametrize("command", ["upgrade", "check"])
def test_malformed_url_is_refused_with_a_message(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", command, "--url", "not a url"]) == 1
    assert capsys.readouterr().err == (
        "error: not a database URL: Could not parse SQLAlchemy URL from given URL string\n"
    )
