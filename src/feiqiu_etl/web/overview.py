"""The chain overview (``/``, the first page), a cell's history (``/history``) and the language switch
(``/lang/<code>``) — issue 29, parts 2-4: the model here, the handlers in :mod:`.routes`.

The overview is one grid: a row per store, a column per task, each cell coloured by the age of its data against
the stale threshold (the one rule of :func:`feiqiu_etl.registry.freshness.freshness_report`, which
``feiqiu-etl freshness --json`` prints: the page cannot disagree with it). Per store: its name, the last run in
which it succeeded, the rows written for it last night (the runs of the last 24 h) with the last 30 nights as a
small chart, and the details it still owes. Below, *tonight*: for each lane of each running run the stores done,
running and waiting, the expected end (the live ETA, :class:`~feiqiu_etl.statistics.LaneStatistics`) next to the
deadline and what will be left at it; and *last night*: what the newest finished run left and why.

:func:`build_overview` assembles the payload of the page and of ``GET /api/overview`` (JSON).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


from feiqiu_etl.common.status import Status
from feiqiu_etl import registry
from feiqiu_etl.web import queries

RUNS_PARAMS = ("status", "store", "page", "per_page")
"""Query parameters of the Runs page: ``/?status=FAILED`` (the old address of Runs) is sent on to ``/runs``."""
NIGHTS = 30
LANG_COOKIE_AGE = 365 * 86400


def _state(request: Request):
    return request.app.state.web


# ---------------------------------------------------------------------------------------------------- model
def colour(age_seconds: float | None, stale_after_seconds: float) -> str:
    """A cell's colour class: ``never`` (never loaded), ``stale`` (older than the threshold), ``aging`` (older
    than half of it), ``fresh``. Stale exactly when :func:`feiqiu_etl.registry.freshness.judge` says so."""
    if age_seconds is None:
        return "never"
    if age_seconds > stale_after_seconds:
        return "stale"
    return "aging" if age_seconds > stale_after_seconds / 2 else "fresh"


def build_overview(conn, settings, hours: float, cache: "FinishedRuns | None" = None) -> dict[str, Any]:
    """``{connector, stale_after_hours, tasks, stores, cells, stale, tonight, last_night, now}``: ``stores`` in
    site-id order, each ``{site_id, name, last_success, rows_last_night, nights: {date: rows}, owed_details,
    stale}``; ``cells`` ``{site_id: {task: freshness row + colour}}``. ``cache`` keeps what finished runs'
    summaries say (a server's :class:`FinishedRuns`; None: read everything now)."""
    report = queries.freshness_report(conn, settings, hours)
    now = conn.execute("SELECT now()").fetchone()[0]
    conn.commit()
    order = {code: i for i, code in enumerate(settings.task_codes)}
    tasks = sorted({r["task"] for r in report["rows"]}, key=lambda c: (order.get(c, len(order)), c))
    limit = hours * 3600.0
    cells: dict[int, dict[str, dict]] = {}
    for r in report["rows"]:
        cells.setdefault(r["site_id"], {})[r["task"]] = {**r, "colour": colour(r["age_seconds"], limit)}
    names = dict(getattr(settings, "store_names", {}) or {})
    facts: dict[int, dict] = {}
    cache = cache if cache is not None else FinishedRuns()
    for run, stores in cache.stores(conn, NIGHTS + 1):
        for row in stores:
            f = facts.setdefault(row["site_id"], {"nights": {}, "last_success": None, "rows_last_night": 0})
            if row["name"] and row["site_id"] not in names:
                names[row["site_id"]] = row["name"]
            f["nights"][run["night"]] = f["nights"].get(run["night"], 0) + int(row["rows"] or 0)
            if row["status"] == Status.SUCCESS and run["finished_at"] is not None:
                f["last_success"] = max(filter(None, [f["last_success"], run["finished_at"]]))
            if run["started_at"] > now - timedelta(hours=24):
                f["rows_last_night"] += int(row["rows"] or 0)
    stores = []
    for site in sorted(cells):
        f = facts.get(site, {"nights": {}, "last_success": None, "rows_last_night": None})
        row_cells = cells[site].values()
        stores.append({"site_id": site, "name": names.get(site), "last_success": f["last_success"],
                       "rows_last_night": f["rows_last_night"], "nights": f["nights"],
                       "owed_details": sum(int(c["owed_details"] or 0) for c in row_cells),
                       "stale": sum(1 for c in row_cells if c["stale"])})
    return {"connector": report["connector"], "stale_after_hours": hours, "schedule": report["schedule"],
            "tasks": tasks, "stores": stores, "cells": cells, "stale": report["stale"], "total": len(report["rows"]),
            "tonight": tonight([r.to_dict() for r in registry.running(conn)], now),
            "last_night": last_night(cache.outline(conn)),
            "now": now}


def tonight(running: list[dict], now: datetime) -> list[dict]:
    """Per lane of each running run: ``{run_id, lane, state, done, running, waiting, stores, eta_s,
    expected_end, deadline_in_s, deadline_at, left_at_deadline, requests_remaining, late}``. The expected end
    is the heartbeat's time plus the lane's live ETA (what ``status --json`` publishes), the deadline the
    heartbeat's time plus ``deadline_in_s``; ``late``: the work does not fit before the deadline."""
    out = []
    for run in running:
        live = run.get("live") or {}
        beat = run.get("heartbeat_at") or now
        for lane in live.get("lanes") or []:
            stores = lane.get("stores") or []
            done = [s for s in stores if s.get("tasks") and s.get("tasks_done", 0) >= s.get("tasks", 0)]
            busy = [s for s in stores if s not in done and s.get("task")]
            waiting = [s for s in stores if s not in done and s not in busy]
            eta = lane.get("eta_s")
            deadline_in = lane.get("deadline_in_s")
            left = lane.get("left_at_deadline")
            out.append({"run_id": run["run_id"], "lane": lane.get("name"), "state": lane.get("state"),
                        "heartbeat": beat,
                        "done": len(done), "running": len(busy), "waiting": len(waiting), "stores": stores,
                        "tasks_done": lane.get("tasks_done"), "tasks": lane.get("tasks"),
                        "eta_s": eta, "expected_end": beat + timedelta(seconds=eta) if eta is not None else None,
                        "deadline_in_s": deadline_in,
                        "deadline_at": beat + timedelta(seconds=deadline_in) if deadline_in is not None else None,
                        "left_at_deadline": left, "requests_remaining": lane.get("requests_remaining"),
                        "late": bool(left)})
    return out


def last_night(run: dict | None) -> dict | None:
    """What the newest finished run left, and why: ``{run_id, status, started_at, finished_at, error, lanes:
    [{name, status, reason, deadline}], left: [{site_id, name, status, reason, lane}], skipped: [...]}``."""
    if run is None:
        return None
    summary = run.get("summary") or {}
    lanes, left = [], []
    for lane in summary.get("lanes") or []:
        lanes.append({"name": lane.get("name"), "status": lane.get("status"), "reason": lane.get("reason"),
                      "deadline": lane.get("deadline")})
        for store in lane.get("stores") or []:
            if store.get("status") not in (Status.SUCCESS, None):
                left.append({**store, "lane": lane.get("name")})
    return {"run_id": run["run_id"], "status": run["status"], "started_at": run["started_at"],
            "finished_at": run["finished_at"], "error": run.get("error"), "lanes": lanes, "left": left,
            "skipped": summary.get("skipped_tasks") or []}


class FinishedRuns:
    """What the overview reads from finished runs' summaries, kept per run id: a finished run's summary does not
    change, and a chain's 30 nights are 30 summaries of ~1,000 task results each, which PostgreSQL would
    otherwise parse on every view. Each view still lists the finished runs (one cheap query) and reads only the
    runs it has not seen; runs older than the window are dropped. Thread-safe enough for Starlette's thread pool
    (a dict assignment per run; two views may read the same new run twice)."""

    def __init__(self) -> None:
        self._stores: dict[str, list[dict]] = {}
        self._outlines: dict[str, dict | None] = {}
        self.reads = self.hits = 0

    def stores(self, conn, days: int) -> list[tuple[dict, list[dict]]]:
        """``[(run {run_id, started_at, finished_at, night}, its lanes' stores)]`` of the last ``days`` days."""
        runs = queries.finished_runs(conn, days)
        wanted = [r["run_id"] for r in runs if r["run_id"] not in self._stores]
        if wanted:
            self._stores.update(queries.run_stores(conn, wanted))
            self.reads += len(wanted)
        self.hits += len(runs) - len(wanted)
        keep = {r["run_id"] for r in runs}
        for rid in [k for k in self._stores if k not in keep]:
            self._stores.pop(rid, None)
        return [(r, self._stores.get(r["run_id"]) or []) for r in runs]

    def outline(self, conn) -> dict | None:
        """The last night's run (:func:`queries.run_outline`), or None."""
        rid = queries.last_finished_id(conn)
        if rid is None:
            return None
        if rid not in self._outlines:
            self._outlines = {rid: queries.run_outline(conn, rid)}
        return self._outlines[rid]

    def statistics(self) -> dict:
        return {"runs_cached": len(self._stores), "summary_reads": self.reads, "cache_hits": self.hits}
