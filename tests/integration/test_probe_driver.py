"""The probe driver against real runtimes built with go, javac and node.

Each runtime writes its pid (and a forked child's) to ``THOP_RUNTIME_PID_FILE``; after the
driver returns, none of those processes may still run (a zombie awaiting its reaper counts as
gone: it no longer runs). The driver is called through the CLI entry point in-process, which
exercises argument parsing, the termination-message file, stdout and the exit status.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from taskhandler_devenv.packers import (
    GO_TRAILER,
    hostile_jar,
    write_go_bundle,
    write_jar,
    write_typescript_bundle,
)
from taskhandler_devenv.runtimes import JAVA_MAIN_CLASS, LANGUAGES, PID_FILE_ENV
from taskhandler_operator.cli import main
from taskhandler_operator.limits import MAX_SUMMARY_BYTES
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.protocol.process_tree import KillReport, ProcessTracker
from taskhandler_operator.protocol.summary import (
    RESULT_MARKER,
    ProbeErrorKind,
    ProbeSummary,
    ProbeWarningKind,
    accept_result,
)
from tests.fixtures.runtimes_plugin import RuntimeFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Every wait of the driver is bounded by its options; this is far above their sum, so it only
# fails when a wait is not bounded at all.
BOUND_SECONDS = 40


@dataclass
class ProbeRun:
    code: int
    summary: ProbeSummary
    stdout: str
    log: str
    pids: list[int]
    elapsed: float

    @property
    def records(self) -> list[dict[str, Any]]:
        """The structured log: every line but the marker and the result line after it."""
        lines = self.log.splitlines()
        if RESULT_MARKER in lines:
            at = lines.index(RESULT_MARKER)
            del lines[at : at + 2]
        return [json.loads(line) for line in lines]

    def events(self, event: str, *, relayed: bool = False) -> list[dict[str, Any]]:
        """The driver's own events named ``event``, or the runtime's relayed ones."""
        return [r for r in self.records if r.get("event") == event and ("source" in r) is relayed]


@pytest.fixture
def probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    def run(artifact: Path, language: str, *options: str) -> ProbeRun:
        pid_file = tmp_path / f"pids-{time.monotonic_ns()}"
        termination_log = tmp_path / "termination-log"
        termination_log.unlink(missing_ok=True)
        monkeypatch.setenv(PID_FILE_ENV, str(pid_file))
        started = time.monotonic()
        code = main(
            [
                "probe",
                str(artifact),
                "--language",
                language,
                "--termination-log",
                str(termination_log),
                *options,
            ]
        )
        elapsed = time.monotonic() - started
        out, err = capsys.readouterr()
        text = termination_log.read_text(encoding="utf-8")
        assert out.strip() == text
        assert len(text.encode()) <= MAX_SUMMARY_BYTES
        pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
        return ProbeRun(code, ProbeSummary.model_validate_json(text), out, err, pids, elapsed)

    return run


def running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def expected_handlers(spec: dict[str, Any]) -> dict[str, Any]:
    validated = TaskHandlerParsingResult.model_validate({"task_handlers": spec})
    handlers: dict[str, Any] = validated.model_dump(mode="json")["task_handlers"]
    return handlers


# -- the good runtimes -----------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_probe_returns_the_declared_handlers(
    language: str, runtime_factory: RuntimeFactory, seed_spec: dict[str, Any], probe: Any
) -> None:
    artifact = runtime_factory(language)
    run = probe(artifact, language)

    assert run.code == 0, run.summary
    summary = run.summary
    assert (summary.status, summary.error, summary.error_kind) == ("ok", None, None)
    assert (summary.dag_count, summary.handler_count) == (2, 5)
    assert summary.schema_version == "2026-10-30"
    assert summary.runtime_exit_code == 0
    result = accept_result(run.log, summary)
    assert result.fileloc == str(artifact)
    assert result.model_dump(mode="json")["task_handlers"] == expected_handlers(seed_spec)
    # Seed 002's shapes, spelled out: nameless positional params, an exact named binding.
    extract, load, when = result.task_handlers["etl"]
    assert extract.mode == "positional" and extract.params is not None
    assert [p.name for p in extract.params] == [None, None]
    assert extract.params[1].value_schema == {
        "anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]
    }
    assert load.mode == "named" and load.params is not None
    assert (load.params[0].name, load.params[0].exact_name) == ("table_name", True)
    assert load.params[1].value_schema == {"type": "integer", "format": "int64"}
    assert when.params is None
    publish, noop = result.task_handlers["reporting"]
    assert publish.task_id == "publish_Ünïcode" and publish.mode == "named"
    assert noop.params == []

    # The result line is the one the summary hashes, right after the marker.
    lines = run.log.splitlines()
    line = lines[lines.index(RESULT_MARKER) + 1]
    assert hashlib.sha256(line.encode()).hexdigest() == summary.result_sha256
    assert summary.result_bytes == len(line.encode())
    # The runtime's logs channel is relayed into the driver's structured log.
    relayed = [r for r in run.records if r.get("source") == "runtime.logs"]
    assert {r["event"] for r in relayed} >= {"runtime started", "probe answered"}
    assert all({"timestamp", "level", "event"} <= r.keys() for r in run.records)
    assert run.pids and set(run.pids) <= set(summary.runtime_pids)
    assert running(run.pids) == []


@pytest.mark.parametrize("language", LANGUAGES)
def test_get_requests_are_answered_with_an_error(
    language: str, runtime_factory: RuntimeFactory, probe: Any
) -> None:
    run = probe(runtime_factory(language, "get-variable-first"), language)

    assert run.code == 0, run.summary
    assert run.summary.handler_count == 5
    answered = run.events("answered a runtime request with an error")
    assert [r["request"] for r in answered] == ["GetVariable"]
    # The runtime itself reports what it got back (and exits 2 if it was not an error).
    (seen,) = run.events("GetVariable answered", relayed=True)
    assert seen["record"]["error"] == "generic_error"
    assert running(run.pids) == []


# -- misbehaving runtimes ----------------------------------------------------------------------

MISBEHAVIOURS: dict[str, tuple[ProbeErrorKind, str, tuple[str, ...]]] = {
    "never-connect": (
        ProbeErrorKind.CONNECT_TIMEOUT,
        re.escape("The runtime did not connect its comm and logs channels within 2s"),
        ("--connect-timeout", "2"),
    ),
    "exit-before-answer": (
        ProbeErrorKind.EXITED_WITHOUT_RESULT,
        re.escape("The runtime exited with code 3 without a parse result"),
        (),
    ),
    "garbage": (
        ProbeErrorKind.INVALID_FRAME,
        re.escape("The runtime sent an invalid frame: payload is not valid msgpack (FormatError)"),
        (),
    ),
    "oversized-frame": (
        ProbeErrorKind.FRAME_TOO_LARGE,
        re.escape("The runtime sent a frame of 16777217 bytes, over the limit of 16777216 bytes"),
        (),
    ),
    "invalid-message": (
        ProbeErrorKind.INVALID_MESSAGE,
        re.escape(
            "The runtime sent a message that does not validate: TaskHandlerParsingResult does "
            "not validate: task_handlers: Input should be a valid dictionary"
        ),
        (),
    ),
    "two-results": (
        ProbeErrorKind.DUPLICATE_RESULT,
        re.escape(
            "The runtime sent a second parse result (request id 1); a probe takes exactly one"
        ),
        (),
    ),
    "fork-child": (
        ProbeErrorKind.PROCESSES_LEFT,
        r"The runtime exited but left 1 process\(es\) running \(pids (?P<pid>\d+)\)",
        (),
    ),
    # Answers, then double-forks a setsid grandchild that ignores SIGTERM and outlives its
    # parent: only adoption (the driver is a child subreaper) finds it.
    "double-fork-escape": (
        ProbeErrorKind.PROCESSES_LEFT,
        r"The runtime exited but left 1 process\(es\) running \(pids (?P<pid>\d+)\)",
        (),
    ),
    "flood-logs": (
        ProbeErrorKind.ANSWER_TIMEOUT,
        r"The runtime did not send a parse result within 2s "
        r"\(it flooded its output: \d+ lines dropped\)",
        ("--timeout", "2"),
    ),
}


@pytest.mark.parametrize("mode", MISBEHAVIOURS)
@pytest.mark.parametrize("language", LANGUAGES)
def test_misbehaving_runtime_fails_in_bounded_time_and_leaves_nothing(
    language: str, mode: str, runtime_factory: RuntimeFactory, probe: Any
) -> None:
    kind, pattern, options = MISBEHAVIOURS[mode]
    run = probe(runtime_factory(language, mode), language, *options)

    summary = run.summary
    assert run.code == 1
    assert summary.status == "error"
    assert summary.error_kind == kind, summary.error
    assert summary.error is not None
    match = re.fullmatch(pattern, summary.error)
    assert match is not None, summary.error
    assert summary.result_sha256 is None
    assert RESULT_MARKER not in run.log
    assert run.elapsed < BOUND_SECONDS
    # Every process the runtime reported (itself, and a forked child) is gone.
    assert run.pids, "the runtime did not start"
    assert running(run.pids) == []
    if mode in ("fork-child", "double-fork-escape"):
        child = run.pids[1]
        assert int(match["pid"]) == child
        assert child in summary.runtime_pids
    if mode == "flood-logs":
        assert summary.logs.dropped_lines > 0
        assert summary.logs.relayed_lines <= 10_000
        assert len(run.log.encode()) < 4 * 1024 * 1024


# -- shutdown: the runtime waits for its supervisor to hang up (as Airflow's SDK runtimes do) --


@pytest.mark.parametrize("language", LANGUAGES)
def test_runtime_that_waits_for_the_supervisor_to_close_exits_at_once(
    language: str, runtime_factory: RuntimeFactory, probe: Any
) -> None:
    # Every test runtime ends its side of both channels after the acknowledgement and exits
    # only once the driver has closed its side. A driver that keeps its sockets open until
    # cleanup would make each of these overstay the whole (long) grace and be killed.
    run = probe(runtime_factory(language), language, "--exit-grace", "60")

    assert run.code == 0, run.summary
    assert run.summary.warnings == []
    # It exited by itself (a kill would show as -9), well inside the grace.
    assert run.summary.runtime_exit_code == 0
    assert run.summary.timings.exit_ms is not None
    assert run.summary.timings.exit_ms < 30_000
    assert run.elapsed < 30
    (exited,) = run.events("runtime exited")
    assert exited["exit_code"] == 0


@pytest.mark.parametrize("language", LANGUAGES)
def test_runtime_that_overstays_the_grace_keeps_its_answer_and_is_killed(
    language: str, runtime_factory: RuntimeFactory, seed_spec: dict[str, Any], probe: Any
) -> None:
    run = probe(runtime_factory(language, "hang-after-ack"), language, "--exit-grace", "1")

    assert run.code == 0, run.summary
    summary = run.summary
    assert summary.status == "ok"
    assert [(w.kind, w.message) for w in summary.warnings] == [
        (
            ProbeWarningKind.EXIT_TIMEOUT,
            "The runtime did not exit within 1s after its parse result was acknowledged; "
            "it was killed",
        )
    ]
    assert summary.runtime_exit_code == -9
    result = accept_result(run.log, summary)
    assert result.model_dump(mode="json")["task_handlers"] == expected_handlers(seed_spec)
    assert running(run.pids) == []
    assert run.elapsed < BOUND_SECONDS


def test_a_process_that_cannot_be_killed_fails_the_probe(
    runtime_factory: RuntimeFactory, probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root every real process dies on SIGKILL; one in uninterruptible sleep (or another
    # user's setuid program) would not. Stand one in for the tracker's last round.
    real_kill_all = ProcessTracker.kill_all

    def kill_all(self: ProcessTracker, timeout: float = 2.0) -> KillReport:
        report = real_kill_all(self, timeout)
        return KillReport([*report.signalled, 424242], [*report.unkillable, 424242])

    monkeypatch.setattr(ProcessTracker, "kill_all", kill_all)
    run = probe(runtime_factory("go"), "go")

    assert run.code == 1
    assert run.summary.error_kind == ProbeErrorKind.PROCESSES_LEFT
    assert run.summary.error == "1 process(es) of the runtime could not be killed (pids 424242)"
    assert RESULT_MARKER not in run.log
    (record,) = run.events("runtime processes survived SIGKILL")
    assert record["pids"] == [424242]


# -- dag_ids and the empty answer -----------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_runtime_that_filters_by_dag_ids(
    language: str, runtime_factory: RuntimeFactory, seed_spec: dict[str, Any], probe: Any
) -> None:
    # An older (Design A) runtime answers only the Dags the request names.
    artifact = runtime_factory(language, "filter-dag-ids")

    unnamed = probe(artifact, language)
    assert unnamed.code == 0, unnamed.summary
    assert accept_result(unnamed.log, unnamed.summary).task_handlers == {}
    assert unnamed.summary.dag_ids_requested is None
    (warning,) = unnamed.summary.warnings
    assert warning.kind == ProbeWarningKind.EMPTY_ANSWER
    assert warning.message.startswith(
        "The runtime registered no task handler. If this artifact implements stub tasks, the "
        "likely cause is an older Go or Java SDK runtime that answers only the Dags named in "
        "the request's dag_ids"
    )
    (logged,) = unnamed.events("probe warning")
    assert logged["kind"] == "empty_answer"

    named = probe(artifact, language, "--dag-id", "reporting", "--dag-id", "etl")
    assert named.code == 0, named.summary
    assert named.summary.warnings == []
    assert named.summary.dag_ids_requested == 2
    result = accept_result(named.log, named.summary)
    assert result.model_dump(mode="json")["task_handlers"] == expected_handlers(seed_spec)
    (sent,) = named.events("sending parse request")
    assert sent["dag_ids"] == ["etl", "reporting"]

    one = probe(artifact, language, "--dag-id", "etl", "--dag-id", "no_such_dag")
    assert list(accept_result(one.log, one.summary).task_handlers) == ["etl"]


@pytest.mark.parametrize("language", LANGUAGES)
def test_strict_filtering_runtime_gives_no_result_without_dag_ids(
    language: str, runtime_factory: RuntimeFactory, seed_spec: dict[str, Any], probe: Any
) -> None:
    # As one released TypeScript SDK runtime does: asked about no Dag, it exits with no answer,
    # so a bundle of such artifacts binds only when probes name the Dags (the operator does).
    artifact = runtime_factory(language, "filter-dag-ids-strict")
    unnamed = probe(artifact, language)
    assert unnamed.code != 0, unnamed.summary
    assert unnamed.summary.status == "error"
    assert unnamed.summary.error_kind == "exited_without_result", unnamed.summary

    named = probe(artifact, language, "--dag-id", "etl")
    assert named.code == 0, named.summary
    assert list(accept_result(named.log, named.summary).task_handlers) == ["etl"]


def test_current_runtimes_ignore_dag_ids(
    runtime_factory: RuntimeFactory, seed_spec: dict[str, Any], probe: Any
) -> None:
    run = probe(runtime_factory("go"), "go", "--dag-id", "etl")
    assert run.code == 0, run.summary
    # The answer names a Dag the request did not: this runtime answers everything, so its
    # cached answer stays valid when new Dags appear (docs/protocol.md, "dag_ids").
    result = accept_result(run.log, run.summary)
    assert result.model_dump(mode="json")["task_handlers"] == expected_handlers(seed_spec)


def test_empty_answer_when_dags_were_named(runtime_factory: RuntimeFactory, probe: Any) -> None:
    run = probe(runtime_factory("typescript", "filter-dag-ids"), "typescript", "--dag-id", "x")
    assert run.code == 0, run.summary
    (warning,) = run.summary.warnings
    assert warning.message == (
        "The runtime registered no task handler for any of the 1 Dag(s) the request named in "
        "dag_ids: the artifact implements none of their stub tasks, or its runtime registered "
        "no handler at all"
    )


def test_frame_limit_is_configurable(runtime_factory: RuntimeFactory, probe: Any) -> None:
    run = probe(runtime_factory("go"), "go", "--max-frame-size", "256")
    assert run.code == 1
    assert run.summary.error_kind == ProbeErrorKind.FRAME_TOO_LARGE
    assert run.summary.error is not None
    assert re.fullmatch(
        r"The runtime sent a frame of \d+ bytes, over the limit of 256 bytes", run.summary.error
    )
    assert running(run.pids) == []


# -- artifacts refused before anything runs ------------------------------------------------------


def refused(run: ProbeRun) -> str:
    assert run.code == 3
    assert run.summary.error_kind == ProbeErrorKind.ARTIFACT_REFUSED
    assert run.summary.runtime_pids == []
    assert run.pids == [], "the runtime was started"
    assert not run.events("runtime started")
    assert run.summary.error is not None
    return run.summary.error


def test_go_bundle_with_a_flipped_binary_byte_is_refused(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    artifact = tmp_path / "bundle" / "etl"
    artifact.parent.mkdir()
    shutil.copy2(runtime_factory("go"), artifact)
    data = bytearray(artifact.read_bytes())
    data[4096] ^= 0x01
    artifact.write_bytes(bytes(data))
    error = refused(probe(artifact, "go"))
    assert error.startswith(f"{artifact}: binary region SHA-256 does not match the trailer")


def test_typescript_bundle_with_a_wrong_region_hash_is_refused(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    artifact = tmp_path / "bundle" / "runtime.min.mjs"
    artifact.parent.mkdir()
    original = runtime_factory("typescript").read_bytes()
    first_line, rest = original.split(b"\n", 1)
    layout = json.loads(first_line.removeprefix(b"//# airflowBundle="))
    layout["code"]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    new_line = b"//# airflowBundle=" + json.dumps(layout, separators=(",", ":")).encode()
    assert len(new_line) == len(first_line)  # offsets stay valid; only the hash is wrong
    artifact.write_bytes(new_line + b"\n" + rest)
    error = refused(probe(artifact, "typescript", "--bundle-root", str(artifact.parent)))
    assert error.startswith("runtime.min.mjs: code region SHA-256 does not match the layout line")


def test_jar_without_main_class_is_refused(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    with zipfile.ZipFile(runtime_factory("java")) as good:
        entries = {n: good.read(n) for n in good.namelist() if not n.startswith("META-INF/")}
    artifact = write_jar(
        tmp_path / "bundle" / "runtime.jar",
        manifest={
            "Airflow-Cache-Digest": "0" * 64,
            "Airflow-Supervisor-Schema-Version": "2026-10-30",
        },
        entries=entries,
    )
    error = refused(probe(artifact, "java", "--bundle-root", str(artifact.parent)))
    assert error == (
        "runtime.jar: has no Main-Class manifest attribute, so the JVM has nothing to run"
    )


def test_unknown_schema_version_is_refused(runtime_factory: RuntimeFactory, probe: Any) -> None:
    artifact = runtime_factory("typescript", schema_version="1999-01-01")
    error = refused(probe(artifact, "typescript"))
    assert error.startswith(
        f"{artifact} uses supervisor schema version '1999-01-01', which this supervisor "
        "does not support (supported: 2026-06-16 to 2026-10-30"
    )


def test_main_class_that_is_a_jvm_option_is_refused_before_anything_runs(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    # "Main-Class: -version" used to verify, and the driver ran `java -classpath … -version`.
    with zipfile.ZipFile(runtime_factory("java")) as good:
        entries = {n: good.read(n) for n in good.namelist() if not n.startswith("META-INF/")}
    artifact = write_jar(
        tmp_path / "bundle" / "runtime.jar",
        manifest={
            "Main-Class": "-version",
            "Airflow-Cache-Digest": "0" * 64,
            "Airflow-Supervisor-Schema-Version": "2026-10-30",
        },
        entries=entries,
    )
    error = refused(probe(artifact, "java", "--bundle-root", str(artifact.parent)))
    assert error == (
        "runtime.jar: Main-Class '-version' is not a Java class name (dot-separated "
        "identifiers), so the java launcher would not run it as a class"
    )


def test_a_hostile_jar_beside_the_artifact_does_not_fail_its_probe(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    artifact = bundle / "app" / "runtime.jar"
    artifact.parent.mkdir(parents=True)
    shutil.copy2(runtime_factory("java"), artifact)
    # A manifest whose local-header offset is 2^64-1 (zip64): it overflowed pread before.
    (bundle / "lib").mkdir()
    (bundle / "lib" / "dep.jar").write_bytes(hostile_jar(manifest_offset64=2**64 - 1))

    run = probe(artifact, "java", "--bundle-root", str(bundle))

    assert run.code == 0, run.summary
    assert run.summary.handler_count == 5
    assert running(run.pids) == []


def test_verification_is_bounded_by_the_probe_timeout(probe: Any, tmp_path: Path) -> None:
    # A sparse 4 GiB Go bundle: hashing it takes seconds; --timeout covers verification too.
    artifact = tmp_path / "etl"
    metadata = b"sdk: {supervisor_schema_version: '2026-10-30'}\n"
    with artifact.open("wb") as handle:
        handle.truncate(4 << 30)
        handle.seek(4 << 30)
        handle.write(metadata)
        handle.write(GO_TRAILER.pack(0, len(metadata), 1, bytes(32), bytes(12), b"AFBNDL01"))
    artifact.chmod(0o755)
    error = refused(probe(artifact, "go", "--timeout", "0.2"))
    assert error == (
        f"{artifact}: verification did not finish within 0.2s (a very large artifact, a slow "
        "disk, or a hostile file)"
    )


def test_missing_artifact_is_refused(probe: Any, tmp_path: Path) -> None:
    error = refused(probe(tmp_path / "nothing", "go"))
    assert error.startswith(f"{tmp_path / 'nothing'}: is not a file")


# -- bundle layout and the command line ------------------------------------------------------


def test_java_classpath_holds_every_jar_of_the_bundle(
    runtime_factory: RuntimeFactory, probe: Any, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    artifact = bundle / "app" / "runtime.jar"
    artifact.parent.mkdir(parents=True)
    shutil.copy2(runtime_factory("java"), artifact)
    dependency = write_jar(bundle / "lib" / "aaa.jar", manifest={}, entries={"a.txt": b"a"})

    run = probe(artifact, "java", "--bundle-root", str(bundle), "--bundle-name", "etl-jars")

    assert run.code == 0, run.summary
    (started,) = run.events("runtime started")
    argv = started["argv"]
    assert argv[1:3] == ["-classpath", f"{artifact}{os.pathsep}{dependency}"]
    assert argv[3] == JAVA_MAIN_CLASS
    assert running(run.pids) == []


# Runs the probe command in this child interpreter, then lists what it imported.
_PROBE_AND_LIST_MODULES = """
import contextlib, io, json, sys
from taskhandler_operator.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "log": err.getvalue(), "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_whole_probe_imports_no_pydantic(
    language: str, runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    # pydantic was most of one probe's own cost (docs/operations.md); every probe pod runs this
    # command in a fresh interpreter, so a model brought back onto its path costs every probe.
    # A real runtime answers, so the frame reader, the message check and the summary all run.
    argv = [str(runtime_factory(language)), "--language", language, "--termination-log", "-"]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE_AND_LIST_MODULES, "probe", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["code"] == 0, report["log"][-2000:]
    summary = ProbeSummary.model_validate_json(proc.stdout.splitlines()[-2])
    assert accept_result(report["log"], summary).handler_count == 5
    modules = {name.split(".")[0] for name in report["modules"]}
    assert modules.isdisjoint({"pydantic", "pydantic_core", "annotated_types"}), sorted(modules)


