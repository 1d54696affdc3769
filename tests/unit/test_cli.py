from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskhandler_operator.cli import main


def test_help_lists_program_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "taskhandler-operator" in out


def test_console_script_runs_as_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("taskhandler-operator ")


def test_command_map_matches_what_the_modules_register() -> None:
    # cli.COMMANDS lets a named subcommand import its module alone; it must name every
    # subcommand the modules register, and the right module for each.
    import argparse
    import importlib

    from taskhandler_operator.cli import COMMAND_MODULES, COMMANDS

    registered: dict[str, str] = {}
    for name in COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(name).register(subparsers)
        registered.update(dict.fromkeys(subparsers.choices, name))
    assert registered == COMMANDS


@pytest.mark.parametrize("command", ["probe", "fetch", "db", "run", "inspect"])
def test_one_command_parses_as_with_every_module(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The parser built for one command gives the same help as the full one.
    from taskhandler_operator.cli import build_parser

    texts = []
    for parser in (build_parser(command), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and f"taskhandler-operator {command}" in texts[0]


def test_unknown_command_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["prob"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'prob'" in err and "probe" in err and "fetch" in err


# The console script in a child interpreter, with an atexit handler that says when the
# interpreter's ordinary teardown ran. stdout and stderr are pipes, so block-buffered: output a
# fast exit did not flush would be missing.
RUN_CONSOLE = """
import atexit, sys
atexit.register(lambda: print("teardown ran", flush=True))
from taskhandler_operator.cli import console_main
sys.argv = ["taskhandler-operator", *sys.argv[1:]]
console_main()
"""


def _console(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN_CONSOLE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_pod_commands_end_without_the_interpreter_teardown(tmp_path: Path) -> None:
    # The probe of a file that is no artifact runs the whole driver and reports a refusal.
    artifact = tmp_path / "etl"
    artifact.write_bytes(b"not an artifact\n")
    probe = _console("probe", str(artifact), "--language", "go", "--termination-log", "-")
    assert probe.returncode == 3, probe.stderr[-2000:]
    summary = json.loads(probe.stdout.splitlines()[-1])
    assert summary["error_kind"] == "artifact_refused"
    assert '"event": "probe summary"' in probe.stderr
    assert "teardown ran" not in probe.stdout

    fetch = _console("fetch", "--dest", str(tmp_path / "bundle"), "--manifest", "[]")
    assert fetch.returncode == 0, fetch.stderr[-2000:]
    assert fetch.stdout.startswith("fetched 0 file(s)")
    assert "teardown ran" not in fetch.stdout

    refused = _console("fetch", "--dest", str(tmp_path / "bundle"), "--manifest", "{")
    assert refused.returncode == 2
    assert refused.stderr.startswith("fetch: ")


def test_other_commands_end_the_ordinary_way(tmp_path: Path) -> None:
    artifact = tmp_path / "etl"
    artifact.write_bytes(b"not an artifact\n")
    verify = _console("verify", str(artifact), "--language", "go")
    assert verify.returncode != 0
    assert verify.stdout.splitlines()[-1] == "teardown ran"
    assert _console("--version").stdout.splitlines()[-1] == "teardown ran"
