"""Surviving the database going away during a run — and never waiting on it without a bound.

Every connection the lanes of a run use — each task's writer, the DWD tables, the run's own bookkeeping — comes
from ONE bounded pool (psycopg-pool, ``db.pool_size`` connections whatever the number of lanes) through a
:class:`DbSlot` of the run's :class:`DatabaseHealth`. A slot checks a connection out for one operation (one
transaction) and gives it back. When an operation fails because the connection is gone (the server restarted,
a backend was terminated, the network broke, the server froze) or the server cannot take writes for a moment
(disk full), the slot drops that connection, the health object *pauses the request lanes* (no point fetching
rows that cannot be stored), and the operation runs again from its start on another connection, with a bounded
exponential backoff — safe because every write is an idempotent upsert in one transaction and the caller
restores what the failed transaction had recorded in memory.

**Who resumes.** The pause and the resume are decided under one lock, together with the figures they follow,
and every operation reports how it ended in a ``finally`` block: the lanes resume as soon as the server answers
an operation after the last failure (it is back, even while other operations still retry), or once no operation
is retrying any more — so whatever way the last retrying operation ends (it succeeds, gives up, is cancelled,
meets a data error) nobody is left paused. (Issue 19's 200-lane hang was a pause applied by one thread after
another thread's success had already "resumed": nobody ever resumed again, and nobody looked at the limit.)

**Within the limit.** A retrying operation gives up once it has failed for longer than ``limit`` seconds
(``db.unavailable_limit``, counted from the server's last answer when the watchdog knows it): it raises
:class:`DatabaseUnavailable`, ``on_gave_up(reason)`` stops the lanes once, and the run ends FAILED (exit 7)
with one line. Each attempt is bounded too: a connect by ``db.connect_timeout``, a pool checkout by the limit,
a statement on a live server by ``statement_timeout``/``lock_timeout``
(:class:`~feiqiu_etl.db.connection.DbLimits`), and a statement on a server that stopped answering — frozen,
``SIGSTOP``, a Unix socket where TCP keepalives do not apply — by the
:class:`~feiqiu_etl.db.watchdog.DatabaseWatchdog`: when nothing has answered for ``stall`` seconds while a
statement waits, it shuts the sockets of every statement in flight down (the waiting threads get a connection
error at once). Once the run is cancelled, an operation meets a
database that is away with :class:`DatabaseUnavailable` at once instead of waiting for it.

The pool and its checkouts are :mod:`feiqiu_etl.db.pool`, the watchdog :mod:`feiqiu_etl.db.watchdog`, the rule
that tells connection errors from data errors :mod:`feiqiu_etl.db.errors`; nothing here knows about ODS or DWD.
"""


from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.db.errors import DatabaseUnavailable, is_connection_error
from feiqiu_etl.db.pool import RunPool
from feiqiu_etl.db.watchdog import DatabaseWatchdog, WatchdogStatistics, stall_seconds, stuck_seconds
from feiqiu_etl.errortext import one_line

__all__ = ["DatabaseHealth", "DatabaseUnavailable", "DbSlot", "DirectSlot", "HealthStatistics", "is_connection_error"]

T = TypeVar("T")
log = logging.getLogger("feiqiu_etl.db")

BACKOFF_START = 0.25
BACKOFF_MAX = 5.0


@dataclass(frozen=True)
class HealthStatistics:
    """``available``: no operation is retrying; ``outages`` begun, ``down_for`` (s) of the current one,
    ``reconnects`` (outages ended), ``last_error``, ``gave_up`` (past the limit), ``retrying`` operations now,
    the ``pool`` (``size``, connections ``open``, ``idle``, clients ``waiting`` now and the ``longest_wait`` s of
    them, ``waits`` that took a second or more and their ``wait_seconds``) and the ``watchdog``'s figures."""

    available: bool
    outages: int
    down_for: float
    reconnects: int
    last_error: str | None
    gave_up: bool
    retrying: int = 0
    pool: dict = field(default_factory=dict)
    watchdog: WatchdogStatistics | None = None


