"""What a run produced — per lane, per store, per task — and how each whole's status follows from its parts'.

The statuses, their exit codes and how they combine are ONE table, :mod:`feiqiu_etl.common.status`; here is what
makes each whole stop:

* a **store** is FAILED when it was refused (40103), every task failed, or not one of its requests succeeded
  (nothing was loaded: a wrong URL, the upstream down); PARTIAL when some task is not SUCCESS; CANCELLED when
  the run was cancelled before it finished; BUSY when its lane was held by another run;
* a **lane** is BUSY when another run holds its token (nothing was tried: no failure); FAILED when it stopped
  (invalid token 40101, upstream unreachable) or every store failed; PARTIAL when some store is not SUCCESS;
* the **run** is CANCELLED when cancelled; BUSY when every lane was busy (exit 6, DWD skipped: the holder's
  own load follows it); FAILED when every lane failed or was busy, whatever the DWD load that followed did (it
  merged what ODS already held), or when the DWD load ran alone and failed; PARTIAL when anything is not
  SUCCESS; else SUCCESS. So one forbidden store, one bad token or one busy lane in a fleet fails alone and the
  run is PARTIAL, while a single-store run refused by the upstream is FAILED (exit 4), with or without DWD.

**DEADLINE** (exit 9) is a whole — store, lane or run — whose parts all succeeded but some of which stopped at a
lane's deadline: everything that ran is loaded, what was left is the next run's (not a failure). A failure
anywhere makes it PARTIAL as before (the deadline is still in each lane's entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from feiqiu_etl.common import exitcodes
from feiqiu_etl.common.status import STATUSES, Status, combine, exit_code, task_status
from feiqiu_etl.deadline import named
from feiqiu_etl.pipeline.models import PipelineResult
from feiqiu_etl.statistics import LaneTotals
from feiqiu_etl.tasks.ods.task import TaskRun

def merge_parts(runs: list[TaskRun]) -> TaskRun:
    """One task's runs of its parts (recent, owed, history) as ONE run, as a task run whole would report it:
    counters summed, windows in time order, the first part's snapshot note, the owed details that earlier runs
    left (not those the recent part deferred to the owed part), the worst status (:func:`task_status`). A task
    skipped in every part is skipped with the first part's reason."""
    if len(runs) == 1:
        runs[0].windows = sorted(runs[0].windows)  # a part's windows run newest first; a result lists them in time
        return runs[0]
    first = runs[0]
    result = PipelineResult(status=task_status(r.status for r in runs))
    for r in runs:
        result.merge(r.result)
    ran = [r for r in runs if r.skipped is None]
    recheck = [r.recheck for r in runs if r.recheck]
    return TaskRun(
        first.task_code, first.site_id, first.table, first.detail_table, result,
        windows=sorted(w for r in runs for w in r.windows), snapshot_note=first.snapshot_note, lane=first.lane,
        first_load=first.first_load,
        owed_details=max(0, sum(r.owed_details for r in runs) - sum(r.deferred_details for r in runs)),
        details_given_up=[p for r in runs for p in r.details_given_up],
        skipped=None if ran else first.skipped,
        recheck={"budget": sum(r["budget"] for r in recheck), "used": sum(r["used"] for r in recheck),
                 "credit": max(float(r.get("credit") or 0.0) for r in recheck)} if recheck else None,
        schema_drift=[d for r in runs for d in r.schema_drift])


@dataclass
class StoreResult:
    """One store of a lane: its tasks' runs; ``reason`` says why it stopped early (e.g. 40103)."""

    site_id: int
    name: str | None
    tasks: list[TaskRun] = field(default_factory=list)
    reason: str | None = None
    status: str = Status.SUCCESS

    def finish(self, cancelled: bool) -> str:
        statuses = [t.status for t in self.tasks]
        ran = [t.result for t in self.tasks if t.skipped is None]
        if ran and not any(r.completed_requests for r in ran) and any(r.request_failures for r in ran) \
                and not cancelled:
            self.reason = self.reason or "not one request succeeded"
        if self.reason and not cancelled:
            self.status = Status.FAILED
        else:
            cancelled_task = any(t.status == Status.CANCELLED for t in self.tasks)
            self.status = combine(statuses, cancelled=cancelled and cancelled_task)
        return self.status

    def to_dict(self) -> dict[str, Any]:
        rows = sum(t.result.total_inserted + t.result.total_updated + t.result.total_skipped for t in self.tasks)
        return {"site_id": self.site_id, "name": self.name, "status": self.status, "reason": self.reason,
                "tasks_done": sum(1 for t in self.tasks if t.skipped is None), "tasks": len(self.tasks),
                "rows": rows, "requests": sum(t.result.total_requests for t in self.tasks)}


