"""``FlowRunner``: executes one :class:`~feiqiu_etl.plan.model.RunPlan` — built once per run.

Order: record the run (``etl_meta.run``, RUNNING) → take every lane's cross-process guard (a lane held by
another process is refused, or waited for) → start :class:`~feiqiu_etl.registry.control.RunControl` (heartbeat,
live status, remote cancel, stored log) → run all lanes at once, one thread each, every lane strictly
serial → load DWD (dimensions, then facts) unless the run was cancelled → combine the statuses
(:mod:`.results`) → finish the record → send the alerts it calls for (:mod:`feiqiu_etl.alerts`) → prune runs past
``run.retention_days`` (:mod:`feiqiu_etl.registry.retention`). The caller prepares the database (DDL, :func:`prepare_database`) and
handles signals; everything else about a run happens here.

Database use is bounded (issue 19): the lanes' writers, the DWD tables and the run's record share ONE pool of
``db.pool_size`` connections (:class:`~feiqiu_etl.db.health.DatabaseHealth`), whatever the number of lanes; the
lane guard's session and the run control's (heartbeat, LISTEN) come on top, and the database watchdog's probe
while in doubt. A record the database does not take (it stopped answering) is kept for later
(:mod:`feiqiu_etl.registry.late`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import psycopg

from feiqiu_etl.alerts.choice import FROM_ENVIRONMENT
from feiqiu_etl.alerts.config import AlertChoice, resolve
from feiqiu_etl.api.client import APIClient, EnvelopeRules
from feiqiu_etl.connector.model import Connector
from feiqiu_etl.db.connection import connect as db_connect
from feiqiu_etl.db.health import DatabaseHealth, DatabaseUnavailable
from feiqiu_etl.errortext import one_line
from feiqiu_etl.logs import RunIdFilter, RunLogHandler, entry
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.plan.model import RunPlan
from feiqiu_etl.runner.lane import LaneRunner, LaneRuntime
from feiqiu_etl.common.status import Status
from feiqiu_etl.runner.results import RunResult
from feiqiu_etl import registry
from feiqiu_etl.registry.control import RunControl
from feiqiu_etl.registry import Invocation
from feiqiu_etl.formats import iso
from feiqiu_etl.registry.lane_guard import LaneBusy, LaneGuard
from feiqiu_etl.registry.late import database_identity
from feiqiu_etl.statistics import RunStatistics
from feiqiu_etl.tasks.ods.reconcile import IntegrityRules
from feiqiu_etl.tasks.ods.context import ApiConventions, TaskContext

log = logging.getLogger("feiqiu_etl.run")

SAMPLE_EVERY = 0.5
END_CONNECT_TIMEOUT = 2.0
"""Seconds the end-of-run database work (the alerts' history, retention) may wait for a connection."""
END_WORK_BOUND = 30.0
"""Seconds the end-of-run database work may take on one connection before its socket is shut (issue 28)."""
"""Seconds between the run's samples of the rows written (rows/s, the timeline's series)."""


@dataclass(frozen=True)
class RunnerWiring:
    """How a runner reaches the outside: ``connect`` opens a database connection (None: Asia/Shanghai sessions,
    :func:`feiqiu_etl.db.connection.connect`), ``client_factory`` builds each lane's API client,
    ``heartbeat`` is the seconds between heartbeats (live status, cancel check), ``abortable`` lets a cancel
    abort the request in flight; ``database`` the warehouse's identity, ``alerts`` the run's alert configuration
    (below)."""

    connect: Callable[[str], psycopg.Connection] | None = None
    client_factory: Callable[..., APIClient] = APIClient
    heartbeat: float = 1.0
    abortable: bool = True
    database: str | None = None
    """:func:`feiqiu_etl.registry.late.database_identity` of the warehouse, when the caller knows it (planning did):
    where a record the database did not take is written later."""
    alerts: AlertChoice = FROM_ENVIRONMENT
    """Where the run's alerts go (:mod:`feiqiu_etl.alerts.choice`): its own configuration, None (no alerts), or
    the environment's, read once when the runner is built."""


def envelope_rules(connector: Connector) -> EnvelopeRules:
    """The connector's envelope and error-code table as the client's :class:`EnvelopeRules`."""
    api = connector.api
    e, err = api.envelope, api.errors
    return EnvelopeRules(
        code_field=e.code_field, ok_code=e.ok_code, message_field=e.message_field, data_field=e.data_field,
        retry=frozenset(err.retry), rate_limited=frozenset(err.rate_limited), retry_after_field=err.retry_after_field,
        abort_run=frozenset(err.abort_run), abort_site=frozenset(err.abort_site), not_found=frozenset(err.not_found),
    )


def prepare_database(conn: psycopg.Connection, connector: Connector, *, stale_after: float = 30.0,
                     alerts: AlertChoice = FROM_ENVIRONMENT) -> list[str]:
    """DDL for etl_meta and the connector's ODS tables, then mark vanished runs INTERRUPTED (returned; alerted
    to ``alerts``, default the environment's configuration)."""
    from feiqiu_etl.db.schema import ensure_ods_tables

    from feiqiu_etl.alerts import sweep_and_alert

    ensure_ods_tables(conn, connector.tasks)
    return sweep_and_alert(conn, stale_after, alerts)


class FlowRunner:
    """One run of a plan. ``run()`` returns the :class:`RunResult`; it never raises for a task, store or
    lane failure (those are in the result), only for programming errors.

    ``invocation`` is what the run record says of how it was started (a new run id, command ``run``, no
    arguments by default; arguments already redacted); ``cancellation`` cancels it (default: its own);
    ``wiring`` how it reaches the database, the API and the heartbeat.
    """

    def __init__(self, plan: RunPlan, dsn: str, *, invocation: Invocation | None = None,
                 cancellation: CancellationToken | None = None, wiring: RunnerWiring = RunnerWiring()):
        self.plan = plan
        self.dsn = dsn
        self.invocation = invocation or Invocation()
        self.run_id = self.invocation.run_id
        self.cancellation = cancellation or CancellationToken()
        self._connect = wiring.connect or db_connect
        self.heartbeat = wiring.heartbeat
        self.result = RunResult(self.run_id, plan.connector.name)
        self.health = DatabaseHealth(dsn, self._connect, limits=plan.db, cancel_event=self.cancellation.event,
                                     on_down=self._db_down, on_up=self._db_up, on_gave_up=self._db_gone)
        tasks = TaskContext(dsn, self.run_id, self.cancellation, conventions=ApiConventions.of(plan.connector),
                            detail_max_attempts=plan.detail_max_attempts, abortable=wiring.abortable,
                            integrity=IntegrityRules(**plan.integrity),
                            connect=self._connect, health=self.health)
        runtime = LaneRuntime(tasks, envelope_rules(plan.connector), self._store_block,
                              store_request=self._store_request, client_factory=wiring.client_factory,
                              stall_after=plan.stall_after)
        self.lanes = [LaneRunner(lane, runtime) for lane in plan.lanes] if plan.load_ods else []
        self.result.lanes = [lane.result for lane in self.lanes]
        self.control: RunControl | None = None
        self.guard: LaneGuard | None = None
        self._phase = "starting"
        self.decided = False  # True once the run's outcome (status, exit code) is final, just before its record
        self._lock = threading.Lock()
        self._series: list[list[float]] = []   # [seconds since start, rows written], about once a second
        self._sampled = float("-inf")
        self._t0 = time.monotonic()
        self._started_at: datetime | None = None
        self._database = wiring.database   # where the run is recorded (registry.late.database_identity)
        self.alerts = resolve(wiring.alerts)  # this run's alert configuration (None: no alerts)

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> RunResult:
        started = datetime.now(timezone.utc)
        self._t0 = time.monotonic()
        self.result.started_at = iso(started)  # ISO 8601 with the display zone's offset
        self._started_at = started
        plan = self.plan
        try:
            self.health.slot().run(self._start_record)
        except DatabaseUnavailable as exc:  # the database stopped answering as the run began: it ends here
            return self._lost_at_start(exc)
        RunIdFilter.run_id = self.run_id
        from feiqiu_etl.alerts import warm_up  # loads Apprise meanwhile, so the end spends only the bound

        warm_up(self.alerts)
        handler = RunLogHandler(self._store_entry)
        logging.getLogger("feiqiu_etl").addHandler(handler)
        self.guard = LaneGuard(self.dsn, self.run_id, connect=self._connect, watchdog=self.health.watchdog)
        self.control = RunControl(self.dsn, self.run_id, self.cancellation, live=self.statistics,
                                  connect=self._connect, interval=self.heartbeat, guard=self.guard,
                                  on_lane_lost=self._lanes_lost).watched_by(self.health.watchdog).start()
        try:
            self._run_lanes_then_dwd(plan)
        finally:
            self._phase = "finishing"
            self.result.finish(self.cancellation.is_cancelled)
            if self.cancellation.is_cancelled and self.cancellation.reason:
                self.result.error = self.result.error or f"cancelled ({self.cancellation.reason})"
            self.result.finished_at = iso(datetime.now(timezone.utc))
            self.decided = True  # the outcome is final: a cancel from here changes nothing (cli/signals.py)
            self._record_end()
            logging.getLogger("feiqiu_etl").removeHandler(handler)
            self.guard.release()
            self.health.close()
        from feiqiu_etl.alerts import after_run  # bounded by alerts.timeout_seconds; never raises

        # End-of-run database work waits for no database that is away and connects within END_CONNECT_TIMEOUT s;
        # retention, optional, is skipped after a signal too (the run must end within seconds).
        answering = not self.result.database_lost and self.health.answering
        self.result.alerts = after_run(self.dsn, self.result.to_dict(), connect=self._end_connect,
                                       config=self.alerts, read_history=answering)
        if answering and not (self.cancellation.is_cancelled and self.cancellation.reason == "signal"):
            from feiqiu_etl.registry.retention import prune_after_run  # bounded; never raises

            prune_after_run(self.dsn, plan.retention_days, connect=self._end_connect)
        return self.result

    def _run_lanes_then_dwd(self, plan) -> None:
        """The run's body: every lane it holds in its own thread (sampled every 0.2 s meanwhile), then the DWD
        load unless the run was cancelled, lost its database, or every lane was held by another run."""
        log.info("run %s started: %d lane(s), %d store(s), %d task run(s)%s", self.run_id, len(plan.lanes),
                 len(plan.stores), plan.task_count, ", then DWD" if plan.dwd else "")
        runnable = self._take_lanes()
        self._phase = "ods"
        threads = [threading.Thread(target=lane.run, name=f"lane-{lane.plan.name}", daemon=True)
                   for lane in runnable]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                self._sample()
                t.join(0.2)
        if not runnable and self.lanes and all(lane.result.busy for lane in self.lanes):
            log.info("DWD skipped: every lane is in use by another run (its own DWD load follows it)")
        elif plan.dwd is not None and not self.cancellation.is_cancelled and not self.result.database_lost:
            self._phase = "dwd"
            self.result.dwd = self._run_dwd()

    def _end_connect(self, dsn: str) -> psycopg.Connection:
        """A connection for optional end-of-run work: within :data:`END_CONNECT_TIMEOUT` s, the run's limits, and
        all its work within :data:`END_WORK_BOUND` s at most (``db.unavailable_limit`` if shorter): a server that
        stops answering meanwhile costs that, not for ever (:func:`~feiqiu_etl.db.connection.bounded_session`)."""
        from feiqiu_etl.db.connection import bounded_session

        return bounded_session(db_connect(dsn, connect_timeout=END_CONNECT_TIMEOUT, limits=self.plan.db),
                               min(END_WORK_BOUND, self.plan.db.unavailable_limit))

    def _start_record(self, conn: psycopg.Connection) -> None:
        plan = self.plan
        self._database = database_identity(conn)
        registry.start_run(conn, self.invocation, config=plan.settings, lanes=[lane.key for lane in plan.lanes],
                           stores=plan.stores, tasks=plan.task_codes, started_at=self._started_at)

    def _lost_at_start(self, exc: BaseException) -> RunResult:
        """The run could not even be recorded as started: it ends FAILED (exit 7) and keeps its record."""
        self.result.database_lost = True
        self.result.error = one_line(exc, with_type=False)
        for lane in self.lanes:
            lane.refuse(self.result.error)
        self.result.finish(self.cancellation.is_cancelled)
        self.result.finished_at = iso(datetime.now(timezone.utc))
        self._keep_record(self.result.to_dict())
        self.health.close()
        return self.result

    def _take_lanes(self) -> list[LaneRunner]:
        """Acquire every lane's cross-process guard, all together (a lane held elsewhere is refused, or waited
        for up to ``wait_for_lane`` while the others are tried too); the others run."""
        outcome = self.guard.acquire_all([(lane.plan.name, lane.plan.key) for lane in self.lanes],
                                         wait=self.plan.wait_for_lane, cancel_event=self.cancellation.event)
        out = []
        for lane in self.lanes:
            refused = outcome.get(lane.plan.name)
            if isinstance(refused, LaneBusy):
                log.warning("%s", refused)  # not a failure: the run is BUSY (exit 6) if every lane is
                lane.refuse(str(refused), busy=True)
            elif refused is not None:  # Cancelled while waiting, or the database went away
                cancelled = self.cancellation.is_cancelled
                lane.refuse("cancelled while waiting for the lane" if cancelled else one_line(refused))
            else:
                out.append(lane)
        return out

    def _db_down(self, reason: str) -> None:
        for lane in self.lanes:
            lane.scheduler.pause(f"database unavailable ({reason})")

    def _db_up(self) -> None:
        for lane in self.lanes:
            lane.scheduler.resume()

    def _db_gone(self, reason: str) -> None:
        self.result.database_lost = True
        self.result.error = reason
        for lane in self.lanes:
            lane.stop(reason)

    def _lanes_lost(self, names: list[str]) -> None:
        for lane in self.lanes:
            if lane.plan.name in names:
                lane.stop("the lane's cross-process lock was lost while the database was away")

    def _run_dwd(self) -> dict:
        from feiqiu_etl.tasks.dwd import DwdLoadContext, DwdLoadTask, ensure_dwd_tables, load_dwd_mapping

        dwd = self.plan.dwd
        try:
            mapping = load_dwd_mapping(self.plan.connector.dwd_mapping_path())
            with self.health.slot() as slot:
                slot.run(lambda conn: ensure_dwd_tables(conn, mapping))
            context = DwdLoadContext(logging.getLogger("feiqiu_etl.dwd"), self.cancellation.event, self.health)
            task = DwdLoadTask(self.dsn, mapping, parallel_workers=dwd.parallel_workers, run_id=self.run_id,
                               full=dwd.full, context=context)
            summary = task.load(only_tables=list(dwd.tables) if dwd.tables else None)
        except Exception as exc:  # noqa: BLE001 - e.g. the database went away during DDL
            log.error("DWD load failed: %s", one_line(exc))
            return {"status": Status.FAILED, "tables": [], "errors": [{"table": "*", "error": one_line(exc)}],
                    "succeeded": 0, "failed": 0}
        out = summary.to_dict()
        out["status"] = summary.status
        return out

    def _record_end(self) -> None:
        r = self.result
        summary = r.to_dict()
        summary["timeline"] = {"rows": _downsample(self._series + [[round(time.monotonic() - self._t0, 2),
                                                                     r.totals()["rows_written"]]])}
        answering = self.health.answering and not self.health.gave_up
        if self.control is not None:  # its last beat and log flush; not long when the database does not answer
            self.control.stop(wait=5.0 if answering else 0.5)
            self.control.flush_now()
        try:
            self.health.slot().run(lambda conn: registry.finish_run(
                conn, self.run_id, status=r.status, exit_code=r.exit_code, summary=summary,
                error=r.error or r.first_reason(), totals=r.totals()))
        except (psycopg.Error, DatabaseUnavailable) as exc:
            log.error("could not record the end of run %s: %s", self.run_id, one_line(exc))
            self._keep_record(summary)

    def _keep_record(self, summary: dict) -> None:
        """The database did not take the run's record: keep it for the next command that reaches it."""
        keep_late_record(self.result, self.invocation, self._database, started_at=self._started_at, plan=self.plan,
                         summary=summary)

    # ------------------------------------------------------------------------------------------------ logs
    def _store_entry(self, item: dict) -> None:
        if self.control is not None:
            self.control.log(item)

    def _store_request(self, record: dict) -> None:
        if self.control is not None:
            self.control.request(record)

    def _store_block(self, block: list, lane: str, site_id: int, task: str) -> None:
        for e in block:
            self._store_entry(entry(e.timestamp, logging.getLevelName(e.level), e.message,
                                    lane=lane, site_id=site_id, task=task))

    # ------------------------------------------------------------------------------------------------ status
    def _sample(self) -> None:
        """The run's own clock (its loop while the lanes run, every 0.2 s): twice a second each lane records
        its rows for rows/s, and once a second the run its rows-over-time series for the timeline."""
        now = time.monotonic()
        if now - self._sampled < SAMPLE_EVERY:
            return
        self._sampled = now
        for lane in self.lanes:
            lane.sample(now)
        elapsed = now - self._t0
        with self._lock:
            if not self._series or elapsed - self._series[-1][0] >= 1.0:
                self._series.append([round(elapsed, 2), sum(lane.rows_written() for lane in self.lanes)])

    def statistics(self) -> RunStatistics:
        """Live status of the run (published about once a second; also drives the progress display). A read:
        it changes nothing, whoever calls it and however often."""
        lanes = tuple(lane.statistics() for lane in self.lanes)
        pool = self.health.statistics().pool
        return RunStatistics(
            run_id=self.run_id, phase=self._phase, cancelling=self.cancellation.is_cancelled,
            tasks_done=sum(lane.tasks_done for lane in lanes), tasks=self.plan.task_count, lanes=lanes,
            elapsed_s=round(time.monotonic() - self._t0, 1), rows_written=sum(lane.rows_written for lane in lanes),
            rows_unchanged=sum(lane.rows_unchanged for lane in lanes),
            rows_per_s=round(sum(lane.rows_per_s for lane in lanes), 1),
            requests_sent=sum(lane.requests_sent for lane in lanes),
            requests_remaining=sum(lane.requests_remaining for lane in lanes),
            eta_s=max((lane.eta_s for lane in lanes), default=0.0),
            pool_waiting=pool.get("waiting", 0), pool_wait_s=pool.get("longest_wait", 0.0),
            pool_in_use=pool.get("open", 0) - pool.get("idle", 0), pool_size=pool.get("size", self.plan.db.pool_size))

    def finished_tasks(self) -> list:
        return [t for lane in self.lanes for t in lane.result.tasks if t.skipped is None]


def keep_late_record(result: RunResult, invocation: Invocation, database: str | None, *,
                     started_at: datetime | None, plan: RunPlan | None = None, summary: dict | None = None) -> None:
    """Keep the record of a run the database did not take (:mod:`feiqiu_etl.registry.late`), for the next command
    that reaches ``database``; logs where (or why not). ``plan`` None: the run ended while planning."""
    from feiqiu_etl import __version__
    from feiqiu_etl.registry import late

    if database is None:
        log.error("run %s cannot be recorded: the database never answered it", result.run_id)
        return
    now = datetime.now(timezone.utc)
    record = late.LateRecord(
        run_id=result.run_id, database=database, command=invocation.command,
        started_at=(started_at or now).isoformat(), finished_at=result.finished_at or now.isoformat(),
        status=result.status, exit_code=result.exit_code, error=result.error or result.first_reason(),
        args=dict(invocation.args), config=plan.settings if plan is not None else {},
        lanes=tuple(lane.key for lane in plan.lanes) if plan is not None else (),
        stores=plan.stores if plan is not None else (), tasks=plan.task_codes if plan is not None else (),
        summary=summary if summary is not None else result.to_dict(), totals=result.totals(), host=registry.HOST,
        pid=os.getpid(), process_started=registry.process_started(), version=__version__)
    path = late.keep(record)
    if path is not None:
        log.error("run %s: its record is kept in %s and written by the next command that reaches the database",
                  result.run_id, path)


def _downsample(series: list[list[float]], limit: int = 600) -> list[list[float]]:
    """At most ``limit`` points, keeping the first and the last."""
    if len(series) <= limit:
        return series
    step = len(series) / (limit - 1)
    return [series[int(i * step)] for i in range(limit - 1)] + [series[-1]]

