from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
from pydantic import ValidationError

from taskhandler_operator.limits import MAX_SUMMARY_BYTES
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.protocol.summary import (
    RESULT_MARKER,
    ExitCode,
    LogStats,
    ProbeErrorKind,
    ProbeSummary,
    ProbeWarningKind,
    ResultRejected,
    SummaryWarning,
    Timings,
    accept_result,
    find_result_line,
    result_line,
)

RESULT = TaskHandlerParsingResult.model_validate(
    {
        "fileloc": "/bundle/etl",
        "task_handlers": {
            "etl": [
                {"task_id": "extract", "binding": "positional", "params": [{"name": None}]},
                {"task_id": "load", "binding": "named", "params": None},
            ]
        },
    }
)


def ok_summary(line: str) -> ProbeSummary:
    return ProbeSummary(
        status="ok",
        artifact="etl",
        language="go",
        result_sha256=hashlib.sha256(line.encode()).hexdigest(),
    )


def test_largest_summary_fits_the_termination_message() -> None:
    summary = ProbeSummary(
        status="error",
        error_kind=ProbeErrorKind.PROCESSES_LEFT,
        error="é" * 10_000,
        artifact="/very/long/" + "a" * 10_000 + "/artifact.min.mjs",
        language="typescript",
        schema_version="2026-10-30",
        result_sha256="0" * 64,
        result_bytes=2**40,
        dag_count=2**31,
        handler_count=2**31,
        runtime_exit_code=-9,
        runtime_pids=list(range(4_000_000, 4_001_000)),
        logs=LogStats(relayed_lines=10**9, dropped_lines=10**12, truncated_lines=10**9),
        timings=Timings(**{f: 1e9 for f in Timings.model_fields}),
    )
    encoded = summary.to_json().encode()
    assert len(encoded) <= MAX_SUMMARY_BYTES < 4096
    assert summary.artifact.endswith("/artifact.min.mjs")
    assert summary.error is not None and summary.error.endswith("…")
    assert len(summary.runtime_pids) == 16
    assert ProbeSummary.model_validate_json(encoded) == summary


def test_largest_ok_summary_with_warnings_fits_the_termination_message() -> None:
    summary = ProbeSummary(
        status="ok",
        artifact="/very/long/" + "a" * 10_000 + "/artifact.min.mjs",
        language="typescript",
        schema_version="2026-10-30",
        result_sha256="0" * 64,
        result_bytes=2**40,
        dag_count=2**31,
        handler_count=2**31,
        runtime_exit_code=-9,
        runtime_pids=list(range(4_000_000, 4_001_000)),
        dag_ids_requested=10_000,
        warnings=[
            SummaryWarning(kind=ProbeWarningKind.EXIT_TIMEOUT, message="\u2028\x00é" * 5_000)
            for _ in range(5)
        ],
        logs=LogStats(relayed_lines=10**9, dropped_lines=10**12, truncated_lines=10**9),
        timings=Timings(**{f: 1e9 for f in Timings.model_fields}),
    )
    encoded = summary.to_json().encode()
    assert len(encoded) <= MAX_SUMMARY_BYTES
    assert len(summary.warnings) == 2
    for warning in summary.warnings:
        assert len(json.dumps(warning.message, ensure_ascii=False).encode()) <= 500
        assert warning.message.endswith("…")
    assert ProbeSummary.model_validate_json(encoded) == summary


def test_only_an_ok_summary_carries_warnings() -> None:
    with pytest.raises(ValidationError, match="only an ok summary carries warnings"):
        ProbeSummary(
            status="error",
            error_kind=ProbeErrorKind.EXIT_STATUS,
            error="x",
            artifact="a",
            language="go",
            warnings=[SummaryWarning(kind=ProbeWarningKind.EMPTY_ANSWER, message="m")],
        )


