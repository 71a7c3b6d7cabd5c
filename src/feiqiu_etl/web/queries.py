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
    return {"now": now, "running": registry.running(conn), "finished": recent_finished(conn)}


def freshness_report(conn: psycopg.Connection, settings: Any, hours: float) -> dict[str, Any]:
    """The freshness payload of the page and ``/api/freshness`` for the server's ``settings`` (its
    ``schedule``, from ``web --fleet``, or every task of its connector): the one rule of
    :func:`feiqiu_etl.registry.freshness.freshness_report`, which ``feiqiu-etl freshness`` uses too."""
    schedule = settings.schedule or Schedule.everything(settings.task_codes)
    return freshness.freshness_report(conn, settings.connector, schedule, hours)
