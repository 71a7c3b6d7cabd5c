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
from feiqiu_etl.common.status import Status

HISTORY_RUNS = 30
"""How many recent finished runs are read for the per-task counts of the last runs."""
RUNS_PER_TASK = 5
"""Task entries kept per (task, store), newest first."""
FLOOR_RUNS = 10
"""A floor the upstream taught a token (a 42901) binds its lane in this many later runs of the token."""
FLOOR_DAYS = 7
"""... and for at most this many days."""


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
    """History of every (task, store) of a plan, plus the mean seconds a request held the lane recently and, per
    lane key (connector and token fingerprint), the highest floor per gap class the upstream taught that token in
    its last runs (s; :func:`read_floors`)."""

    tasks: Mapping[tuple[str, int], TaskHistory] = field(default_factory=dict)
    request_seconds: float | None = None
    floors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def of(self, task: str, site_id: int) -> TaskHistory:
        return self.tasks.get((task, site_id), TaskHistory())


EMPTY = PlanHistory()


def read_floors(conn: psycopg.Connection, lanes: Iterable[str]) -> dict[str, dict[str, float]]:
    """``{lane key: {gap class: seconds}}``: the highest floor each token's lane learnt from a 42901 in its last
    :data:`FLOOR_RUNS` runs of the last :data:`FLOOR_DAYS` days (the run records' lane figures, whatever the runs'
    status). A lane with a deadline never narrows a gap below it. Read-only."""
    wanted = set(lanes)
    out: dict[str, dict[str, float]] = {}
    seen: dict[str, int] = {}
    if not wanted:
        return out
    for lanes_json, in conn.execute(
            "SELECT summary->'lanes' FROM etl_meta.run WHERE summary IS NOT NULL "
            "AND started_at > now() - make_interval(days => %s) ORDER BY started_at DESC LIMIT %s",
            (FLOOR_DAYS, HISTORY_RUNS)):
        for lane in lanes_json or []:
            key = lane.get("key") if isinstance(lane, dict) else None
            if key not in wanted or seen.get(key, 0) >= FLOOR_RUNS:
                continue
            seen[key] = seen.get(key, 0) + 1
            for gap_class, seconds in (lane.get("floors") or {}).items():
                if isinstance(seconds, (int, float)) and seconds > out.setdefault(key, {}).get(gap_class, 0.0):
                    out[key][gap_class] = float(seconds)
    conn.commit()
    return out


def read_history(conn: psycopg.Connection, connector: str, keys: Iterable[tuple[str, int]],
                 lanes: Iterable[str] = ()) -> PlanHistory:
    """Read the history of ``keys`` ((task code, site id) pairs) for ``connector``, and the learnt floors of the
    lane keys ``lanes``. Read-only."""
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
            "SELECT summary FROM etl_meta.run WHERE status IN ('SUCCESS', 'PARTIAL', 'DEADLINE') "
            "AND summary IS NOT NULL AND summary->>'connector' IS NOT DISTINCT FROM %s ORDER BY started_at DESC "
            "LIMIT %s", (connector, HISTORY_RUNS)):
        for entry in summary.get("tasks") or []:
            if entry.get("skipped") or entry.get("status") not in (Status.SUCCESS, Status.PARTIAL):
                continue  # planned but never started, or stopped by its lane's deadline: not the data's whole story
            mine = runs.setdefault((entry.get("task"), entry.get("site_id")), [])
            if len(mine) < RUNS_PER_TASK:
                mine.append(entry)
        for lane in summary.get("lanes") or []:
            busy += float(lane.get("busy_seconds") or 0)
            sent += float(lane.get("requests_sent") or 0)
    conn.commit()
    tasks = {key: TaskHistory(tuple(done.get(key, ())), horizons.get(key), owed.get(key, 0), tuple(runs.get(key, ())))
             for key in keys}
    return PlanHistory(tasks, busy / sent if sent else None, read_floors(conn, lanes))
