"""``LaneRunner``: one token's lane — its stores take turns on ONE serial ``RequestScheduler``.

Each store runs its tasks one after another on a thread of its own (at most ``max_active_stores`` at once);
every request of every store goes through the lane, which grants it round-robin between the stores that are
waiting. So a lane stays strictly serial at the upstream (Property 1, risk control is per token across all
its stores and endpoints — upstream-api.md §1.1, §2.2), while a big store cannot starve the freshness of the
small ones: they finish in a fraction of the lane's time instead of after it.

A token refused with 40101 stops the whole lane (the lane trips); a store refused with 40103 stops only that
store; an unreachable upstream trips the lane after a few attempts (``max_transport_failures``). What was
not started is reported as not run, with the reason.

**A lane with a deadline** (issue 20) knows how much time it has. It runs in phases (:data:`~feiqiu_etl.plan.fit.
PHASES`): every store's recent data first, then the owed details, then history newest first (the plan's parts of
each task; a part's runs are merged back into one result per task at the end). At the start it says what fits
(:func:`~feiqiu_etl.plan.fit.fit_lane`); while it runs it keeps the pace that meets the deadline from the work left
and its own seconds per request (:func:`~feiqiu_etl.plan.fit.pace_for`), narrowing the gaps within safe bounds
(:class:`~feiqiu_etl.pipeline.pace.Pace`) and saying so once; at the deadline its own cancellation token (a child of
the run's) stops it: no new request, what was fetched is written, finished segments checkpointed, owed details
kept — the tasks stopped or not started end ``DEADLINE``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from feiqiu_etl.api.client import APIClient, EnvelopeRules
from feiqiu_etl.api.errors import AuthError, SiteForbiddenError
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.pipeline.pace import Pace
from feiqiu_etl.pipeline.request_scheduler import AttemptRecord, RequestScheduler
from feiqiu_etl.plan.fit import PHASES, Work, fit_lane, lane_seconds, pace_for
from feiqiu_etl.plan.model import LanePlan, StorePlan, TaskPlan
from feiqiu_etl.runner.executor import StoreLog, TaskExecutor
from feiqiu_etl.runner.lane_work import remaining_work, unsized
from feiqiu_etl.common.status import Status
from feiqiu_etl.runner.results import LaneResult, StoreResult, merge_parts
from feiqiu_etl.statistics import (CurrentRequest, LaneStatistics, LaneTotals, Queues, RateMeter, StoreProgress,
                                   TaskStatistics)
from feiqiu_etl.tasks.ods.task import BaseOdsTask, LaneAccess, TaskContext, TaskRun

PACE_STEP = 0.05
"""The pace is changed only by more than this (no flapping between two samples)."""
SWITCH_INTERVAL = 0.001
"""s: the interpreter's thread switch interval while lanes run (at most; Python's default is 5 ms). A response read by
the lane's request thread, and the lane thread woken for its next request, wait for the interpreter behind the
threads that parse and write the pages fetched; at 5 ms that wait was a request's largest cost on a busy machine
(bench_night: 7 ms per attempt, the simulator's part 2 ms). Set for the whole process, never raised."""


@dataclass
class _StoreState:
    """A store of the lane: what it runs in order (``schedule``: its tasks, or their parts), the runs of those
    done so far (``result.tasks`` while the lane runs: one per entry of the schedule, in order; once ``closed``,
    one per task, the parts merged), the task running now."""

    plan: StorePlan
    result: StoreResult
    schedule: tuple[tuple[str, TaskPlan], ...] = ()
    current: BaseOdsTask | None = None
    refused: str | None = None
    closed: bool = False

    @property
    def done(self) -> list[TaskRun]:
        return self.result.tasks


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
        self.cancellation = runtime.tasks.cancellation.child()  # the run's cancel, and this lane's deadline
        self.pace = Pace(lane.safe_gaps) if lane.deadline is not None else None
        self.scheduler = RequestScheduler(name=lane.name, max_transport_failures=lane.max_transport_failures,
                                          logger=self.log, observer=self._attempt, pace=self.pace,
                                          documented=lane.documented_gaps, floor_margin=lane.floor_margin)
        # stores complete one after another, in the plan's order (issue 30): the lane goes to the first store with a
        # request ready; the others fill it only while the leader has nothing to send (re-ranked as work is learnt)
        self._order = [s.site_id for s in lane.ordered_stores()]
        self.scheduler.rank(self._order)
        self._wall0 = time.time() - time.monotonic()
        self.client = runtime.client_factory(lane.api_base, lane.token.value, timeout=lane.timeout,
                                             retry=lane.retry, rules=runtime.rules,
                                             connect_timeout=lane.connect_timeout)
        self.result = LaneResult(lane.name, lane.key)
        self._stores = [_StoreState(s, StoreResult(s.site_id, s.name), lane.schedule(s.site_id)) for s in lane.stores]
        self.result.stores = [s.result for s in self._stores]
        self._lock = threading.Lock()
        self._rate = RateMeter()
        self._started: float | None = None
        self._finished: float | None = None
        self._deadline: float | None = None  # monotonic
        self._told_narrowing = False
        self._moved = time.monotonic()   # the lane's last progress: an attempt ended, a task began or ended, rows
        self._moved_rows = 0
        self._executor = TaskExecutor(replace(runtime.tasks, cancellation=self.cancellation), lane.name,
                                      runtime.store_log)

    # -------------------------------------------------------------------------------------------- run
    def run(self) -> LaneResult:
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._started = self._moved = time.monotonic()
        self._arm_deadline()
        try:
            for phase in (PHASES if self.plan.phased else ("all",)):
                rank = {site: i for i, site in enumerate(self._order)}
                stores = sorted((s for s in self._stores if any(p == phase for p, _ in s.schedule)),
                                key=lambda s: rank[s.plan.site_id])  # the pool starts them in this order
                workers = max(1, min(self.plan.active_stores, len(stores)))
                if workers == 1:
                    for store in stores:
                        self._run_store(store, phase)
                else:
                    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"lane-{self.plan.name}") as pool:
                        list(pool.map(lambda s, ph=phase: self._run_store(s, ph), stores))
        finally:
            self.client.close()
            self._finished = time.monotonic()
            self.cancellation.dispose()
            self._close_results()
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
            if not t.result.completed_requests and t.result.status == Status.PARTIAL:
                t.result.status = Status.FAILED
        return (f"upstream unreachable: {s.requests_sent} transport failure(s) in a row, not one attempt reached "
                f"a server" + (f" (last: {last})" if last else ""))

    def refuse(self, reason: str, *, busy: bool = False) -> LaneResult:
        """Do not run this lane at all (e.g. another process holds it): every task is reported not run."""
        self.result.reason, self.result.busy = reason, busy
        for store in self._stores:
            status = Status.BUSY if busy else Status.FAILED
            store.result.tasks = [TaskRun.not_run(t, "lane busy" if busy else reason, status,
                                                  self.plan.name)
                                  for t in self.plan.tasks_of(store.plan.site_id)]
        self.client.close()
        return self.result

    # -------------------------------------------------------------------------------------------- deadline
    def _arm_deadline(self) -> None:
        """Start the deadline's timer and say what fits in the time left (the plan's fit, recomputed now)."""
        plan = self.plan
        if plan.deadline is None or plan.deadline_at is None:
            return
        left = (plan.deadline_at - datetime.now(timezone.utc)).total_seconds()
        self.cancellation.cancel_after(left, "deadline")
        fit = fit_lane(plan, max(0.0, left))
        lines = fit.lines(plan.name, plan.until())
        level = logging.INFO if fit.fits and not fit.narrowed else logging.WARNING
        note = plan.estimate_note()
        for line in lines + ([note] if note else []):
            self.log.log(level, "%s", line, extra={"lane": plan.name})
        self._told_narrowing = fit.narrowed
        if self.pace is not None:
            self.pace.set(fit.pace)
        self.result.deadline = {"text": plan.deadline.text, "at": plan.deadline_at.isoformat(), "reached": False,
                                "fit": fit.to_dict()}
        self._deadline = self._started + left  # from now on the run's loop keeps the pace

    def _update_pace(self, now: float) -> None:
        """Keep the pace that meets the deadline with the work left (called about twice a second)."""
        if self.pace is None or self._deadline is None or self._finished or self.cancellation.is_cancelled:
            return
        left = self._deadline - now
        work, overhead = self._remaining_work()
        factor = pace_for(work, max(0.0, left), overhead)
        old = self.pace.factor
        if abs(factor - old) <= PACE_STEP and not (factor == 0.0 < old) and not (factor == 1.0 > old):
            return
        self.pace.set(factor)
        if factor < 1.0 and not self._told_narrowing:
            self._told_narrowing = True
            safe = ", ".join(f"{c} {g:g} s" for c, g in sorted(self.plan.safe_gaps.items()))
            self.log.warning("lane %s: %d requests left need %.0f s at the configured gaps, %.0f s are left until "
                             "the deadline %s: narrowing the gaps toward the safe floors (%s; pace %.2f)",
                             self.plan.name, sum(w.requests for w in work), lane_seconds(work, 1.0, overhead), left,
                             self.plan.until(), safe, factor, extra={"lane": self.plan.name})
        else:
            self.log.debug("lane %s: pace %.2f -> %.2f (%.0f s left)", self.plan.name, old, factor, left)

    def _close_results(self) -> None:
        """Each store's runs of its parts merged into one per task (plan order); stopped by the deadline, the
        tasks stopped or not started are DEADLINE, and the lane says what was left."""
        reached = self.cancellation.reason == "deadline" and not self.rt.tasks.cancellation.is_cancelled
        left = 0
        for store in self._stores:
            runs: dict[str, list[TaskRun]] = {}
            for (_, task), run in zip(store.schedule, store.done):
                if reached and run.status in (Status.CANCELLED, Status.DEADLINE):
                    run.result.status, run.result.cancelled = Status.DEADLINE, False
                    left += max(0, task.estimate.requests - run.result.total_requests)
                runs.setdefault(run.task_code, []).append(run)
            with self._lock:
                store.result.tasks = [merge_parts(runs[t.code]) for t in self.plan.tasks_of(store.plan.site_id)
                                      if t.code in runs]
                store.closed = True
        if self.result.deadline is not None:
            self.result.deadline["reached"] = reached
            if reached:
                self.result.deadline["left_requests"] = left
            self.result.deadline["pace"] = round(self.pace.factor, 3) if self.pace is not None else 1.0

    def stop(self, reason: str) -> None:
        """Stop the lane from outside (e.g. its cross-process lock was lost): no new request is sent."""
        self.result.reason = self.result.reason or reason
        self.scheduler.trip(reason)

    def _run_store(self, store: _StoreState, phase: str) -> None:
        for part_phase, task in store.schedule:
            if part_phase != phase:
                continue
            why, status = self._skip_reason(store)
            if why:
                with self._lock:
                    store.done.append(TaskRun.not_run(task, why, status, self.plan.name))
                continue
            access = LaneAccess(self.scheduler, self._transport(store), self.plan.name, store.plan.site_id)
            run = self._executor.run(task, access, observer=lambda ods, s=store: self._observe(s, ods))
            with self._lock:  # one step: its rows move from the running task to the finished ones
                store.done.append(run)
                store.current = None
            self._moved = time.monotonic()
        if store.refused:
            store.result.reason = store.refused

    def _skip_reason(self, store: _StoreState) -> tuple[str | None, str]:
        if self.cancellation.is_cancelled and self.cancellation.reason == "deadline" \
                and not self.rt.tasks.cancellation.is_cancelled:
            return f"deadline {self.plan.until()} reached: left for the next run", Status.DEADLINE
        if self.cancellation.is_cancelled:
            return "cancelled before start", Status.CANCELLED
        tripped = self.scheduler.tripped
        if tripped:
            return tripped, Status.FAILED
        if store.refused:
            return store.refused, Status.FAILED
        return None, Status.FAILED

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
            "drawn": None if record.drawn is None else round(record.drawn, 4),
        })

    def _observe(self, store: _StoreState, task: BaseOdsTask) -> None:
        with self._lock:
            store.current = task
        self._moved = time.monotonic()

    # -------------------------------------------------------------------------------------------- observe
    def _states(self) -> list[tuple[_StoreState, BaseOdsTask | None, list[TaskRun]]]:
        """Each store with its running task and its finished ones (runs of parts), taken in one step."""
        with self._lock:
            return [(s, s.current, list(s.done), s.closed) for s in self._stores]

    def _remaining_work(self, states: list | None = None) -> tuple[list[Work], float]:
        """The work left (:func:`~feiqiu_etl.runner.lane_work.remaining_work`) and the lane's own seconds per
        request besides its gap: what the ETA and the pace are made of."""
        return remaining_work(self._states() if states is None else states, self.plan.safe_gaps), self._overhead()

    def _overhead(self) -> float:
        """Seconds a request holds the lane besides its planned gap, as this lane measured it (its wall time less the
        time it waited in gaps, plus the time it woke after a request was due — a busy machine's delay, which the
        planned gaps do not include — per request sent); the plan's figure before three requests."""
        lane = self.scheduler.statistics()
        if lane.requests_sent < 3 or self._started is None:
            return self.plan.request_seconds
        elapsed = (self._finished or time.monotonic()) - self._started
        return max(0.0, elapsed - lane.waited_seconds + lane.late_seconds) / lane.requests_sent

    @staticmethod
    def _rows(finished: list[TaskRun], running: TaskStatistics | None) -> tuple[int, int]:
        """``(written, unchanged)``: rows inserted or updated, rows found unchanged, by these tasks."""
        written = sum(t.result.total_inserted + t.result.total_updated for t in finished)
        unchanged = sum(t.result.total_skipped for t in finished)
        if running is not None:
            written, unchanged = written + running.rows_written, unchanged + running.rows_unchanged
        return written, unchanged

    def rows_written(self) -> int:
        """Rows this lane's tasks inserted or updated so far (unchanged ones not counted: :meth:`rows_processed`)."""
        return sum(self._rows(finished, cur.statistics() if cur is not None else None)[0]
                   for _, cur, finished, _ in self._states())

    def rows_processed(self) -> int:
        """Rows committed so far by this lane's tasks, unchanged ones included (its throughput and progress)."""
        return sum(sum(self._rows(finished, cur.statistics() if cur is not None else None))
                   for _, cur, finished, _ in self._states())

    def sample(self, now: float | None = None) -> None:
        """Record the rows written so far (monotonic time ``now``) for :attr:`LaneStatistics.rows_per_s` (rows
        written count as the lane's progress too); with a deadline, keep the pace that meets it."""
        now = time.monotonic() if now is None else now
        rows = self.rows_processed()
        self._rate.record(now, rows)
        if rows != self._moved_rows:
            self._moved_rows, self._moved = rows, now
        self._rerank()
        self._update_pace(now)

    def _rerank(self) -> None:
        """Rank the stores again by what is left of them (the running tasks' pages told their size): stalest first,
        then the least work left — so at any cut-off as many stores as possible are whole (issue 30). A store whose
        size nobody knows yet (no history, and none of its lists has told its total) counts as having no work left
        until its first page tells: one request of each new store before the lane commits to the biggest one, so a
        small new store is not stuck behind a big one whose size only the contract's lower bound guessed."""
        if self._started is None or self._finished is not None:
            return
        states = self._states()
        work, _ = self._remaining_work(states)
        left: dict[int, int] = {s.plan.site_id: 0 for s in self._stores}
        for w in work:
            left[w.site_id] = left.get(w.site_id, 0) + w.requests
        for site in unsized(states):
            left[site] = 0
        order = sorted(left, key=lambda site: self.plan.store_key(site, left[site]))
        if order != self._order:
            self._order = order
            self.scheduler.rank(order)

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
        queues, rows, unchanged, processed, done_tasks = Queues(), 0, 0, 0, 0
        stores: list[StoreProgress] = []
        running: list[TaskStatistics] = []
        states = self._states()
        for store, cur, finished, closed in states:
            st = cur.statistics() if cur is not None else None
            written, same = self._rows(finished, st)
            rows, unchanged, processed = rows + written, unchanged + same, processed + written + same
            planned = self.plan.tasks_of(store.plan.site_id)
            tasks_done = len(finished) if closed else _tasks_done(store.schedule, len(finished))
            done_tasks += tasks_done
            if st is not None and st.state != "starting":
                queues += st.queues
                if st.state == "running":
                    running.append(st)
                    if lane.current_tenant == store.plan.site_id or current is None:
                        current = CurrentRequest(cur.task.code, store.plan.site_id, lane.current, lane.in_flight)
            stores.append(StoreProgress(store.plan.site_id, store.plan.name, tasks_done=tasks_done,
                                        tasks=len(planned), task=cur.task.code if cur is not None else None,
                                        refused=store.refused))
        work, overhead = self._remaining_work(states)
        remaining = sum(w.requests for w in work)
        state = "finished" if self._finished else ("waiting for lane" if self._started is None else "running")
        factor = self.pace.factor if self.pace is not None else 1.0
        eta = 0.0 if self._finished else lane_seconds(work, factor, overhead) \
            + (lane.next_due_in if lane.wait_reason else 0.0)
        deadline_in = None if self._deadline is None else max(0.0, self._deadline - now)
        left_at_deadline = None
        if deadline_in is not None and not self._finished:
            # the plan's rule (requests x expected gap): what does not fit before the deadline is left
            left_at_deadline = 0 if eta <= deadline_in or eta <= 0 else round(remaining * (1 - deadline_in / eta))
            eta = min(eta, deadline_in)
        return LaneStatistics(
            name=self.plan.name, key=self.plan.key, state=state, current=current,
            next_due_in=round(lane.next_due_in, 1), wait_reason=lane.wait_reason, requests_sent=lane.requests_sent,
            throttled=lane.throttled, banned=lane.banned, banned_seconds=round(lane.banned_seconds, 1),
            floors=lane.floors, tripped=lane.tripped, queues=queues, rows_written=rows,
            rows_unchanged=unchanged, rows_per_s=round(self._rate.rate(now, processed), 1), requests_remaining=remaining, tasks_done=done_tasks,
            tasks=len(self.plan.tasks), eta_s=round(eta, 1), stores=tuple(stores), running=tuple(running),
            deadline_in_s=None if deadline_in is None else round(deadline_in, 1),
            pace=None if self.pace is None else round(factor, 3), stalled_for=self.stalled_for(now),
            left_at_deadline=left_at_deadline)


def _tasks_done(schedule: tuple[tuple[str, TaskPlan], ...], finished: int) -> int:
    """Tasks of a store whose every part (or the task itself) is finished, the first ``finished`` entries of its
    schedule being done."""
    left = {task.code for _, task in schedule[finished:]}
    return len({task.code for _, task in schedule} - left)