@pytest.mark.parametrize("language", LANGUAGES)
def test_console_script_end_to_end(
    language: str, runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    # The console script ends a probe with os._exit (cli.console_main): the summary, the log
    # and the termination message must all be out before it.
    artifact = runtime_factory(language)
    termination_log = tmp_path / "termination"
    argv = ["probe", str(artifact), "--language", language]
    proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", *argv],
        env={**os.environ, "THOP_TERMINATION_LOG": str(termination_log)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = ProbeSummary.model_validate_json(termination_log.read_text())
    assert proc.stdout.strip() == termination_log.read_text()
    assert accept_result(proc.stderr, summary).handler_count == 5


def test_invalid_options_exit_with_a_driver_error(
    probe: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["probe", str(tmp_path / "x"), "--language", "go", "--timeout", "0"])
    err = capsys.readouterr().err
    assert code == 4
    (record,) = [json.loads(line) for line in err.splitlines()]
    assert record["event"] == "invalid probe options"
    assert record["errors"][0]["loc"] == ["answer_timeout"]
    assert record["errors"][0]["msg"] == "Input should be greater than 0"


def test_runtime_that_exits_before_connecting(probe: Any, tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("'node' is not on PATH")
    artifact = write_typescript_bundle(tmp_path / "quits.min.mjs", b"process.exit(5);\n")
    run = probe(artifact, "typescript")
    assert run.code == 1
    assert run.summary.error_kind == ProbeErrorKind.EXITED_BEFORE_CONNECT
    assert run.summary.error == (
        "The runtime exited with code 5 before connecting its comm and logs channels"
    )
    assert run.summary.runtime_exit_code == 5


def test_missing_launcher_is_a_driver_error(runtime_factory: RuntimeFactory, probe: Any) -> None:
    run = probe(runtime_factory("typescript"), "typescript", "--node", "no-such-node-binary")
    assert run.code == 4
    assert run.summary.error_kind == ProbeErrorKind.LAUNCH_FAILED
    assert run.summary.error == (
        "the typescript runtime needs 'no-such-node-binary', which is not an executable file "
        "on PATH"
    )
    assert run.pids == []


# -- a connection from outside the runtime's process tree -----------------------------------

RUNTIMES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "runtimes"
PATIENT_RUNTIME = RUNTIMES_DIR / "python" / "patient_runtime.py"


def test_connection_from_outside_the_process_tree_is_refused(
    probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Go bundle whose "binary" is a shell script: sh execs the real runtime before it would
    # ever read the trailer, and the bundle still passes full verification.
    launcher = f'#!/bin/sh\nexec "{sys.executable}" "{PATIENT_RUNTIME}" "$@"\n'.encode()
    artifact = write_go_bundle(tmp_path / "bundle" / "patient", launcher)
    port_file, go_file = tmp_path / "comm-port", tmp_path / "go"
    monkeypatch.setenv("THOP_TEST_PORT_FILE", str(port_file))
    monkeypatch.setenv("THOP_TEST_GO_FILE", str(go_file))
    intruder: dict[str, Any] = {}

    def intrude() -> None:
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        # The test process is not in the runtime's tree: its connection must be closed unread,
        # and the probe must still get the real runtime's answer afterwards.
        with socket.create_connection(("127.0.0.1", int(port_file.read_text())), timeout=10) as s:
            s.sendall(b"\x00\x00\x00\x01\xc0")
            intruder["closed"] = s.recv(1024) == b""
        go_file.touch()

    thread = threading.Thread(target=intrude)
    thread.start()
    try:
        run = probe(artifact, "go")
    finally:
        go_file.touch()
        thread.join(timeout=30)

    assert intruder.get("closed") is True
    (refused,) = run.events("refused a connection from outside the runtime's process tree")
    assert refused["channel"] == "comm"
    assert run.code == 0, run.summary
    assert run.summary.handler_count == 1
    accepted = accept_result(run.log, run.summary)
    assert list(accepted.task_handlers) == ["intruder_test"]


# -- processes that try to outlive the probe without ever answering ----------------------------

ESCAPER = b"""#!/bin/sh
# After the start-up snapshot, a subshell double-forks a SIGTERM-ignoring grandchild out of the
# session and exits at once, so no snapshot of the tree ever sees it; then the runtime %s.
sleep 0.1
( setsid sh -c 'trap "" TERM; echo $$ >> "$THOP_RUNTIME_PID_FILE"; \\
  exec sleep 300 </dev/null >/dev/null 2>&1' & )
echo $$ >> "$THOP_RUNTIME_PID_FILE"
sleep 0.2
%s
"""


@pytest.mark.parametrize(
    ("then", "options", "kind"),
    [
        (b"exit 3", (), ProbeErrorKind.EXITED_BEFORE_CONNECT),
        (b"exec sleep 300", ("--connect-timeout", "1"), ProbeErrorKind.CONNECT_TIMEOUT),
    ],
    ids=["exits-before-connecting", "never-connects"],
)
def test_an_escaped_grandchild_of_a_runtime_that_never_answers_is_killed(
    then: bytes, options: tuple[str, ...], kind: ProbeErrorKind, probe: Any, tmp_path: Path
) -> None:
    # Without adoption the grandchild, re-parented to init in a session of its own, outlived
    # these probes.
    script = ESCAPER % (then.split()[0], then)
    artifact = write_go_bundle(tmp_path / "bundle" / "escaper", script)
    run = probe(artifact, "go", *options)
    assert run.summary.error_kind == kind, run.summary
    assert len(run.pids) == 2, run.pids
    assert running(run.pids) == []
