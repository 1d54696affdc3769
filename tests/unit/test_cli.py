from __future__ import annotations

import subprocess
import sys

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