def test_warning_kinds_are_a_contract() -> None:
    assert {k.name: k.value for k in ProbeWarningKind} == {
        "EXIT_TIMEOUT": "exit_timeout",
        "EMPTY_ANSWER": "empty_answer",
    }


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (ProbeErrorKind.ARTIFACT_REFUSED, ExitCode.ARTIFACT_REFUSED),
        (ProbeErrorKind.LAUNCH_FAILED, ExitCode.DRIVER_ERROR),
        (ProbeErrorKind.DRIVER_ERROR, ExitCode.DRIVER_ERROR),
        (ProbeErrorKind.CONNECT_TIMEOUT, ExitCode.PROBE_FAILED),
        (ProbeErrorKind.PROCESSES_LEFT, ExitCode.PROBE_FAILED),
    ],
)
def test_exit_codes(kind: ProbeErrorKind, code: ExitCode) -> None:
    summary = ProbeSummary(status="error", error_kind=kind, artifact="a", language="go")
    assert summary.exit_code == code
    assert ok_summary("x").exit_code == ExitCode.OK
    assert int(ExitCode.OK) == 0


def test_summary_rejects_a_malformed_hash() -> None:
    with pytest.raises(ValidationError, match="result_sha256"):
        ProbeSummary(status="ok", artifact="a", language="go", result_sha256="ABC")


def test_accepts_the_line_after_the_marker_when_the_hash_matches() -> None:
    line = result_line(RESULT)
    log = "\n".join(['{"event": "starting"}', RESULT_MARKER, line, '{"event": "done"}'])
    assert accept_result(log, ok_summary(line)) == RESULT


def test_result_line_is_one_compact_line() -> None:
    line = result_line(RESULT)
    assert "\n" not in line and ", " not in line
    assert TaskHandlerParsingResult.model_validate_json(line) == RESULT


@pytest.mark.parametrize("text", ["a\u2028b", "a\u2029b", "a\x85b", "a\x1cb", "\u00e9t\u00e9"])
def test_result_with_unicode_line_separators_is_accepted(text: str) -> None:
    # JSON leaves U+2028/U+2029/U+0085 unescaped; str.splitlines() would cut the line there.
    result = RESULT.model_copy(update={"import_errors": {"etl": text}})
    line = result_line(result)
    assert line.isascii()
    log = f"{RESULT_MARKER}\n{line}\n"
    assert accept_result(log, ok_summary(line)).import_errors == {"etl": text}
    # A reader also takes the unescaped form: lines end at "\n" only, as in a container log.
    raw = json.dumps(result.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    accepted = accept_result(f"{RESULT_MARKER}\n{raw}\n", ok_summary(raw))
    assert accepted.import_errors == {"etl": text}


def test_takes_the_last_marker() -> None:
    assert find_result_line(["a", RESULT_MARKER, "first", RESULT_MARKER, "second"]) == "second"
    assert find_result_line(["a", RESULT_MARKER]) is None
    assert find_result_line([f"{RESULT_MARKER}\r\n", "x\r\n"]) == "x"


def test_rejects_a_line_that_does_not_match_the_hash() -> None:
    line = result_line(RESULT)
    tampered = line.replace("extract", "extrakt")
    with pytest.raises(ResultRejected, match=r"the logged result hashes to [0-9a-f]{64}, the"):
        accept_result(f"{RESULT_MARKER}\n{tampered}\n", ok_summary(line))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("", "the result: Invalid JSON"),
        ("{}", "task_handlers: Field required"),
        ('{"task_handlers": {"d": [{"task_id": 1}]}}', "task_handlers.d.0.task_id"),
    ],
)
def test_rejects_a_matching_line_that_is_not_a_result(line: str, says: str) -> None:
    # Found by tests/fuzz: the hash matched, and pydantic's ValidationError escaped.
    with pytest.raises(ResultRejected) as info:
        accept_result(f"{RESULT_MARKER}\n{line}\n", ok_summary(line))
    message = str(info.value)
    assert message.startswith("the logged result is not a valid TaskHandlerParsingResult (")
    assert says in message and "\n" not in message


def test_rejects_a_log_without_marker() -> None:
    with pytest.raises(ResultRejected) as info:
        accept_result("nothing here\n", ok_summary("x"))
    assert str(info.value) == "the probe log has no result marker followed by a line"


def test_rejects_a_failed_probe() -> None:
    failed = ProbeSummary(
        status="error",
        error_kind=ProbeErrorKind.ANSWER_TIMEOUT,
        error="The runtime did not send a parse result within 60s",
        artifact="a",
        language="go",
    )
    with pytest.raises(ResultRejected, match="did not succeed: The runtime did not send"):
        accept_result(f"{RESULT_MARKER}\n{result_line(RESULT)}\n", failed)


