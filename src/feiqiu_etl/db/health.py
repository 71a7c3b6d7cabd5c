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
``SIGSTOP``, a Unix socket where TCP keepalives do not apply — by the :class:`DatabaseWatchdog`: when nothing has
answered for ``stall`` seconds while a statement waits, it shuts the sockets of every statement in flight
down (the waiting threads get a connection error at once). Once the run is cancelled, an operation meets a
database that is away with :class:`DatabaseUnavailable` at once instead of waiting for it.

Nothing here knows about ODS or DWD; it only tells connection errors from data errors.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from feiqiu_etl.db.connection import DbLimits, abandon, open_pool
from feiqiu_etl.errortext import one_line

T = TypeVar("T")
log = logging.getLogger("feiqiu_etl.db")

BACKOFF_START = 0.25
BACKOFF_MAX = 5.0
CHECKOUT_STEP = 1.0
"""Seconds of one wait for a pooled connection: a cancel is noticed within it (issue 28 item 1)."""
WATCH_INTERVAL = 0.2
"""Seconds between two looks of the watchdog at the statements in flight."""
CANCELLED_STALL = 1.0
"""The watchdog's patience (s) once the run is cancelled, with a server that answers nothing."""
CANCELLED_GRACE = 1.0
"""Once the run is cancelled, an operation begun before the cancel and still in flight this long (s) after it is
dropped whatever else answers (a signal ends a run within 5 s in every state: issue 28 item 1); the end-of-run
work begun after the cancel keeps its own bound."""
_RETRY_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53100", "53200", "53300", "40001", "40P01", "25P03")
"""Connection exceptions, admin/crash shutdown, cannot connect now, disk full, out of memory, too many
connections, serialization failure, deadlock, idle-in-transaction timeout: worth a reconnect and a retry."""


