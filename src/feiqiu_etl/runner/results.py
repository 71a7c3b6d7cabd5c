"""What a run produced — per lane, per store, per task — and the ONE place where statuses combine.

Status rules (README "exit codes" says the same):

* a **task**'s status is its pipeline's: FAILED (aborted) > CANCELLED > PARTIAL (some item failed) > SUCCESS;
* a **store** is FAILED when it was refused (40103), every task failed, or not one of its requests succeeded
  (nothing was loaded: a wrong URL, the upstream down); PARTIAL when some task is not SUCCESS; CANCELLED when
  the run was cancelled before it finished;
* a **lane** is FAILED when it stopped (invalid token 40101, upstream unreachable, lane busy) or every store
  failed; PARTIAL when some store is not SUCCESS;
* the **run** is CANCELLED when cancelled; FAILED when every lane failed, whatever the DWD load that
  followed did (it merged what ODS already held), or when the DWD load ran alone and failed; PARTIAL when
  anything is not SUCCESS; else SUCCESS. So one forbidden store or one bad token in a fleet fails alone and
  the run is PARTIAL, while a single-store run refused by the upstream is FAILED (exit 4; every lane busy:
  exit 6), with or without DWD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from feiqiu_etl import exitcodes
from feiqiu_etl.statistics import LaneTotals
from feiqiu_etl.tasks.ods.task import TaskRun

SUCCESS, PARTIAL, FAILED, CANCELLED = "SUCCESS", "PARTIAL", "FAILED", "CANCELLED"
EXIT_CODES = exitcodes.BY_STATUS
EXIT_LANE_BUSY = exitcodes.LANE_BUSY
EXIT_DATABASE = exitcodes.DATABASE_LOST


def combine(statuses: Iterable[str], *, cancelled: bool = False) -> str:
    """Status of a whole from its parts' statuses (see the module docstring)."""
    parts = list(statuses)
    if cancelled or CANCELLED in parts:
        return CANCELLED
    if not parts:
        return SUCCESS
    if all(s == FAILED for s in parts):
        return FAILED
    if all(s == SUCCESS for s in parts):
        return SUCCESS
    return PARTIAL


@dataclass
class StoreResult:
    """One store of a lane: its tasks' runs; ``reason`` says why it stopped early (e.g. 40103)."""

    site_id: int
    name: str | None
    tasks: list[TaskRun] = field(default_factory=list)
    reason: str | None = None
    status: str = SUCCESS

    def finish(self, cancelled: bool) -> str:
        statuses = [t.status for t in self.tasks]
        ran = [t.result for t in self.tasks if t.skipped is None]
        if ran and not any(r.completed_requests for r in ran) and any(r.request_failures for r in ran) \
                and not cancelled:
            self.reason = self.reason or "not one request succeeded"
        if self.reason and not cancelled:
            self.status = FAILED
        else:
            self.status = combine(statuses, cancelled=cancelled and any(t.status == CANCELLED for t in self.tasks))
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
    status: str = SUCCESS
    statistics: LaneTotals | None = None

    def finish(self, cancelled: bool) -> str:
        statuses = [s.finish(cancelled) for s in self.stores]
        self.status = FAILED if (self.reason and not cancelled) else combine(statuses, cancelled=cancelled and
                                                                              CANCELLED in statuses)
        return self.status

    @property
    def tasks(self) -> list[TaskRun]:
        return [t for s in self.stores for t in s.tasks]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "status": self.status, "reason": self.reason,
                "busy": self.busy, "stores": [s.to_dict() for s in self.stores],
                **(self.statistics.to_dict() if self.statistics is not None else {})}


@dataclass
class RunResult:
    """A whole run. ``tasks`` lists every planned task (those that never started have ``skipped`` set)."""

    run_id: str
    connector: str
    status: str = SUCCESS
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
        every_lane_failed = bool(parts) and all(p == FAILED for p in parts)
        if self.dwd is not None:
            parts.append(self.dwd.get("status", SUCCESS))
        if self.database_lost or (every_lane_failed and not cancelled):
            self.status = FAILED
        else:
            self.status = combine(parts, cancelled=cancelled)
        return self.status

    def first_reason(self) -> str | None:
        """Why the first lane or store that stopped did (``lane north: invalid token (40101)``), or None."""
        for lane in self.lanes:
            if lane.reason:
                return f"lane {lane.name}: {lane.reason}"
            for store in lane.stores:
                if store.reason:
                    return f"store {store.site_id}: {store.reason}"
        return "cancelled" if self.status == CANCELLED else None

    @property
    def exit_code(self) -> int:
        if self.status == FAILED and self.database_lost:
            return EXIT_DATABASE
        if self.status == FAILED and self.lanes and all(lane.busy for lane in self.lanes):
            return EXIT_LANE_BUSY
        return EXIT_CODES.get(self.status, 4)

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
            "error": self.error or (self.first_reason() if self.status == FAILED else None),
            "started_at": self.started_at, "finished_at": self.finished_at,
            "lanes": [lane.to_dict() for lane in self.lanes], "tasks": [t.to_dict() for t in self.tasks],
            "skipped_tasks": self.skipped, "dwd": self.dwd, **self.totals(), "alerts": self.alerts,
        }
