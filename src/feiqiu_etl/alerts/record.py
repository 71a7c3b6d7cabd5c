"""What was sent: ``etl_meta.alert``, one row per (reason, subject, target) — the record against storms.

Before sending, :func:`claim` inserts the rows of the findings a target should receive; a row that already
exists (sent, or being sent by another process) is not claimed again, so one reason about one subject
reaches each target once, whichever process sees it first. A row whose delivery failed (``ok`` false) may
be claimed again the next time the same finding comes up (e.g. the next freshness check). After sending,
:func:`finish` stores the outcome (ok, one-line error, latency, attempts, when) with a ``message_id`` shared
by the rows that went out in one message. :func:`alerts_of_run` gives a run's deliveries for ``show`` and
the web API. The table is created with the others (:mod:`feiqiu_etl.db.schema`). Targets are stored redacted (never a URL with its secret). Every statement has a time limit.
"""

from __future__ import annotations

from typing import Any, Iterable

import psycopg
from psycopg.rows import dict_row

from feiqiu_etl.alerts.rules import Finding, ordered
from feiqiu_etl.common.status import Status

STATEMENT_TIMEOUT = "5s"


def claim(conn: psycopg.Connection, items: Iterable[tuple[str, str, str, str | None]]) -> set[tuple[str, str, str]]:
    """Claim ``(reason, subject, target, run_id)`` rows; return the ``(reason, subject, target)`` claimed now
    (new, or failed before). Commits."""
    rows = list(items)
    if not rows:
        return set()
    claimed: set[tuple[str, str, str]] = set()
    with conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        with conn.cursor() as cur:
            for reason, subject, target, run_id in rows:
                got = cur.execute(
                    "INSERT INTO etl_meta.alert (reason, subject, target, run_id) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (reason, subject, target) DO UPDATE SET run_id = coalesce(EXCLUDED.run_id, "
                    "etl_meta.alert.run_id), ok = NULL, error = NULL, created_at = now() "
                    "WHERE etl_meta.alert.ok = false RETURNING reason, subject, target",
                    (reason, subject, target, run_id)).fetchone()
                if got:
                    claimed.add(tuple(got))
    return claimed


def finish(conn: psycopg.Connection, message_id: str, keys: Iterable[tuple[str, str, str]], delivery: dict) -> None:
    """Store the outcome ``delivery`` (:class:`~feiqiu_etl.alerts.sending.Delivery` as a dict) of one message
    on its rows ``keys``. Commits."""
    keys = list(keys)
    if not keys:
        return
    with conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        with conn.cursor() as cur:
            cur.executemany(
                "UPDATE etl_meta.alert SET message_id = %s, ok = %s, error = %s, latency_s = %s, attempts = %s, "
                "sent_at = %s WHERE reason = %s AND subject = %s AND target = %s",
                [(message_id, delivery["ok"], delivery["error"], delivery["latency_s"], delivery["attempts"],
                  delivery["sent_at"], *k) for k in keys])


def alerts_of_run(conn: psycopg.Connection, run_id: str) -> list[dict[str, Any]]:
    """A run's messages, oldest first: ``{target, reasons, ok, error, latency_s, attempts, sent_at}`` (one
    per message and target; ``ok`` None while being sent)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT target, array_agg(DISTINCT reason ORDER BY reason) AS reasons, bool_and(ok) AS ok, "
            "max(error) AS error, max(latency_s) AS latency_s, max(attempts) AS attempts, max(sent_at) AS sent_at, "
            "count(*) AS items FROM etl_meta.alert WHERE run_id = %s "
            "GROUP BY coalesce(message_id, id::text), target ORDER BY min(created_at), target",
            (run_id,)).fetchall()
    conn.commit()
    for r in rows:  # most severe first, as in the message
        r["reasons"] = [x.reason for x in ordered(Finding(reason, "") for reason in r["reasons"])]
    return rows


def alert_lines(alerts: list[dict[str, Any]]) -> list[str]:
    """``show``'s lines about a run's alerts (``alerts_of_run``)."""
    out = []
    for a in alerts:
        state = "sent" if a.get("ok") else ("sending" if a.get("ok") is None else Status.FAILED)
        latency = f" in {a['latency_s']:.2f} s" if a.get("latency_s") is not None else ""
        error = f": {a['error']}" if a.get("error") else ""
        out.append(f"alert {', '.join(a.get('reasons') or [])} → {a['target']}: {state}{latency}"
                   f" ({a.get('attempts') or 0} attempt(s)){error}")
    return out
