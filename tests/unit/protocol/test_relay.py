from __future__ import annotations

import asyncio
import io
import json

import pytest

from taskhandler_operator.protocol.eventlog import EventLog
from taskhandler_operator.protocol.relay import (
    LineSplitter,
    RelayBudget,
    RelayLimits,
    describe_line,
    relay_stream,
)


def test_splits_lines_across_chunks() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b"one\ntw") == [(b"one", False)]
    assert splitter.feed(b"o\r\nthree") == [(b"two", False)]
    assert splitter.finish() == [(b"three", False)]
    assert splitter.finish() == []


def test_long_line_is_cut_once_and_the_rest_discarded() -> None:
    splitter = LineSplitter(4)
    assert splitter.feed(b"abcdefgh") == [(b"abcd", True)]
    assert splitter.feed(b"ijkl") == []  # still the same long line
    assert splitter.feed(b"mn\nok\n") == [(b"ok", False)]


def test_line_of_exactly_the_limit_is_whole() -> None:
    assert LineSplitter(3).feed(b"abc\n") == [(b"abc", False)]


def test_unterminated_cut_line_leaves_nothing_at_finish() -> None:
    splitter = LineSplitter(2)
    assert splitter.feed(b"abc") == [(b"ab", True)]
    assert splitter.finish() == []


def test_rejects_a_zero_limit() -> None:
    with pytest.raises(ValueError, match="max_line_bytes must be positive"):
        LineSplitter(0)


def test_budget_counts_bytes_and_lines() -> None:
    budget = RelayBudget(RelayLimits(max_total_bytes=10, max_lines=3))
    assert budget.admit(4) and budget.admit(4)
    assert not budget.admit(4)  # 12 bytes > 10
    assert budget.admit(2)
    assert not budget.admit(0)  # three lines already relayed
    assert (budget.relayed_lines, budget.relayed_bytes, budget.dropped_lines) == (3, 10, 2)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("info", "info"),
        ("WARN", "warning"),
        ("critical", "error"),
        ("trace", "debug"),
        ("something", "info"),
        (10, "debug"),
        (25, "info"),
        (30, "warning"),
        (50, "error"),
        (None, "info"),
    ],
)
def test_runtime_levels(level: object, expected: str) -> None:
    line = json.dumps({"event": "hello", "level": level}).encode()
    got_level, event, fields = describe_line("logs", line, False)
    assert (got_level, event) == (expected, "hello")
    assert fields["record"]["event"] == "hello"
    assert fields["source"] == "runtime.logs"


def test_non_json_and_stderr_are_text() -> None:
    assert describe_line("logs", b"not json", False) == (
        "info",
        "runtime logs",
        {"source": "runtime.logs", "line": "not json"},
    )
    assert describe_line("stderr", b'{"event": "x"}', False)[2]["line"] == '{"event": "x"}'
    assert describe_line("logs", b"\xff", True)[2] == {
        "source": "runtime.logs",
        "truncated": True,
        "line": "\ufffd",
    }


async def test_deeply_nested_record_is_relayed_as_text_and_relaying_goes_on() -> None:
    # json.loads raises RecursionError (not ValueError) on deep nesting; the relay must not
    # die on it, or the runtime's logs channel would no longer be drained.
    deep = b"[" * 5000 + b"]" * 5000
    out = io.StringIO()
    reader = asyncio.StreamReader()
    reader.feed_data(deep + b'\n{"event":"after","level":"info"}\n')
    reader.feed_eof()
    await relay_stream(reader, "logs", EventLog(out), RelayBudget())
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["runtime logs", "after"]
    assert records[0]["line"] == deep.decode()


def test_long_event_text_is_shortened() -> None:
    _, event, _ = describe_line("logs", json.dumps({"event": "e" * 5000}).encode(), False)
    assert event == "e" * 512


async def test_relay_stream_stops_relaying_past_the_budget() -> None:
    out = io.StringIO()
    budget = RelayBudget(RelayLimits(max_line_bytes=8, max_total_bytes=1000, max_lines=2))
    reader = asyncio.StreamReader()
    reader.feed_data(b'{"event":"a","level":"warning"}\nplain\nthird\nfourth')
    reader.feed_eof()
    await relay_stream(reader, "logs", EventLog(out), budget)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == [
        "runtime logs",  # the JSON record was cut at 8 bytes, so it is relayed as text
        "runtime logs",
        "runtime output exceeds the relay budget; further lines are dropped",
    ]
    assert records[0]["truncated"] is True and records[0]["line"] == '{"event"'
    assert records[1]["line"] == "plain"
    assert (budget.relayed_lines, budget.dropped_lines, budget.truncated_lines) == (2, 2, 1)