class DatabaseHealth:
    """A run's database: its bounded pool, its availability and its watchdog (thread-safe).

    ``connect(dsn)`` opens connections (the pool's, and the watchdog's probe); ``limits`` gives the pool size and
    ``unavailable_limit`` (s, how long an outage is waited out); ``cancel_event`` ends
    waiting early; ``on_down(reason)``/``on_up()`` are called when an outage starts and ends (the runner pauses
    and resumes its lanes there; always in that order, never overlapping) and ``on_gave_up(reason)`` once when
    the limit is passed (the runner stops its lanes). Call :meth:`close` at the end of the run.
    """

    def __init__(self, dsn: str, connect: Callable[[str], psycopg.Connection], *, limits: DbLimits = DbLimits(),
                 cancel_event: threading.Event | None = None, on_down: Callable[[str], None] | None = None,
                 on_up: Callable[[], None] | None = None, on_gave_up: Callable[[str], None] | None = None):
        self.dsn = dsn
        self.limits = limits
        self.limit = limits.unavailable_limit
        self._cancel = cancel_event
        self._on_down = on_down
        self._on_up = on_up
        self._on_gave_up = on_gave_up
        self.pool = RunPool(dsn, connect, limits, cancel_event)
        self.watchdog = DatabaseWatchdog(stall_seconds(self.limit), probe=lambda: self.pool.connect(dsn),
                                         cancel_event=cancel_event, bound=stuck_seconds(limits))
        self._lock = threading.Lock()          # the figures below
        self._transition = threading.Lock()    # an outage's start or end together with on_down/on_up
        self._retrying = 0
        self._answering = True      # False from a connection failure until an operation is answered again
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

    @property
    def gave_up_reason(self) -> str:
        with self._lock:
            return f"database unavailable for more than {self.limit:.0f} s: {self._last_error}"

    @property
    def answering(self) -> bool:
        """False from a connection failure until the server answers an operation again."""
        with self._lock:
            return self._answering

    @property
    def last_error(self) -> str | None:
        with self._lock:
            return self._last_error

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    # ------------------------------------------------------------------------------------------ the pool
    def checkout(self, deadline: float | None = None) -> psycopg.Connection:
        """A connection of the run's pool (:meth:`RunPool.checkout <feiqiu_etl.db.pool.RunPool.checkout>`)."""
        return self.pool.checkout(deadline)

    def checkin(self, conn: psycopg.Connection, *, broken: bool = False) -> None:
        """Give ``conn`` back to the pool (closed first when ``broken``)."""
        self.pool.checkin(conn, broken=broken)

    def close(self) -> None:
        """Close the pool (idle connections now; those in use when they come back) and stop the watchdog."""
        # the pool's workers may be in a connect to a server that does not answer: not waited for long
        self.pool.close(1.0 if self.answering else 0.1)
        self.watchdog.stop()

    # ------------------------------------------------------------------------------------------ outages
    def _failed(self, exc: BaseException, *, first: bool, since: float | None = None) -> None:
        """An operation failed with a connection error (``first``: it starts retrying now, ``since`` the server's
        last sign of life when the watchdog knows it)."""
        text = one_line(exc, 200, with_type=False)
        now = time.monotonic()
        with self._transition:
            with self._lock:
                self._last_error = text
                self._answering = False
                self._retrying += 1 if first else 0
                start = self._down_since is None
                if start:
                    self._down_since = min(since or now, now)
                    self._outages += 1
            if start:
                log.warning("database unavailable (%s); pausing the lanes and reconnecting, for at most %.0f s",
                            text, self.limit)
                if self._on_down is not None:
                    self._on_down(text)

    def _ended(self, *, retrying: bool, answered: bool) -> None:
        """An operation ended: ``answered`` — it succeeded, or the server answered it with an error of its own —
        or not (it gave up, was cancelled); ``retrying``: it had been retrying. The outage ends, and the lanes
        resume, as soon as the server answers an operation after the last failure (a database that answers is
        back, even while other operations still retry), or when no operation is retrying any more (then the
        lanes are not left paused with nobody to resume them; the next failure pauses them again)."""
        if not retrying and self._down_since is None and self._answering:
            return  # the common case, without a lock: nothing is down (a failure that starts later is later)
        with self._transition:
            with self._lock:
                if retrying:
                    self._retrying -= 1
                if answered:
                    self._answering = True
                if self._down_since is None or (not answered and self._retrying > 0):
                    return
                since, self._down_since = self._down_since, None
                self._reconnects += 1 if answered else 0
                quiet = self._gave_up or (self._cancel is not None and self._cancel.is_set())
            if answered:
                log.warning("database back after %.1f s; resuming", time.monotonic() - since)
            elif not quiet:
                log.warning("no operation waits for the database any more; resuming the lanes")
            if self._on_up is not None:
                self._on_up()

    def _wait(self, delay: float, since: float) -> None:
        """Sleep ``delay`` (cancellable) before the next try of an operation failing since ``since``, or raise once
        that is longer ago than the limit (or the run gave up already)."""
        with self._lock:
            left = self.limit - (time.monotonic() - since)
            gave_up = left <= 0 or self._gave_up
            notify = gave_up and not self._gave_up
            self._gave_up = gave_up or self._gave_up
        if gave_up:
            reason = self.gave_up_reason
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
        stats = self.pool.statistics()
        with self._lock:
            down = time.monotonic() - self._down_since if self._down_since is not None else 0.0
            return HealthStatistics(self._down_since is None and self._answering, self._outages, down, self._reconnects,
                                    self._last_error, self._gave_up, self._retrying, stats,
                                    self.watchdog.statistics())


