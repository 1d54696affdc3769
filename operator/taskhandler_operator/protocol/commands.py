"""``taskhandler-operator probe``: the probe driver's command line (runs in probe pods).

Output contract (see docs/protocol.md):

* stderr — the structured log (JSON lines), including the result marker and the result line;
* stdout — the summary, one JSON line;
* the termination-message file — the same summary;
* exit status — :class:`~taskhandler_operator.protocol.summary.ExitCode`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from taskhandler_operator.protocol.eventlog import EventLog

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "THOP_TERMINATION_LOG"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="ask an artifact which task handlers it registers, without running them",
        description=(
            "Verify a Lang-SDK artifact, start its runtime on loopback channels, send "
            "TaskHandlerParseRequest and report the TaskHandlerParsingResult. Exit status: "
            "0 valid result, 1 the runtime failed, 3 artifact refused, 4 driver error."
        ),
    )
    parser.add_argument("artifact", type=Path, metavar="ARTIFACT")
    parser.add_argument(
        "--language", required=True, choices=["go", "java", "typescript"], help="artifact kind"
    )
    parser.add_argument(
        "--bundle-root",
        type=Path,
        metavar="DIR",
        help="root of the artifact bundle (Java: every *.jar under it is the classpath); "
        "default: the artifact's directory",
    )
    parser.add_argument(
        "--bundle-name", metavar="B", help="Dag bundle name sent in the parse request"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the runtime has to answer after the request (default 60)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds the runtime has to connect both channels (default 10)",
    )
    parser.add_argument(
        "--exit-grace",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds the runtime has to exit after its result is acknowledged (default 5)",
    )
    parser.add_argument(
        "--max-frame-size",
        type=int,
        default=16 * 1024 * 1024,
        metavar="BYTES",
        help="largest frame accepted from the runtime (default 16 MiB)",
    )
    parser.add_argument("--java", default="java", help="Java launcher (default: java on PATH)")
    parser.add_argument("--node", default="node", help="Node.js executable (default: node)")
    parser.add_argument(
        "--jvm-arg",
        action="append",
        default=[],
        dest="jvm_args",
        metavar="ARG",
        help="extra JVM option, before the main class (repeatable)",
    )
    parser.add_argument(
        "--dag-id",
        action="append",
        dest="dag_ids",
        metavar="DAG_ID",
        help="name a Dag in the request's dag_ids (repeatable); runtimes of the current "
        "protocol ignore it, older Go/Java SDK runtimes answer only the Dags named "
        "(see docs/protocol.md)",
    )
    parser.add_argument(
        "--termination-log",
        metavar="PATH",
        default=os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG),
        help=f"where the summary is written (default: ${TERMINATION_LOG_ENV}, "
        f"else {DEFAULT_TERMINATION_LOG}); '-' to skip",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="lowest level of the driver's own log (default info)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Heavy imports here, so that `taskhandler-operator --help` stays fast.
    # No pydantic on this path (protocol/plain.py says why; test_cli_imports.py keeps it so).
    _import_asyncio_without_tls()
    import asyncio

    from taskhandler_operator.artifacts.models import Language
    from taskhandler_operator.protocol.driver import ProbeConfig, run_probe
    from taskhandler_operator.protocol.plain import RESULT_MARKER, ExitCode

    log = EventLog(sys.stderr, min_level=args.log_level)
    try:
        config = ProbeConfig(
            artifact=args.artifact,
            language=Language(args.language),
            bundle_root=args.bundle_root,
            bundle_name=args.bundle_name,
            answer_timeout=args.timeout,
            connect_timeout=args.connect_timeout,
            exit_grace=args.exit_grace,
            max_frame_size=args.max_frame_size,
            java=args.java,
            node=args.node,
            jvm_args=tuple(args.jvm_args),
            dag_ids=tuple(args.dag_ids) if args.dag_ids is not None else None,
        )
    except ValueError as exc:
        # pydantic's ValidationError (a ValueError) from the options model ProbeConfig defers to.
        errors = getattr(exc, "errors", None)
        if errors is None:
            raise
        log.error("invalid probe options", errors=errors(include_url=False))
        return int(ExitCode.DRIVER_ERROR)
    outcome = asyncio.run(run_probe(config, log))
    summary = outcome.summary
    if outcome.result_json is not None:
        log.info("probe succeeded", handlers=summary.handler_count, dags=summary.dag_count)
        log.write_lines(RESULT_MARKER, outcome.result_json)
    else:
        log.error("probe failed", error_kind=summary.error_kind, error=summary.error)
    text = summary.to_json()
    log.info("probe summary", summary=summary.to_dict())
    _write_termination_log(args.termination_log, text, log)
    print(text, file=sys.stdout, flush=True)
    return int(summary.exit_code)


def _import_asyncio_without_tls() -> None:
    """Import asyncio without ``ssl`` in a fresh probe process.

    The driver speaks plain TCP on loopback only, and asyncio imports ``ssl`` (OpenSSL) whenever
    it can: that was about 5 % of a probe's own cost (docs/operations.md). A ``None`` entry in
    ``sys.modules`` makes ``import ssl`` fail, which asyncio handles by running without TLS; the
    entry is removed at once, so a later ``import ssl`` works. A process that already has asyncio
    or ssl (a test calling this command in-process) is left as it is.
    """
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]


def _write_termination_log(path: str, text: str, log: EventLog) -> None:
    if path == "-":
        return
    target = Path(path)
    # Outside a pod nothing provides /dev/termination-log; creating a file in /dev (as root)
    # would be wrong, so the default path is only written when it already exists.
    if path == DEFAULT_TERMINATION_LOG and not target.exists():
        log.debug("no termination-message file", path=path)
        return
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write the termination message", path=path, error=str(exc))


__all__ = ["DEFAULT_TERMINATION_LOG", "TERMINATION_LOG_ENV", "register", "run"]
