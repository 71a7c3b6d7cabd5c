"""Per-task log buffering (spec §3.8, §4.5, Property 15).

Tasks of a flow run concurrently, so their log lines would interleave. A :class:`TaskLogBuffer` collects
one task's entries (from any thread) and, at the end of the task, ``flush()`` returns them in one block, in
timestamp order — and, unless ``emit=False``, writes them to the parent logger, each prefixed
``[TASK_CODE]``. It never writes anything before ``flush()`` and never mixes tasks: each buffer only holds
what was logged into it.

Usage (the TaskExecutor, which also lets each line reach stderr the moment it is logged and stores the
block with the run)::

    buffer = TaskLogBuffer(code, parent_logger)
    task_logger.addHandler(buffer.handler())
    ...                                # run the task; lines propagate to stderr as they happen
    block = buffer.flush(emit=False)   # the task's ordered block, stored with the run

The time source is injectable (``now=``) so tests can produce out-of-order timestamps deterministically.
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

_OUTPUT_LOCK = threading.RLock()
"""Held while a flush writes out, so blocks of tasks finishing at the same time never interleave."""


@dataclass(frozen=True)
class LogEntry:
    """One buffered line (spec §4.5). ``message`` is already formatted (``msg % args``)."""

    timestamp: datetime
    level: int
    task_code: str
    message: str


class TaskLogBuffer:
    """Thread-safe buffer of one task's log entries; see the module docstring."""

    def __init__(
        self,
        task_code: str,
        parent_logger: logging.Logger,
        *,
        now: Callable[[], datetime] = datetime.now,
    ):
        self.task_code = task_code
        self._parent = parent_logger
        self._now = now
        self._lock = threading.Lock()
        self._buffer: list[LogEntry] = []
        self._flushing = threading.local()

    def log(self, level: int, message: str, *args: Any, exc_info: Any = None) -> LogEntry:
        """Buffer one entry, formatted like ``logging`` does (``message % args`` when args are given).

        ``exc_info=True`` (or an exception) appends the traceback. Returns the entry.
        """
        text = message % args if args else str(message)
        if exc_info:
            text = f"{text}\n{_format_exc(exc_info)}"
        return self._append(level, text)

    def debug(self, message: str, *args: Any, **kwargs: Any) -> LogEntry:
        return self.log(logging.DEBUG, message, *args, **kwargs)

    def info(self, message: str, *args: Any, **kwargs: Any) -> LogEntry:
        return self.log(logging.INFO, message, *args, **kwargs)

    def warning(self, message: str, *args: Any, **kwargs: Any) -> LogEntry:
        return self.log(logging.WARNING, message, *args, **kwargs)

    def error(self, message: str, *args: Any, **kwargs: Any) -> LogEntry:
        return self.log(logging.ERROR, message, *args, **kwargs)

    def _append(self, level: int, text: str) -> LogEntry:
        with self._lock:
            entry = LogEntry(timestamp=self._now(), level=level, task_code=self.task_code, message=text)
            self._buffer.append(entry)
            return entry

    def flush(self, *, emit: bool = True) -> list[LogEntry]:
        """Write every buffered entry to the parent logger (unless ``emit`` is False), oldest first (ties keep
        logging order), as ``"[TASK_CODE] message"``, in one contiguous block; empty the buffer and return
        the entries.

        Entries logged while a flush is writing go to the next flush. Records that the parent logger's
        own handlers route back into this buffer during the flush are ignored (no loop, no deadlock).
        """
        with self._lock:
            entries = sorted(self._buffer, key=lambda e: e.timestamp)
            self._buffer.clear()
        if not emit:
            return entries
        with _OUTPUT_LOCK:
            self._flushing.active = True
            try:
                for entry in entries:
                    self._parent.log(entry.level, "[%s] %s", entry.task_code, entry.message)
            finally:
                self._flushing.active = False
        return entries

    def handler(self, level: int = logging.NOTSET) -> "TaskLogHandler":
        """A ``logging.Handler`` that buffers the records of the logger it is attached to."""
        return TaskLogHandler(self, level)

    def __len__(self) -> int:
        with self._lock:
            return len(self._buffer)

    def __repr__(self) -> str:
        return f"<TaskLogBuffer {self.task_code} entries={len(self)}>"


class TaskLogHandler(logging.Handler):
    """Routes a task's ``logging.Logger`` into its :class:`TaskLogBuffer` (message text and traceback;
    the buffer's clock stamps the entry). Formatting of the final line is the parent's handlers' job."""

    def __init__(self, buffer: TaskLogBuffer, level: int = logging.NOTSET):
        super().__init__(level)
        self.buffer = buffer

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self.buffer._flushing, "active", False):  # noqa: SLF001 - our own flush writing out
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text = f"{text}\n{_format_exc(record.exc_info)}"
            self.buffer._append(record.levelno, text)  # noqa: SLF001 - the handler is part of the buffer
        except Exception:
            self.handleError(record)


def _format_exc(exc_info: Any) -> str:
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif not isinstance(exc_info, tuple):
        return traceback.format_exc().rstrip()
    return "".join(traceback.format_exception(*exc_info)).rstrip()
