"""One probe's own cost: the ``probe`` and ``fetch`` processes a probe Job runs, exec to exit.

Every probe Job runs ``taskhandler-operator fetch`` (init container) and then
``taskhandler-operator probe`` (kube/probe_job.py), each in a fresh interpreter. This benchmark
times both as separate processes, the way a pod runs them, and subtracts a baseline measured in
the same run:

* **probe**: the baseline is the runtime's own start-to-answer time, reported by the runtime
  itself on its logs channel (the ``probe answered`` record the driver relays into its log, as in
  ``benchmarks/probe.py``), minus the time the runtime spent waiting for the driver's request.
  The probe's own cost = the probe process's wall time (exec to exit, measured here) minus that.
  Everything else counts against the probe: interpreter start, imports, verification, spawning,
  the exchange, the runtime's exit after the acknowledgement and the cleanup. Go measures from its
  package initialisation, Node from its time origin, Java from its ``/proc`` start time (10 ms
  resolution).
* **fetch**: the baseline is a plain HTTP GET of the same signed URL into a file, by ``curl``
  (a ``python -S`` urllib client when curl is absent), against the same artifact server (the
  operator's ``ArtifactServer``, in a subprocess). The fetch's own cost = its wall time minus the
  baseline's; it adds the manifest, the size and sha256 checks and the atomic move.

CPU is the process's user + system time (``RUSAGE_CHILDREN`` deltas), including, for ``probe``,
the runtime it spawned and reaped. The commands are the operator installed as the images
install it (:func:`pod_bin`: not editable, no development environment), not this development
venv. Runs are medians after one warm-up, with Python bytecode cached
in a private folder (``PYTHONPYCACHEPREFIX``), as in an image whose modules are precompiled;
``no_bytecode_ms`` is one run with an empty cache and bytecode writing off (every module compiled
from source, which is what an image installed with ``pip --no-compile`` and
``PYTHONDONTWRITEBYTECODE=1`` pays on every start).

Target: at most 150 ms of own cost per probe and per fetch.
Run: ``python -m benchmarks.probe_cost [--repeat 5] [--language go]``.

Library use (benchmarks/operator.py)::

    measure_probe_cost("go")            # -> dict with wall_ms, own_ms, verdict, ...
    measure_fetch_cost(Path("etl.jar"))  # -> dict with wall_ms, baseline_ms, own_ms, verdict, ...
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._report import print_table, write_json

TARGET_OWN_MS = 150.0
LANGUAGES = ("go", "java", "typescript")
NAMESPACE = "bench"
BUNDLE = "probe-cost"


@functools.cache
def pod_bin() -> Path:
    """The bin folder of the operator installed as its images install it: from a copy of the
    sources, not editable, without the development environment (``hack/node-venv.sh``, the
    venv the process node runs probe containers from). This development venv is the wrong
    place to time a pod's commands: its editable installs put import finders into every start
    (``site`` alone took 70-140 ms of each start here), which no image has.
    ``THOP_PROBE_COST_BIN`` overrides it; an empty value means this interpreter's own venv."""
    given = os.environ.get("THOP_PROBE_COST_BIN")
    if given is not None:
        return Path(given) if given else Path(sys.executable).parent
    from taskhandler_devenv.kubecluster.control_plane import node_venv_bin

    return node_venv_bin()


def console_script() -> str:
    """The ``taskhandler-operator`` console script a probe pod runs (:func:`pod_bin`)."""
    beside = pod_bin() / "taskhandler-operator"
    return str(beside) if beside.exists() else shutil.which("taskhandler-operator") or str(beside)


def pod_python() -> str:
    """The interpreter of :func:`pod_bin`, for the bare start the figures are read against."""
    beside = pod_bin() / "python"
    return str(beside) if beside.exists() else sys.executable


def _verdict(own_ms: float) -> str:
    return "PASS" if own_ms <= TARGET_OWN_MS else "FAIL"


