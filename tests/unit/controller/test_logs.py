"""Log formats, bundle context and redaction, through the real logging machinery."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskhandler_operator.controller.logs import (
    LogFormat,
    Redactor,
    bundle_context,
    configure,
    current_context,
    set_revision,
    uninstall_record_factory,
)

SECRET = "hunter2-Sup3r/s3cret+key"
log = logging.getLogger("taskhandler_operator.tests.logs")

Emit = Callable[[], str]


@pytest.fixture
def capture() -> Iterator[Callable[[str], tuple[io.StringIO, Redactor]]]:
    root = logging.getLogger()
    before_handlers, before_level = list(root.handlers), root.level
    installed: list[logging.Handler] = []

    def setup(fmt: str) -> tuple[io.StringIO, Redactor]:
        stream = io.StringIO()
        redactor = Redactor([SECRET])
        installed.append(configure(fmt, level=logging.DEBUG, redactor=redactor, stream=stream))
        return stream, redactor

    try:
        yield setup
    finally:
        for handler in installed:
            root.removeHandler(handler)
        root.handlers[:] = before_handlers
        root.setLevel(before_level)
        uninstall_record_factory()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


# --- redaction -------------------------------------------------------------------------------


def leak_everywhere() -> None:
    log.info("connecting with %s", SECRET)
    log.warning("url https://example.org/x?token=%s", urllib.parse.quote(SECRET, safe=""))
    log.info(
        "dumped Secret: %s", {"data": {"password": base64.b64encode(SECRET.encode()).decode()}}
    )
    log.info("an extra field", extra={"detail": f"password {SECRET}"})
    try:
        raise RuntimeError(f"authentication failed for {SECRET}")
    except RuntimeError:
        log.exception("sync failed")
    log.info("stack", stack_info=True, extra={"note": SECRET})


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_a_planted_secret_never_reaches_the_output(
    capture: Callable[[str], tuple[io.StringIO, Redactor]], fmt: str
) -> None:
    stream, _ = capture(fmt)
    leak_everywhere()
    out = stream.getvalue()
    assert "sync failed" in out and "RuntimeError" in out  # the records themselves got out
    for spelling in (
        SECRET,
        urllib.parse.quote(SECRET, safe=""),
        base64.b64encode(SECRET.encode()).decode(),
        "hunter2",
    ):
        assert spelling not in out
    assert out.count("***") >= 5  # message, query, base64, traceback (+ extras in JSON)


def test_other_handlers_get_the_scrubbed_text_too(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    # kopf or a test harness may add their own handler; they must not see the raw message.
    capture("json")
    other = io.StringIO()
    handler = logging.StreamHandler(other)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("kopf").addHandler(handler)
    try:
        logging.getLogger("kopf.objects").error("login with %s failed", SECRET)
        try:
            raise ValueError(SECRET)
        except ValueError:
            logging.getLogger("kopf.objects").exception("boom")
    finally:
        logging.getLogger("kopf").removeHandler(handler)
    text = other.getvalue()
    assert "login with *** failed" in text and "ValueError: ***" in text
    assert SECRET not in text


def test_secrets_registered_later_are_scrubbed_too(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, redactor = capture("plain")
    redactor.add(b"late-arriving-value")
    log.info("value is late-arriving-value")
    assert "late-arriving-value" not in stream.getvalue()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "postgresql://airflow:pa55w0rd@db:5432/airflow",
            "postgresql://airflow:***@db:5432/airflow",
        ),
        ("https://user:tok@git.example/x.git", "https://user:***@git.example/x.git"),
        ("https://git.example/x.git", "https://git.example/x.git"),
        ("GET /a?x=1&token=abc.def&y=2", "GET /a?x=1&token=***&y=2"),
        ("password=letmein user=bob", "password=*** user=bob"),
        ('{"password": "letmein", "user": "bob"}', '{"password": "***", "user": "bob"}'),
        ("X-Amz-Signature=0123abcd&X-Amz-Date=2026", "X-Amz-Signature=***&X-Amz-Date=2026"),
        ("/artifacts/a.jar?expires=99&sig=Zm9vYmFy", "/artifacts/a.jar?expires=99&sig=***"),
        ("Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.x.y", "Authorization: Bearer ***"),
        ("tokens are counted, a passwordless login", "tokens are counted, a passwordless login"),
        ("api_token=1", "api_token=1"),  # not a listed name: prefix of a longer word
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert Redactor()(text) == expected


def test_short_values_are_not_registered() -> None:
    redactor = Redactor(["ab", ""])
    assert redactor("a tab and a cab") == "a tab and a cab"


def test_longer_secret_containing_a_shorter_one_is_masked_whole() -> None:
    redactor = Redactor(["secret1", "secret1-and-more"])
    assert redactor("x secret1-and-more y") == "x *** y"


def test_unformattable_arguments_do_not_lose_the_record(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, _ = capture("plain")
    log.info("two %s %s", SECRET)
    out = stream.getvalue()
    assert "unformattable log arguments" in out
    assert SECRET not in out


# --- context and formats ---------------------------------------------------------------------


def test_json_lines_carry_namespace_name_revision(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, _ = capture("json")
    log.info("outside")
    with bundle_context("team-a", "java-handlers"):
        log.info("syncing")
        set_revision("main@1a2b3c4")
        log.warning("probing %d artifacts", 3)
    first, second, third = lines(stream)
    assert first["namespace"] is None and first["name"] is None
    assert second | {"time": None} == {
        "time": None,
        "level": "INFO",
        "logger": "taskhandler_operator.tests.logs",
        "message": "syncing",
        "namespace": "team-a",
        "name": "java-handlers",
        "revision": None,
    }
    assert third["message"] == "probing 3 artifacts"
    assert third["revision"] == "main@1a2b3c4"
    assert third["level"] == "WARNING"
    assert third["time"].endswith("Z") and "T" in third["time"]
    assert current_context() is None


async def test_context_follows_tasks_and_threads(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, _ = capture("json")

    async def bundle(name: str) -> None:
        with bundle_context("ns", name, revision=f"rev-{name}"):
            await asyncio.sleep(0)
            await asyncio.create_task(asyncio.to_thread(log.info, "in a thread"))
            log.info("in the task")

    await asyncio.gather(bundle("one"), bundle("two"))
    records = lines(stream)
    assert len(records) == 4
    for record in records:
        assert record["revision"] == f"rev-{record['name']}"
    assert {r["name"] for r in records} == {"one", "two"}


def test_kopf_object_reference_is_used_without_a_context(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, _ = capture("json")
    ref = {"kind": "TaskHandlerBundle", "namespace": "ns", "name": "from-kopf", "uid": "u"}
    logging.getLogger("kopf.objects").info("handler done", extra={"k8s_ref": ref})
    (record,) = lines(stream)
    assert (record["namespace"], record["name"]) == ("ns", "from-kopf")
    assert "k8s_ref" not in record


def test_plain_lines_show_the_bundle(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    stream, _ = capture("plain")
    with bundle_context("ns", "go-handlers", revision="abc123"):
        log.info("published %d bindings", 7)
    log.info("idle")
    first, second = stream.getvalue().splitlines()
    assert first.endswith(
        "INFO taskhandler_operator.tests.logs [ns/go-handlers@abc123] published 7 bindings"
    )
    assert second.endswith("INFO taskhandler_operator.tests.logs idle")
    assert first[:4].isdigit() and first[23] == "Z"


def test_configure_again_replaces_its_handler(
    capture: Callable[[str], tuple[io.StringIO, Redactor]],
) -> None:
    first, _ = capture("plain")
    second, _ = capture("json")
    log.info("once")
    assert first.getvalue() == ""
    assert len(lines(second)) == 1
    ours = [h for h in logging.getLogger().handlers if h.filters]
    assert len(ours) == 1


def test_unknown_format_is_one_line_error() -> None:
    with pytest.raises(ValueError, match="unknown log format 'yaml'; use one of: plain, json"):
        configure("yaml")
    assert LogFormat("json") is LogFormat.JSON


def test_set_revision_outside_a_bundle_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="outside bundle_context"):
        set_revision("x")


# --- kopf's routine successes -----------------------------------------------------------------


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_event_handlers_successes_are_debug_others_stay_info(
    capture: Callable[[str], tuple[io.StringIO, Redactor]], level: int
) -> None:
    stream, _ = capture("json")
    logging.getLogger().setLevel(level)
    kopf_log = logging.getLogger("kopf.objects")
    for handler in ("wake-on-vanish", "job_event", "pod_event", "wake-create"):
        kopf_log.info("Handler '%s' succeeded.", handler)
    kopf_log.error("Handler 'job_event' failed with an exception and will try again.")
    log.info("Handler 'pod_event' succeeded.")  # not kopf's: left alone
    seen = [(line["level"], line["message"]) for line in lines(stream)]
    routine = [
        ("DEBUG", f"Handler '{handler}' succeeded.")
        for handler in ("wake-on-vanish", "job_event", "pod_event")
    ]
    expected = [
        *(routine if level == logging.DEBUG else []),
        ("INFO", "Handler 'wake-create' succeeded."),
        ("ERROR", "Handler 'job_event' failed with an exception and will try again."),
        ("INFO", "Handler 'pod_event' succeeded."),
    ]
    assert seen == expected
