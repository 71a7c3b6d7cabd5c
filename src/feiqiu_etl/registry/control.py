"""``RunControl``: the background thread that keeps a running run visible and cancellable from outside.

About once a second (``interval``) it publishes the run's heartbeat and live status snapshot to
``etl_meta.run``, flushes queued log entries to ``etl_meta.run_log``, checks the lane guard and looks at
the durable cancel flag. In between it waits on ``LISTEN`` (PostgreSQL LISTEN/NOTIFY), so ``feiqiu-etl
cancel RUN_ID`` wakes it at once; the flag covers a missed notification. It owns one autocommit
connection, whose statements the run's database watchdog watches (a server that stops answering drops it);
if the database goes away it keeps trying (the run itself decides how long it can live without one) and
never raises into the run.

It is also the lanes' watchdog: each beat it looks at every lane's ``stalled_for`` (no progress for longer than
``run.stall_after``) and logs when a lane stalls and when it moves again, with what it waits for; ``status``
and the web page show the same figure from the live snapshot. The look needs no database.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psycopg
from psycopg import sql

from feiqiu_etl.errortext import one_line
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.registry import runs
from feiqiu_etl.registry.lane_guard import LaneGuard
from feiqiu_etl.statistics import RunStatistics

log = logging.getLogger("feiqiu_etl.control")


@dataclass(frozen=True)
class ControlStatistics:
    heartbeats: int
    failed_heartbeats: int
    log_entries: int
    cancel_source: str | None
    last_heartbeat_age: float | None


class RunControl:
    """Heartbeat, live status, stored log and remote cancel of one run (see module docstring).

    ``live()`` returns the run's :class:`~feiqiu_etl.statistics.RunStatistics` (published as its JSON);
    ``guard`` (optional) is checked each beat and ``on_lane_lost(names)`` is told of lanes whose lock was lost.
    """

    def __init__(self, dsn: str, run_id: str, cancellation: CancellationToken, *, live: Callable[[], RunStatistics],
                 connect: Callable[[str], psycopg.Connection], interval: float = 1.0,
                 guard: LaneGuard | None = None, on_lane_lost: Callable[[list[str]], None] | None = None):
        self._dsn = dsn
        self._run_id = run_id
        self._cancellation = cancellation
        self._live = live
        self._connect = connect
        self._interval = interval
        self._guard = guard
        self._on_lane_lost = on_lane_lost
        self._watchdog = None  # a feiqiu_etl.db.watchdog.DatabaseWatchdog (watched_by)
        self._stalled: dict[str, float] = {}   # lane name -> when it was reported stalled
        self._conn: psycopg.Connection | None = None
        self._logs: queue.SimpleQueue[dict] = queue.SimpleQueue()
        self._requests: queue.SimpleQueue[dict] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        self._failed = 0
        self._logged = 0
        self._cancel_source: str | None = None
        self._last_beat: float | None = None

    # -------------------------------------------------------------------------------------- lifecycle
    def watched_by(self, watchdog) -> "RunControl":
        """Let the run's :class:`~feiqiu_etl.db.watchdog.DatabaseWatchdog` watch this control's statements (a server
        that stops answering then drops its connection instead of holding the heartbeat up). Before :meth:`start`."""
        self._watchdog = watchdog
        return self

    def start(self) -> "RunControl":
        self._thread = threading.Thread(target=self._loop, name="run-control", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: float = 5.0) -> None:
        """Stop the thread after a last beat and log flush (waits up to ``wait`` s: less when the database does not
        answer — the run ends all the same, and the thread, a daemon, goes with the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)
        if self._thread is None or not self._thread.is_alive():
            self._close()

    def log(self, entry: dict) -> None:
        """Queue one stored-log entry ``{ts, level, lane, site_id, task, message}`` (thread-safe)."""
        self._logs.put(entry)

    def request(self, record: dict) -> None:
        """Queue one lane attempt for the run's timeline (``runs.REQUEST_COLUMNS``; thread-safe)."""
        self._requests.put(record)

    def flush_now(self) -> None:
        """Write queued log entries from the calling thread (used at the very end of a run; not while the control
        thread still runs, nor when it has no connection: the database did not answer it)."""
        if self._conn is None or (self._thread is not None and self._thread.is_alive()):
            return
        try:
            conn = self._connection()
            with self._watched(conn):
                self._flush_logs(conn)
        except psycopg.Error:
            pass

    # -------------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            started = time.monotonic()
            live = self._snapshot()
            try:
                conn = self._connection()
                with self._watched(conn):
                    self._beat(conn, live)
                    self._flush_logs(conn)
            except psycopg.Error as exc:
                self._failed += 1
                if self._failed in (1, 10) or self._failed % 60 == 0:
                    log.warning("run control: the database is not answering (%s); retrying", one_line(exc, 200, with_type=False))
                self._close()
            if self._guard is not None:
                lost = self._guard.check()
                if lost and self._on_lane_lost is not None:
                    self._on_lane_lost(lost)
            if stopping:
                return
            self._listen(max(0.0, self._interval - (time.monotonic() - started)))

    def _snapshot(self) -> dict:
        """The live status as JSON (and the lanes' watchdog's look at it); never raises."""
        try:
            live = self._live()
        except Exception as exc:  # noqa: BLE001 - a broken snapshot must not stop the heartbeat
            return {"error": f"snapshot failed: {one_line(exc, 200, with_type=False)}"}
        self._watch_lanes(live)
        return live.to_dict()

    def _watch_lanes(self, live: RunStatistics) -> None:
        """Log a lane that stalls (once) and when it moves again."""
        for lane in live.lanes:
            if lane.stalled_for is not None and lane.name not in self._stalled:
                self._stalled[lane.name] = time.monotonic()
                cur = lane.current
                doing = f"{cur.task} {cur.request or ''}".strip() if cur is not None else "no request"
                waiting = ("for the upstream's response" if cur is not None and cur.in_flight else
                           f"for {lane.wait_reason}" if lane.wait_reason else "for its tasks (processing, writing)")
                log.warning("lane %s: no progress for %.0f s (%s; waiting %s)", lane.name, lane.stalled_for, doing,
                            waiting)
            elif lane.stalled_for is None and lane.name in self._stalled:
                since = self._stalled.pop(lane.name)
                log.warning("lane %s: moving again after %.0f s%s", lane.name, time.monotonic() - since,
                            "" if lane.state == "running" else f" ({lane.state})")

    def _watched(self, conn: psycopg.Connection):
        """The body's statements on ``conn``, watched by the run's database watchdog (if any)."""
        return self._watchdog.track(conn, "run control") if self._watchdog is not None else contextlib.nullcontext()

    def _beat(self, conn: psycopg.Connection, live: dict) -> None:
        requested_at, by = runs.heartbeat(conn, self._run_id, live)
        self._beats += 1
        self._last_beat = time.monotonic()
        if requested_at is not None and not self._cancellation.is_cancelled:
            self._cancel(f"cancel requested by {by or 'another process'}")

    def _flush_logs(self, conn: psycopg.Connection) -> None:
        for source, write in ((self._logs, runs.append_log), (self._requests, runs.append_requests)):
            entries = []
            while True:
                try:
                    entries.append(source.get_nowait())
                except queue.Empty:
                    break
            if not entries:
                continue
            try:
                write(conn, self._run_id, entries)
                self._logged += len(entries) if source is self._logs else 0
            except psycopg.Error:
                for e in entries:  # keep them for the next beat
                    source.put(e)
                raise

    def _listen(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a cancel notification addressed to this run (or for stop)."""
        deadline = time.monotonic() + timeout
        conn = self._conn
        if conn is None:
            self._stop.wait(timeout)
            return
        try:
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                notes = list(conn.notifies(timeout=min(left, 0.25), stop_after=1))
                if any(n.payload == self._run_id for n in notes) and not self._cancellation.is_cancelled:
                    # Only a recorded request cancels: any role that can connect can NOTIFY, but only
                    # `feiqiu-etl cancel` and the web page (which write etl_meta.run) set the flag.
                    with self._watched(conn):
                        requested_at, by = runs.cancel_request(conn, self._run_id)
                    if requested_at is None:
                        log.warning("ignored a cancel notification with no recorded cancel request")
                        continue
                    self._cancel(f"cancel requested by {by or 'another process'}")
                    return
        except psycopg.Error:
            self._close()

    def _cancel(self, source: str) -> None:
        self._cancel_source = source
        log.warning("%s: stopping (no new requests; what was fetched is written)", source)
        self._cancellation.cancel("remote")

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = self._connect(self._dsn)
            conn.autocommit = True
            try:
                with self._watched(conn):
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(runs.CANCEL_CHANNEL)))
            except psycopg.Error:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def statistics(self) -> ControlStatistics:
        age = time.monotonic() - self._last_beat if self._last_beat is not None else None
        return ControlStatistics(self._beats, self._failed, self._logged, self._cancel_source, age)
