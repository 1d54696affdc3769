"""A probe pod's two commands stay slim: ``fetch`` and ``probe`` import none of the operator's
heavy libraries.

Every probe Job runs both in a fresh interpreter, so each library imported on their path is paid
once per artifact probed (benchmarks/probe_cost.py measures it). Each case runs the real CLI in a
child interpreter and lists ``sys.modules`` afterwards; an eager import added anywhere on these
paths (a command module, the CLI's dispatch, a reader) fails here.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

# The operator's own libraries: database, Kubernetes, controller, HTTP framework, S3, metrics.
HEAVY = (
    "sqlalchemy",
    "alembic",
    "psycopg",
    "kubernetes",
    "kopf",
    "aiohttp",
    "aiobotocore",
    "botocore",
    "prometheus_client",
    "pydantic_settings",
    "pythonjsonlogger",
)
# Not needed before a command runs (--help), nor by fetch at all.
LIBRARIES = ("pydantic", "pydantic_core", "yaml", "msgpack", "psutil", "asyncio")
# Not imported by a probe either: pydantic was most of a probe's own cost (protocol/plain.py);
# the operator validates what a probe reports with the models, the probe pod does not need them.
PROBE_FREE = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection")

RUN_CLI = """
import contextlib, io, json, sys
from taskhandler_operator.cli import main
sink = io.StringIO()
with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
    try:
        code = main(json.loads(sys.argv[1]))
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "output": sink.getvalue(), "modules": sorted(sys.modules)}))
"""


def run_cli(*argv: str) -> tuple[int, set[str], str]:
    """Exit code, the top-level and full names in ``sys.modules``, and the output."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN_CLI, json.dumps(list(argv))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(proc.stdout.splitlines()[-1])
    modules = set(report["modules"])
    return report["code"], modules | {m.split(".")[0] for m in modules}, report["output"]


def imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in modules]


@pytest.mark.parametrize("command", ["probe", "fetch"])
def test_help_imports_no_library(command: str) -> None:
    code, modules, output = run_cli(command, "--help")
    assert code == 0 and f"taskhandler-operator {command}" in output
    assert imported(modules, HEAVY + LIBRARIES) == []
    # Only the chosen command's module is registered, not every concern's.
    assert "taskhandler_operator.settings" not in modules
    assert "taskhandler_operator.db.commands" not in modules


JAVA_READER = ("taskhandler_operator.artifacts.java", "zipfile")
OTHER_READERS = ("taskhandler_operator.artifacts.listing",)


@pytest.mark.parametrize(
    ("language", "name", "libraries"),
    [
        # Each language imports its own reader only (artifacts/verify.py).
        ("go", "etl", ("taskhandler_operator.artifacts.typescript", *JAVA_READER, *OTHER_READERS)),
        # The Go reader's YAML parser is imported on first use, not by the verifier. A JAR's
        # classpath is every JAR in the bundle, which the walk finds (artifacts/walk.py)
        # without the listing and its other readers.
        (
            "java",
            "etl.jar",
            (
                "yaml",
                "taskhandler_operator.artifacts.go",
                "taskhandler_operator.artifacts.typescript",
                *OTHER_READERS,
            ),
        ),
        (
            "typescript",
            "etl.min.mjs",
            ("yaml", "taskhandler_operator.artifacts.go", *JAVA_READER, *OTHER_READERS),
        ),
    ],
)
def test_probe_run_imports_only_the_driver_and_its_reader(
    tmp_path: Path, language: str, name: str, libraries: tuple[str, ...]
) -> None:
    # A file that is no artifact goes through the whole command: options, the driver, and
    # verification up to its language's reader, which refuses it.
    artifact = tmp_path / name
    artifact.write_bytes(b"not an artifact\n")
    code, modules, output = run_cli(
        "probe", str(artifact), "--language", language, "--termination-log", "-"
    )
    assert code == 3, output  # the artifact refused
    assert "taskhandler_operator.protocol.driver" in modules
    assert "taskhandler_operator.protocol.session" in modules
    assert f"taskhandler_operator.artifacts.{language}" in modules
    # No TLS either: the driver talks to the runtime on loopback (protocol/commands.py).
    assert imported(modules, (*HEAVY, *PROBE_FREE, "ssl", *libraries)) == []


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A loopback HTTP server over one file: (its URL, its bytes)."""
    root = tmp_path / "served"
    root.mkdir()
    payload = b"artifact bytes\n" * 1000
    (root / "etl.jar").write_bytes(payload)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/etl.jar", payload
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_run_imports_the_standard_library_only(
    tmp_path: Path, served: tuple[str, bytes]
) -> None:
    url, payload = served
    manifest = [
        {
            "path": "lib/etl.jar",
            "url": url,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload),
        }
    ]
    dest = tmp_path / "bundle"
    code, modules, output = run_cli(
        "fetch", "--dest", str(dest), "--manifest", json.dumps(manifest)
    )
    assert code == 0, output
    assert (dest / "lib" / "etl.jar").read_bytes() == payload
    assert "urllib.request" in modules  # the download really ran in that interpreter
    assert imported(modules, HEAVY + LIBRARIES) == []
