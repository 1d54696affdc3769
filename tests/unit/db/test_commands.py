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


# -- hostile and careless URLs: one line, exit 1 (retrying cannot help), never the password ----

BAD_URLS = {
    "non-numeric port": (
        "postgresql://u:s3cret@db:abc/airflow",
        "error: not a database URL: the port is not a number, or an IPv6 host misses its ']'",
    ),
    "unclosed IPv6 bracket": (
        "postgresql://u:s3cret@[::1/airflow",
        "error: not a database URL: the port is not a number, or an IPv6 host misses its ']'",
    ),
    "unknown query option": (
        "postgresql://u:s3cret@db/airflow?fooo=bar",
        "error: unknown connection option 'fooo' in the URL (known: ",
    ),
    "port out of range": (
        "postgresql://u:s3cret@127.0.0.1:99999/airflow",
        "error: not a database URL: port 99999 is out of range (1-65535)",
    ),
    "bad sslmode": (
        "postgresql://u:s3cret@127.0.0.1/airflow?sslmode=bogus",
        "error: connection option sslmode='bogus' is not one of allow, disable, prefer, "
        "require, verify-ca, verify-full",
    ),
    "NUL in the database name": (
        "postgresql://u:s3cret@127.0.0.1:5999/air%00flow",
        "error: not a database URL: the database name contains a NUL character",
    ),
    "raw NUL": (
        "postgresql://u:s3cret@127.0.0.1/air\x00flow",
        "error: not a database URL: it contains a NUL character",
    ),
    "no database": (
        "postgresql://u:s3cret@127.0.0.1:5432/",
        "error: the URL names no database; add it after the host, e.g. "
        "postgresql://user@host:5432/airflow",
    ),
    "non-numeric timeout": (
        "postgresql://u:s3cret@127.0.0.1/airflow?connect_timeout=soon",
        "error: connection option connect_timeout='soon' is not a whole number",
    ),
}


@pytest.mark.parametrize("case", BAD_URLS)
@pytest.mark.parametrize("command", ["upgrade", "check"])
def test_bad_url_is_a_one_line_permanent_error(
    case: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, expected = BAD_URLS[case]
    assert main(["db", command, "--url", url]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(expected), err
    assert "s3cret" not in err


@pytest.mark.parametrize("name", ["", ".x", "a b", "x" * 251, "a/b"])
def test_claims_release_refuses_a_bad_bundle_name(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "claims", "release", name, "--url", "postgresql://u@h/db"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {name!r} is not a bundle name\n"


def test_claims_without_a_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["db", "claims"])
    assert stopped.value.code == 2
