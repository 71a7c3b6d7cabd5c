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

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import psycopg

from feiqiu_etl.formats import when

from feiqiu_etl.registry import HOST

log = logging.getLogger("feiqiu_etl.lane_guard")
POLL = 0.25


def token_part(lane_key: str) -> str:
    """The token fingerprint of a lane key ``connector:fingerprint``."""
    return lane_key.rsplit(":", 1)[-1]


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
    held: tuple[str, ...]
    reconnects: int
    lost: tuple[str, ...]


class LaneGuard:
    """The advisory locks of one run's lanes on one dedicated connection (see module docstring)."""

    def __init__(self, dsn: str, run_id: str, *, connect: Callable[[str], psycopg.Connection]):
        self._dsn = dsn
        self._run_id = run_id
        self._connect = connect
        self._conn: psycopg.Connection | None = None
        self._held: dict[str, str] = {}   # lane key -> lane name
        self._lost: list[str] = []
        self._reconnects = 0
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self._dsn)
            self._conn.autocommit = True
        return self._conn

    def acquire(self, lane: str, lane_key: str, *, wait: float | None = None,
                cancel_event: threading.Event | None = None) -> None:
        """Take the lock of ``lane_key`` or raise :class:`LaneBusy` (after up to ``wait`` s; None = at once).
        Raises ``feiqiu_etl.pipeline.Cancelled`` if ``cancel_event`` fires while waiting."""
        from feiqiu_etl.pipeline.errors import Cancelled

        started = time.monotonic()
        with self._lock:
            if any(token_part(k) == token_part(lane_key) for k in self._held):  # session locks are re-entrant
                raise LaneBusy(lane, lane_key, {"run_id": self._run_id, "host": HOST, "pid": os.getpid(),
                                                "acquired_at": datetime.now(timezone.utc)}, 0.0)
            conn = self._connection()
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(lane_key),)).fetchone()[0]:
                waited = time.monotonic() - started
                if wait is None or waited >= wait:
                    raise LaneBusy(lane, lane_key, self._holder(conn, lane_key), waited)
                if cancel_event is not None and cancel_event.wait(POLL):
                    raise Cancelled()
                if cancel_event is None:
                    time.sleep(POLL)
            self._held[lane_key] = lane
            conn.execute(
                "INSERT INTO etl_meta.lane_lock (lane_key, run_id, lane, host, pid, acquired_at) "
                "VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (lane_key) DO UPDATE SET run_id = EXCLUDED.run_id, "
                "lane = EXCLUDED.lane, host = EXCLUDED.host, pid = EXCLUDED.pid, acquired_at = EXCLUDED.acquired_at",
                (lane_key, self._run_id, lane, HOST, os.getpid()))
        if time.monotonic() - started > POLL:
            log.warning("lane %s: got the lane after waiting %.1f s", lane, time.monotonic() - started)

    @staticmethod
    def _holder(conn: psycopg.Connection, lane_key: str) -> dict | None:
        """Who holds the lock: the run recorded for the lane if that run is still RUNNING, else the session
        PostgreSQL shows holding it (e.g. someone took the advisory lock by hand)."""
        row = conn.execute("SELECT l.run_id, l.host, l.pid, l.acquired_at FROM etl_meta.lane_lock l "
                           "JOIN etl_meta.run r ON r.run_id = l.run_id WHERE substring(l.lane_key from '[^:]*$') = %s "
                           "AND r.status = 'RUNNING' ORDER BY l.acquired_at DESC LIMIT 1",
                           (token_part(lane_key),)).fetchone()
        if row:
            return dict(zip(("run_id", "host", "pid", "acquired_at"), row))
        key = lock_key(lane_key) & 0xFFFFFFFFFFFFFFFF  # a bigint key is (classid, objid) = (high, low) 32 bits
        row = conn.execute("SELECT a.pid, a.usename FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid "
                           "WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1 "
                           "AND k.classid = %s::bigint::oid AND k.objid = %s::bigint::oid AND k.database = "
                           "(SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1",
                           (key >> 32, key & 0xFFFFFFFF)).fetchone()
        return {"backend_pid": row[0], "role": row[1]} if row else None

    def check(self) -> list[str]:
        """Make sure the locks are still held (reconnecting after a lost connection). Returns the lanes
        whose lock another process took meanwhile (the caller must stop them)."""
        with self._lock:
            if not self._held:
                return []
            try:
                self._connection().execute("SELECT 1")
                return []
            except psycopg.Error:
                pass
            try:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                conn = self._connection()
            except psycopg.Error:
                return []  # the database is away; the next check tries again
            self._reconnects += 1
            lost = []
            for key, lane in list(self._held.items()):
                if not conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(key),)).fetchone()[0]:
                    lost.append(lane)
                    del self._held[key]
            self._lost.extend(lost)
            if lost:
                log.error("lane guard: lost the lock of %s while the database was away", ", ".join(lost))
            return lost

    def release(self) -> None:
        """Release every lock (closing the connection does it too)."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._held.clear()
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def statistics(self) -> LaneGuardStatistics:
        with self._lock:
            return LaneGuardStatistics(tuple(self._held.values()), self._reconnects, tuple(self._lost))
