"""devenv/console.py: a stdout whose reader is gone (``make demo | tee`` and Ctrl-C, which
stops ``tee`` too) never stops the process that prints; its exit status stays its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import logging, sys, time
    from taskhandler_devenv import console
    time.sleep(0.5)  # the reader is gone by now
    for n in range(2000):
        console.emit(f"line {n} " + "x" * 100)
    logging.getLogger("demo").warning("a warning to the same pipe")
    print("a plain print after the pipe broke", flush=True)
    assert console.output_lost()
    console.finish()
    sys.exit(130)
    """
)


def run(stderr_to_stdout: bool) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # as tee dies
    _, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, b"", err)


def test_a_broken_stdout_and_stderr_pipe_keeps_the_exit_status() -> None:
    assert run(stderr_to_stdout=True).returncode == 130


def test_a_separate_stderr_stays_untouched() -> None:
    done = run(stderr_to_stdout=False)
    assert done.returncode == 130
    assert b"a warning to the same pipe" in done.stderr  # stderr was fine: still used
