"""``LaneGuard``: one serial lane per token *across processes* (upstream-api.md §2.2: the upstream bans a
token, not a process).

For its whole life a run holds, per lane, a PostgreSQL **session-level advisory lock** derived from the lane
key (connector name + a hash of the token — never the token itself) on a connection of its own. A second
process on the same token and database either waits for it (``wait`` seconds, cancellable) or gets
:class:`LaneBusy` at once, naming the holder (run id, host, pid, since when) from ``etl_meta.lane_lock``.
Different tokens have different keys and run in parallel. The lock dies with its session, so a killed
run never blocks the next one; if the guard's own connection breaks while the run goes on, :meth:`check`
reconnects and takes the locks again (and reports a lane it could not get back).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import psycopg

from feiqiu_etl.common.lanes import token_part
from feiqiu_etl.formats import when

from feiqiu_etl.registry.runs import HOST

log = logging.getLogger("feiqiu_etl.lane_guard")
POLL = 0.25


RELEASE_WAIT = 2.0
"""Seconds :meth:`LaneGuard.release` gives ``pg_advisory_unlock_all()`` before it shuts the session's socket down."""


def lock_key(lane_key: str) -> int:
    """The signed 64-bit advisory-lock key of a lane key, from its token part only: the upstream bans a token,
    whatever connector (file, name) sends with it (upstream-api.md §2.2)."""
    digest = hashlib.sha256(f"feiqiu-etl token {token_part(lane_key)}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class LaneBusy(Exception):
    """Another process holds the lane; ``holder`` has ``run_id``, ``host``, ``pid``, ``acquired_at``."""

    def __init__(self, lane: str, lane_key: str, holder: dict | None, waited: float):
        self.lane, self.lane_key, self.holder, self.waited = lane, lane_key, holder or {}, waited
        h = self.holder
        if h.get("run_id"):
            who = (f"run {h.get('run_id')} (host {h.get('host')}, pid {h.get('pid')}, since "
                   f"{when(h['acquired_at'])})")
        elif h.get("backend_pid"):
            who = (f"a database session that is no feiqiu-etl run (PostgreSQL backend pid {h['backend_pid']}, "
                   f"role {h.get('role')})")
        else:
            who = "another session"
        waited_text = f" after waiting {waited:.0f} s" if waited >= 0.5 else ""
        super().__init__(f"lane {lane} ({lane_key}) is in use by {who}{waited_text}; the upstream bans a token "
                         "that sends in parallel, so this run does not start it (--wait-for-lane SECONDS waits)")


@dataclass(frozen=True)
class LaneGuardStatistics:
    """Lanes ``held`` now, ``waiting`` for another process to release them, ``lost`` while the database was
    away; ``reconnects`` of the guard's session."""

    held: tuple[str, ...]
    reconnects: int
    lost: tuple[str, ...]
    waiting: tuple[str, ...] = ()


class LaneGuard:
    """The advisory locks of one run's lanes on one dedicated connection (see module docstring).

    One session holds the locks of every token of the run, whatever their number: it is never lent to anyone
    else (it is not a connection of the run's pool). Every statement on it is short and, with a ``watchdog``
    (:class:`~feiqiu_etl.db.watchdog.DatabaseWatchdog`), watched: a server that stops answering drops it, and
    :meth:`check` takes the locks again once the server answers. The internal lock is held only for one
    statement at a time, never while waiting for a lane, so :meth:`check` (the run control's heartbeat) and a
    cancel are never held up by a lane another process holds.
    """

    def __init__(self, dsn: str, run_id: str, *, connect: Callable[[str], psycopg.Connection], watchdog=None):
        self._dsn = dsn
        self._run_id = run_id
        self._connect = connect
        self._watchdog = watchdog
        self._conn: psycopg.Connection | None = None
        self._held: dict[str, str] = {}   # lane key -> lane name
        self._lost: list[str] = []
        self._reconnects = 0
        self._waiting: dict[str, str] = {}   # lane key -> lane name, while acquire_all waits for it
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self._dsn)
            self._conn.autocommit = True
        return self._conn

    def _execute(self, conn: psycopg.Connection, query: str, params: tuple = ()) -> list[tuple]:
        """One statement on the guard's session, watched by the watchdog (if any)."""
        watch = self._watchdog.track(conn, "lane guard") if self._watchdog is not None else contextlib.nullcontext()
        with watch:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def acquire(self, lane: str, lane_key: str, *, wait: float | None = None,
                cancel_event: threading.Event | None = None) -> None:
        """Take the lock of ``lane_key`` or raise :class:`LaneBusy` (after up to ``wait`` s; None = at once).
        Raises ``feiqiu_etl.pipeline.Cancelled`` if ``cancel_event`` fires while waiting."""
        outcome = self.acquire_all([(lane, lane_key)], wait=wait, cancel_event=cancel_event)[lane]
        if outcome is not None:
            raise outcome

    def acquire_all(self, lanes: list[tuple[str, str]], *, wait: float | None = None,
                    cancel_event: threading.Event | None = None,
                    on_acquired: Callable[[str], None] | None = None) -> dict[str, Exception | None]:
        """Take the locks of ``lanes`` (``(name, lane_key)`` pairs) together: every lane not yet held is tried
        every 0.25 s (``pg_try_advisory_lock``: never a blocking lock wait) until all are held or ``wait``
        seconds have passed (None: one try). ``on_acquired(name)`` is called for each lane the moment it is
        taken. Returns ``{name: None}`` for a lane taken, else the exception that refused it: :class:`LaneBusy`
        (naming the holder), ``Cancelled`` when ``cancel_event`` fired while waiting (noticed within 0.25 s), or
        the database's error."""
        from feiqiu_etl.pipeline.errors import Cancelled

        started = time.monotonic()
        outcome: dict[str, Exception | None] = {}
        todo = self._reserve(lanes, outcome)
        refused: set[str] = set()  # lanes another process held at some try
        try:
            while todo:
                for key, name in list(todo.items()):
                    try:
                        taken = self._try(name, key)
                    except psycopg.Error as exc:
                        outcome[name] = exc
                        del todo[key]
                        continue
                    if not taken:
                        refused.add(key)
                    if taken:
                        outcome[name] = None
                        del todo[key]
                        if key in refused:  # another run held it: a wait worth saying (not a slow database)
                            log.warning("lane %s: got the lane after waiting %.1f s for another run", name,
                                        time.monotonic() - started)
                        elif time.monotonic() - started > POLL:
                            log.info("lane %s: took the lane in %.1f s (the database was slow; no run held it)",
                                     name, time.monotonic() - started)
                        if on_acquired is not None:
                            on_acquired(name)
                waited = time.monotonic() - started
                if todo and (wait is None or waited >= wait):
                    for key, name in todo.items():
                        outcome[name] = LaneBusy(name, key, self._holder_of(key), waited)
                    todo.clear()
                if todo and cancel_event is not None and cancel_event.wait(POLL):
                    for name in todo.values():
                        outcome[name] = Cancelled()
                    todo.clear()
                elif todo and cancel_event is None:
                    time.sleep(POLL)
        finally:
            with self._lock:
                for key in [k for k, _ in lanes]:
                    self._waiting.pop(key, None)
        return outcome

    def _reserve(self, lanes: list[tuple[str, str]], outcome: dict[str, Exception | None]) -> dict[str, str]:
        """``{lane_key: name}`` of the ``lanes`` to try, now marked waiting; a lane whose token this guard holds
        already (session locks are re-entrant: one token, one lane per run) gets its :class:`LaneBusy` in
        ``outcome`` instead."""
        todo: dict[str, str] = {}
        with self._lock:
            tokens = {token_part(k) for k in self._held}
            for name, key in lanes:
                if token_part(key) in tokens:
                    outcome[name] = LaneBusy(name, key, {"run_id": self._run_id, "host": HOST, "pid": os.getpid(),
                                                         "acquired_at": datetime.now(timezone.utc)}, 0.0)
                    continue
                tokens.add(token_part(key))
                todo[key] = name
            self._waiting.update(todo)
        return todo

    def _try(self, lane: str, lane_key: str) -> bool:
        """One ``pg_try_advisory_lock``; when it is taken, record the holder in ``etl_meta.lane_lock``."""
        with self._lock:
            conn = self._connection()
            try:
                if not self._execute(conn, "SELECT pg_try_advisory_lock(%s)", (lock_key(lane_key),))[0][0]:
                    return False
                self._held[lane_key] = lane
                self._execute(
                    conn,
                    "INSERT INTO etl_meta.lane_lock (lane_key, run_id, lane, host, pid, acquired_at) "
                    "VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (lane_key) DO UPDATE SET run_id = "
                    "EXCLUDED.run_id, lane = EXCLUDED.lane, host = EXCLUDED.host, pid = EXCLUDED.pid, "
                    "acquired_at = EXCLUDED.acquired_at",
                    (lane_key, self._run_id, lane, HOST, os.getpid()))
                return True
            except psycopg.Error:
                if conn.broken or conn.closed:
                    self._drop_connection()
                raise

    def _holder_of(self, lane_key: str) -> dict | None:
        with self._lock:
            try:
                return self._holder(self._connection(), lane_key, self._execute)
            except psycopg.Error:
                return None

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    @staticmethod
    def _holder(conn: psycopg.Connection, lane_key: str, execute) -> dict | None:
        """Who holds the lock: the run recorded for the lane if that run is still RUNNING, else the session
        PostgreSQL shows holding it (e.g. someone took the advisory lock by hand)."""
        rows = execute(conn, "SELECT l.run_id, l.host, l.pid, l.acquired_at FROM etl_meta.lane_lock l "
                             "JOIN etl_meta.run r ON r.run_id = l.run_id WHERE substring(l.lane_key from '[^:]*$') = %s "
                             "AND r.status = 'RUNNING' ORDER BY l.acquired_at DESC LIMIT 1", (token_part(lane_key),))
        if rows:
            return dict(zip(("run_id", "host", "pid", "acquired_at"), rows[0]))
        key = lock_key(lane_key) & 0xFFFFFFFFFFFFFFFF  # a bigint key is (classid, objid) = (high, low) 32 bits
        rows = execute(conn, "SELECT a.pid, a.usename FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid "
                             "WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1 "
                             "AND k.classid = %s::bigint::oid AND k.objid = %s::bigint::oid AND k.database = "
                             "(SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1",
                             (key >> 32, key & 0xFFFFFFFF))
        return {"backend_pid": rows[0][0], "role": rows[0][1]} if rows else None

    def check(self) -> list[str]:
        """Make sure the locks are still held (reconnecting after a lost connection). Returns the lanes
        whose lock another process took meanwhile (the caller must stop them). Never waits for a lane."""
        with self._lock:
            if not self._held:
                return []
            try:
                self._execute(self._connection(), "SELECT 1")
                return []
            except psycopg.Error:
                pass
            try:
                self._drop_connection()
                conn = self._connection()
            except psycopg.Error:
                return []  # the database is away; the next check tries again
            self._reconnects += 1
            lost = []
            try:
                for key, lane in list(self._held.items()):
                    if not self._execute(conn, "SELECT pg_try_advisory_lock(%s)", (lock_key(key),))[0][0]:
                        lost.append(lane)
                        del self._held[key]
            except psycopg.Error:
                self._drop_connection()  # gone again: the next check tries again
            self._lost.extend(lost)
            if lost:
                log.error("lane guard: lost the lock of %s while the database was away", ", ".join(lost))
            return lost

    def release(self) -> None:
        """Release every lock: ``pg_advisory_unlock_all()`` on the idle session, then close it, so the next run of
        the token (a Dagster step its pool starts the moment this one ends, a cron night right after another) finds
        the lane free — closing alone frees the locks only once the server has ended the backend, a moment later
        (a run started in that moment was BUSY). The statement is given :data:`RELEASE_WAIT` seconds, then its
        socket is shut down (a server that does not answer). When the session is busy in another thread (the run
        control's check, on a server that does not answer), its socket is shut down at once — the server ends the
        session, and the locks with it, when it notices — and nothing waits for that thread."""
        from feiqiu_etl.db.connection import abandon

        locked = self._lock.acquire(timeout=0.5)
        try:
            conn, self._conn = self._conn, None
            self._held.clear()
        finally:
            if locked:
                self._lock.release()
        if conn is None:
            return
        if not locked:
            abandon(conn)
            return
        watchdog = threading.Timer(RELEASE_WAIT, abandon, args=(conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock_all()")
        finally:
            watchdog.cancel()
        with contextlib.suppress(psycopg.Error):
            conn.close()

    def statistics(self) -> LaneGuardStatistics:
        with self._lock:
            return LaneGuardStatistics(tuple(self._held.values()), self._reconnects, tuple(self._lost),
                                       tuple(self._waiting.values()))
