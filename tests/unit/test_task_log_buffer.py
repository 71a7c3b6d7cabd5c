"""``TaskLogBuffer`` edges (spec §7.3): empty buffer, formatting, the logging handler, tracebacks, a parent
logger that routes back into the buffer, and concurrent writers. Ordering and isolation across tasks are
Property 15 (tests/properties/test_log_buffer_properties.py)."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta

from feiqiu_etl.pipeline.log_buffer import LogEntry, TaskLogBuffer

T0 = datetime(2026, 1, 1)


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def parent() -> tuple[logging.Logger, Capture]:
    logger = logging.getLogger(f"tests.logbuffer.{uuid.uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    capture = Capture()
    logger.addHandler(capture)
    return logger, capture


def ticking(*offsets: int):
    it = iter(offsets)
    return lambda: T0 + timedelta(seconds=next(it))


def test_empty_buffer_flushes_nothing():
    logger, capture = parent()
    buf = TaskLogBuffer("ODS_MEMBER", logger)
    assert buf.flush() == [] and capture.lines == [] and len(buf) == 0


def test_messages_are_formatted_prefixed_and_sorted_by_time():
    logger, capture = parent()
    buf = TaskLogBuffer("ODS_MEMBER", logger, now=ticking(5, 1, 1))
    buf.info("page %d of %s", 2, "members")
    buf.warning("literal %s without args")
    buf.error("late %s", "error")
    entries = buf.flush()
    assert entries == [
        LogEntry(T0 + timedelta(seconds=1), logging.WARNING, "ODS_MEMBER", "literal %s without args"),
        LogEntry(T0 + timedelta(seconds=1), logging.ERROR, "ODS_MEMBER", "late error"),
        LogEntry(T0 + timedelta(seconds=5), logging.INFO, "ODS_MEMBER", "page 2 of members"),
    ]
    assert capture.lines == [(logging.WARNING, "[ODS_MEMBER] literal %s without args"),
                             (logging.ERROR, "[ODS_MEMBER] late error"),
                             (logging.INFO, "[ODS_MEMBER] page 2 of members")]
    assert buf.flush() == [] and len(capture.lines) == 3


def test_handler_routes_a_task_logger_into_the_buffer_with_tracebacks():
    logger, capture = parent()
    buf = TaskLogBuffer("ODS_SETTLEMENT", logger)
    task_logger = logging.getLogger(f"tests.logbuffer.task.{uuid.uuid4().hex}")
    task_logger.setLevel(logging.DEBUG)
    task_logger.propagate = False
    task_logger.addHandler(buf.handler(logging.INFO))
    task_logger.debug("below the handler level")
    try:
        raise ValueError("bad page")
    except ValueError:
        task_logger.exception("page %s failed", 3)
    buf.error("direct", exc_info=ValueError("given"))
    assert capture.lines == []  # nothing before the flush
    entries = buf.flush()
    assert [e.message.splitlines()[0] for e in entries] == ["page 3 failed", "direct"]
    assert "ValueError: bad page" in entries[0].message and "ValueError: given" in entries[1].message
    assert all(line.startswith("[ODS_SETTLEMENT] ") for _, line in capture.lines)


def test_parent_that_feeds_back_into_the_buffer_neither_loops_nor_deadlocks():
    logger, capture = parent()
    buf = TaskLogBuffer("ODS_GOODS", logger)
    logger.addHandler(buf.handler())  # misconfiguration: the parent routes into the same buffer
    buf.info("one")
    done = threading.Event()
    threading.Thread(target=lambda: (buf.flush(), done.set()), daemon=True).start()
    assert done.wait(5.0), "flush deadlocked"
    assert capture.lines == [(logging.INFO, "[ODS_GOODS] one")] and len(buf) == 0


def test_concurrent_writers_lose_nothing():
    logger, _ = parent()
    buf = TaskLogBuffer("ODS_PAYMENT", logger)
    threads = [threading.Thread(target=lambda n=n: [buf.info("t%d-%d", n, i) for i in range(200)]) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = buf.flush()
    assert len(entries) == 800 and len({e.message for e in entries}) == 800
    assert [e.timestamp for e in entries] == sorted(e.timestamp for e in entries)
