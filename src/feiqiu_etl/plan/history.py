"""What the warehouse remembers that a plan needs: finished window segments, incremental horizons, owed
details and the counts of the last runs. This is planning's only I/O; :func:`read_history` returns frozen data
that :func:`feiqiu_etl.plan.builder.build_plan` turns into a plan without touching the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

import psycopg

from feiqiu_etl.connector.windows import Window, from_aware

HISTORY_RUNS = 30
"""How many recent finished runs are read for the per-task counts of the last runs."""
RUNS_PER_TASK = 5
"""Task entries kept per (task, store), newest first."""


@dataclass(frozen=True)
class TaskHistory:
    """One (task, store): segments done, the horizon, owed details, and the task entries of the last finished
    runs that ran it, newest first (dicts of ``TaskRun.to_dict()``; at most ``RUNS_PER_TASK``)."""

    done: tuple[Window, ...] = ()
    horizon: datetime | None = None
    owed_details: int = 0
    runs: tuple[Mapping[str, Any], ...] = ()

    @property
    def last(self) -> Mapping[str, Any] | None:
        """The task entry of the last finished run that ran it (None if it never ran)."""
        return self.runs[0] if self.runs else None


@dataclass(frozen=True)
class PlanHistory:
    """History of every (task, store) of a plan, plus the mean seconds a request held the lane recently."""

    tasks: Mapping[tuple[str, int], TaskHistory] = field(default_factory=dict)
    request_seconds: float | None = None

    def of(self, task: str, site_id: int) -> TaskHistory:
        return self.tasks.get((task, site_id), TaskHistory())


EMPTY = PlanHistory()


def read_history(conn: psycopg.Connection, connector: str, keys: Iterable[tuple[str, int]]) -> PlanHistory:
    """Read the history of ``keys`` ((task code, site id) pairs) for ``connector``. Read-only."""
    keys = list(dict.fromkeys(keys))
    sites = sorted({s for _, s in keys})
    done: dict[tuple[str, int], list[Window]] = {}
    for task, site, a, b in conn.execute(
            "SELECT task_code, site_id, window_start, window_end FROM etl_meta.window_progress "
            "WHERE connector = %s AND site_id = ANY(%s)", (connector, sites)):
        done.setdefault((task, site), []).append(Window(from_aware(a), from_aware(b)))
    horizons = {(t, s): from_aware(h) for t, s, h in conn.execute(
        "SELECT task_code, site_id, horizon_start FROM etl_meta.window_horizon WHERE connector = %s "
        "AND site_id = ANY(%s)", (connector, sites))}
    owed = {(t, s): n for t, s, n in conn.execute(
        "SELECT task_code, site_id, count(*) FROM etl_meta.detail_pending WHERE connector = %s "
        "AND site_id = ANY(%s) GROUP BY 1, 2", (connector, sites))}
    runs: dict[tuple[str, int], list[dict]] = {}
    busy = sent = 0.0
    for summary, in conn.execute(
            "SELECT summary FROM etl_meta.run WHERE status IN ('SUCCESS', 'PARTIAL') AND summary IS NOT NULL "
            "AND summary->>'connector' IS NOT DISTINCT FROM %s ORDER BY started_at DESC LIMIT %s",
            (connector, HISTORY_RUNS)):
        for entry in summary.get("tasks") or []:
            if entry.get("skipped"):  # planned but never started: it says nothing about the data
                continue
            mine = runs.setdefault((entry.get("task"), entry.get("site_id")), [])
            if len(mine) < RUNS_PER_TASK:
                mine.append(entry)
        for lane in summary.get("lanes") or []:
            busy += float(lane.get("busy_seconds") or 0)
            sent += float(lane.get("requests_sent") or 0)
    conn.commit()
    tasks = {key: TaskHistory(tuple(done.get(key, ())), horizons.get(key), owed.get(key, 0), tuple(runs.get(key, ())))
             for key in keys}
    return PlanHistory(tasks, busy / sent if sent else None)
