"""Surviving the database going away during a run.

Every connection a run holds — each task's writer, the DWD tables' connections, the run's own bookkeeping —
goes through a :class:`DbSlot` of the run's :class:`DatabaseHealth`. When a statement fails because the
connection is gone (the server restarted, a backend was terminated, the network broke) or the server cannot
take writes for a moment (disk full), the slot drops the connection, the health object *pauses the request
lanes* (no point fetching rows that cannot be stored), reconnects with a bounded exponential backoff and the
operation is run again from its start — safe because every write is an idempotent upsert in one transaction
and the caller restores what the failed transaction had recorded in memory. Once a connection works again the
lanes resume. If the database stays away longer than ``limit`` seconds (``db.unavailable_limit``, default
60 s), every waiting operation raises :class:`DatabaseUnavailable` and the run ends FAILED (exit code 7)
with one line; a rerun completes the work.

Nothing here knows about ODS or DWD; it only tells connection errors from data errors.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import psycopg

from feiqiu_etl.errortext import one_line

T = TypeVar("T")
log = logging.getLogger("feiqiu_etl.db")

BACKOFF_START = 0.25
BACKOFF_MAX = 5.0
_RETRY_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53100", "53200", "53300", "40001", "40P01", "25P03")
"""Connection exceptions, admin/crash shutdown, cannot connect now, disk full, out of memory, too many
connections, serialization failure, deadlock, idle-in-transaction timeout: worth a reconnect and a retry."""


class DatabaseUnavailable(Exception):
    """The database stayed unreachable past the run's limit (or the run was cancelled while waiting)."""


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that a fresh connection may cure (not for bad data or SQL)."""
    if isinstance(exc, DatabaseUnavailable):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return sqlstate.startswith(_RETRY_SQLSTATES)
    if isinstance(exc, psycopg.OperationalError):
        return True
    if isinstance(exc, psycopg.InterfaceError):
        return "connection" in str(exc).lower()
    return False


@dataclass(frozen=True)
class HealthStatistics:
    available: bool
    outages: int
    down_for: float
    reconnects: int
    last_error: str | None
    gave_up: bool


class DatabaseHealth:
    """A run's database availability (thread-safe). ``connect(dsn)`` opens connections; ``limit`` (s) is
    how long an outage is waited out; ``cancel_event`` ends waiting early; ``on_down(reason)``/``on_up()``
    are called when an outage starts and ends (the runner pauses and resumes its lanes there) and
    ``on_gave_up(reason)`` once when the limit is passed (the runner stops its lanes)."""

    def __init__(self, dsn: str, connect: Callable[[str], psycopg.Connection], *, limit: float = 60.0,
                 cancel_event: threading.Event | None = None, on_down: Callable[[str], None] | None = None,
                 on_up: Callable[[], None] | None = None, on_gave_up: Callable[[str], None] | None = None):
        self.dsn = dsn
        self._connect = connect
        self.limit = limit
        self._cancel = cancel_event
        self._on_down = on_down
        self._on_up = on_up
        self._on_gave_up = on_gave_up
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._outages = 0
        self._reconnects = 0
        self._last_error: str | None = None
        self._gave_up = False

    def slot(self, *, autocommit: bool = False) -> "DbSlot":
        return DbSlot(self, autocommit=autocommit)

    @property
    def gave_up(self) -> bool:
        with self._lock:
            return self._gave_up

    def _failed(self, exc: BaseException) -> None:
        text = one_line(exc, 200, with_type=False)
        with self._lock:
            self._last_error = text
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
                self._outages += 1
        if first:
            log.warning("database unavailable (%s); pausing the lanes and reconnecting, for at most %.0f s",
                        text, self.limit)
            if self._on_down is not None:
                self._on_down(text)

    def _recovered(self) -> None:
        with self._lock:
            was_down = self._down_since is not None
            if not was_down:
                return
            since = self._down_since
            self._down_since = None
            self._reconnects += 1
        if was_down:
            log.warning("database back after %.1f s; resuming", time.monotonic() - (since or time.monotonic()))
            if self._on_up is not None:
                self._on_up()

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection:
        """A new connection, waiting out an outage (backoff 0.25 s doubling to 5 s) up to ``limit`` seconds
        after it began. Raises :class:`DatabaseUnavailable` past the limit or on cancel."""
        delay = BACKOFF_START
        while True:
            try:
                conn = self._connect(self.dsn)
                conn.autocommit = autocommit
                return conn
            except psycopg.Error as exc:
                self._failed(exc)
            self._wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    def _wait(self, delay: float) -> None:
        """Sleep ``delay`` (cancellable) before the next try, or raise once the outage passed the limit."""
        notify = gave_up = False
        reason = ""
        with self._lock:
            since = self._down_since or time.monotonic()
            left = self.limit - (time.monotonic() - since)
            if left <= 0 or self._gave_up:
                notify, gave_up = not self._gave_up, True
                self._gave_up = True
                reason = f"database unavailable for more than {self.limit:.0f} s: {self._last_error}"
        if gave_up:
            if notify:
                log.error("%s; stopping the run", reason)
                if self._on_gave_up is not None:
                    self._on_gave_up(reason)
            raise DatabaseUnavailable(reason)
        pause = min(delay, left)
        if self._cancel is not None:
            if self._cancel.wait(pause):
                raise DatabaseUnavailable(f"cancelled while the database was unavailable: {self._last_error}")
        else:
            time.sleep(pause)

    def statistics(self) -> HealthStatistics:
        with self._lock:
            down = time.monotonic() - self._down_since if self._down_since is not None else 0.0
            return HealthStatistics(self._down_since is None, self._outages, down, self._reconnects,
                                    self._last_error, self._gave_up)


class DbSlot:
    """One user's connection (one thread). :meth:`run` executes ``op(conn)`` and, on a connection error,
    reconnects and runs it again from the start (``on_retry()`` first, to restore in-memory state)."""

    def __init__(self, health: DatabaseHealth, *, autocommit: bool = False):
        self.health = health
        self._autocommit = autocommit
        self._conn: psycopg.Connection | None = None

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self.health.connect(autocommit=self._autocommit)
        return self._conn

    def run(self, op: Callable[[psycopg.Connection], T], *, on_retry: Callable[[], None] | None = None) -> T:
        """``op(conn)``, retried on a fresh connection after a connection error until it succeeds (the
        outage ends with the first operation that succeeds, not with a connect: a full disk accepts
        connections but no writes). Raises :class:`DatabaseUnavailable` past the limit."""
        delay = BACKOFF_START
        while True:
            conn = self.conn
            try:
                value = op(conn)
                self.health._recovered()
                return value
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                self.health._failed(exc)
                self.discard()
                if on_retry is not None:
                    on_retry()
                self.health._wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is gone anyway
                pass

    def close(self) -> None:
        self.discard()

    def __enter__(self) -> "DbSlot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DirectSlot:
    """A :class:`DbSlot` without recovery: one connection, errors propagate (tests, simple callers)."""

    def __init__(self, dsn: str, connect: Callable[[str], psycopg.Connection]):
        self._dsn = dsn
        self._connect = connect
        self._conn: psycopg.Connection | None = None

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self._dsn)
        return self._conn

    def run(self, op: Callable[[psycopg.Connection], T], *, on_retry: Callable[[], None] | None = None) -> T:
        return op(self.conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