class _Run:
    """One timed process: wall and CPU milliseconds, exit status and output."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
        self.wall_ms = (time.perf_counter() - started) * 1000
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_ms = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    def check(self, what: str) -> _Run:
        if self.returncode != 0:
            raise RuntimeError(f"{what} failed ({self.returncode}): {self.stderr[-2000:]}")
        return self


@contextmanager
def bytecode_env(
    base: Mapping[str, str] | None = None,
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """(warm, cold) environments: bytecode cached in a private folder, and compiled every run.

    The warm environment writes bytecode (its first run fills the cache); the cold one points at
    an empty folder with writing off.
    """
    env = {k: v for k, v in (base or os.environ).items() if k != "THOP_RUNTIME_PID_FILE"}
    with tempfile.TemporaryDirectory(prefix="thop-pyc-") as folder:
        warm = {**env, "PYTHONPYCACHEPREFIX": str(Path(folder) / "warm")}
        warm.pop("PYTHONDONTWRITEBYTECODE", None)
        cold = {**env, "PYTHONPYCACHEPREFIX": str(Path(folder) / "cold")}
        cold["PYTHONDONTWRITEBYTECODE"] = "1"
        yield warm, cold


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 1)


def runtime_own_ms(log_text: str) -> float:
    """The runtime's start-to-answer time minus its wait for the request, from the probe's log."""
    from benchmarks.probe import runtime_timing

    timing = runtime_timing(log_text)
    return timing["start_to_answer_ms"] - timing["waited_ms"]


def measure_probe_cost(
    language: str,
    artifact: Path | None = None,
    *,
    repeat: int = 5,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Time ``taskhandler-operator probe`` on one artifact against the runtime's own time.

    ``language`` is go, java or typescript; ``artifact`` defaults to the good test runtime
    (``devenv.runtimes``, built and cached on first use). Returns medians over ``repeat`` runs
    after one warm-up: ``wall_ms`` and ``cpu_ms`` of the probe process, ``runtime_own_ms``,
    ``own_ms`` (= wall - runtime own), ``target_ms``, ``verdict`` (PASS/FAIL), ``no_bytecode_ms``
    and the per-run ``samples``. Raises RuntimeError when a probe fails.
    """
    if artifact is None:
        from taskhandler_devenv.runtimes import SEED_SPEC, build_runtime

        artifact = build_runtime(language, SEED_SPEC)
    argv = [
        *(console_script(), "probe", str(artifact), "--language", language),
        *("--termination-log", "-"),
    ]
    samples: list[dict[str, float]] = []
    with bytecode_env(env) as (warm, cold):
        _Run(argv, warm, timeout).check("probe warm-up")
        for _ in range(max(1, repeat)):
            run = _Run(argv, warm, timeout).check("probe")
            own_runtime = runtime_own_ms(run.stderr)
            samples.append(
                {
                    "wall_ms": round(run.wall_ms, 2),
                    "cpu_ms": round(run.cpu_ms, 2),
                    "runtime_own_ms": round(own_runtime, 2),
                    "own_ms": round(run.wall_ms - own_runtime, 2),
                }
            )
        no_bytecode = _Run(argv, cold, timeout).check("probe without bytecode")
    own = _median([s["own_ms"] for s in samples])
    return {
        "command": "probe",
        "language": language,
        "runs": len(samples),
        "wall_ms": _median([s["wall_ms"] for s in samples]),
        "cpu_ms": _median([s["cpu_ms"] for s in samples]),
        "baseline": "runtime start-to-answer",
        "baseline_ms": _median([s["runtime_own_ms"] for s in samples]),
        "own_ms": own,
        "target_ms": TARGET_OWN_MS,
        "verdict": _verdict(own),
        "no_bytecode_ms": round(no_bytecode.wall_ms, 1),
        "samples": samples,
    }


# -- fetch ------------------------------------------------------------------------------------

# The operator's artifact server over one revision, in its own process: prints the signed
# manifest item of each file named, then serves until stdin closes.
_SERVE = """
import asyncio, json, sys
from pathlib import Path
from taskhandler_operator.sources.server import ArtifactServer
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.sync import sync

async def main() -> None:
    store = RevisionStore(Path(sys.argv[1]))
    await store.open()
    source = SourceSpec.model_validate({"volume": {"path": sys.argv[2]}})
    volumes = VolumeAccess.for_operator([Path(sys.argv[2])], store=store.root)
    revision = await sync(source, None, store, namespace=sys.argv[3], bundle=sys.argv[4],
                          timeout=600, volumes=volumes)
    server = ArtifactServer(store, bytes.fromhex(sys.argv[5]))
    await server.start()
    items = [await server.manifest_entry(sys.argv[3], sys.argv[4], revision.id, rel, 3600)
             for rel in sys.argv[6:]]
    print(json.dumps(items), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop()

asyncio.run(main())
"""

# The baseline client when curl is absent: the least a Python process can do for one GET.
_PLAIN_GET = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as out:
    while chunk := r.read(1 << 20):
        out.write(chunk)
