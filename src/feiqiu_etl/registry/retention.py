"""Retention of the run registry: old runs lose their stored log and request timeline, never the data.

``feiqiu-etl runs prune --older-than 90d`` and ``run.retention_days`` (default 90, 0 = keep forever; applied
at the end of every run by :func:`prune_after_run`) call :func:`prune`. For every run that ended (any status
but ``RUNNING``) before the cutoff it deletes the run's stored log (``etl_meta.run_log``) and its request
timeline (``etl_meta.run_request``) and its listings' reconciliation (``etl_meta.listing_reconcile``, issue 25;
the run's summary keeps their verdict counts), drops the rows-over-time series from its summary, and stamps the run's
``pruned_at``: the run's record — status, counts, per-store/task results, errors — stays, and ``show`` and
the web page say "timeline pruned on …". With ``records=True`` (``runs prune --records``) the run records
themselves go too, with the alerts recorded about them.

Only ``etl_meta`` registry tables are touched: never ``ods``/``dwd`` rows, never the bookkeeping that says
what is loaded (windows, snapshots, owed details). Bounded: each batch of at most ``batch`` runs is one
transaction under a statement and lock timeout, and no batch starts after ``budget_s`` seconds; what is left
is pruned the next time (``complete`` False says so). A run being pruned is locked (``FOR UPDATE SKIP
LOCKED``), so two pruners never wait on each other.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

import psycopg

from feiqiu_etl.errortext import one_line

log = logging.getLogger("feiqiu_etl.retention")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", re.IGNORECASE | re.ASCII)  # ASCII digits only


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` (a positive number and one unit) as a timedelta. Raises
    ``ValueError`` with a one-line reason for anything else."""
    found = _DURATION.fullmatch(text or "")
    if not found:
        shown = repr(text[:40]) if isinstance(text, str) else repr(text)
        raise ValueError(f"not a duration: {shown} (a number and a unit: 90d, 12h, 30m, 45s or 2w)")
    seconds = float(found.group(1)) * _UNITS[found.group(2).lower()]
    if seconds <= 0:
        raise ValueError(f"the duration must be above 0, got {text.strip()!r}")
    if seconds > 100 * 366 * 86400:
        raise ValueError(f"the duration must be at most 100 years, got {text.strip()!r}")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` did: ``runs`` whose log and timeline were pruned (``records``: run records deleted),
    stored-log rows and request-timeline rows deleted, alert rows deleted with their records, the ``cutoff``
    (runs that ended before it were eligible), ``complete`` False when the time budget ran out first, and
    ``seconds`` spent."""

    runs: int = 0
    records: int = 0
    log_rows: int = 0
    request_rows: int = 0
    alert_rows: int = 0
    reconcile_rows: int = 0
    cutoff: datetime | None = None
    complete: bool = True
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """The figures for ``--json`` (``cutoff`` stays a datetime: ``registry.jsonable`` writes it)."""
        return {"runs": self.runs, "records": self.records, "log_rows": self.log_rows,
                "request_rows": self.request_rows, "alert_rows": self.alert_rows,
                "reconcile_rows": self.reconcile_rows,
                "cutoff": self.cutoff, "complete": self.complete,
                "seconds": round(self.seconds, 3)}


_ELIGIBLE = ("SELECT run_id FROM etl_meta.run WHERE status <> 'RUNNING' "
             "AND coalesce(finished_at, started_at) < %(cutoff)s AND (%(records)s OR pruned_at IS NULL) "
             "ORDER BY started_at, run_id LIMIT %(batch)s FOR UPDATE SKIP LOCKED")


def prune(conn: psycopg.Connection, older_than: timedelta, *, records: bool = False, budget_s: float = 30.0,
          batch: int = 200, statement_timeout_s: float = 10.0,
          clock: Callable[[], float] = time.monotonic) -> PruneResult:
    """Prune every run that ended more than ``older_than`` ago (module docstring). ``budget_s``: no batch
    starts later than this many seconds after the call; ``statement_timeout_s`` bounds each statement and
    lock wait. Commits each batch. Raises psycopg errors (a statement over its limit included); what was
    committed before stays pruned."""
    started = clock()
    cutoff = conn.execute("SELECT now() - %s", (older_than,)).fetchone()[0]
    conn.commit()
    totals = dict(runs=0, records=0, log_rows=0, request_rows=0, alert_rows=0, reconcile_rows=0)
    complete = True
    while True:
        if clock() - started > budget_s:
            complete = False
            break
        with conn.transaction():
            ms = max(1, int(statement_timeout_s * 1000))
            conn.execute(f"SET LOCAL statement_timeout = {ms}")
            conn.execute(f"SET LOCAL lock_timeout = {ms}")
            ids = [r[0] for r in conn.execute(_ELIGIBLE, {"cutoff": cutoff, "records": records,
                                                          "batch": batch}).fetchall()]
            if not ids:
                break
            totals["log_rows"] += conn.execute("DELETE FROM etl_meta.run_log WHERE run_id = ANY(%s)",
                                               (ids,)).rowcount
            totals["request_rows"] += conn.execute("DELETE FROM etl_meta.run_request WHERE run_id = ANY(%s)",
                                                   (ids,)).rowcount
            totals["reconcile_rows"] += conn.execute(
                "DELETE FROM etl_meta.listing_reconcile WHERE run_id = ANY(%s)", (ids,)).rowcount
            if records:
                totals["alert_rows"] += conn.execute("DELETE FROM etl_meta.alert WHERE run_id = ANY(%s)",
                                                     (ids,)).rowcount
                totals["records"] += conn.execute("DELETE FROM etl_meta.run WHERE run_id = ANY(%s)",
                                                  (ids,)).rowcount
            else:
                conn.execute("UPDATE etl_meta.run SET pruned_at = now(), live = NULL, "
                             "summary = CASE WHEN jsonb_typeof(summary) = 'object' THEN summary - 'timeline' "
                             "ELSE summary END WHERE run_id = ANY(%s)", (ids,))
            totals["runs"] += len(ids)
        if len(ids) < batch:
            break
    return PruneResult(**totals, cutoff=cutoff, complete=complete, seconds=clock() - started)


def prune_after_run(dsn: str, retention_days: float, *, connect: Callable[[str], psycopg.Connection],
                    budget_s: float = 5.0) -> PruneResult | None:
    """``run.retention_days`` at the end of a run: prune runs older than that many days (0: keep forever,
    None returned), in batches of 20 runs; no batch starts after ``budget_s`` seconds and each statement may
    take ``budget_s / 2`` seconds. Never raises: a failure is one WARNING line, and what is left is pruned after
    the next run."""
    if not retention_days or retention_days <= 0:
        return None
    try:
        with connect(dsn) as conn:
            result = prune(conn, timedelta(days=retention_days), budget_s=budget_s, batch=20,
                           statement_timeout_s=max(0.5, budget_s / 2))
    except Exception as exc:  # noqa: BLE001 - retention must never fail a run
        log.warning("retention: could not prune runs older than %g days: %s", retention_days, one_line(exc))
        return None
    if result.runs:
        log.info("retention: pruned the log and timeline of %d run(s) older than %g days (%d log rows, %d "
                 "requests)%s", result.runs, retention_days, result.log_rows, result.request_rows,
                 "" if result.complete else "; the rest after the next run")
    return result
