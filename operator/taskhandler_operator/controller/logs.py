"""Logging for the operator process: plain or JSON lines, bundle context, secret redaction.

* :func:`configure` installs one stderr handler on the root logger in ``plain`` or ``json``
  format (python-json-logger, which kopf uses for its own ``--log-format=json``).
* :func:`bundle_context` sets, for the current task and everything it starts (asyncio tasks and
  ``asyncio.to_thread`` copy context variables), the namespace, name and revision that every
  record logged during a bundle's work then carries, whatever module logs it. Records from
  kopf's per-object logger carry its ``k8s_ref`` instead, which is used when no context is set.
* :class:`Redactor` scrubs secret values registered at run time (what the operator read from
  Secrets: passwords, tokens, keys), their base64 and URL-quoted spellings, URL userinfo
  passwords and ``password=``/``token=``-like parameters. The message, its arguments, the
  traceback and the stack are scrubbed when the record is created (a wrapped LogRecord
  factory), so every handler in the process gets the scrubbed text; ``extra=`` values, which
  are attached after creation, are scrubbed by the filter on our handler. (A filter on a logger
  would not do: it does not see records propagated from child loggers.)
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from taskhandler_operator.redaction import (
    MASK,
    compile_values,
    credential_spellings,
    scrub_patterns,
    spellings,
)

CONTEXT_FIELDS = ("namespace", "name", "revision")


class Redactor:
    """Replaces secrets in text with ``***``. Thread-safe; secrets can be added at any time.

    The values and their spellings, and the patterns, are :mod:`taskhandler_operator.redaction`'s
    (one redaction for logs, events, status and CLI output). Values shorter than ``min_length``
    are not registered: scrubbing every "ab" in every line would make the logs unreadable.
    """

    def __init__(self, secrets: Iterable[str | bytes] = (), *, min_length: int = 6) -> None:
        self._min_length = min_length
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str | bytes) -> None:
        found: set[str] = set()
        for secret in secrets:
            found |= spellings(secret)
        self._register(found)

    def add_credentials(self, credentials: Mapping[str, bytes]) -> None:
        """A Secret's data: its values and the basic-auth pairs they form."""
        self._register(credential_spellings(credentials))

    def _register(self, found: set[str]) -> None:
        found = {s for s in found if len(s) >= self._min_length}
        if not found:
            return
        with self._lock:
            if found <= self._values:
                return
            self._values |= found
            self._pattern = compile_values(self._values)

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MASK, text)
        return scrub_patterns(text)


# --- bundle context ------------------------------------------------------------------------


@dataclass(frozen=True)
class LogContext:
    namespace: str
    name: str
    revision: str | None = None


_context: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar(
    "taskhandler_operator_log_context", default=None
)


@contextlib.contextmanager
def bundle_context(namespace: str, name: str, revision: str | None = None) -> Iterator[None]:
    """Tag every record logged inside the block (this task and what it starts) with the bundle."""
    token = _context.set(LogContext(namespace, name, revision))
    try:
        yield
    finally:
        _context.reset(token)


def set_revision(revision: str | None) -> None:
    """Record the revision once the source has synced; only inside :func:`bundle_context`."""
    current = _context.get()
    if current is None:
        raise RuntimeError("set_revision outside bundle_context")
    _context.set(replace(current, revision=revision))


def current_context() -> LogContext | None:
    return _context.get()


# --- the filter and formatters -------------------------------------------------------------

# Standard LogRecord attributes plus kopf's extras: everything else on a record is an extra a
# caller passed, which the JSON formatter prints and so must be redacted too.
_STANDARD_ATTRS = frozenset(RESERVED_ATTRS) | {"message", "asctime", "k8s_skip", "settings"}


_exc_formatter = logging.Formatter()


