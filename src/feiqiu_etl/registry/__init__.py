"""The run registry: every run's record in ``etl_meta.run`` and its stored log in ``etl_meta.run_log``.

A run is recorded when it starts (command, redacted arguments, configuration snapshot, host, pid, version),
publishes a heartbeat and a live status snapshot about once a second while it runs, and is finished with
its status, exit code, per-lane/store/task results and one-line error. Another process — ``runs``,
``show``, ``status``, ``cancel``, the web page — reads the same rows. Nothing stays ``RUNNING`` forever:
:func:`sweep_interrupted` (called by every command that opens the database) turns a run whose process is
gone (same host, pid dead) or whose heartbeat is stale into ``INTERRUPTED``.

Cancel from another process: :func:`request_cancel` sets a durable flag and sends ``NOTIFY`` on
:data:`CANCEL_CHANNEL`; the running process listens (:mod:`.control`) and also sees the flag with its next
heartbeat if it missed the notification. Every function takes an open psycopg connection and commits.
Values are parameters; no identifier comes from outside.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterable, Mapping

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from feiqiu_etl.formats import iso

CANCEL_CHANNEL = "feiqiu_etl_cancel"
RUN_ID_CHARACTERS = r"[A-Za-z0-9._:-]{1,128}"
"""What a run id (or a prefix of one) is made of: ``20261201T020003Z-1a2b3c4d`` (:func:`new_run_id`); anything
else — a NUL byte, a control character, 129 characters or more — names no run and is refused before the
database is asked (``show``/``cancel``: one line, exit 2; the web API: 404)."""
STATUSES = ("RUNNING", "SUCCESS", "PARTIAL", "FAILED", "CANCELLED", "BUSY", "DEADLINE", "INTERRUPTED")
"""What ``etl_meta.run.status`` holds: RUNNING, the final statuses of ``runner.results.STATUSES`` and INTERRUPTED."""
HOST = socket.gethostname()

_LIST_COLUMNS = ("run_id, status, command, started_at, finished_at, heartbeat_at, host, pid, stores, tasks, lanes, "
                 "rows_written, requests, rejections, errors, exit_code, error, cancel_requested_at, recorded_late_at")
# seconds as a float (``extract`` gives numeric, which JSON would carry as a string)
_DURATION = "extract(epoch FROM coalesce(finished_at, now()) - started_at)::float8 AS duration"


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
                   "wait_reason", "outcome", "detail")


def append_requests(conn: psycopg.Connection, run_id: str, records: list[dict]) -> None:
    """Append lane attempts (dicts with :data:`REQUEST_COLUMNS`) to ``etl_meta.run_request`` (the timeline)."""
    if not records:
        return
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO etl_meta.run_request (run_id, lane, seq, site_id, task, request, gap_class, started_at, "
            "seconds, gap, wait_reason, outcome, detail) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            [(run_id, *(r.get(c) for c in REQUEST_COLUMNS)) for r in records])
    conn.commit()


def run_requests(conn: psycopg.Connection, run_id: str) -> list[dict[str, Any]]:
    """The lane attempts of a run in time order (for the timeline chart)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT lane, seq, site_id, task, request, gap_class, started_at, seconds, gap, wait_reason, outcome, "
            "detail FROM etl_meta.run_request WHERE run_id = %s ORDER BY started_at, lane, seq", (run_id,)).fetchall()
    conn.commit()
    return rows


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
    if row[0] == "RUNNING":
        conn.execute("UPDATE etl_meta.run SET cancel_requested_at = coalesce(cancel_requested_at, now()), "
                     "cancel_requested_by = coalesce(cancel_requested_by, %s) WHERE run_id = %s", (by, run_id))
        conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, run_id))
    conn.commit()
    return row[0]


