"""The probe driver: ask an artifact which task handlers it registers, without running them.

Steps (reference ``airflow-langsdk.md`` §5 and §6.3, Design B), every wait bounded:

1. verify the artifact exactly as a worker would (integrity, schema version); a refused
   artifact never runs;
2. open the comm and logs listeners on loopback and start the runtime in a new session with
   ``--comm=127.0.0.1:P --logs=127.0.0.1:Q``;
3. accept one connection per channel, only from a process of the runtime's tree
   (``connect_timeout``);
4. send ``TaskHandlerParseRequest`` as the id-0 frame; answer every ``Get*``/``Put*`` request
   with an ``ErrorResponse`` (a probe has no Airflow client); relay the logs channel, stdout and
   stderr into the driver's log, bounded;
5. take exactly one ``TaskHandlerParsingResult`` and acknowledge it (``answer_timeout``);
6. end our side of both channels, and close each one as soon as the runtime ends its side
   (Airflow's SDK runtimes wait for that before they exit);
7. give the runtime ``exit_grace`` to exit, then kill its process group and every descendant
   (the driver adopts orphans as a child subreaper). A second result, a non-zero exit, a
   process left running or one that cannot be killed fails the probe; overstaying the grace
   after a valid answer, and an empty answer, are warnings on an ok summary.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from taskhandler_operator.artifacts.models import ArtifactVerificationError, VerifiedArtifact
from taskhandler_operator.artifacts.verify import verify_artifact
from taskhandler_operator.protocol.eventlog import EventLog
from taskhandler_operator.protocol.launch import ProbeConfig, build_command, runtime_environment
from taskhandler_operator.protocol.plain import (
    RESULT_MARKER,
    LogStats,
    PlainResult,
    PlainSummary,
    ProbeErrorKind,
    ProbeWarningKind,
    SummaryWarning,
    Timings,
    sha256_text,
)
from taskhandler_operator.protocol.session import ProbeFailure, ProbeSession, ms_since

__all__ = [
    "RESULT_MARKER",
    "ProbeConfig",
    "ProbeFailure",
    "ProbeOutcome",
    "build_command",
    "run_probe",
    "runtime_environment",
]


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """The summary as the pod writes it (``summary.ProbeSummary`` reads it back) and the
    validated result, in their pydantic-free forms (plain.py)."""

    summary: PlainSummary
    result: PlainResult | None = None
    result_json: str | None = None


def _verify(config: ProbeConfig) -> VerifiedArtifact:
    # The probe's --timeout bounds verification too (a hostile artifact must not keep a
    # probe pod busy hashing or parsing for longer than it may take to answer).
    return verify_artifact(
        config.artifact, config.language, config.bundle_root, timeout=config.answer_timeout
    )


async def run_probe(config: ProbeConfig, log: EventLog) -> ProbeOutcome:
    """Probe one artifact. Never raises for a runtime's behaviour: the summary says what failed."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    log.info("verifying artifact", artifact=str(config.artifact), language=config.language.value)
    try:
        verified = await asyncio.to_thread(_verify, config)
    except ArtifactVerificationError as exc:
        timings["verify_ms"] = ms_since(started)
        return _failed(config, None, ProbeErrorKind.ARTIFACT_REFUSED, str(exc), timings, started)
    except Exception as exc:  # a reader bug on a hostile artifact must still end in a summary
        timings["verify_ms"] = ms_since(started)
        message = f"probe driver error: {type(exc).__name__}: {exc}"
        return _failed(config, None, ProbeErrorKind.DRIVER_ERROR, message, timings, started)
    timings["verify_ms"] = ms_since(started)
    log.info(
        "artifact verified",
        schema_version=verified.schema_version,
        size_bytes=verified.size_bytes,
        cache_digest=verified.cache_digest,
    )
    session = ProbeSession(config, verified, log, timings)
    try:
        result = await session.run()
    except ProbeFailure as failure:
        return _failed(config, verified, failure.kind, failure.message, timings, started, session)
    line = result.line()
    warnings = [
        SummaryWarning(kind=ProbeWarningKind(w.kind), message=w.message) for w in session.warnings
    ]
    if not result.task_handlers:
        warnings.insert(0, _empty_answer_warning(config))
    for warning in warnings:
        log.warning("probe warning", kind=warning.kind.value, message=warning.message)
    summary = PlainSummary(
        status="ok",
        artifact=str(config.artifact),
        language=config.language.value,
        schema_version=verified.schema_version,
        result_sha256=sha256_text(line),
        result_bytes=len(line.encode("utf-8")),
        dag_count=len(result.task_handlers),
        handler_count=result.handler_count,
        runtime_exit_code=session.exit_code,
        runtime_pids=session.pids,
        dag_ids_requested=len(config.dag_ids) if config.dag_ids is not None else None,
        warnings=warnings,
        logs=session.log_stats(),
        timings=Timings(total_ms=ms_since(started), **timings),
    )
    return ProbeOutcome(summary, result, line)


def empty_answer_message(dag_ids: tuple[str, ...] | None) -> str:
    if dag_ids is None:
        return (
            "The runtime registered no task handler. If this artifact implements stub tasks, "
            "the likely cause is an older Go or Java SDK runtime that answers only the Dags "
            "named in the request's dag_ids, and this request named none: probe it with "
            "--dag-id for each Dag whose stubs it serves"
        )
    return (
        f"The runtime registered no task handler for any of the {len(dag_ids)} Dag(s) the "
        "request named in dag_ids: the artifact implements none of their stub tasks, or its "
        "runtime registered no handler at all"
    )


def _empty_answer_warning(config: ProbeConfig) -> SummaryWarning:
    return SummaryWarning(
        kind=ProbeWarningKind.EMPTY_ANSWER, message=empty_answer_message(config.dag_ids)
    )


def _failed(
    config: ProbeConfig,
    verified: VerifiedArtifact | None,
    kind: ProbeErrorKind,
    message: str,
    timings: dict[str, float],
    started: float,
    session: ProbeSession | None = None,
) -> ProbeOutcome:
    summary = PlainSummary(
        status="error",
        error_kind=kind,
        error=message,
        artifact=str(config.artifact),
        language=config.language.value,
        schema_version=verified.schema_version if verified else None,
        runtime_exit_code=session.exit_code if session else None,
        runtime_pids=session.pids if session else [],
        logs=session.log_stats() if session else LogStats(),
        timings=Timings(total_ms=ms_since(started), **timings),
    )
    return ProbeOutcome(summary)
