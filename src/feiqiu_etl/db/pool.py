"""The run's ONE bounded pool of connections, and the rule that tells waiting for one from the database being away.

Every connection the lanes of a run use comes from one psycopg-pool pool of ``db.pool_size`` connections, whatever
the number of lanes (:func:`~feiqiu_etl.db.connection.open_pool`). A checkout waits in steps of
:data:`CHECKOUT_STEP` s, so that a cancel is noticed within one step. Waiting for a pooled connection is not the
database being away (issue 28 item 9): while the pool can connect, a pool whose connections are all busy is
contention and the wait goes on; only a failed connect since the wait began makes it an outage.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable

import psycopg

from feiqiu_etl.db.connection import DbLimits, open_pool
from feiqiu_etl.db.errors import DatabaseUnavailable

log = logging.getLogger("feiqiu_etl.db")

CHECKOUT_STEP = 1.0
"""Seconds of one wait for a pooled connection: a cancel is noticed within it (issue 28 item 1)."""


class RunPool:
    """The bounded pool of one run (thread-safe), opened on first use.

    ``connect(dsn)`` opens its connections (:meth:`connect` notes each failure: what makes a pool wait an
    outage); ``limits`` gives ``pool_size`` and ``unavailable_limit`` (s); ``cancel_event`` ends a wait within a
    step. Call :meth:`close` at the end of the run.
    """

    def __init__(self, dsn: str, connect: Callable[[str], psycopg.Connection], limits: DbLimits,
                 cancel_event: threading.Event | None = None):
        self.dsn = dsn
        self.limits = limits
        self.limit = limits.unavailable_limit
        self._connect = connect
        self._cancel = cancel_event
        self._lock = threading.Lock()          # the figures below
        self._pool = None
        self._pool_lock = threading.Lock()
        self._closed = False
        self._contention_noted = False
        self._waiters: dict[object, float] = {}   # checkouts waiting now -> since (monotonic)
        self._waits = 0            # checkouts that waited a step or more
        self._wait_seconds = 0.0
        self._connect_failed_at: float | None = None
        self._connect_ok_at: float | None = None

    def _the_pool(self):
        with self._pool_lock:
            if self._closed:
                raise DatabaseUnavailable("the run's database pool is closed")
            if self._pool is None:
                self._pool = open_pool(self.dsn, self.connect, self.limits, name="feiqiu-etl-run")
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
            self._waiters[key] = asked
        try:
            while True:
                try:
                    return pool.getconn(CHECKOUT_STEP)
                except PoolTimeout:
                    now = time.monotonic()
                    if self._cancel is not None and self._cancel.is_set():
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
                self._waiters.pop(key, None)
                if waited >= CHECKOUT_STEP:
                    self._waits += 1
                    self._wait_seconds += waited

    def connect(self, dsn: str) -> psycopg.Connection:
        """The pool's connect (and the watchdog's probe's): ``connect(dsn)``, its failure noted (what makes a
        pool wait an outage)."""
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

    def close(self, timeout: float) -> None:
        """Close the pool: idle connections now (its workers waited for ``timeout`` s at most: they may be in a
        connect to a server that does not answer), those in use when they come back."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=timeout)

    def statistics(self) -> dict:
        """``size``, connections ``open``, ``idle`` (once opened), clients ``waiting`` now and the
        ``longest_wait`` s of them, ``waits`` that took a step or more and their ``wait_seconds``."""
        pool = self._pool
        stats = {}
        if pool is not None:
            raw = pool.get_stats()
            stats = {"size": self.limits.pool_size, "open": raw.get("pool_size", 0),
                     "idle": raw.get("pool_available", 0)}
        with self._lock:
            now = time.monotonic()
            stats.update(waiting=len(self._waiters),
                         longest_wait=round(now - min(self._waiters.values()), 1) if self._waiters else 0.0,
                         waits=self._waits, wait_seconds=round(self._wait_seconds, 1))
        return stats
