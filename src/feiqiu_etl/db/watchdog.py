"""The watchdog of a run's database: a server that stopped answering becomes a connection error within seconds.

A statement on a live server is bounded by ``statement_timeout``/``lock_timeout``
(:class:`~feiqiu_etl.db.connection.DbLimits`); a statement on a server that stopped answering — frozen,
``SIGSTOP``, a Unix socket where TCP keepalives do not apply — is bounded by the :class:`DatabaseWatchdog`: when
nothing has answered for ``stall`` seconds while a statement waits, it shuts the sockets of every statement in
flight down (the waiting threads get a connection error at once), and an operation in flight past its own
client-side bound (:func:`stuck_seconds`) is dropped even while the server answers others (issue 28 item 1).
Its thread never does I/O; its probe (a ``SELECT 1`` on a connection of its own) runs in a thread of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import psycopg

from feiqiu_etl.db.connection import DbLimits, abandon

log = logging.getLogger("feiqiu_etl.db")

WATCH_INTERVAL = 0.2
"""Seconds between two looks of the watchdog at the statements in flight."""
CANCELLED_STALL = 1.0
"""The watchdog's patience (s) once the run is cancelled, with a server that answers nothing."""
CANCELLED_GRACE = 1.0
"""Once the run is cancelled, an operation begun before the cancel and still in flight this long (s) after it is
dropped whatever else answers (a signal ends a run within 5 s in every state: issue 28 item 1); the end-of-run
work begun after the cancel keeps its own bound."""


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
