"""Writing a run's record: ``etl_meta.run`` when it starts, its heartbeat and live snapshot while it runs, its
end; its stored log (``etl_meta.run_log``) and request timeline (``etl_meta.run_request``); the sweep that turns
a vanished run INTERRUPTED; a cancel request from another process (durable flag + ``NOTIFY`` on
:data:`CANCEL_CHANNEL`). Every function takes an open psycopg connection and commits. Values are parameters; no
identifier comes from outside. Reading the records back is :mod:`.records`."""

from __future__ import annotations

import getpass
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

import psycopg
from psycopg.types.json import Jsonb

from feiqiu_etl.common.status import Status

CANCEL_CHANNEL = "feiqiu_etl_cancel"
HOST = socket.gethostname()


def process_started(pid: int | None = None) -> float | None:
    """Creation time (s since the epoch) of process ``pid`` (default: this one), or None if it is gone."""
    import psutil

    try:
        return psutil.Process(pid or os.getpid()).create_time()
    except (psutil.Error, OSError):
        return None


def new_run_id() -> str:
    """``20261201T020003Z-1a2b3c4d``: UTC start time (sorts by age) and 8 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class Invocation:
    """How a run was started, as its record keeps it: its id, the command (``run``, ``demo``, ``dagster``) and
    its arguments (already redacted: no token, no password)."""

    run_id: str = field(default_factory=new_run_id)
    command: str = "run"
    args: Mapping[str, Any] = field(default_factory=dict)


def start_run(conn: psycopg.Connection, invocation: Invocation, *, config: dict, lanes: Iterable[str] = (),
              stores: Iterable[int] = (), tasks: Iterable[str] = (), started_at: datetime | None = None) -> None:
    """Insert the ``RUNNING`` record of a run (``config`` must already be redacted)."""
    from feiqiu_etl import __version__

    run_id, command, args = invocation.run_id, invocation.command, dict(invocation.args)
    started_at = started_at or datetime.now(timezone.utc)
    conn.execute(
        "INSERT INTO etl_meta.run (run_id, started_at, status, command, args, config, host, pid, process_started, "
        "version, heartbeat_at, lanes, stores, tasks) VALUES (%s, %s, 'RUNNING', %s, %s, %s, %s, %s, %s, %s, now(), "
        "%s, %s, %s)",
        (run_id, started_at, command, Jsonb(args), Jsonb(config), HOST, os.getpid(), process_started(), __version__,
         list(lanes), list(stores), list(tasks)))
    conn.commit()


def heartbeat(conn: psycopg.Connection, run_id: str, live: Mapping[str, Any] | None) -> tuple[datetime | None,
                                                                                            str | None]:
    """Publish the heartbeat and the live snapshot (``RunStatistics.to_dict()``, or ``{"error": …}`` when it
    could not be built); return ``(cancel_requested_at, cancel_requested_by)``."""
    row = conn.execute(
        "UPDATE etl_meta.run SET heartbeat_at = now(), live = %s WHERE run_id = %s "
        "RETURNING cancel_requested_at, cancel_requested_by",
        (Jsonb(dict(live)) if live is not None else None, run_id)).fetchone()
    conn.commit()
    return (row[0], row[1]) if row else (None, None)


def cancel_request(conn: psycopg.Connection, run_id: str) -> tuple[datetime | None, str | None]:
    """``(cancel_requested_at, cancel_requested_by)`` of a run, ``(None, None)`` when none was recorded."""
    row = conn.execute("SELECT cancel_requested_at, cancel_requested_by FROM etl_meta.run WHERE run_id = %s",
                       (run_id,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def finish_run(conn: psycopg.Connection, run_id: str, *, status: str, exit_code: int, summary: dict | None,
               error: str | None = None, totals: Mapping[str, int] | None = None,
               late_end: datetime | None = None) -> None:
    """Record the end of a run (only a run still ``RUNNING`` or ``INTERRUPTED`` is updated). ``totals`` are
    ``RunResult.totals()``: ``rows_written``, ``requests``, ``rejections`` and ``errors`` are kept in the
    run's columns (a missing one as 0; others are ignored). ``late_end``: the run ended then, and its record is
    written late (:mod:`feiqiu_etl.registry.late`: ``recorded_late_at`` = now); None: it ends now."""
    counts = [int((totals or {}).get(k, 0)) for k in ("rows_written", "requests", "rejections", "errors")]
    conn.execute(
        "UPDATE etl_meta.run SET status = %s, exit_code = %s, summary = %s, error = %s, "
        "finished_at = coalesce(%s, now()), heartbeat_at = coalesce(%s, now()), live = NULL, rows_written = %s, "
        "requests = %s, rejections = %s, errors = %s, recorded_late_at = CASE WHEN %s THEN now() END "
        "WHERE run_id = %s AND status IN ('RUNNING', 'INTERRUPTED')",
        (status, exit_code, Jsonb(summary) if summary is not None else None, error, late_end, late_end,
         *counts, late_end is not None, run_id))
    conn.commit()


def append_log(conn: psycopg.Connection, run_id: str, entries: list[dict]) -> None:
    """Append log entries ``{ts, level, lane, site_id, task, message}`` to the run's stored log, in order."""
    if not entries:
        return
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO etl_meta.run_log (run_id, ts, level, lane, site_id, task, message) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(run_id, e["ts"], e["level"], e.get("lane"), e.get("site_id"), e.get("task"), e["message"][:20000])
             for e in entries])
    conn.commit()


