"""``LaneRunner``: one token's lane — its stores take turns on ONE serial ``RequestScheduler``.

Each store runs its tasks one after another on a thread of its own (at most ``max_active_stores`` at once);
every request of every store goes through the lane, which grants it round-robin between the stores that are
waiting. So a lane stays strictly serial at the upstream (Property 1, risk control is per token across all
its stores and endpoints — upstream-api.md §1.1, §2.2), while a big store cannot starve the freshness of the
small ones: they finish in a fraction of the lane's time instead of after it.

A token refused with 40101 stops the whole lane (the lane trips); a store refused with 40103 stops only that
store; an unreachable upstream trips the lane after a few attempts (``max_transport_failures``). What was
not started is reported as not run, with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from feiqiu_etl.api.client import APIClient, EnvelopeRules
from feiqiu_etl.api.errors import AuthError, SiteForbiddenError
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.pipeline.request_scheduler import AttemptRecord, RequestScheduler
from feiqiu_etl.pipeline.unified_pipeline import UnifiedPipeline
from feiqiu_etl.plan.model import LanePlan, StorePlan, TaskPlan
from feiqiu_etl.runner.executor import TaskExecutor
from feiqiu_etl.runner.results import CANCELLED, FAILED, LaneResult, StoreResult
from feiqiu_etl.tasks.ods.task import TaskRun

RATE_WINDOW = 15.0
"""Seconds of history behind the rows/s figure."""


@dataclass
class _StoreState:
    plan: StorePlan
    result: StoreResult
    current: tuple[TaskPlan, UnifiedPipeline] | None = None
    refused: str | None = None
    estimate: Callable[[], Any] | None = None  # the running task's live_estimate (plan/estimates.py)


@dataclass
class _Sample:
    at: float
    rows: int


@dataclass
class LaneRuntime:
    """What a lane needs from the run: database, identity, cancellation, the stored-log sink."""

    dsn: str
    run_id: str
    token: CancellationToken
    rules: EnvelopeRules
    conventions: Any
    detail_max_attempts: int
    store_log: Callable[[list, str, int, str], None]
    store_request: Callable[[dict], None] = lambda record: None
    client_factory: Callable[..., APIClient] = APIClient
    connect: Callable | None = None
    abortable: bool = True
    health: Any = None


class LaneRunner:
    """Runs a :class:`LanePlan` (see module docstring). ``run()`` returns its :class:`LaneResult`."""

    def __init__(self, lane: LanePlan, runtime: LaneRuntime):
        self.plan = lane
        self.rt = runtime
        self.log = logging.getLogger(f"feiqiu_etl.lane.{lane.name}")
        self.scheduler = RequestScheduler(name=lane.name, max_transport_failures=lane.max_transport_failures,
                                          logger=self.log, observer=self._attempt)
        self._wall0 = time.time() - time.monotonic()
        self.client = runtime.client_factory(lane.api_base, lane.token.value, timeout=lane.timeout,
                                             retry=lane.retry, rules=runtime.rules,
                                             connect_timeout=lane.connect_timeout)
        self.result = LaneResult(lane.name, lane.key)
        self._stores = [_StoreState(s, StoreResult(s.site_id, s.name)) for s in lane.stores]
        self.result.stores = [s.result for s in self._stores]
        self._lock = threading.Lock()
        self._samples: deque[_Sample] = deque()
        self._started: float | None = None
        self._finished: float | None = None
        self._executor = TaskExecutor(runtime, lane.name)

    # -------------------------------------------------------------------------------------------- run
    def run(self) -> LaneResult:
        self._started = time.monotonic()
        try:
            workers = max(1, min(self.plan.max_active_stores, len(self._stores)))
            if workers == 1:
                for store in self._stores:
                    self._run_store(store)
            else:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"lane-{self.plan.name}") as pool:
                    list(pool.map(self._run_store, self._stores))
        finally:
            self.client.close()
            self._finished = time.monotonic()
        self.result.reason = self.result.reason or self.scheduler.tripped
        self.result.statistics = self._lane_numbers()
        return self.result

    def refuse(self, reason: str, *, busy: bool = False) -> LaneResult:
        """Do not run this lane at all (e.g. another process holds it): every task is reported not run."""
        self.result.reason, self.result.busy = reason, busy
        for store in self._stores:
            store.result.tasks = [TaskRun.not_run(t, reason, FAILED, self.plan.name)
                                  for t in self.plan.tasks_of(store.plan.site_id)]
        self.client.close()
        return self.result

    def stop(self, reason: str) -> None:
        """Stop the lane from outside (e.g. its cross-process lock was lost): no new request is sent."""
        self.result.reason = self.result.reason or reason
        self.scheduler.trip(reason)

    def _run_store(self, store: _StoreState) -> None:
        for task in self.plan.tasks_of(store.plan.site_id):
            why, status = self._skip_reason(store)
            if why:
                store.result.tasks.append(TaskRun.not_run(task, why, status, self.plan.name))
                continue
            run = self._executor.run(task, self.scheduler, self._transport(store),
                                     observer=lambda p, s=store, t=task: self._observe(s, t, p),
                                     on_estimate=lambda fn, s=store: setattr(s, "estimate", fn))
            with self._lock:
                store.result.tasks.append(run)
        if store.refused:
            store.result.reason = store.refused

    def _skip_reason(self, store: _StoreState) -> tuple[str | None, str]:
        if self.rt.token.is_cancelled:
            return "cancelled before start", CANCELLED
        tripped = self.scheduler.tripped
        if tripped:
            return tripped, FAILED
        if store.refused:
            return store.refused, FAILED
        return None, FAILED

    def _transport(self, store: _StoreState):
        def transport(request: PipelineRequest, send):
            try:
                return self.client.fetch(request, send)
            except AuthError:
                self.scheduler.trip("invalid or expired token (40101)")
                raise
            except SiteForbiddenError:
                store.refused = f"store {store.plan.site_id} is not authorised for this token (40103)"
                raise
        return transport

    def _attempt(self, record: AttemptRecord) -> None:
        """One lane attempt, for the run's timeline (wall-clock times, the store's task at that moment)."""
        task = None
        for store in self._stores:
            if store.plan.site_id == record.tenant and store.current is not None:
                task = store.current[0].code
        if self.log.isEnabledFor(logging.DEBUG):  # -vv: every attempt as it ends
            waited = "" if record.gap is None else f", after {record.gap:.2f} s ({record.wait_reason or 'gap'})"
            self.log.debug("request #%d %s: %s in %.2f s%s%s", record.seq, record.label or "-", record.outcome,
                           record.ended - record.started, waited, f": {record.detail}" if record.detail else "",
                           extra={"lane": self.plan.name, "site_id": record.tenant, "task": task})
        self.rt.store_request({
            "lane": self.plan.name, "seq": record.seq, "site_id": record.tenant, "task": task,
            "request": record.label, "gap_class": record.gap_class,
            "started_at": datetime.fromtimestamp(self._wall0 + record.started, timezone.utc),
            "seconds": round(record.ended - record.started, 4),
            "gap": None if record.gap is None else round(record.gap, 4), "wait_reason": record.wait_reason,
            "outcome": record.outcome, "detail": record.detail,
        })

    def _observe(self, store: _StoreState, task: TaskPlan, pipeline: UnifiedPipeline | None) -> None:
        with self._lock:
            store.current = (task, pipeline) if pipeline is not None else None

    # -------------------------------------------------------------------------------------------- observe
    def rows_written(self) -> int:
        with self._lock:
            done = sum(t.result.total_inserted + t.result.total_updated + t.result.total_skipped
                       for s in self._stores for t in s.result.tasks)
            live = sum(p.statistics().rows_written for s in self._stores if s.current for _, p in [s.current])
        return done + live

    def _lane_numbers(self) -> dict[str, Any]:
        s = self.scheduler.statistics()
        elapsed = ((self._finished or time.monotonic()) - self._started) if self._started else 0.0
        return {"requests_sent": s.requests_sent, "throttled": s.throttled, "banned": s.banned,
                "banned_seconds": round(s.banned_seconds, 1), "floors": s.floors, "busy_seconds": round(s.busy_seconds, 3),
                "waited_seconds": round(s.waited_seconds, 3), "seconds": round(elapsed, 3),
                "aborted_in_flight": s.aborted_in_flight}

    def snapshot(self) -> dict[str, Any]:
        """The lane's live status: current request and why the next waits, queues, rows and rows/s,
        requests done and estimated remaining, tasks done/total, ETA (seconds)."""
        lane = self.scheduler.statistics()
        now = time.monotonic()
        rows = self.rows_written()
        self._samples.append(_Sample(now, rows))
        while len(self._samples) > 2 and now - self._samples[0].at > RATE_WINDOW:
            self._samples.popleft()
        first = self._samples[0]
        rate = (rows - first.rows) / (now - first.at) if now - first.at > 0.5 else 0.0
        current, queues, remaining, done_tasks, stores = None, {"frontier": 0, "processing": 0, "write": 0}, 0, 0, []
        per_request = self._seconds_per_request(lane)
        with self._lock:
            states = [(s, s.current, list(s.result.tasks)) for s in self._stores]
        for store, cur, finished in states:
            done_codes = {t.task_code for t in finished}
            done_tasks += len(finished)
            for task in self.plan.tasks_of(store.plan.site_id):
                if cur is not None and task is cur[0]:
                    st = cur[1].statistics()
                    known = st.frontier + (st.seeds_left or 0) + (1 if lane.in_flight else 0)
                    expected = store.estimate().requests if store.estimate else task.estimate.requests
                    remaining += max(expected - st.requests, known)
                    queues["frontier"] += st.frontier
                    queues["processing"] += st.processing_queue
                    queues["write"] += st.write_queue
                    if lane.current_tenant == store.plan.site_id or current is None:
                        current = {"task": task.code, "site_id": store.plan.site_id, "request": lane.current,
                                   "in_flight": lane.in_flight}
                elif task.code not in done_codes:
                    remaining += task.estimate.requests
            stores.append({"site_id": store.plan.site_id, "name": store.plan.name,
                           "tasks_done": len(finished), "tasks": len(self.plan.tasks_of(store.plan.site_id)),
                           "task": cur[0].code if cur else None, "refused": store.refused})
        state = "finished" if self._finished else ("waiting for lane" if self._started is None else "running")
        return {
            "name": self.plan.name, "key": self.plan.key, "state": state, "current": current,
            "next_due_in": round(lane.next_due_in, 1), "wait_reason": lane.wait_reason,
            "requests_sent": lane.requests_sent, "throttled": lane.throttled, "banned": lane.banned,
            "banned_seconds": round(lane.banned_seconds, 1), "floors": lane.floors, "tripped": lane.tripped,
            "queues": queues, "rows_written": rows, "rows_per_s": round(rate, 1),
            "requests_remaining": remaining, "tasks_done": done_tasks, "tasks": len(self.plan.tasks),
            "eta_s": round(remaining * per_request + (lane.next_due_in if lane.wait_reason else 0.0), 1)
            if not self._finished else 0.0,
            "stores": stores,
        }

    def _seconds_per_request(self, lane) -> float:
        """Lane seconds per request so far — wall time, so that the work between requests (a task's start,
        its last batch) counts too; before three requests, the planned mean gap plus 0.1 s."""
        if lane.requests_sent >= 3 and self._started is not None:
            return (time.monotonic() - self._started) / lane.requests_sent
        tasks = self.plan.tasks
        return sum((t.config.rate_min + t.config.rate_max) / 2 for t in tasks) / len(tasks) + 0.1 if tasks else 0.0
