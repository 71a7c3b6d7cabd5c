"""The few reads the web page needs beyond :mod:`feiqiu_etl.runs.registry`, and JSON-safe values.

Like the registry, every function takes an open psycopg connection, passes values as parameters and
commits (so a pooled connection goes back idle). Nothing here writes.
"""

from __future__ import annotations

from typing import Any, Iterable

import psycopg
from psycopg.rows import dict_row

from feiqiu_etl.runs import registry
from feiqiu_etl.runs.registry import jsonable  # noqa: F401 - the web modules import it from here


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


def freshness_rows(conn: psycopg.Connection, connector: str, task_codes: Iterable[str],
                   stale_after_seconds: float) -> list[dict[str, Any]]:
    """:func:`registry.freshness` plus, for every store seen there, the connector's tasks that never
    completed a window or snapshot (``kind`` None, age None); each row gets ``stale``: its age is above
    ``stale_after_seconds`` or it never completed."""
    rows = registry.freshness(conn, connector)
    return mark_stale(rows, task_codes, stale_after_seconds)


def mark_stale(rows: list[dict], task_codes: Iterable[str], stale_after_seconds: float) -> list[dict]:
    """See :func:`freshness_rows` (pure: the rows are those of :func:`registry.freshness`)."""
    codes = list(task_codes)
    seen = {(r["site_id"], r["task"]) for r in rows}
    out = [dict(r) for r in rows]
    for site in sorted({r["site_id"] for r in rows}):
        for code in codes:
            if (site, code) not in seen:
                out.append({"site_id": site, "task": code, "kind": None, "fresh_until": None,
                            "age_seconds": None, "owed_details": 0, "max_attempts": None})
    for r in out:
        age = r.get("age_seconds")
        r["age_seconds"] = float(age) if age is not None else None
        r["stale"] = r["age_seconds"] is None or r["age_seconds"] > stale_after_seconds
    out.sort(key=lambda r: (r["site_id"], r["task"]))
    return out