def test_control_characters_cannot_inflate_the_summary() -> None:
    summary = ProbeSummary(
        status="error",
        error_kind=ProbeErrorKind.INVALID_MESSAGE,
        error="unexpected message type '" + "\x00" * 5000 + "'",
        artifact="\x01" * 5000,
        language="go",
    )
    assert len(summary.to_json().encode()) <= MAX_SUMMARY_BYTES
    assert summary.error is not None and summary.error.startswith("unexpected message type '")


# -- contracts a reader relies on (pinned value by value) ---------------------------------------


def test_an_error_summary_is_never_accepted_even_with_a_matching_hash() -> None:
    line = result_line(RESULT)
    failed = ProbeSummary(
        status="error",
        error_kind=ProbeErrorKind.EXIT_STATUS,
        error="The runtime exited with code 1 after sending its parse result",
        artifact="a",
        language="go",
        result_sha256=hashlib.sha256(line.encode()).hexdigest(),
    )
    with pytest.raises(ResultRejected, match="the probe did not succeed: The runtime exited"):
        accept_result(f"{RESULT_MARKER}\n{line}\n", failed)


def test_an_ok_summary_without_a_hash_is_not_accepted() -> None:
    summary = ProbeSummary(status="ok", artifact="a", language="go")
    with pytest.raises(ResultRejected, match="the probe did not succeed: no result hash"):
        accept_result(f"{RESULT_MARKER}\n{result_line(RESULT)}\n", summary)


def test_exit_codes_are_a_contract() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "PROBE_FAILED": 1,
        "ARTIFACT_REFUSED": 3,
        "DRIVER_ERROR": 4,
    }


def test_error_kinds_and_their_exit_codes_are_a_contract() -> None:
    assert {k.value: int(k.exit_code) for k in ProbeErrorKind} == {
        "artifact_refused": 3,
        "launch_failed": 4,
        "exited_before_connect": 1,
        "connect_timeout": 1,
        "answer_timeout": 1,
        "exited_without_result": 1,
        "invalid_frame": 1,
        "frame_too_large": 1,
        "invalid_message": 1,
        "duplicate_result": 1,
        "exit_timeout": 1,
        "exit_status": 1,
        "processes_left": 1,
        "driver_error": 4,
    }


def test_an_error_summary_without_a_kind_is_a_driver_error() -> None:
    summary = ProbeSummary(status="error", artifact="a", language="go")
    assert summary.exit_code is ExitCode.DRIVER_ERROR
    assert ProbeSummary(status="ok", artifact="a", language="go").exit_code is ExitCode.OK


def _encoded(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode())


@pytest.mark.parametrize(
    ("field", "limit", "keep_end"),
    [("error", 1200, False), ("artifact", 400, True)],
)
@pytest.mark.parametrize("unit", ["a", "é", "\x00", "😀", "\u2028"])
def test_each_shortened_field_keeps_the_longest_piece_that_fits(
    field: str, limit: int, keep_end: bool, unit: str
) -> None:
    text = "".join(f"{unit}{i % 10}" for i in range(2000))
    kwargs = {"artifact": "a", "error": None, field: text}
    summary = ProbeSummary(status="error", language="go", **kwargs)
    value = getattr(summary, field)
    assert _encoded(value) <= limit
    value.encode("utf-8")  # valid text: never half a character
    if keep_end:
        assert value.startswith("…")
        kept = value[1:]
        assert text.endswith(kept)
        longer = text[len(text) - len(kept) - 1 :]
        assert _encoded("…" + longer) > limit
    else:
        assert value.endswith("…")
        kept = value[:-1]
        assert text.startswith(kept)
        assert _encoded(text[: len(kept) + 1] + "…") > limit


@pytest.mark.parametrize("field", ["error", "artifact"])
def test_a_field_that_fits_is_kept_whole(field: str) -> None:
    text = "x" * 300
    summary = ProbeSummary(
        status="error",
        language="go",
        **{"artifact": "a", field: text},
    )
    assert getattr(summary, field) == text


def test_a_warning_message_is_shortened_to_its_limit_and_stays_text() -> None:
    text = "é\x01" * 1000
    message = SummaryWarning(kind=ProbeWarningKind.EMPTY_ANSWER, message=text).message
    kept = message.removesuffix("…")
    assert message.endswith("…") and text.startswith(kept)
    assert _encoded(message) <= 500
    assert _encoded(text[: len(kept) + 1] + "…") > 500


