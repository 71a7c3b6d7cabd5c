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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from feiqiu_etl.api.client import APIClient, EnvelopeRules
from feiqiu_etl.api.errors import AuthError, SiteForbiddenError
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.pipeline.request_scheduler import AttemptRecord, RequestScheduler, SchedulerStatistics
from feiqiu_etl.plan.model import LanePlan, StorePlan
from feiqiu_etl.runner.executor import StoreLog, TaskExecutor
from feiqiu_etl.runner.results import BUSY, CANCELLED, FAILED, PARTIAL, LaneResult, StoreResult
from feiqiu_etl.statistics import (CurrentRequest, LaneStatistics, LaneTotals, Queues, RateMeter, StoreProgress,
                                   TaskStatistics)
from feiqiu_etl.tasks.ods.task import BaseOdsTask, LaneAccess, TaskContext, TaskRun


@dataclass
class _StoreState:
    plan: StorePlan
    result: StoreResult
    current: BaseOdsTask | None = None
    refused: str | None = None


@dataclass(frozen=True)
class LaneRuntime:
    """What a lane needs from the run: what its tasks share (database, run id, cancellation, the connector's
    conventions, database health), the connector's envelope rules, where each task's log block and each lane
    attempt go (the run's stored log and request timeline), and how to build the API client."""

    tasks: TaskContext
    rules: EnvelopeRules
    store_log: StoreLog
    store_request: Callable[[dict], None] = lambda record: None
    client_factory: Callable[..., APIClient] = APIClient
    stall_after: float = 900.0
    """Seconds without progress after which the lane reports itself stalled (``run.stall_after``)."""


