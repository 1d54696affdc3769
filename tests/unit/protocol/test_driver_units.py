"""The pure parts of the driver: the runtime command, the environment and the options."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from pydantic import ValidationError

from taskhandler_operator.artifacts.java import is_java_binary_name
from taskhandler_operator.artifacts.models import Language, VerifiedArtifact
from taskhandler_operator.artifacts.schema_versions import (
    KNOWN_SCHEMA_VERSIONS,
    UnknownSchemaVersion,
    check_known_schema_version,
)
from taskhandler_operator.protocol import driver
from taskhandler_operator.protocol.driver import ProbeConfig, build_command, runtime_environment
from taskhandler_operator.protocol.eventlog import EventLog
from taskhandler_operator.protocol.launch import UnsafeCommand
from taskhandler_operator.protocol.summary import ExitCode, ProbeErrorKind


def verified(language: Language, path: str, **kw: object) -> VerifiedArtifact:
    return VerifiedArtifact(
        path=Path(path),
        language=language,
        schema_version="2026-10-30",
        size_bytes=1,
        cache_digest=None,
        **kw,  # type: ignore[arg-type]
    )


def test_go_runs_the_artifact_by_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/tmp")
    assert build_command(verified(Language.GO, "bundle/etl")) == ["/tmp/bundle/etl"]


def test_typescript_runs_node_on_the_bundle() -> None:
    command = build_command(verified(Language.TYPESCRIPT, "/b/x.min.mjs"), node="/usr/bin/node")
    assert command == ["/usr/bin/node", "/b/x.min.mjs"]


def test_java_classpath_keeps_verification_order_then_jvm_args_then_main_class() -> None:
    # Verification sorts by path relative to the bundle root; a JAR reached through a symlink
    # ("a/dep.jar" -> /b/z/real.jar) keeps its relative place although its real path sorts last.
    artifact = verified(
        Language.JAVA,
        "/b/app/app.jar",
        main_class="com.example.Main",
        classpath=(Path("/b/z/real.jar"), Path("/b/app/app.jar"), Path("/b/lib/sdk.jar")),
    )
    assert build_command(artifact, java="/usr/bin/java", jvm_args=["-Xshare:auto"]) == [
        "/usr/bin/java",
        "-classpath",
        "/b/z/real.jar:/b/app/app.jar:/b/lib/sdk.jar",
        "-Xshare:auto",
        "com.example.Main",
    ]


def test_java_without_main_class_cannot_be_run() -> None:
    with pytest.raises(ValueError, match="no Main-Class to run"):
        build_command(verified(Language.JAVA, "/b/app.jar"))


@pytest.mark.parametrize(
    "main_class",
    [
        "-version",
        "-XX:+UnlockDiagnosticVMOptions",
        "com.example.Main -version",
        "a..b",
        "1a.B",
        "com/example/Main",
        "",
        "a.",
        "x" * 1025,
    ],
)
def test_main_class_must_be_a_java_binary_name(main_class: str) -> None:
    # "-version" would reach the java launcher as an option, not as a class to run.
    artifact = verified(
        Language.JAVA, "/b/app.jar", main_class=main_class, classpath=(Path("/b/app.jar"),)
    )
    with pytest.raises(UnsafeCommand, match=r"is not a Java class name|no Main-Class"):
        build_command(artifact)


@pytest.mark.parametrize(
    "main_class", ["Main", "com.example.Main", "com.example.Outer$Inner", "$x._y1", "ünï.Cödé"]
)
def test_java_binary_names_are_accepted(main_class: str) -> None:
    assert is_java_binary_name(main_class)


@pytest.mark.parametrize("entry", ["/b/x:y.jar", "lib/dep.jar"])
def test_classpath_entries_must_be_absolute_and_unsplittable(entry: str) -> None:
    # "/b/x:y.jar" would become "/b/x" and "y.jar", the second resolved from the working folder.
    artifact = verified(
        Language.JAVA,
        "/b/app.jar",
        main_class="com.example.Main",
        classpath=(Path("/b/app.jar"), Path(entry)),
    )
    with pytest.raises(UnsafeCommand, match="is relative or contains ':'"):
        build_command(artifact)


def test_dag_ids_are_sorted_deduplicated_and_bounded() -> None:
    config = ProbeConfig(artifact=Path("a"), language=Language.GO, dag_ids=("b", "a", "b"))
    assert config.dag_ids == ("a", "b")
    assert ProbeConfig(artifact=Path("a"), language=Language.GO).dag_ids is None
    for bad in ("", "x" * 251, "a\x00b"):
        with pytest.raises(ValidationError, match="a dag_id must be 1 to 250 characters"):
            ProbeConfig(artifact=Path("a"), language=Language.GO, dag_ids=(bad,))
    with pytest.raises(ValidationError, match="at most 10000 items"):
        ProbeConfig(
            artifact=Path("a"), language=Language.GO, dag_ids=tuple(map(str, range(10_001)))
        )


def test_environment_adds_logging_defaults_without_overriding() -> None:
    env = runtime_environment({"PATH": "/bin", "AIRFLOW__LOGGING__LOGGING_LEVEL": "DEBUG"})
    assert env == {
        "PATH": "/bin",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "DEBUG",
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "",
    }


def test_config_defaults_and_bundle_naming() -> None:
    config = ProbeConfig(artifact=Path("/srv/bundles/etl/bin/etl"), language=Language.GO)
    assert (config.connect_timeout, config.answer_timeout, config.exit_grace) == (10, 60, 5)
    assert config.max_frame_size == 16 * 1024 * 1024
    assert config.effective_bundle_root == Path("/srv/bundles/etl/bin")
    assert config.effective_bundle_name == "bin"
    named = dataclasses.replace(config, bundle_root=Path("/srv/b"), bundle_name="etl")
    assert (named.effective_bundle_root, named.effective_bundle_name) == (Path("/srv/b"), "etl")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("answer_timeout", 0, "answer_timeout\n  Input should be greater than 0"),
        ("connect_timeout", -1, "connect_timeout\n  Input should be greater than 0"),
        ("exit_grace", 0, "exit_grace\n  Input should be greater than 0"),
        ("max_frame_size", 10, "max_frame_size\n  Input should be greater than or equal to 64"),
    ],
)
def test_config_rejects_bad_limits(field: str, value: float, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        ProbeConfig(artifact=Path("a"), language=Language.GO, **{field: value})  # type: ignore[arg-type]
    assert message in str(info.value)


def test_known_schema_versions() -> None:
    for version in KNOWN_SCHEMA_VERSIONS:
        check_known_schema_version("etl", version)
    with pytest.raises(UnknownSchemaVersion) as info:
        check_known_schema_version("etl", "1999-01-01")
    assert str(info.value).startswith(
        "etl uses supervisor schema version '1999-01-01', which this supervisor does not support "
        "(supported: 2026-06-16 to 2026-10-30: "
    )


async def test_unexpected_verification_exception_still_ends_in_a_summary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Only the routing of run_probe is under test: a reader that raises something other
    # than ArtifactVerificationError must give a driver_error summary, not escape.
    def broken(*_args: object, **_kw: object) -> VerifiedArtifact:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(driver, "verify_artifact", broken)
    config = ProbeConfig(artifact=tmp_path / "etl", language=Language.GO)
    outcome = await driver.run_probe(config, EventLog(io.StringIO()))
    assert outcome.result is None
    assert outcome.summary.error_kind is ProbeErrorKind.DRIVER_ERROR
    assert outcome.summary.error == "probe driver error: TypeError: unhashable type: 'list'"
    assert outcome.summary.exit_code == ExitCode.DRIVER_ERROR