REQUEST_COLUMNS = ("lane", "seq", "site_id", "task", "request", "gap_class", "started_at", "seconds", "gap",
                   "wait_reason", "outcome", "detail", "drawn")


def append_requests(conn: psycopg.Connection, run_id: str, records: list[dict]) -> None:
    """Append lane attempts (dicts with :data:`REQUEST_COLUMNS`) to ``etl_meta.run_request`` (the timeline)."""
    if not records:
        return
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO etl_meta.run_request (run_id, lane, seq, site_id, task, request, gap_class, started_at, "
            "seconds, gap, wait_reason, outcome, detail, drawn) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s) "
            "ON CONFLICT DO NOTHING",
            [(run_id, *(r.get(c) for c in REQUEST_COLUMNS)) for r in records])
    conn.commit()



def sweep_interrupted(conn: psycopg.Connection, stale_after: float = 30.0) -> list[str]:
    """Mark ``INTERRUPTED`` every ``RUNNING`` run whose process is gone: on this host, its pid is dead (or now
    belongs to another process); elsewhere, its heartbeat is older than ``stale_after`` seconds. Returns
    the run ids marked (:func:`feiqiu_etl.alerts.sweep_and_alert` alerts about them: what commands call; it
    writes the records kept because the database did not answer when their run ended first, :mod:`.late`)."""
    rows = conn.execute(
        "SELECT run_id, host, pid, process_started, heartbeat_at, now() - coalesce(heartbeat_at, started_at) "
        "FROM etl_meta.run WHERE status = 'RUNNING'").fetchall()
    marked = []
    for run_id, host, pid, started, beat, age in rows:
        why = None
        if host == HOST and pid:
            alive = process_started(pid)
            if alive is None or (started is not None and abs(alive - started) > 1.0):
                why = f"process {pid} on {host} is gone"
        if why is None and age > timedelta(seconds=stale_after) and (host != HOST or not pid):
            why = f"no heartbeat since {beat or 'start'} (host {host or 'unknown'})"
        if why is None and age > timedelta(seconds=max(stale_after * 10, 600)):
            why = f"no heartbeat since {beat} although process {pid} exists"
        if why:
            done = conn.execute(
                "UPDATE etl_meta.run SET status = 'INTERRUPTED', error = %s, finished_at = coalesce(heartbeat_at, "
                "started_at), live = NULL WHERE run_id = %s AND status = 'RUNNING'", (why, run_id))
            if done.rowcount:  # not when another process marked it (or the run finished) meanwhile
                marked.append(run_id)
    conn.commit()
    return marked


def request_cancel(conn: psycopg.Connection, run_id: str, by: str | None = None) -> str | None:
    """Ask a running run to cancel: durable flag + ``NOTIFY``. Returns the run's status before (None if
    there is no such run); only a ``RUNNING`` run is flagged."""
    by = by or f"{os_user()}@{HOST} pid {os.getpid()}"
    row = conn.execute("SELECT status FROM etl_meta.run WHERE run_id = %s", (run_id,)).fetchone()
    if row is None:
        conn.commit()
        return None
    if row[0] == Status.RUNNING:
        conn.execute("UPDATE etl_meta.run SET cancel_requested_at = coalesce(cancel_requested_at, now()), "
                     "cancel_requested_by = coalesce(cancel_requested_by, %s) WHERE run_id = %s", (by, run_id))
        conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, run_id))
    conn.commit()
    return row[0]



def os_user() -> str:
    """The operating-system user of this process ("unknown" when the system has no name for it): who cancelled
    a run, who reset state."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "unknown"