"""


@contextmanager
def artifact_server(files: Sequence[Path], workdir: Path) -> Iterator[list[dict[str, Any]]]:
    """Serve ``files`` from a fresh revision; yields their signed ``fetch`` manifest items."""
    volume = workdir / "volume"
    volume.mkdir(parents=True)
    names = []
    for path in files:
        shutil.copyfile(path, volume / path.name)
        names.append(path.name)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", _SERVE, str(workdir / "store"), str(volume)),
            *(NAMESPACE, BUNDLE, secrets.token_bytes(32).hex(), *names),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the artifact server did not start")
        yield json.loads(line)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _baseline_argv(url: str, dest: Path) -> tuple[str, list[str]]:
    curl = shutil.which("curl")
    if curl:
        return "curl", [curl, "-sSf", "-o", str(dest), url]
    return "python -S urllib", [sys.executable, "-S", "-c", _PLAIN_GET, url, str(dest)]


def measure_fetch_cost(
    artifact: Path,
    *,
    repeat: int = 5,
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Time ``taskhandler-operator fetch`` of ``artifact`` from the artifact server.

    The baseline is a plain GET of the same signed URL (curl, else ``python -S``), alternated
    with the fetch runs. Returns medians over ``repeat`` runs after one warm-up of each:
    ``wall_ms``, ``cpu_ms``, ``baseline_ms``, ``baseline_cpu_ms``, ``own_ms`` (= wall -
    baseline), ``target_ms``, ``verdict`` (PASS/FAIL), ``no_bytecode_ms``, ``bytes`` and the
    per-run ``samples``. Raises RuntimeError when a download fails.
    """
    base = Path(tempfile.mkdtemp(prefix="thop-fetch-cost-", dir=workdir))
    samples: list[dict[str, float]] = []
    try:
        with artifact_server([artifact], base) as items, bytecode_env(env) as (warm, cold):
            manifest = json.dumps(items)
            baseline_name, _ = _baseline_argv(items[0]["url"], base / "x")

            def fetch(n: int, environment: Mapping[str, str]) -> _Run:
                argv = [console_script(), "fetch", "--dest", str(base / f"fetched-{n}")]
                return _Run([*argv, "--manifest", manifest], environment, timeout).check("fetch")

            def plain(n: int) -> _Run:
                _, argv = _baseline_argv(items[0]["url"], base / f"plain-{n}")
                return _Run(argv, warm, timeout).check(baseline_name)

            fetch(-1, warm)
            plain(-1)
            for n in range(max(1, repeat)):
                ours, theirs = fetch(n, warm), plain(n)
                samples.append(
                    {
                        "wall_ms": round(ours.wall_ms, 2),
                        "cpu_ms": round(ours.cpu_ms, 2),
                        "baseline_ms": round(theirs.wall_ms, 2),
                        "baseline_cpu_ms": round(theirs.cpu_ms, 2),
                        "own_ms": round(ours.wall_ms - theirs.wall_ms, 2),
                    }
                )
            no_bytecode = fetch(repeat + 1, cold)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    own = _median([s["own_ms"] for s in samples])
    return {
        "command": "fetch",
        "artifact": artifact.name,
        "bytes": int(items[0]["size"]),
        "runs": len(samples),
        "wall_ms": _median([s["wall_ms"] for s in samples]),
        "cpu_ms": _median([s["cpu_ms"] for s in samples]),
        "baseline": baseline_name,
        "baseline_ms": _median([s["baseline_ms"] for s in samples]),
        "baseline_cpu_ms": _median([s["baseline_cpu_ms"] for s in samples]),
        "own_ms": own,
        "target_ms": TARGET_OWN_MS,
        "verdict": _verdict(own),
        "no_bytecode_ms": round(no_bytecode.wall_ms, 1),
        "samples": samples,
    }


def python_start_ms(repeat: int = 3) -> float:
    """A bare interpreter start (with site), to read the figures against."""
    times = []
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        subprocess.run([pod_python(), "-c", "pass"], check=True, timeout=60)
        times.append((time.perf_counter() - started) * 1000)
    return _median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (median)")
    parser.add_argument("--language", action="append", choices=LANGUAGES)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--check-targets", action="store_true", help="exit 1 on a FAIL")
    args = parser.parse_args(argv)
    from taskhandler_devenv.runtimes import SEED_SPEC, ToolchainMissing, build_runtime

    rows: list[dict[str, Any]] = []
    for language in args.language or LANGUAGES:
        try:
            artifact = build_runtime(language, SEED_SPEC)
        except ToolchainMissing as exc:
            print(f"skipping {language}: {exc}", file=sys.stderr)
            continue
        rows.append(measure_probe_cost(language, artifact, repeat=args.repeat))
        fetched = measure_fetch_cost(artifact, repeat=args.repeat, workdir=args.workdir)
        rows.append({**fetched, "language": language})
    interpreter_ms = python_start_ms()
    columns = [
        "command",
        "language",
        "runs",
        "wall_ms",
        "cpu_ms",
        "baseline",
        "baseline_ms",
        "own_ms",
        "target_ms",
        "verdict",
        "no_bytecode_ms",
    ]
    print_table(
        rows,
        columns,
        title=(
            f"One probe's own cost (medians; own = wall - baseline; target <= {TARGET_OWN_MS:g} "
            f"ms; a bare `python -c pass` takes {interpreter_ms} ms; load {os.getloadavg()[0]:.2f})"
        ),
    )
    path = write_json(
        "probe_cost",
        {
            "target_own_ms": TARGET_OWN_MS,
            "python_start_ms": interpreter_ms,
            "commands_from": console_script(),
            "load_average": os.getloadavg(),
            "cpu_count": os.cpu_count(),
            "results": rows,
        },
    )
    print(f"\nwrote {path}")
    failed = [r for r in rows if r["verdict"] != "PASS"]
    return 1 if args.check_targets and failed else 0


if __name__ == "__main__":
    sys.exit(main())