def test_pids_are_cut_to_sixteen_and_warnings_to_two() -> None:
    summary = ProbeSummary(
        status="ok",
        artifact="a",
        language="go",
        runtime_pids=list(range(100)),
        warnings=[
            SummaryWarning(kind=ProbeWarningKind.EXIT_TIMEOUT, message=str(i)) for i in range(5)
        ],
    )
    assert summary.runtime_pids == list(range(16))
    assert [w.message for w in summary.warnings] == ["0", "1"]


# -- found by mutation testing (docs/mutation-testing.md) -----------------------------------


def test_only_line_ends_are_stripped_from_log_lines() -> None:
    # Trailing blanks and letters belong to the line; only "\r\n" is the container log's.
    assert find_result_line([RESULT_MARKER, "value \t"]) == "value \t"
    assert find_result_line([RESULT_MARKER, "endsInXX\r\n"]) == "endsInXX"
    assert find_result_line([RESULT_MARKER + " ", "not after a marker"]) is None


def test_a_result_holding_timestamps_is_logged_as_json_text() -> None:
    # msgpack timestamps decode to datetimes; the result line must still be JSON.
    stamped = RESULT.model_copy(
        update={"warnings": [dt.datetime(2026, 10, 30, 12, 0, tzinfo=dt.UTC)]}
    )
    line = result_line(stamped)
    assert json.loads(line)["warnings"] == ["2026-10-30T12:00:00Z"]


def test_a_field_of_exactly_its_limit_is_kept_whole() -> None:
    text = "e" * (1200 - 2)  # the JSON string takes its two quotes too
    assert _encoded(text) == 1200
    summary = ProbeSummary(status="error", artifact="a", language="go", error=text)
    assert summary.error == text


def test_the_summary_json_leaves_out_what_is_unset() -> None:
    text = ProbeSummary(status="ok", artifact="a", language="go").to_json()
    assert "null" not in text
    assert json.loads(text)["status"] == "ok"


# --- the streamed reader ---------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from taskhandler_operator.protocol.summary import (  # noqa: E402
    ResultScanner,
)

_LINES = st.lists(
    st.one_of(
        st.just(RESULT_MARKER),
        st.just(RESULT_MARKER + "\r"),
        st.text(alphabet="ab\r{}", max_size=12),
    ),
    max_size=12,
)


def _scan(data: bytes, cuts: list[int], max_line: int) -> ResultScanner:
    scanner = ResultScanner(max_line)
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        scanner.feed(data[start:cut])
        start = cut
    scanner.feed(data[start:])
    scanner.finish()
    return scanner


@given(_LINES, st.lists(st.integers(min_value=0), max_size=6))
@settings(max_examples=300, deadline=None)
def test_the_scanner_finds_what_the_whole_log_reader_finds(
    lines: list[str], cuts: list[int]
) -> None:
    """Fed in any chunks, the streamed reader agrees with :func:`find_result_line` on the whole
    text (lines cut at "\\n" only)."""
    text = "\n".join(lines)
    scanner = _scan(text.encode(), cuts, max_line=64)
    expected = find_result_line(text.split("\n"))
    assert (None if scanner.found is None else scanner.found.decode()) == expected
    assert scanner.bytes_read == len(text.encode())


def test_the_scanner_keeps_only_the_result_line_of_a_huge_log() -> None:
    noise = b"y" * (1 << 20)
    result = b'{"dag_handlers":{}}'
    scanner = ResultScanner(len(result))
    for _ in range(16):  # 16 MiB of noise lines, and one endless line, before the result
        scanner.feed(noise + b"\n")
    scanner.feed(noise * 4)
    scanner.feed(b"\n" + RESULT_MARKER.encode() + b"\n" + result + b"\nbye\n")
    assert scanner.finish() == result
    # What it held at most: a marker-long piece of any line, or the result line.
    assert scanner.peak <= len(RESULT_MARKER) + 16
    assert scanner.bytes_read > 20 * (1 << 20)


def test_a_result_line_longer_than_expected_is_not_kept() -> None:
    scanner = ResultScanner(8)
    scanner.feed(RESULT_MARKER.encode() + b"\n" + b"x" * 100 + b"\n")
    assert scanner.finish() is None and scanner.found_too_long
