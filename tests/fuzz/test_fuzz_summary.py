"""Fuzz the termination-message and result parsers: ``ProbeSummary`` from a termination
message, ``job_outcome`` reading a finished probe Job, and ``accept_result`` checking the logged
result against the summary, at the fuzzing budget.

Inputs: arbitrary text, JSON documents shaped like a summary with any field replaced by a
hostile value, truncated summaries, and probe logs of random lines around the result marker,
whose result line the summary's sha256 matches (a valid result, or any JSON). Contracts:

* ``ProbeSummary.model_validate_json`` returns a summary or raises pydantic's
  ``ValidationError``; a summary round-trips through ``to_json``;
* ``job_outcome`` never raises: a finished Job is SUCCEEDED (exit 0 and a valid ok summary) or
  FAILED with a reason and a message; it never trusts an invalid summary;
* ``accept_result`` returns a ``TaskHandlerParsingResult`` or raises ``ResultRejected``;
* a summary the driver builds fits the termination message (``MAX_SUMMARY_BYTES``) whatever its
  error text, artifact path and warnings;
* under 64 MiB per example.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from pydantic import ValidationError

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.probe_job import (
    FETCH_CONTAINER,
    PROBE_CONTAINER,
    ProbeJobOutcome,
    ProbePhase,
    job_outcome,
)
from taskhandler_operator.limits import MAX_SUMMARY_BYTES
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.protocol.summary import (
    RESULT_MARKER,
    ExitCode,
    ProbeErrorKind,
    ProbeSummary,
    ProbeWarningKind,
    ResultRejected,
    SummaryWarning,
    Timings,
    accept_result,
    result_line,
)
from tests.fuzz.budget import FUZZ, bounded_memory
from tests.unit.protocol.frame_inputs import json_values
from tests.unit.protocol.test_summary import RESULT

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

GOOD: dict[str, Any] = json.loads(
    ProbeSummary(
        status="ok",
        artifact="etl",
        language="go",
        result_sha256="0" * 64,
        result_bytes=10,
        dag_count=1,
        handler_count=2,
        runtime_pids=[10, 11],
        warnings=[SummaryWarning(kind=ProbeWarningKind.EMPTY_ANSWER, message="none")],
        timings=Timings(verify_ms=1.0, total_ms=2.0),
    ).to_json()
)
HOSTILE = st.one_of(
    json_values,
    st.sampled_from(
        [None, -1, 2**64, 1e308, "", "x" * 100_000, "\x00", "\ud800", [], {}, [1] * 1000, "ok"]
    ),
)


@st.composite
def summary_documents(draw: st.DrawFn) -> str:
    document = dict(GOOD)
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from([*GOOD, "timings", "logs", "status", "extra"]))
        if draw(st.integers(0, 4)) == 0:
            document.pop(key, None)
        else:
            document[key] = draw(HOSTILE)
    text = json.dumps(document)
    if draw(st.integers(0, 5)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


MESSAGES = st.one_of(summary_documents(), st.text(max_size=4096), st.just(json.dumps(GOOD)))


@FUZZ
@given(text=MESSAGES)
def test_a_termination_message_is_a_summary_or_a_validation_error(text: str) -> None:
    with bounded_memory():
        try:
            summary = ProbeSummary.model_validate_json(text)
        except ValidationError:
            event("invalid")
            return
        event("valid")
        assert ProbeSummary.model_validate_json(summary.to_json()) == summary
        assert isinstance(summary.exit_code, ExitCode)


def _finished_job(message: str, exit_code: int, failed: bool) -> tuple[dict[str, Any], ...]:
    condition = {"type": "Failed" if failed else "Complete", "status": "True"}
    job = {"spec": {"activeDeadlineSeconds": 200}, "status": {"conditions": [condition]}}
    terminated = {"exitCode": exit_code, "message": message, "reason": "Completed"}
    pod = {
        "spec": {"containers": [{"name": PROBE_CONTAINER}]},
        "status": {
            "initContainerStatuses": [
                {"name": FETCH_CONTAINER, "state": {"terminated": {"exitCode": 0}}}
            ],
            "containerStatuses": [{"name": PROBE_CONTAINER, "state": {"terminated": terminated}}],
        },
    }
    return job, pod


@FUZZ
@given(
    message=MESSAGES,
    exit_code=st.one_of(st.sampled_from([0, 1, 3, 4, 137]), st.integers(-(2**31), 2**31)),
    failed=st.booleans(),
    log_tail=st.none() | st.text(max_size=2048),
)
def test_a_finished_probe_job_is_read_without_raising(
    message: str, exit_code: int, failed: bool, log_tail: str | None
) -> None:
    job, pod = _finished_job(message, exit_code, failed)
    with bounded_memory():
        outcome = job_outcome(job, pod, log_tail)
    assert isinstance(outcome, ProbeJobOutcome) and outcome.finished
    event(f"{outcome.phase.value}: {outcome.reason}")
    assert outcome.reason and outcome.message
    if outcome.phase is ProbePhase.SUCCEEDED:
        assert exit_code == 0 and not failed
        assert outcome.summary is not None and outcome.summary.ok
        assert outcome.summary == ProbeSummary.model_validate_json(message)


RESULT_LINES = st.one_of(
    st.just(result_line(RESULT)),
    json_values.map(json.dumps),
    st.text(max_size=512).filter(lambda s: "\n" not in s),
)
LOG_LINES = st.lists(
    st.one_of(st.text(max_size=200), st.just(RESULT_MARKER)).map(lambda s: s.replace("\n", " ")),
    max_size=8,
)


@FUZZ
@given(
    before=LOG_LINES,
    line=RESULT_LINES,
    after=LOG_LINES,
    marked=st.booleans(),
    hashed=st.sampled_from(["line", "other", "none"]),
)
def test_a_logged_result_is_accepted_or_rejected(
    before: list[str], line: str, after: list[str], marked: bool, hashed: str
) -> None:
    lines = [*before, *([RESULT_MARKER, line] if marked else []), *after]
    digest = {
        "line": hashlib.sha256(line.encode("utf-8", "surrogatepass")).hexdigest(),
        "other": "f" * 64,
        "none": None,
    }[hashed]
    summary = ProbeSummary(status="ok", artifact="etl", language="go", result_sha256=digest)
    with bounded_memory():
        try:
            result = accept_result("\n".join(lines), summary)
        except ResultRejected as exc:
            assert str(exc) and "\n" not in str(exc)
            event("rejected")
            return
    event("accepted")
    assert isinstance(result, TaskHandlerParsingResult)


_TEXT = st.text(max_size=20_000) | st.sampled_from(
    ["é" * 20_000, "\U0001f600" * 10_000, "\\" * 9000]
)


@FUZZ
@given(
    error=_TEXT,
    artifact=_TEXT,
    language=st.sampled_from([language.value for language in Language]),
    warnings=st.lists(
        st.builds(SummaryWarning, kind=st.sampled_from(ProbeWarningKind), message=_TEXT),
        max_size=6,
    ),
    pids=st.lists(st.integers(1, 2**22), max_size=64),
    counts=st.integers(0, 2**31),
    millis=st.floats(0, 1e12, allow_nan=False),
    ok=st.booleans(),
)
def test_a_driver_summary_fits_the_termination_message(
    error: str,
    artifact: str,
    language: str,
    warnings: list[SummaryWarning],
    pids: list[int],
    counts: int,
    millis: float,
    ok: bool,
) -> None:
    common: dict[str, Any] = {
        "artifact": artifact,
        "language": language,
        "schema_version": "2026-10-30",
        "runtime_pids": pids,
        "dag_count": counts,
        "handler_count": counts,
        "result_bytes": counts,
        "runtime_exit_code": -counts,
        "timings": Timings(**dict.fromkeys(Timings.model_fields, millis)),
    }
    if ok:
        summary = ProbeSummary(status="ok", result_sha256="a" * 64, warnings=warnings, **common)
    else:
        summary = ProbeSummary(
            status="error", error_kind=ProbeErrorKind.DRIVER_ERROR, error=error, **common
        )
    assert len(summary.to_json().encode("utf-8")) <= MAX_SUMMARY_BYTES