def list_runs(conn: psycopg.Connection, *, limit: int = 20, offset: int = 0, status: str | None = None,
              store: int | None = None) -> list[dict[str, Any]]:
    """Runs newest first (dicts of the listing columns plus ``duration`` in seconds)."""
    clause, params = _filters(status, store)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT {_LIST_COLUMNS}, {_DURATION} FROM etl_meta.run {clause} "
            "ORDER BY started_at DESC, run_id DESC LIMIT %s OFFSET %s",
            (*params, limit, offset)).fetchall()
    conn.commit()
    return rows


def count_runs(conn: psycopg.Connection, *, status: str | None = None, store: int | None = None) -> int:
    """How many runs :func:`list_runs` would page through."""
    clause, params = _filters(status, store)
    n = conn.execute(f"SELECT count(*) FROM etl_meta.run {clause}", params).fetchone()[0]
    conn.commit()
    return n


def _filters(status: str | None, store: int | None) -> tuple[str, list]:
    """``WHERE`` clause (fixed text) and parameters for the status/store filters."""
    where, params = [], []
    if status:
        where.append("status = %s")
        params.append(status.upper())
    if store is not None:
        where.append("%s = ANY(stores)")
        params.append(store)
    return (f"WHERE {' AND '.join(where)}" if where else ""), params


def get_run(conn: psycopg.Connection, run_id: str, *, with_log: bool = True) -> dict[str, Any] | None:
    """One run: its record (with ``summary``, ``args``, ``config``, ``live``, ``pruned_at``: when retention removed
    its log and request timeline, :mod:`.retention`), the ``alerts`` sent about it
    (:func:`feiqiu_etl.alerts.record.alerts_of_run`) and, optionally, ``log``."""
    with conn.cursor(row_factory=dict_row) as cur:
        run = cur.execute(
            f"SELECT {_LIST_COLUMNS}, args, config, summary, live, version, cancel_requested_by, pruned_at, "
            f"{_DURATION} FROM etl_meta.run WHERE run_id = %s", (run_id,)).fetchone()
        if run is not None:
            from feiqiu_etl.alerts.record import alerts_of_run

            run["alerts"] = alerts_of_run(conn, run_id)
        if run is not None and with_log:
            run["log"] = cur.execute(
                "SELECT ts, level, lane, site_id, task, message FROM etl_meta.run_log WHERE run_id = %s "
                "ORDER BY seq", (run_id,)).fetchall()
    conn.commit()
    if run is not None and isinstance(run.get("args"), dict):
        run["args"] = redact_args(run["args"])  # records of older versions kept a URL's query secrets
    return run


def redact_args(params: dict[str, Any]) -> dict[str, Any]:
    """A command's parameters as they may be stored and shown: a secret-named one (the token, ``auth_token`` …:
    :func:`~feiqiu_etl.textsafe.is_secret_name`) never (``***``), a DSN without its password
    (:func:`~feiqiu_etl.db.connection.redact_dsn`), the API base and any other URL without its secrets
    (:func:`~feiqiu_etl.textsafe.redact_url`); tuples as lists. Idempotent."""
    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.textsafe import is_secret_name, redact_url

    out: dict[str, Any] = {}
    for key, value in params.items():
        if is_secret_name(key):
            out[key] = "***" if value else None
        elif key == "dsn" and isinstance(value, str) and value:
            out[key] = redact_dsn(value)
        elif isinstance(value, str) and "://" in value:
            out[key] = redact_url(value)
        elif isinstance(value, tuple):
            out[key] = list(value)
        else:
            out[key] = value
    return out


def running(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Runs in progress with their live snapshot and heartbeat age (s)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT {_LIST_COLUMNS}, live, extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age, "
            "extract(epoch FROM now() - started_at)::float8 AS duration "
            "FROM etl_meta.run WHERE status = 'RUNNING' ORDER BY started_at").fetchall()
    conn.commit()
    return rows


