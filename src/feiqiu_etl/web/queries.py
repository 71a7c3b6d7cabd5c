"""The few reads the web page needs beyond :mod:`feiqiu_etl.registry`, and JSON-safe values.

Like the registry, every function takes an open psycopg connection, passes values as parameters and
commits (so a pooled connection goes back idle). Nothing here writes.
"""

from __future__ import annotations

from typing import Any, Iterable

import psycopg
from psycopg.rows import dict_row

from feiqiu_etl import registry
from feiqiu_etl.registry import freshness
from feiqiu_etl.registry.freshness import Schedule
from feiqiu_etl.registry import jsonable  # noqa: F401 - the web modules import it from here


def store_ids(conn: psycopg.Connection) -> list[int]:
    """Every store (site id) that appears in some run, ascending (for the Runs page's store filter)."""
    rows = conn.execute("SELECT DISTINCT unnest(stores) AS s FROM etl_meta.run ORDER BY s").fetchall()
    conn.commit()
    return [r[0] for r in rows if r[0] is not None]


def recent_finished(conn: psycopg.Connection, within_seconds: float = 600.0, limit: int = 10) -> list[dict]:
    """Runs that finished in the last ``within_seconds`` (newest first), so that the Live page can show how a
    run it was watching ended (``CANCELLED`` after a cancel)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT run_id, status, started_at, finished_at, exit_code, error, rows_written, requests, rejections, "
            "errors, stores, tasks, lanes, cancel_requested_at, cancel_requested_by, "
            "(summary->>'rows_unchanged')::bigint AS rows_unchanged, "
            "extract(epoch FROM finished_at - started_at) AS duration FROM etl_meta.run "
            "WHERE status <> 'RUNNING' AND finished_at > now() - make_interval(secs => %s) "
            "ORDER BY finished_at DESC LIMIT %s", (within_seconds, limit)).fetchall()
    conn.commit()
    return rows


def live_totals(conn: psycopg.Connection, run_ids: Iterable[str]) -> dict[str, dict]:
    """Rows and requests so far of running runs (from their live snapshots): ``{run_id: {rows_written,
    requests, tasks_done, tasks}}``."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = conn.execute(
        "SELECT run_id, (live->>'rows_written')::bigint, (live->>'requests_sent')::bigint, "
        "(live->>'tasks_done')::int, (live->>'tasks')::int FROM etl_meta.run WHERE run_id = ANY(%s)",
        (ids,)).fetchall()
    conn.commit()
    return {r[0]: {"rows_written": r[1], "requests": r[2], "tasks_done": r[3], "tasks": r[4]} for r in rows}


def status_payload(conn: psycopg.Connection) -> dict[str, Any]:
    """What ``GET /api/status`` and the Live page show: ``running`` (registry.running, with live snapshots
    and heartbeat ages) and ``finished`` (runs ended in the last 10 minutes)."""
    now = conn.execute("SELECT now()").fetchone()[0]
    conn.commit()
    running = [run.to_dict() for run in registry.running(conn)]  # the feed's change key reads them as rows
    return {"now": now, "running": running, "finished": recent_finished(conn)}


def freshness_report(conn: psycopg.Connection, settings: Any, hours: float) -> dict[str, Any]:
    """The freshness payload of the page and ``/api/freshness`` for the server's ``settings`` (its
    ``schedule``, from ``web --fleet``, or every task of its connector): the one rule of
    :func:`feiqiu_etl.registry.freshness.freshness_report`, which ``feiqiu-etl freshness`` uses too."""
    schedule = settings.schedule or Schedule.everything(settings.task_codes)
    return freshness.freshness_report(conn, settings.connector, schedule, hours)


