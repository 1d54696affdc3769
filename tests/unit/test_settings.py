"""The settings object: environment, flags over environment, one-line errors, secrets kept out."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from taskhandler_operator.cli import main
from taskhandler_operator.settings import (
    Settings,
    SettingsError,
    add_arguments,
    env_of,
    flag_of,
    load_settings,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("THOP_") and name not in ("THOP_CACHE",):
            monkeypatch.delenv(name)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    settings = load_settings()
    assert settings.namespaces == () and settings.cluster_id is None
    assert (settings.probe_parallelism, settings.metrics_port, settings.log_format) == (
        4,
        8080,
        "json",
    )
    assert settings.resolved_database_url() is None


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THOP_NAMESPACES", "team-a, team-b,")
    monkeypatch.setenv("THOP_RUNTIME_IMAGES__JAVA", "registry.example/thop-java:1")
    monkeypatch.setenv("THOP_PROBE_PARALLELISM", "8")
    monkeypatch.setenv("THOP_ARTIFACT_SERVER_URL", "http://thop.ops.svc:8090")
    from_env = load_settings()
    assert from_env.namespaces == ("team-a", "team-b")
    assert from_env.runtime_images.java == "registry.example/thop-java:1"
    assert from_env.probe_parallelism == 8
    assert str(from_env.artifact_server_url) == "http://thop.ops.svc:8090/"

    args = parse("--probe-parallelism", "2", "--namespace", "ops", "--runtime-image", "go=go:2")
    flagged = load_settings(args)
    assert (flagged.probe_parallelism, flagged.namespaces) == (2, ("ops",))
    # A flag for one language overrides that language only.
    assert flagged.runtime_images.go == "go:2"
    assert flagged.runtime_images.java == "registry.example/thop-java:1"


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        (
            {"THOP_PROBE_PARALLELISM": "0"},
            (),
            "invalid setting THOP_PROBE_PARALLELISM (--probe-parallelism): "
            "Input should be greater than or equal to 1",
        ),
        (
            {},
            ("--metrics-port", "http"),
            "invalid setting THOP_METRICS_PORT (--metrics-port): Input should be a valid "
            "integer, unable to parse string as an integer",
        ),
        (
            {"THOP_LOG_FORMAT": "xml"},
            (),
            "invalid setting THOP_LOG_FORMAT (--log-format): Input should be 'json' or 'text'",
        ),
        (
            {},
            ("--runtime-image", "rust=rust:1"),
            "invalid setting THOP_RUNTIME_IMAGES__RUST (--runtime-image rust=...): unknown "
            "language 'rust', expected go, java or typescript",
        ),
        ({}, ("--runtime-image", "java"), "--runtime-image 'java': expected LANGUAGE=IMAGE"),
        (
            {"THOP_ARTIFACT_SERVER_BIND": "8090"},
            (),
            "invalid setting THOP_ARTIFACT_SERVER_BIND (--artifact-server-bind): String should "
            "match pattern '^[^\\s:]*:\\d{1,5}$'",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_flag(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: tuple[str, ...], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(parse(*argv))
    assert str(caught.value) == message


def test_the_database_url_from_a_file_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "postgresql://airflow:s3cret@db:5432/airflow"
    url_file = tmp_path / "url"
    url_file.write_text(secret + "\n")
    monkeypatch.setenv("THOP_DATABASE_URL_FILE", str(url_file))
    settings = load_settings()
    assert settings.resolved_database_url() == secret
    assert "s3cret" not in repr(load_settings(parse("--database-url", secret)))

    monkeypatch.setenv("THOP_DATABASE_URL", secret)
    with pytest.raises(SettingsError) as both:
        load_settings().resolved_database_url()
    assert str(both.value) == (
        "set THOP_DATABASE_URL (--database-url) or THOP_DATABASE_URL_FILE "
        "(--database-url-file), not both"
    )
    monkeypatch.delenv("THOP_DATABASE_URL")

    url_file.write_text("  \n")
    with pytest.raises(SettingsError, match=r"^the database URL file .*/url is empty$"):
        load_settings().resolved_database_url()
    monkeypatch.setenv("THOP_DATABASE_URL_FILE", str(tmp_path / "absent"))
    with pytest.raises(SettingsError) as missing:
        load_settings().resolved_database_url()
    assert str(missing.value) == (
        f"the database URL file {tmp_path / 'absent'}: cannot be opened (No such file or directory)"
    )


def test_the_signing_key_from_a_file_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().resolved_signing_key() is None  # a key is made at start
    key = "9f" * 32
    key_file = tmp_path / "signingKey"
    key_file.write_text(key + "\n")
    monkeypatch.setenv("THOP_SIGNING_KEY_FILE", str(key_file))
    assert load_settings().resolved_signing_key() == key.encode()
    assert load_settings(parse("--signing-key-file", str(key_file))).resolved_signing_key() == (
        key.encode()
    )

    key_file.write_text("short\n")
    with pytest.raises(SettingsError) as short:
        load_settings().resolved_signing_key()
    assert str(short.value) == (
        f"the signing key file {key_file} holds 5 bytes; it needs at least 32 "
        "(e.g. openssl rand -hex 32)"
    )
    assert "short" not in str(short.value).replace(str(key_file), "")
    monkeypatch.setenv("THOP_SIGNING_KEY_FILE", str(tmp_path / "absent"))
    with pytest.raises(SettingsError) as missing:
        load_settings().resolved_signing_key()
    assert str(missing.value) == (
        f"the signing key file {tmp_path / 'absent'}: cannot be opened (No such file or directory)"
    )


def test_run_refuses_an_unusable_signing_key_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent"
    argv = ["run", "--database-url", "postgresql://u@h/d", "--signing-key-file", str(absent)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"taskhandler-operator run: the signing key file {absent}: cannot be opened "
        "(No such file or directory)\n"
    )


@pytest.mark.parametrize(
    "command", [["upgrade"], ["check"], ["handover"], ["dag-bundle", "orders"]]
)
def test_db_commands_read_the_url_through_the_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main(["db", *command, "--url-file", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == (
        f"error: the database URL file {tmp_path / 'absent'}: cannot be opened "
        "(No such file or directory)\n"
    )


def test_every_setting_is_described_and_documented() -> None:
    page = (REPO_ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert f"`{env_of(name)}`" in page or name == "runtime_images", name
        assert f"`{flag_of(name)}`" in page or name in ("runtime_images", "namespaces"), name
    assert "`THOP_RUNTIME_IMAGES__<LANGUAGE>`" in page and "`--runtime-image`" in page
    assert "`--namespace`" in page
