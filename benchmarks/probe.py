"""Probe benchmark: the driver's own overhead over the runtime's start-and-answer time.

For each language, builds the good test runtime (``devenv.runtimes``) and probes it
``--repeat`` times after one warm-up, in this process (``run_probe``), and a few times through
the console script (a fresh Python per probe, as in a probe pod).

The baseline is measured by the runtime itself, in the same run: it reports, on its logs
channel, the time from its process start to the moment it sends its answer, and how much of that
it spent waiting for the driver's request. Its own work is the difference. The driver's overhead
is everything else in the driver's wall time: verification, listeners, spawning, the ownership
check, the request, the acknowledgement, waiting for the exit and the cleanup. The runtime's
exit after the acknowledgement is not measured by the runtime, so it is counted as overhead
(``exit_ms`` shows how much of it there is). Process start times have 10 ms resolution for Java
(read from ``/proc``); Go measures from its package initialisation, Node from its time origin.

Target: under 50 ms of overhead per probe. Run: ``python -m benchmarks.probe [--repeat 9]``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._report import print_table, write_json
from taskhandler_devenv.runtimes import (
    LANGUAGES,
    SEED_SPEC,
    ToolchainMissing,
    build_runtime,
)
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.protocol.driver import ProbeConfig, run_probe
from taskhandler_operator.protocol.eventlog import EventLog

TARGET_OVERHEAD_MS = 50.0


def runtime_timing(log_text: str) -> dict[str, float]:
    """The runtime's own timing record, relayed into the driver's log."""
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        inner = record.get("record")
        if record.get("source") == "runtime.logs" and inner and inner["event"] == "probe answered":
            return {
                "start_to_answer_ms": float(inner["start_to_answer_ms"]),
                "waited_ms": float(inner["waited_for_request_ms"]),
            }
    raise RuntimeError("the runtime did not report its timing")


def probe_in_process(artifact: Path, language: str) -> dict[str, float]:
    buffer = io.StringIO()
    config = ProbeConfig(artifact=artifact, language=Language(language))
    started = time.perf_counter()
    outcome = asyncio.run(run_probe(config, EventLog(buffer)))
    wall_ms = (time.perf_counter() - started) * 1000
    if not outcome.summary.ok:
        raise RuntimeError(f"probe failed: {outcome.summary.error}")
    timing = runtime_timing(buffer.getvalue())
    runtime_own = timing["start_to_answer_ms"] - timing["waited_ms"]
    steps = outcome.summary.timings
    return {
        "wall_ms": wall_ms,
        "runtime_own_ms": runtime_own,
        "runtime_waited_ms": timing["waited_ms"],
        "overhead_ms": wall_ms - runtime_own,
        "verify_ms": steps.verify_ms or 0.0,
        "connect_ms": steps.connect_ms or 0.0,
        "exit_ms": steps.exit_ms or 0.0,
        "cleanup_ms": steps.cleanup_ms or 0.0,
    }


def probe_cli(artifact: Path, language: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "taskhandler_operator", "probe", str(artifact)),
            *("--language", language, "--termination-log", "-"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    wall_ms = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"probe failed: {proc.stdout}{proc.stderr[-2000:]}")
    return wall_ms


def python_start_ms() -> float:
    """A bare interpreter start, to read the console-script column against."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    return (time.perf_counter() - started) * 1000


def median_of(samples: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(s[key] for s in samples), 2)


def measure(language: str, repeat: int, cli_repeat: int) -> dict[str, Any]:
    artifact = build_runtime(language, SEED_SPEC)
    probe_in_process(artifact, language)  # warm-up: page cache, JIT caches, imports
    samples = [probe_in_process(artifact, language) for _ in range(repeat)]
    cli = [probe_cli(artifact, language) for _ in range(cli_repeat)]
    row: dict[str, Any] = {"language": language, "runs": repeat}
    for key in (
        "wall_ms",
        "runtime_own_ms",
        "overhead_ms",
        "verify_ms",
        "connect_ms",
        "exit_ms",
        "cleanup_ms",
    ):
        row[key] = median_of(samples, key)
    row["wall_over_runtime"] = round(row["wall_ms"] / row["runtime_own_ms"], 2)
    row["cli_wall_ms"] = round(statistics.median(cli), 1)
    row["target_met"] = row["overhead_ms"] < TARGET_OVERHEAD_MS
    row["samples"] = samples
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="probes per language (median)")
    parser.add_argument("--cli-repeat", type=int, default=3, help="console-script probes")
    parser.add_argument("--language", action="append", choices=LANGUAGES)
    args = parser.parse_args(argv)
    os.environ.pop("THOP_RUNTIME_PID_FILE", None)
    rows = []
    for language in args.language or LANGUAGES:
        try:
            rows.append(measure(language, args.repeat, args.cli_repeat))
        except ToolchainMissing as exc:
            print(f"skipping {language}: {exc}", file=sys.stderr)
    interpreter_ms = round(statistics.median(python_start_ms() for _ in range(3)), 1)
    columns = [
        "language",
        "runs",
        "runtime_own_ms",
        "wall_ms",
        "overhead_ms",
        "wall_over_runtime",
        "verify_ms",
        "connect_ms",
        "exit_ms",
        "cleanup_ms",
        "cli_wall_ms",
        "target_met",
    ]
    print_table(
        rows,
        columns,
        title=(
            f"Probe driver overhead (medians; target < {TARGET_OVERHEAD_MS:g} ms; "
            f"a bare `python -c pass` takes {interpreter_ms} ms)"
        ),
    )
    path = write_json(
        "probe",
        {
            "target_overhead_ms": TARGET_OVERHEAD_MS,
            "python_start_ms": interpreter_ms,
            "load_average": os.getloadavg(),
            "results": rows,
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