def finished_runs(conn: psycopg.Connection, days: int = 31) -> list[dict]:
    """The finished runs of the last ``days`` days, oldest first: ``{run_id, started_at, finished_at, night}``;
    ``night`` is the date the run started on in the warehouse's zone, shifted back 12 h (a run started at 01:00
    belongs to the night before). Cheap: no summary is read."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT run_id, started_at, finished_at, "
            "       ((started_at AT TIME ZONE current_setting('TimeZone')) - interval '12 hours')::date AS night "
            "FROM etl_meta.run WHERE status <> 'RUNNING' AND started_at > now() - make_interval(days => %s) "
            "ORDER BY started_at", (days,)).fetchall()
    conn.commit()
    return rows


def run_stores(conn: psycopg.Connection, run_ids: list[str]) -> dict[str, list[dict]]:
    """``{run_id: [{site_id, name, status, rows, reason}]}``: the stores of the runs' lanes
    (``summary.lanes[].stores[]``), read in the database (the summaries' task lists stay there)."""
    if not run_ids:
        return {}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT r.run_id, (st->>'site_id')::bigint AS site_id, st->>'name' AS name, st->>'status' AS status, "
            "       coalesce((st->>'rows')::bigint, 0) AS rows, st->>'reason' AS reason "
            "FROM etl_meta.run r, jsonb_array_elements(CASE WHEN jsonb_typeof(r.summary->'lanes') = 'array' "
            "     THEN r.summary->'lanes' ELSE '[]'::jsonb END) lane, "
            "     jsonb_array_elements(CASE WHEN jsonb_typeof(lane->'stores') = 'array' THEN lane->'stores' "
            "     ELSE '[]'::jsonb END) st "
            "WHERE r.run_id = ANY(%s)", (run_ids,)).fetchall()
    conn.commit()
    out: dict[str, list[dict]] = {rid: [] for rid in run_ids}
    for row in rows:
        out[row.pop("run_id")].append(row)
    return out


def last_finished_id(conn: psycopg.Connection, within_hours: float = 36.0) -> str | None:
    """The id of the newest finished ``run`` of the last ``within_hours`` hours with a summary (last night)."""
    row = conn.execute(
        "SELECT run_id FROM etl_meta.run WHERE status <> 'RUNNING' AND summary IS NOT NULL AND command = 'run' "
        "AND started_at > now() - make_interval(secs => %s) ORDER BY started_at DESC LIMIT 1",
        (within_hours * 3600,)).fetchone()
    conn.commit()
    return row[0] if row else None


def run_outline(conn: psycopg.Connection, run_id: str) -> dict | None:
    """A finished run without its task list: ``{run_id, status, started_at, finished_at, error, summary: {lanes,
    skipped_tasks}}``."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT run_id, status, started_at, finished_at, error, jsonb_build_object("
            "'lanes', summary->'lanes', 'skipped_tasks', summary->'skipped_tasks') AS summary "
            "FROM etl_meta.run WHERE run_id = %s", (run_id,)).fetchone()
    conn.commit()
    return row


def cell_history(conn: psycopg.Connection, connector: str, site_id: int, task: str, days: int = 30) -> dict:
    """One store and task over the last ``days`` days: ``runs`` (newest first: run_id, started_at, finished_at,
    run status and the task's result from the run's summary) and ``loads`` (windowed: each finished window
    segment's ``completed_at`` and its age then, ``lag_seconds`` = completed_at - window_end, oldest first)."""
    with conn.cursor(row_factory=dict_row) as cur:
        runs = cur.execute(
            "SELECT r.run_id, r.status AS run_status, r.started_at, r.finished_at, t AS result "
            "FROM etl_meta.run r, jsonb_array_elements(CASE WHEN jsonb_typeof(r.summary->'tasks') = 'array' "
            "     THEN r.summary->'tasks' ELSE '[]'::jsonb END) t "
            "WHERE (t->>'site_id')::bigint = %s AND t->>'task' = %s "
            "AND r.started_at > now() - make_interval(days => %s) ORDER BY r.started_at DESC LIMIT 200",
            (site_id, task, days)).fetchall()
        loads = cur.execute(
            "SELECT completed_at, window_start, window_end, run_id, "
            "       extract(epoch FROM completed_at - window_end) AS lag_seconds "
            "FROM etl_meta.window_progress WHERE connector = %s AND site_id = %s AND task_code = %s "
            "AND completed_at > now() - make_interval(days => %s) ORDER BY completed_at, window_end",
            (connector, site_id, task, days)).fetchall()
        now = cur.execute("SELECT now() AS now").fetchone()["now"]
    conn.commit()
    return {"runs": runs, "loads": loads, "now": now}