class DatabaseUnavailable(Exception):
    """The database stayed unreachable past the run's limit (or the run was cancelled while waiting)."""


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that a fresh connection may cure (not for bad data or SQL). A pool checkout that timed
    out (``psycopg_pool.PoolTimeout``) is one."""
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


def stuck_seconds(limits: DbLimits) -> float:
    """The client-side bound of one operation of a run (s): ``statement_timeout`` — past which a live server has
    ended the statement itself — plus the watchdog's stall. An operation in flight longer is dropped even while
    the server answers others (one backend frozen or stuck, which no server-side timeout can end: issue 28)."""
    return limits.statement_timeout + stall_seconds(limits.unavailable_limit)


def stall_seconds(limit: float) -> float:
    """How long the watchdog lets a statement wait while the server answers nothing at all before it drops the
    connections in flight: a quarter of ``limit``, between 2 and 15 s (the outage then counts from the server's
    last answer, so a frozen server still ends the run within ``limit``)."""
    return min(15.0, max(2.0, limit / 4))


# ---------------------------------------------------------------------------------------------- watchdog
@dataclass(eq=False)
class _InFlight:
    conn: psycopg.Connection
    started: float
    what: str
    bound: float | None = None           # dropped when in flight longer, whatever else answers
    dropped_since: float | None = None   # set when the watchdog dropped it: the server's last sign of life


@dataclass(frozen=True)
class WatchdogStatistics:
    """``in_flight`` statements now, ``oldest`` of them (s), ``quiet`` seconds since the server last answered
    anything, ``dropped`` connections shut down because the server stopped answering, ``probes`` sent, ``stuck``
    operations dropped past their own bound (or after a cancel) while the server answered others."""

    in_flight: int
    oldest: float
    quiet: float
    dropped: int
    probes: int
    stuck: int = 0


class DatabaseWatchdog:
    """Turns a server that stopped answering into a connection error, within ``stall`` seconds.

    Think of it as a lifeguard who watches the pool without getting in: every database round trip of the run is
    :meth:`track`-ed while it runs, and every answer from the server (a result, or an error the server sent) is a
    sign of life. When a tracked statement has waited ``stall`` s and nothing at all has answered for ``stall``
    s, the server is taken for frozen: every connection in flight is :func:`~feiqiu_etl.db.connection.abandon`-ed
    (its socket shut down), so each waiting thread gets a connection error at once and its retry logic takes
    over. A slow statement on a live server is left alone as long as anything else answers — the run's heartbeat
    does, once a second — or, when nothing else runs, a ``SELECT 1`` on a connection of the watchdog's own
    (``probe()``, opened only while in doubt, closed after) answers. Once ``cancel_event`` is set (the run is
    cancelled: a signal must end it within seconds) the patience is :data:`CANCELLED_STALL` s at most.

    **Stuck operations** (issue 28 item 1): one backend can stop answering while the others still do (frozen,
    stuck in the kernel) — the heartbeat's answers then keep the rule above from firing, and no server-side
    timeout can end that statement. So every tracked operation also has a client-side ``bound`` (s; the
    watchdog's default, or one given to :meth:`track`): in flight longer, its connection alone is shut down,
    whatever else answers; and once the run is cancelled, every operation begun before the cancel and still in
    flight :data:`CANCELLED_GRACE` s after it is. The watchdog's own thread never does I/O.
    """

    def __init__(self, stall: float, *, probe: Callable[[], psycopg.Connection] | None = None,
                 name: str = "db-watchdog", cancel_event: threading.Event | None = None,
                 bound: float | None = None):
        self.stall = stall
        self.bound = bound
        self._stuck = 0
        self._cancelled_at: float | None = None
        self._cancel = cancel_event
        self._probe_connect = probe
        self._name = name
        self._lock = threading.Lock()
        self._ops: dict[int, _InFlight] = {}
        self._ids = itertools.count()
        self._last_answer = time.monotonic()
        self._dropped = 0
        self._probes = 0
        self._probing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def track(self, conn: psycopg.Connection, what: str = "statement", *,
              bound: float | None = None) -> Iterator[_InFlight]:
        """Watch the round trips on ``conn`` inside the body (one thread's), for at most ``bound`` s (default the
        watchdog's). An answer — the body ends, or raises an error the server sent — counts as a sign of life;
        a dropped connection's error propagates as it is."""
        op = _InFlight(conn, time.monotonic(), what, bound if bound is not None else self.bound)
        key = next(self._ids)
        with self._lock:
            self._ops[key] = op
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._watch, name=self._name, daemon=True)
                self._thread.start()
        try:
            yield op
        except BaseException as exc:
            if op.dropped_since is None and getattr(exc, "sqlstate", None):
                self.answered()
            raise
        else:
            if op.dropped_since is None:
                self.answered()
        finally:
            with self._lock:
                self._ops.pop(key, None)

    def answered(self) -> None:
        """The server answered just now (thread-safe)."""
        now = time.monotonic()
        with self._lock:
            if now > self._last_answer:
                self._last_answer = now

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            now = time.monotonic()
            cancelled = self._cancel is not None and self._cancel.is_set()
            if cancelled and self._cancelled_at is None:
                self._cancelled_at = now
            stall = min(self.stall, CANCELLED_STALL) if cancelled else self.stall
            drop: list[_InFlight] = []
            stuck: list[_InFlight] = []
            probe = False
            with self._lock:
                waiting = [op for op in self._ops.values() if op.dropped_since is None]
                if not waiting:
                    continue
                for op in waiting:  # past its own bound, or still in flight well after a cancel
                    if (op.bound is not None and now - op.started > op.bound) or \
                            (cancelled and op.started < self._cancelled_at and now - self._cancelled_at > CANCELLED_GRACE):
                        op.dropped_since = max(self._last_answer, op.started)
                        stuck.append(op)
                self._stuck += len(stuck)
                waiting = [op for op in waiting if op.dropped_since is None]
            for op in stuck:
                log.warning("database %s in flight for %.1f s (%s): dropping its connection",
                            op.what, now - op.started, f"more than its bound of {op.bound:.0f} s"
                            if op.bound is not None and now - op.started > op.bound else "the run is cancelled")
                abandon(op.conn)
            if not waiting:
                continue
            with self._lock:
                oldest = min(op.started for op in waiting)
                quiet = now - max(self._last_answer, oldest)
                if now - oldest > stall and quiet > stall:
                    since = max(self._last_answer, oldest)
                    for op in waiting:
                        op.dropped_since = since
                    drop = waiting
                    self._dropped += len(drop)
                elif (now - oldest > stall / 2 and quiet > stall / 2 and self._probe_connect is not None
                      and not self._probing):
                    self._probing = probe = True
            if drop:
                log.warning("database not answering for %.1f s: dropping %d connection(s) in flight (%s)",
                            now - drop[0].dropped_since, len(drop), ", ".join(sorted({op.what for op in drop})))
                for op in drop:
                    abandon(op.conn)
            if probe:
                threading.Thread(target=self._probe, name=f"{self._name}-probe", daemon=True).start()

    def _probe(self) -> None:
        """``SELECT 1`` on a connection of its own (tracked like any other): an answer proves the server alive."""
        try:
            self._probes += 1
            conn = self._probe_connect()  # type: ignore[misc] - bounded by the connect timeout
            try:
                with self.track(conn, "probe"):
                    conn.execute("SELECT 1")
            finally:
                conn.close()
        except Exception:  # noqa: BLE001 - no answer is what the watchdog acts on
            pass
        finally:
            with self._lock:
                self._probing = False

    def statistics(self) -> WatchdogStatistics:
        now = time.monotonic()
        with self._lock:
            starts = [op.started for op in self._ops.values()]
            return WatchdogStatistics(len(starts), now - min(starts) if starts else 0.0, now - self._last_answer,
                                      self._dropped, self._probes, self._stuck)


# ---------------------------------------------------------------------------------------------- health
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
        self._connect = connect
        self._cancel = cancel_event
        self._on_down = on_down
        self._on_up = on_up
        self._on_gave_up = on_gave_up
        self.watchdog = DatabaseWatchdog(stall_seconds(self.limit), probe=lambda: self._pool_connect(dsn),
                                         cancel_event=cancel_event, bound=stuck_seconds(limits))
        self._lock = threading.Lock()          # the figures below
        self._transition = threading.Lock()    # an outage's start or end together with on_down/on_up
        self._pool = None
        self._pool_lock = threading.Lock()
        self._closed = False
        self._retrying = 0
        self._answering = True      # False from a connection failure until an operation is answered again
        self._down_since: float | None = None
        self._outages = 0
        self._reconnects = 0
        self._last_error: str | None = None
        self._gave_up = False
        self._contention_noted = False
        self._pool_waiters: dict[object, float] = {}   # checkouts waiting now -> since (monotonic)
        self._pool_waits = 0            # checkouts that waited a step or more
        self._pool_wait_seconds = 0.0
        self._connect_failed_at: float | None = None
        self._connect_ok_at: float | None = None

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
    def _the_pool(self):
        with self._pool_lock:
            if self._closed:
                raise DatabaseUnavailable("the run's database pool is closed")
            if self._pool is None:
                self._pool = open_pool(self.dsn, self._pool_connect, self.limits, name="feiqiu-etl-run")
            return self._pool

    def checkout(self, deadline: float | None = None) -> psycopg.Connection:
        """A connection of the pool, asked for in steps of :data:`CHECKOUT_STEP` s (a cancel is noticed within
        one step). Waiting for a pooled connection is not the database being away (issue 28 item 9): a pool whose
        connections are all busy while it can connect is contention, and the wait goes on (the statements holding
        the connections are bounded themselves, and the run's own limits end it). Only a failed connect — of the
        pool, or of the watchdog's probe — since the wait began makes it an outage: then ``PoolTimeout`` is raised
        once the limit has passed (at ``deadline``, a monotonic time, if given). Raises ``PoolTimeout`` within a
        step once the run is cancelled, and :class:`DatabaseUnavailable` when the pool is closed."""
        from psycopg_pool import PoolTimeout

        pool = self._the_pool()
        asked = time.monotonic()
        ends = asked + self.limit if deadline is None else deadline
        key = object()
        with self._lock:
            self._pool_waiters[key] = asked
        try:
            while True:
                try:
                    return pool.getconn(CHECKOUT_STEP)
                except PoolTimeout:
                    now = time.monotonic()
                    if self.cancelled:
                        raise
                    if now < ends:
                        continue
                    with self._lock:
                        failed = self._connect_failed_at is not None and self._connect_failed_at >= asked
                    stats = pool.get_stats()
                    busy = stats.get("pool_size", 0) - stats.get("pool_available", 0)
                    if failed or busy <= 0:
                        raise
                    if not self._contention_noted:
                        self._contention_noted = True
                        log.warning("all %d pooled database connections have been busy for %.0f s while the "
                                    "database answers: waiting for one (db.pool_size; not an outage)",
                                    self.limits.pool_size, now - asked)
        finally:
            waited = time.monotonic() - asked
            with self._lock:
                self._pool_waiters.pop(key, None)
                if waited >= CHECKOUT_STEP:
                    self._pool_waits += 1
                    self._pool_wait_seconds += waited

    def _pool_connect(self, dsn: str) -> psycopg.Connection:
        """The pool's connect: ``connect(dsn)``, its failure noted (what makes a pool wait an outage)."""
        try:
            conn = self._connect(dsn)
        except BaseException:
            with self._lock:
                self._connect_failed_at = time.monotonic()
            raise
        with self._lock:
            self._connect_ok_at = time.monotonic()
        return conn

    def checkin(self, conn: psycopg.Connection, *, broken: bool = False) -> None:
        """Give ``conn`` back (closed first when ``broken``: the pool then replaces it)."""
        if broken or conn.broken:
            with contextlib.suppress(Exception):
                conn.close()
        pool = self._pool
        if pool is None:
            with contextlib.suppress(Exception):
                conn.close()
            return
        try:
            pool.putconn(conn)
        except Exception:  # noqa: BLE001 - a closed pool: the connection is closed instead
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the pool (idle connections now; those in use when they come back) and stop the watchdog."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:  # its workers may be in a connect to a server that does not answer: not waited for long
            pool.close(timeout=1.0 if self.answering else 0.1)
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
        pool = self._pool
        stats = {}
        if pool is not None:
            raw = pool.get_stats()
            stats = {"size": self.limits.pool_size, "open": raw.get("pool_size", 0),
                     "idle": raw.get("pool_available", 0)}
        with self._lock:
            now = time.monotonic()
            stats.update(waiting=len(self._pool_waiters),
                         longest_wait=round(now - min(self._pool_waiters.values()), 1) if self._pool_waiters else 0.0,
                         waits=self._pool_waits, wait_seconds=round(self._pool_wait_seconds, 1))
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
