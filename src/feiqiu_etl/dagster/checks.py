"""The asset checks of the fleet's ODS assets, as verdicts: is a store's data fresh, and did a run finish
everything it planned. What the Dagster UI shows under each lane's asset (Checks tab), decided here.

* ``fresh_<site id>``, one per store of the lane: every task the store is **scheduled** for (the lane's
  ``tasks:``, else all of the connector's) has data newer than the threshold — decided by the one freshness
  rule of :mod:`feiqiu_etl.registry.freshness` (the ``freshness`` command, the web page and the STALE alert use
  it too). It is evaluated for every store of the lane, whenever the lane's asset is materialized and on its
  own (the ``feiqiu_freshness`` job and its schedule), so data that stopped moving shows even when no run
  comes;
* ``complete``: the run's own completeness, for the stores it materialized — every planned window segment of
  every windowed task is recorded finished (``etl_meta.window_progress``: all its pages and details were
  committed), every snapshot task completed its snapshot in this run (``etl_meta.snapshot_done``), no
  planned task was left unstarted, and no owed detail was given up (``detail.max_attempts``). A run can be
  SUCCESS for the step (a PARTIAL store is materialized, see :mod:`.outcome`) and still fail this check:
  the check says what the next run will have to fetch again.

Functions here read the warehouse (bounded statements) or are pure; nothing imports ``dagster``:
:mod:`feiqiu_etl.dagster.definitions` turns a :class:`CheckVerdict` into an ``AssetCheckResult``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

import psycopg

from feiqiu_etl.connector.windows import parse_local, to_aware
from feiqiu_etl.runner.results import RunResult
from feiqiu_etl.registry.freshness import Schedule, freshness_rows, judge

COMPLETE = "complete"
MAX_LISTED = 10


def fresh_check_name(site_id: int) -> str:
    """``fresh_<site id>``: Dagster check names take letters, digits and ``_`` only."""
    return f"fresh_{int(site_id)}"


@dataclass(frozen=True)
class CheckVerdict:
    """One check's result: ``passed``, a one-line ``description`` (what is wrong, or that all is well) and
    ``metadata`` (numbers and short texts for the UI)."""

    passed: bool
    description: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ freshness
def freshness_verdicts(rows: Iterable[Mapping[str, Any]], site_ids: Iterable[int],
                       stale_after_hours: float) -> dict[int, CheckVerdict]:
    """Pure: one verdict per store of ``site_ids`` from the judged rows of
    :func:`feiqiu_etl.registry.freshness.judge` (``stale`` already decided by the one rule)."""
    by_site: dict[int, list[Mapping[str, Any]]] = {int(s): [] for s in site_ids}
    for row in rows:
        if int(row["site_id"]) in by_site:
            by_site[int(row["site_id"])].append(row)
    out: dict[int, CheckVerdict] = {}
    for site, mine in by_site.items():
        stale = [r for r in mine if r["stale"]]
        never = [r["task"] for r in stale if r.get("age_seconds") is None]
        old = [r for r in stale if r.get("age_seconds") is not None]
        ages = [r["age_seconds"] for r in mine if r.get("age_seconds") is not None]
        meta: dict[str, Any] = {
            "tasks_scheduled": len(mine),
            "tasks_stale": len(stale),
            "stale_after_hours": float(stale_after_hours),
            "oldest_age_hours": round(max(ages) / 3600.0, 2) if ages else None,
            "owed_details": sum(int(r.get("owed_details") or 0) for r in mine),
        }
        if stale:
            meta["stale_tasks"] = ", ".join(r["task"] for r in stale[:MAX_LISTED]) + (
                f" … and {len(stale) - MAX_LISTED} more" if len(stale) > MAX_LISTED else "")
        parts = []
        if never:
            listed = ", ".join(never[:3]) + (" …" if len(never) > 3 else "")
            parts.append(f"{len(never)} task(s) never loaded ({listed})")
        if old:
            worst = max(old, key=lambda r: r["age_seconds"])
            parts.append(f"{len(old)} task(s) older than {stale_after_hours:g} h (oldest {worst['task']}: "
                         f"{worst['age_seconds'] / 3600.0:.1f} h)")
        if not mine:
            out[site] = CheckVerdict(False, f"store {site} is scheduled for no task", meta)
        elif parts:
            out[site] = CheckVerdict(False, f"store {site}: " + "; ".join(parts), meta)
        else:
            out[site] = CheckVerdict(True, f"store {site}: all {len(mine)} scheduled task(s) newer than "
                                           f"{stale_after_hours:g} h", meta)
    return out


def read_freshness(conn: psycopg.Connection, connector: str, schedule: Schedule, site_ids: Iterable[int],
                   stale_after_hours: float) -> dict[int, CheckVerdict]:
    """:func:`freshness_verdicts` of the warehouse behind ``conn`` (a warehouse no run ever wrote to holds no
    ``etl_meta`` yet: every scheduled task is then "never loaded")."""
    try:
        rows = freshness_rows(conn, connector, schedule, stale_after_hours * 3600.0)
    except psycopg.errors.UndefinedTable:
        conn.rollback()
        rows = judge([], schedule, stale_after_hours * 3600.0)
    return freshness_verdicts(rows, site_ids, stale_after_hours)


# ----------------------------------------------------------------------------------------------- completeness
@dataclass(frozen=True)
class PlannedTask:
    """What a run planned for one (store, task): its window segments (naive Asia/Shanghai, ``[start, end)``),
    or ``snapshot``; ``skipped`` says why it never started; ``given_up`` lists the owed details it gave up."""

    site_id: int
    task: str
    snapshot: bool
    windows: tuple[tuple[datetime, datetime], ...] = ()
    skipped: str | None = None
    given_up: tuple[str, ...] = ()


def uncovered(window: tuple[datetime, datetime], finished: Iterable[tuple[datetime, datetime]]
              ) -> list[tuple[datetime, datetime]]:
    """Pure: the parts of ``window`` (``[start, end)``) that no segment of ``finished`` covers."""
    start, end = window
    gaps: list[tuple[datetime, datetime]] = []
    cursor = start
    for s, e in sorted(finished):
        if e <= cursor or s >= end:
            continue
        if s > cursor:
            gaps.append((cursor, min(s, end)))
        cursor = max(cursor, e)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return gaps


def completeness_verdict(planned: Iterable[PlannedTask],
                         finished: Mapping[tuple[int, str], list[tuple[datetime, datetime]]],
                         snapshots_done: set[tuple[int, str]], *, run_started: datetime | None = None
                         ) -> CheckVerdict:
    """Pure: the ``complete`` verdict of one run (module docstring). ``finished`` maps (site, task) to the
    finished segments (aware datetimes); ``snapshots_done`` holds the (site, task) whose snapshot this run
    completed; ``run_started`` (aware): a segment reaching past it needs to be finished only up to it (the
    runner checkpoints no later than its task's start)."""
    problems: list[str] = []
    per_store: dict[int, dict[str, int]] = {}
    tasks = list(planned)
    for t in tasks:
        counts = per_store.setdefault(t.site_id, {"windows": 0, "windows_finished": 0, "snapshots": 0,
                                                  "snapshots_complete": 0, "details_given_up": 0, "not_run": 0})
        counts["details_given_up"] += len(t.given_up)
        if t.given_up:
            problems.append(f"{t.task} store {t.site_id}: {len(t.given_up)} owed detail(s) given up")
        if t.skipped is not None:
            counts["not_run"] += 1
            problems.append(f"{t.task} store {t.site_id}: not run ({t.skipped})")
            continue
        if t.snapshot:
            counts["snapshots"] += 1
            if (t.site_id, t.task) in snapshots_done:
                counts["snapshots_complete"] += 1
            else:
                problems.append(f"{t.task} store {t.site_id}: snapshot not completed")
        for start, end in t.windows:
            counts["windows"] += 1
            start, end = to_aware(start), to_aware(end)
            if run_started is not None and end > run_started:
                end = max(start, run_started)
            gaps = uncovered((start, end), finished.get((t.site_id, t.task), [])) if start < end else []
            if gaps:
                problems.append(f"{t.task} store {t.site_id}: window {start:%Y-%m-%d %H:%M} … {end:%Y-%m-%d %H:%M} "
                                f"not finished")
            else:
                counts["windows_finished"] += 1
    totals = {k: sum(c[k] for c in per_store.values()) for k in
              ("windows", "windows_finished", "snapshots", "snapshots_complete", "details_given_up", "not_run")}
    meta: dict[str, Any] = {"stores": len(per_store), "tasks": len(tasks), **totals}
    if problems:
        meta["problems"] = "\n".join(problems[:MAX_LISTED]) + (
            f"\n… and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")
        return CheckVerdict(False, f"{len(problems)} problem(s): {problems[0]}", meta)
    return CheckVerdict(True, f"every planned window and snapshot of {len(per_store)} store(s) finished, no owed "
                              "detail given up", meta)


def planned_tasks(result: RunResult, site_ids: Iterable[int], snapshot_codes: set[str]) -> list[PlannedTask]:
    """What ``result`` planned for the stores ``site_ids`` (its partitions)."""
    wanted = {int(s) for s in site_ids}
    out = []
    for lane in result.lanes:
        for store in lane.stores:
            if store.site_id not in wanted:
                continue
            for t in store.tasks:
                out.append(PlannedTask(store.site_id, t.task_code, t.task_code in snapshot_codes,
                                       tuple((parse_local(s), parse_local(e)) for s, e in t.windows),
                                       t.skipped, tuple(str(k) for k in t.details_given_up)))
    return out


def read_completeness(conn: psycopg.Connection, connector: str, result: RunResult, site_ids: Iterable[int],
                      snapshot_codes: set[str]) -> CheckVerdict:
    """:func:`completeness_verdict` of ``result`` for ``site_ids``, from what the warehouse recorded."""
    planned = planned_tasks(result, site_ids, snapshot_codes)
    sites = sorted({t.site_id for t in planned})
    finished: dict[tuple[int, str], list[tuple[datetime, datetime]]] = {}
    rows = conn.execute("SELECT site_id, task_code, window_start, window_end FROM etl_meta.window_progress "
                        "WHERE connector = %s AND site_id = ANY(%s)", (connector, sites)).fetchall()
    for site, task, start, end in rows:
        finished.setdefault((int(site), task), []).append((start, end))
    done = {(int(site), task) for site, task in conn.execute(
        "SELECT site_id, task_code FROM etl_meta.snapshot_done WHERE connector = %s AND site_id = ANY(%s) "
        "AND run_id = %s", (connector, sites, result.run_id)).fetchall()}
    conn.commit()
    started = None
    if result.started_at:
        started = datetime.fromisoformat(result.started_at)
        if started.tzinfo is None:
            started = to_aware(started)
    return completeness_verdict(planned, finished, done, run_started=started)