class DbSlot:
    """One user's access to the run's database (one thread). :meth:`run` checks a pooled connection out for one
    operation ``op(conn)`` and, on a connection error, runs it again from the start on another connection
    (``on_retry()`` first, to restore in-memory state)."""

    def __init__(self, health: DatabaseHealth, *, autocommit: bool = False):
        self.health = health
        self._autocommit = autocommit

    def run(self, op: Callable[[psycopg.Connection], T], *, on_retry: Callable[[], None] | None = None) -> T:
        """``op(conn)`` in one checkout, retried after a connection error until it succeeds (the outage ends with
        the last retrying operation, not with a connect: a full disk accepts connections but no writes). A
        transaction ``op`` leaves open is committed. Raises :class:`DatabaseUnavailable` past the limit (or
        when the run is cancelled while the database is away), and ``op``'s own errors."""
        health = self.health
        if health.gave_up:  # past the limit already: no new wait (the run is ending)
            raise DatabaseUnavailable(health.gave_up_reason)
        if health.cancelled and not health.answering:  # cancelled: no new wait for a database that is away
            raise DatabaseUnavailable(f"cancelled while the database was unavailable: {health.last_error}")
        delay = BACKOFF_START
        since: float | None = None   # this operation fails since then
        answered = False
        try:
            while True:
                dropped: list[float | None] = [None]
                try:
                    value = self._once(op, dropped, since)
                    answered = True
                    return value
                except Exception as exc:
                    if not is_connection_error(exc):
                        answered = getattr(exc, "sqlstate", None) is not None
                        raise
                    health._failed(exc, first=since is None, since=dropped[0])
                    if since is None:
                        since = min(dropped[0] or time.monotonic(), time.monotonic())
                    if on_retry is not None:
                        on_retry()
                    health._wait(delay, since)
                    delay = min(delay * 2, BACKOFF_MAX)
        finally:
            health._ended(retrying=since is not None, answered=answered)

    def _once(self, op: Callable[[psycopg.Connection], T], dropped: list, since: float | None) -> T:
        health = self.health
        asked = time.monotonic()
        try:
            conn = health.checkout(None if since is None else since + health.limit)
        except Exception:
            dropped[0] = asked  # no connection since then: the outage counts from the request
            raise
        ok = False
        try:
            if conn.autocommit != self._autocommit:
                conn.autocommit = self._autocommit
            with health.watchdog.track(conn, "operation") as tracked:
                try:
                    value = op(conn)
                    if conn.info.transaction_status == TransactionStatus.INTRANS:
                        conn.commit()
                except BaseException:
                    dropped[0] = tracked.dropped_since
                    if not conn.broken and conn.info.transaction_status in (TransactionStatus.INTRANS,
                                                                           TransactionStatus.INERROR):
                        with contextlib.suppress(Exception):
                            conn.rollback()
                    raise
            ok = True
            return value
        finally:
            health.checkin(conn, broken=not ok and (conn.broken or dropped[0] is not None))

    def close(self) -> None:
        """Nothing to release: a slot holds a connection only while :meth:`run` runs."""

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