@dataclass
class LaneResult:
    """One token's lane: its stores, why it stopped (if it did) and its :class:`LaneTotals` (None when it never
    ran: refused, busy)."""

    name: str
    key: str
    stores: list[StoreResult] = field(default_factory=list)
    reason: str | None = None
    busy: bool = False
    status: str = Status.SUCCESS
    statistics: LaneTotals | None = None
    deadline: dict[str, Any] | None = None  # the deadline, what the plan said fits, and whether it was reached

    def finish(self, cancelled: bool) -> str:
        statuses = [s.finish(cancelled) for s in self.stores]
        if self.busy:  # never started: another run holds the token (not a failure, not a cancel)
            for store in self.stores:
                store.status = Status.BUSY
            self.status = Status.BUSY
        elif self.reason and not cancelled:
            self.status = Status.FAILED
        else:
            self.status = combine(statuses, cancelled=cancelled and Status.CANCELLED in statuses)
        return self.status

    @property
    def tasks(self) -> list[TaskRun]:
        return [t for s in self.stores for t in s.tasks]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "status": self.status, "reason": self.reason,
                "busy": self.busy, "stores": [s.to_dict() for s in self.stores],
                **(self.statistics.to_dict() if self.statistics is not None else {}), "deadline": self.deadline}


@dataclass
class RunResult:
    """A whole run. ``tasks`` lists every planned task (those that never started have ``skipped`` set)."""

    run_id: str
    connector: str
    status: str = Status.SUCCESS
    lanes: list[LaneResult] = field(default_factory=list)
    dwd: dict | None = None
    started_at: str = ""
    finished_at: str = ""
    error: str | None = None
    database_lost: bool = False
    alerts: list[dict] = field(default_factory=list)  # sent at the end (feiqiu_etl.alerts), with their outcome

    @property
    def tasks(self) -> list[TaskRun]:
        return [t for lane in self.lanes for t in lane.tasks if t.skipped is None]

    @property
    def skipped(self) -> list[dict]:
        return [{"task": t.task_code, "site_id": t.site_id, "lane": t.lane, "reason": t.skipped}
                for lane in self.lanes for t in lane.tasks if t.skipped is not None]

    def finish(self, cancelled: bool) -> str:
        parts = [lane.finish(cancelled) for lane in self.lanes]
        every_lane_stopped = combine(parts) if parts and all(STATUSES[p].stopped for p in parts) else None
        if self.dwd is not None:
            parts.append(self.dwd.get("status", Status.SUCCESS))
        if self.database_lost:
            self.status = Status.FAILED
        elif every_lane_stopped and not cancelled:
            self.status = every_lane_stopped  # BUSY when every lane was busy, else FAILED
        else:
            self.status = combine(parts, cancelled=cancelled)
        return self.status

    def first_reason(self) -> str | None:
        """Why the first lane or store that stopped did (``lane north: invalid token (40101)``), or None."""
        for lane in self.lanes:
            if lane.reason:  # a busy lane's reason names the lane itself ("lane north (…) is in use by …")
                return lane.reason if lane.busy else f"lane {lane.name}: {lane.reason}"
            for store in lane.stores:
                if store.reason:
                    return f"store {store.site_id}: {store.reason}"
        if self.status == Status.DEADLINE:
            reached = [lane for lane in self.lanes if (lane.deadline or {}).get("reached")]
            return "; ".join(f"lane {lane.name}: deadline {named(lane.deadline['text'], lane.deadline.get('at'))} "
                             "reached, the rest is left for the "
                             "next run" for lane in reached) or None
        return "cancelled" if self.status == Status.CANCELLED else None

    @property
    def exit_code(self) -> int:
        if self.status == Status.FAILED and self.database_lost:
            return exitcodes.DATABASE_LOST
        return exit_code(self.status)

    def totals(self) -> dict[str, int]:
        tasks = self.tasks
        return {
            # rows the run changed (new, changed, soft-deleted): an unchanged rerun writes 0
            "rows_written": sum(t.result.total_inserted + t.result.total_updated + t.result.total_deleted
                                for t in tasks),
            "rows_unchanged": sum(t.result.total_skipped for t in tasks),
            "requests": sum(t.result.total_requests for t in tasks),
            "rejections": sum(t.result.rate_limited for t in tasks),
            "errors": sum(len(t.result.errors) for t in tasks) + len((self.dwd or {}).get("errors", [])),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "connector": self.connector, "status": self.status, "exit_code": self.exit_code,
            "error": self.error or (self.first_reason() if self.status in (Status.FAILED, Status.BUSY, Status.DEADLINE)
                                    else None),
            "started_at": self.started_at, "finished_at": self.finished_at,
            "lanes": [lane.to_dict() for lane in self.lanes], "tasks": [t.to_dict() for t in self.tasks],
            "skipped_tasks": self.skipped, "dwd": self.dwd, **self.totals(), "alerts": self.alerts,
        }