class LaneRunner:
    """Runs a :class:`LanePlan` (see module docstring). ``run()`` returns its :class:`LaneResult`;
    :meth:`statistics` is its live :class:`LaneStatistics` (any thread, no side effect); :meth:`sample`
    records the rows written so far for its rows/s (the run's loop calls it)."""

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
        self._rate = RateMeter()
        self._started: float | None = None
        self._finished: float | None = None
        self._moved = time.monotonic()   # the lane's last progress: an attempt ended, a task began or ended, rows
        self._moved_rows = 0
        self._executor = TaskExecutor(runtime.tasks, lane.name, runtime.store_log)

    # -------------------------------------------------------------------------------------------- run
    def run(self) -> LaneResult:
        self._started = self._moved = time.monotonic()
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
        self.result.reason = self.result.reason or self.scheduler.tripped or self._never_reached()
        self.result.statistics = self.totals()
        return self.result

    def _never_reached(self) -> str | None:
        """``upstream unreachable: …`` when no attempt of the lane reached a server although it sent some —
        the circuit breaker's reason, also when the lane ran out of requests before ``lane.max_transport_failures``
        (a one-task run: its request's retries fail, nothing is left to send). Its tasks that loaded nothing are
        FAILED, as when the breaker trips."""
        s = self.scheduler.statistics()
        if not s.requests_sent or s.consecutive_transport_failures < s.requests_sent:
            return None
        runs = [t for store in self._stores for t in store.result.tasks if t.skipped is None]
        last = next((e.get("error") for t in reversed(runs) for e in reversed(t.result.errors)
                     if e.get("stage") == "request"), None)
        for t in runs:
            if not t.result.completed_requests and t.result.status == PARTIAL:
                t.result.status = FAILED
        return (f"upstream unreachable: {s.requests_sent} transport failure(s) in a row, not one attempt reached "
                f"a server" + (f" (last: {last})" if last else ""))

    def refuse(self, reason: str, *, busy: bool = False) -> LaneResult:
        """Do not run this lane at all (e.g. another process holds it): every task is reported not run."""
        self.result.reason, self.result.busy = reason, busy
        for store in self._stores:
            store.result.tasks = [TaskRun.not_run(t, "lane busy" if busy else reason, BUSY if busy else FAILED,
                                                  self.plan.name)
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
            access = LaneAccess(self.scheduler, self._transport(store), self.plan.name, store.plan.site_id)
            run = self._executor.run(task, access, observer=lambda ods, s=store: self._observe(s, ods))
            with self._lock:  # one step: its rows move from the running task to the finished ones
                store.result.tasks.append(run)
                store.current = None
            self._moved = time.monotonic()
        if store.refused:
            store.result.reason = store.refused

    def _skip_reason(self, store: _StoreState) -> tuple[str | None, str]:
        if self.rt.tasks.cancellation.is_cancelled:
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
        self._moved = time.monotonic()
        task = None
        for store in self._stores:
            current = store.current
            if store.plan.site_id == record.tenant and current is not None:
                task = current.task.code
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

    def _observe(self, store: _StoreState, task: BaseOdsTask) -> None:
        with self._lock:
            store.current = task
        self._moved = time.monotonic()

    # -------------------------------------------------------------------------------------------- observe
    def _states(self) -> list[tuple[_StoreState, BaseOdsTask | None, list[TaskRun]]]:
        """Each store with its running task and its finished ones, taken in one step."""
        with self._lock:
            return [(s, s.current, list(s.result.tasks)) for s in self._stores]

    @staticmethod
    def _rows(finished: list[TaskRun], running: TaskStatistics | None) -> int:
        done = sum(t.result.total_inserted + t.result.total_updated + t.result.total_skipped for t in finished)
        return done + (running.rows_written if running is not None else 0)

    def rows_written(self) -> int:
        """Rows committed so far by this lane's tasks (inserted + updated + unchanged)."""
        return sum(self._rows(finished, cur.statistics() if cur is not None else None)
                   for _, cur, finished in self._states())

    def sample(self, now: float | None = None) -> None:
        """Record the rows written so far (monotonic time ``now``) for :attr:`LaneStatistics.rows_per_s` (rows
        written count as the lane's progress too)."""
        now = time.monotonic() if now is None else now
        rows = self.rows_written()
        self._rate.record(now, rows)
        if rows != self._moved_rows:
            self._moved_rows, self._moved = rows, now

    def stalled_for(self, now: float | None = None) -> float | None:
        """Seconds since the running lane last moved (an attempt ended, a task began or ended, rows were written),
        once that is longer than ``run.stall_after``; None while it moves, before it runs and after it ended."""
        if self._started is None or self._finished is not None:
            return None
        quiet = (time.monotonic() if now is None else now) - self._moved
        return round(quiet, 1) if quiet > self.rt.stall_after else None

    def totals(self) -> LaneTotals:
        """The lane's figures so far (final once :meth:`run` returned)."""
        s = self.scheduler.statistics()
        elapsed = ((self._finished or time.monotonic()) - self._started) if self._started else 0.0
        return LaneTotals(requests_sent=s.requests_sent, throttled=s.throttled, banned=s.banned,
                          banned_seconds=round(s.banned_seconds, 1), floors=s.floors,
                          busy_seconds=round(s.busy_seconds, 3), waited_seconds=round(s.waited_seconds, 3),
                          seconds=round(elapsed, 3), aborted_in_flight=s.aborted_in_flight)

    def statistics(self) -> LaneStatistics:
        """The lane's live status (see :class:`LaneStatistics`): built from the scheduler's and the running
        tasks' statistics; reading it changes nothing."""
        lane = self.scheduler.statistics()
        now = time.monotonic()
        current: CurrentRequest | None = None
        queues, rows, remaining, done_tasks = Queues(), 0, 0, 0
        stores: list[StoreProgress] = []
        running: list[TaskStatistics] = []
        for store, cur, finished in self._states():
            st = cur.statistics() if cur is not None else None
            rows += self._rows(finished, st)
            done_codes = {t.task_code for t in finished}
            done_tasks += len(finished)
            planned = self.plan.tasks_of(store.plan.site_id)
            for task in planned:
                if st is not None and task is cur.task and st.state != "starting":
                    remaining += st.requests_remaining
                    queues += st.queues
                    if st.state == "running":
                        running.append(st)
                        if lane.current_tenant == store.plan.site_id or current is None:
                            current = CurrentRequest(task.code, store.plan.site_id, lane.current, lane.in_flight)
                elif task.code not in done_codes:
                    remaining += task.estimate.requests
            stores.append(StoreProgress(store.plan.site_id, store.plan.name, tasks_done=len(finished),
                                        tasks=len(planned), task=cur.task.code if cur is not None else None,
                                        refused=store.refused))
        state = "finished" if self._finished else ("waiting for lane" if self._started is None else "running")
        eta = 0.0 if self._finished else round(remaining * self._seconds_per_request(lane)
                                               + (lane.next_due_in if lane.wait_reason else 0.0), 1)
        return LaneStatistics(
            name=self.plan.name, key=self.plan.key, state=state, current=current,
            next_due_in=round(lane.next_due_in, 1), wait_reason=lane.wait_reason, requests_sent=lane.requests_sent,
            throttled=lane.throttled, banned=lane.banned, banned_seconds=round(lane.banned_seconds, 1),
            floors=lane.floors, tripped=lane.tripped, queues=queues, rows_written=rows,
            rows_per_s=round(self._rate.rate(now, rows), 1), requests_remaining=remaining, tasks_done=done_tasks,
            tasks=len(self.plan.tasks), eta_s=eta, stores=tuple(stores), running=tuple(running),
            stalled_for=self.stalled_for(now))

    def _seconds_per_request(self, lane: SchedulerStatistics) -> float:
        """Lane seconds per request so far — wall time, so that the work between requests (a task's start,
        its last batch) counts too; before three requests, the planned mean gap plus 0.1 s."""
        if lane.requests_sent >= 3 and self._started is not None:
            return (time.monotonic() - self._started) / lane.requests_sent
        tasks = self.plan.tasks
        return sum((t.config.rate_min + t.config.rate_max) / 2 for t in tasks) / len(tasks) + 0.1 if tasks else 0.0
