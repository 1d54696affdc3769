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