def run_id_problem(text: str) -> str | None:
    """None when ``text`` may be a run id or a prefix of one (:data:`RUN_ID_CHARACTERS`, or ``last``), else a
    one-line reason that shows it escaped and shortened."""
    if re.fullmatch(RUN_ID_CHARACTERS, text):
        return None
    shown = repr(text[:40]) + ("…" if len(text) > 40 else "")
    return (f"not a run id: {shown} (run ids are letters, digits and . _ : - only, at most 128 of them; "
            "see feiqiu-etl runs)")


def resolve_run_id(conn: psycopg.Connection, prefix: str) -> str | None:
    """The run id that equals ``prefix`` or uniquely starts with it; ``"last"`` is the newest run. None when
    there is no such run or the prefix is ambiguous (:func:`matching_runs` tells which)."""
    found = matching_runs(conn, prefix, limit=2)
    return found[0] if len(found) == 1 else None


def matching_runs(conn: psycopg.Connection, prefix: str, limit: int = 6) -> list[str]:
    """Up to ``limit`` run ids for ``prefix``: ``[id]`` if one equals it (or ``prefix`` is ``"last"``: the
    newest run), else those that start with it, newest first (several: the prefix is ambiguous)."""
    if prefix == "last":
        rows = conn.execute("SELECT run_id FROM etl_meta.run ORDER BY started_at DESC LIMIT 1").fetchall()
        conn.commit()
        return [r[0] for r in rows]
    rows = conn.execute("SELECT run_id FROM etl_meta.run WHERE run_id = %s OR run_id LIKE %s "
                        "ORDER BY run_id = %s DESC, started_at DESC, run_id DESC LIMIT %s",
                        (prefix, prefix.replace("%", r"\%").replace("_", r"\_") + "%", prefix, limit)).fetchall()
    conn.commit()
    ids = [r[0] for r in rows]
    return ids[:1] if ids and ids[0] == prefix else ids


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO 8601 strings with their offset in the display zone
    (:func:`feiqiu_etl.formats.iso`), ``Decimal`` as float and ``timedelta`` as seconds: what
    ``runs``/``show``/``status --json`` print and the web API answers, so both agree."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return iso(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def last_loaded(conn: psycopg.Connection, connector: str) -> list[dict[str, Any]]:
    """Per store and task: end of the newest finished window segment (windowed) or time of the last
    complete snapshot, and the details still owed."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "WITH w AS (SELECT task_code, site_id, max(window_end) AS fresh_until, max(completed_at) AS at "
            "           FROM etl_meta.window_progress WHERE connector = %(c)s GROUP BY 1, 2), "
            "s AS (SELECT task_code, site_id, completed_at AS fresh_until, completed_at AS at "
            "      FROM etl_meta.snapshot_done WHERE connector = %(c)s), "
            "o AS (SELECT task_code, site_id, count(*) AS owed, max(attempts) AS max_attempts "
            "      FROM etl_meta.detail_pending WHERE connector = %(c)s GROUP BY 1, 2), "
            "k AS (SELECT task_code, site_id FROM w UNION SELECT task_code, site_id FROM s "
            "      UNION SELECT task_code, site_id FROM o) "
            "SELECT k.site_id, k.task_code AS task, CASE WHEN w.task_code IS NOT NULL THEN 'windowed' "
            "       WHEN s.task_code IS NOT NULL THEN 'snapshot' END AS kind, "
            "       coalesce(w.fresh_until, s.fresh_until) AS fresh_until, "
            "       extract(epoch FROM now() - coalesce(w.fresh_until, s.fresh_until)) AS age_seconds, "
            "       coalesce(o.owed, 0) AS owed_details, o.max_attempts "
            "FROM k LEFT JOIN w USING (task_code, site_id) LEFT JOIN s USING (task_code, site_id) "
            "LEFT JOIN o USING (task_code, site_id) ORDER BY k.site_id, k.task_code", {"c": connector}).fetchall()
    conn.commit()
    return rows


def os_user() -> str:
    """The operating-system user of this process ("unknown" when the system has no name for it): who cancelled
    a run, who reset state."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "unknown"