def _scrub_text(record: logging.LogRecord, redact: Redactor) -> None:
    """Message (with its arguments), traceback and stack, redacted in place."""
    try:
        message = record.getMessage()
    except Exception as exc:  # a bad format string must not lose the record
        message = f"{record.msg!r} (unformattable log arguments: {exc})"
    record.msg = redact(message)
    record.args = None
    if record.exc_info and not record.exc_text:
        record.exc_text = _exc_formatter.formatException(record.exc_info)
    # Formatters print exc_text when exc_info is gone; dropping exc_info keeps them from
    # formatting the traceback again, unredacted.
    record.exc_info = None
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class _RecordFactory:
    """Wraps the process's LogRecord factory so every record's text is scrubbed as it is
    created: no handler (ours, kopf's, a test harness's) ever sees the raw message or
    traceback. It adds no attributes, since ``extra=`` may not overwrite one."""

    def __init__(self, inner: Callable[..., logging.LogRecord], redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        _scrub_text(record, self.redactor)
        return record


def install_record_factory(redactor: Redactor) -> None:
    """Scrub every record from now on (idempotent: replaces our earlier factory)."""
    current = logging.getLogRecordFactory()
    inner = current.inner if isinstance(current, _RecordFactory) else current
    logging.setLogRecordFactory(_RecordFactory(inner, redactor))


def uninstall_record_factory() -> None:
    current = logging.getLogRecordFactory()
    if isinstance(current, _RecordFactory):
        logging.setLogRecordFactory(current.inner)


class ContextFilter(logging.Filter):
    """On our handler: adds namespace/name/revision and scrubs ``extra=`` string values.

    Extras are attached after the record factory ran, so they are scrubbed here; the bundle
    context is read here too (handlers run in the logging call's thread and context).
    """

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self._redact = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in list(vars(record).items()):
            if key not in _STANDARD_ATTRS and isinstance(value, str):
                setattr(record, key, self._redact(value))
        if record.args is not None or record.exc_info is not None:
            _scrub_text(record, self._redact)  # a record made before the factory was installed
        context = _context.get()
        if context is not None:
            values: dict[str, Any] = {
                "namespace": context.namespace,
                "bundle_name": context.name,
                "revision": context.revision,
            }
        else:
            # kopf's per-object logger (handlers' ``logger`` kwarg) carries the object ref.
            ref = getattr(record, "k8s_ref", None) or {}
            values = {"namespace": ref.get("namespace"), "bundle_name": ref.get("name")}
        # LogRecord.name is the logger's name, so the bundle's name travels as ``bundle_name``.
        for key, value in values.items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        return True


#: kopf's watch-event handlers (``kopf.on.event``), which run on every event of every bundle,
#: probe Job and probe pod: kopf logs each success at INFO, one line per status patch.
EVENT_HANDLERS = frozenset({"wake-on-vanish", "job_event", "pod_event"})
_HANDLER_SUCCEEDED = re.compile(r"Handler '([^']+)' succeeded\.")


class RoutineSuccessFilter(logging.Filter):
    """On our handler: kopf's "Handler '<id>' succeeded." for :data:`EVENT_HANDLERS` becomes
    DEBUG (dropped at INFO). Their failures, and every other handler's success, stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not record.name.startswith("kopf"):
            return True
        found = _HANDLER_SUCCEEDED.fullmatch(record.getMessage())
        if found is None or found[1] not in EVENT_HANDLERS:
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


class PlainFormatter(logging.Formatter):
    """``2026-11-30T12:00:00.123Z INFO logger [ns/name@rev] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(bundle)s%(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc(record.created)

    def format(self, record: logging.LogRecord) -> str:
        namespace = getattr(record, "namespace", None)
        name = _bundle_name(record)
        revision = getattr(record, "revision", None)
        bundle = ""
        if name:
            bundle = f"[{namespace}/{name}" if namespace else f"[{name}"
            bundle += f"@{revision}] " if revision else "] "
        record.bundle = bundle
        return super().format(record)


def _bundle_name(record: logging.LogRecord) -> str | None:
    value = getattr(record, "bundle_name", None)
    return value if isinstance(value, str) else None


class JsonLineFormatter(JsonFormatter):
    """One JSON object per line: time, level, logger, message, namespace, name, revision, extras."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
            reserved_attrs=[*RESERVED_ATTRS, "k8s_skip", "k8s_ref", "settings", "bundle"],
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["time"] = _utc(record.created)
        # ``name`` is the logger; the bundle's name is in ``bundle_name`` (see ContextFilter).
        log_data["namespace"] = getattr(record, "namespace", None)
        log_data["name"] = _bundle_name(record)
        log_data.pop("bundle_name", None)
        log_data["revision"] = getattr(record, "revision", None)


def _utc(created: float) -> str:
    moment = datetime.fromtimestamp(created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class LogFormat(enum.Enum):
    PLAIN = "plain"
    JSON = "json"


_HANDLER_MARK = "_taskhandler_operator_handler"


def configure(
    log_format: LogFormat | str = LogFormat.PLAIN,
    *,
    level: int | str = logging.INFO,
    redactor: Redactor | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Route all logging through one handler on the root logger; returns it.

    Calling it again replaces the handler this function installed before (and only that one),
    so tests and a re-configuring CLI do not stack handlers. It also installs the record
    factory that adds the bundle context and redacts (process-wide, see :class:`_RecordFactory`).
    """
    try:
        chosen = LogFormat(log_format)
    except ValueError:
        raise ValueError(
            f"unknown log format {log_format!r}; use one of: "
            + ", ".join(f.value for f in LogFormat)
        ) from None
    redactor = redactor or Redactor()
    install_record_factory(redactor)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(RoutineSuccessFilter())
    handler.addFilter(ContextFilter(redactor))
    handler.setFormatter(JsonLineFormatter() if chosen is LogFormat.JSON else PlainFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
