"""Printing that survives a reader gone away (development only).

``make demo 2>&1 | tee demo.log`` stopped with Ctrl-C: the terminal signals the whole
foreground process group, ``tee`` included, so from then on every write to stdout fails with
EPIPE (Python ignores SIGPIPE, so it is a ``BrokenPipeError``, not death). A shutdown that
prints must still finish: :func:`emit` swallows the error and points the broken descriptors at
``/dev/null``, so later prints, logging handlers, tracebacks and the interpreter's final flush
of ``sys.stdout`` all succeed silently.
"""

from __future__ import annotations

import contextlib
import os
import sys

_lost = False


def output_lost() -> bool:
    """True once stdout was found broken (everything since went to ``/dev/null``)."""
    return _lost


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def lose_output() -> None:
    """Send stdout (and stderr, when it is the same pipe or file) to ``/dev/null`` for good."""
    global _lost
    if _lost:
        return
    _lost = True
    also_stderr = _same_file(1, 2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2) if also_stderr else (1,):
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    # A closed stream object (not just a broken descriptor) gets a new one.
    if sys.stdout is None or sys.stdout.closed:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if also_stderr and (sys.stderr is None or sys.stderr.closed):
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def emit(line: str) -> None:
    """``print(line, flush=True)`` that never raises for a broken or closed stdout."""
    if _lost:
        return
    try:
        print(line, flush=True)
    except (OSError, ValueError, AttributeError):  # EPIPE, EIO; closed file; stdout None
        lose_output()


def finish() -> None:
    """Flush stdout now, so the interpreter's own flush at exit cannot fail (exit status 120)."""
    if _lost:
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        lose_output()
