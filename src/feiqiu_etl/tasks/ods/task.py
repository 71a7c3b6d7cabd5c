"""``BaseOdsTask``: runs one planned ODS task for one store through a ``UnifiedPipeline`` (spec §3.5).

The windows come from the plan (a :class:`PlannedTask`, e.g. the plan's ``TaskPlan``): half-open segments of at most
31 days (upstream-api §1.2). ``execute()`` records the incremental horizon before any request (so that a
segment that fails is still a hole for the next run), seeds page 1 of every segment (or of the snapshot)
plus details still owed from earlier runs, and runs the pipeline with :class:`OdsProcessor` as
``process_fn`` and :class:`OdsWriter` as ``write_fn``. Scope completions checkpoint a segment (all its
pages and details committed) or apply the snapshot soft delete (only after a provably complete snapshot,
never when cancelled). A detail that failed for good goes back to the owed list with its attempt count;
one that answers "not found" (40401) leaves it (upstream-api §2.1: skip, no retry).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Hashable, Iterator, Protocol

import psycopg
from psycopg import sql

from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.errortext import one_line
from feiqiu_etl.db.health import DatabaseHealth, DirectSlot
from feiqiu_etl.connector.windows import Window, fmt, from_aware, to_aware
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.estimates import Estimate, ListProgress, live_estimate
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.errors import AbortPipeline
from feiqiu_etl.pipeline.models import PipelineRequest, PipelineResult, WriteResult
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.pipeline.unified_pipeline import Transport, UnifiedPipeline
from feiqiu_etl.statistics import Queues, TaskStatistics
from feiqiu_etl.tasks.ods.drift import FieldTracker, record_drift
from feiqiu_etl.tasks.ods import reconcile
from feiqiu_etl.tasks.ods.processing import OdsProcessor, PageTotals, SnapshotState
from feiqiu_etl.tasks.ods.deletions import GuardRules
from feiqiu_etl.tasks.ods.reconcile import IntegrityRules, Reconciler
from feiqiu_etl.tasks.ods.rows import DetailFailed, layouts_for
from feiqiu_etl.tasks.ods.writer import OdsWriter, detail_request
from feiqiu_etl.common.status import Status


class PlannedTask(Protocol):
    """What an ODS task reads of its plan: the spec, the store, the effective pipeline settings, the window
    segments, the incremental horizon, the estimate, whether it is a first load and how many details to re-check (and the fraction of one carried over).
    The plan's :class:`~feiqiu_etl.plan.model.TaskPlan` is one; the task package names what it needs instead of
    importing the plan (the plan is built above the tasks)."""

    @property
    def spec(self) -> OdsTaskSpec: ...
    @property
    def site_id(self) -> int: ...
    @property
    def config(self) -> PipelineConfig: ...
    @property
    def windows(self) -> tuple[Window, ...]: ...
    @property
    def horizon(self) -> datetime | None: ...
    @property
    def estimate(self) -> Estimate: ...
    @property
    def first_load(self) -> bool: ...
    @property
    def recheck_budget(self) -> int: ...
    @property
    def recheck_credit(self) -> float: ...


@dataclass(frozen=True)
class ApiConventions:
    """The connector's request conventions that the task needs (names of body keys, limits)."""

    connector: str = "feiqiu"
    site_param: str = "siteId"
    page_param: str = "page"
    limit_param: str = "limit"
    start_param: str = "startTime"
    end_param: str = "endTime"
    max_pages: int = 5000
    first_page: int = 1

    @classmethod
    def of(cls, connector) -> "ApiConventions":
        """The conventions of a :class:`~feiqiu_etl.connector.model.Connector`."""
        api = connector.api
        return cls(connector=connector.name, site_param=api.site_param, page_param=api.pagination.page_param,
                   limit_param=api.pagination.limit_param, start_param=api.window.start_param,
                   end_param=api.window.end_param, max_pages=api.pagination.max_pages,
                   first_page=api.pagination.first_page)


@dataclass
class TaskRun:
    """Outcome of one task for one store (``result`` holds the §4.3 counters)."""

    task_code: str
    site_id: int
    table: str
    detail_table: str | None
    result: PipelineResult
    windows: list[tuple[str, str]] = field(default_factory=list)
    snapshot_note: str | None = None
    lane: str | None = None
    first_load: bool = False
    owed_details: int = 0
    details_given_up: list[str] = field(default_factory=list)
    skipped: str | None = None
    recheck: dict | None = None
    schema_drift: list[dict] = field(default_factory=list)  # tasks/ods/drift.py: new/lost fields, reported once
    deferred_details: int = 0  # a snapshot's recent part: details recorded as owed for the owed part
    reconcile: dict | None = None  # tasks/ods/reconcile.py: verdict counts, refetches, listings not ok (issue 25)
    deletions: dict | None = None  # tasks/ods/deletions.py: the snapshot's soft delete as the guard decided it
    nul_removed: int = 0  # NUL characters removed from the upstream's text before storing (issue 28 item 7)

    @property
    def status(self) -> str:
        return self.result.status

    def to_dict(self) -> dict:
        return {
            "task": self.task_code, "site_id": self.site_id, "lane": self.lane, "table": self.table,
            "detail_table": self.detail_table, "windows": [list(w) for w in self.windows],
            "snapshot_note": self.snapshot_note, "first_load": self.first_load, "owed_details": self.owed_details,
            "details_given_up": self.details_given_up, "skipped": self.skipped, "recheck": self.recheck,
            "schema_drift": self.schema_drift, "deferred_details": self.deferred_details,
            "reconcile": self.reconcile, "deletions": self.deletions, "nul_removed": self.nul_removed,
            **self.result.to_dict(),
        }

    @classmethod
    def not_run(cls, task: PlannedTask, reason: str, status: str, lane: str | None = None) -> "TaskRun":
        """A planned task that never started (its store or lane stopped, or the run was cancelled)."""
        spec = task.spec
        result = PipelineResult(status=status, cancelled=status == Status.CANCELLED)
        return cls(spec.code, task.site_id, spec.table, spec.detail.target_table if spec.detail else None, result,
                   [(fmt(w.start), fmt(w.end)) for w in task.windows], lane=lane, skipped=reason)


@dataclass(frozen=True)
class TaskContext:
    """What every ODS task of one run shares: the database (``dsn``; ``connect`` opens a connection, default
    :func:`feiqiu_etl.db.connection.connect`; with ``health`` every database step survives a lost connection),
    the run id written to every row, the run's cancellation, the connector's request conventions, how many
    failed attempts give an owed detail up, whether a cancel may abort the request in flight, and the
    ``integrity`` rules every listing is reconciled by (issue 25, tasks/ods/reconcile.py)."""

    dsn: str
    run_id: str
    cancellation: CancellationToken
    conventions: ApiConventions = ApiConventions()
    detail_max_attempts: int = 5
    abortable: bool = False
    connect: Callable[[str], psycopg.Connection] | None = None
    health: DatabaseHealth | None = None
    integrity: IntegrityRules = IntegrityRules()


@dataclass(frozen=True)
class LaneAccess:
    """How one task reaches the upstream: the lane's :class:`RequestScheduler` (shared by every store of the
    token), the ``transport`` that performs a request through it, the lane's name (for the result) and the
    task's ``tenant`` (its store's share of the lane: the lane takes turns between tenants)."""

    scheduler: RequestScheduler
    transport: Transport
    name: str | None = None
    tenant: Hashable | None = None


class BaseOdsTask:
    """One planned ODS task (``task``: its spec, store, settings, windows and estimate) for one store, run on
    ``lane`` within ``context``; ``logger`` is the task's own (its lines go to the task's log block). The
    writer's connection is opened per ``execute``. :meth:`statistics` may be read from any thread."""

    def __init__(self, task: PlannedTask, lane: LaneAccess, context: TaskContext, logger: logging.Logger):
        self.task = task
        self.spec = task.spec
        self.lane = lane
        self.ctx = context
        self.conv = context.conventions
        self.logger = logger
        self._pipeline: UnifiedPipeline | None = None
        self._result: PipelineResult | None = None
        self._live: tuple | None = None

    def statistics(self) -> TaskStatistics:
        """Snapshot (a read; it changes nothing): from the pipeline while it runs (its queues, counts and
        writer), from the result once it ended; ``starting`` before the pipeline exists."""
        base = {"task": self.spec.code, "site_id": self.task.site_id, "requests_planned": self.task.estimate.requests}
        result, pipeline = self._result, self._pipeline
        if result is not None:
            return TaskStatistics(**base, state="finished", requests=result.total_requests,
                                  fetched=result.total_fetched, failures=len(result.errors),
                                  rows_written=result.total_inserted + result.total_updated,
                                  rows_unchanged=result.total_skipped,
                                  rate_limited=result.rate_limited, seconds_writing=result.timing.get("write", 0.0))
        st = pipeline.statistics() if pipeline is not None else None
        if st is None or not st.running:
            return TaskStatistics(**base, requests_remaining=self.task.estimate.requests)
        known = st.frontier + (st.seeds_left or 0) + (1 if st.scheduler.in_flight else 0)
        expected = self.live_estimate().requests  # page 1's total once it answered (estimates.py)
        writer = st.writer
        return TaskStatistics(
            **base, state="running", requests=st.requests,
            requests_remaining=max(expected - st.requests, known), fetched=st.fetched,
            rows_written=st.rows_written, rows_unchanged=st.rows_unchanged, failures=st.failures, rate_limited=st.rate_limited,
            queues=Queues(st.frontier, st.processing_queue, st.write_queue), seeds_left=st.seeds_left,
            batches_written=writer.batches_written if writer else 0,
            seconds_writing=writer.seconds_writing if writer else 0.0, elapsed_s=round(st.elapsed, 1))

    def execute(self) -> TaskRun:
        """Run the task; with a :class:`DatabaseHealth` every database step survives a lost connection
        (reconnect, then the step again), else the first database error is the step's failure."""
        from feiqiu_etl.db.connection import connect

        spec, site_id = self.spec, self.task.site_id
        layouts = layouts_for(spec)
        ctx = self.ctx
        slot = ctx.health.slot() if ctx.health is not None else DirectSlot(ctx.dsn, ctx.connect or connect)
        try:
            slot.run(self._record_horizon)
            owes = spec.detail is not None and self.task.phase in ("all", "owed")
            pending = slot.run(lambda c: self._pending_details(c, site_id)) if owes else []
            rechecks = slot.run(lambda c: self._recheck_candidates(c, site_id, pending)) \
                if spec.detail and self.task.recheck_budget > 0 else []
            snapshot = SnapshotState() if spec.is_snapshot else None
            writer = OdsWriter(None, spec, layouts, ctx.run_id, self.conv.connector,
                               detail_scope_follows_rows=not spec.is_snapshot,
                               detail_max_attempts=ctx.detail_max_attempts, defer_details=self.task.defers_details)
            writer.owe((site_id, r.context["parent_key"]) for r in pending)
            fields = FieldTracker()
            totals = PageTotals()
            reconciler = slot.run(lambda c: self._reconciler(c, site_id))
            processor = OdsProcessor(spec, site_id, layouts, self.conv.max_pages + self.conv.first_page - 1,
                                     page_param=self.conv.page_param, site_field=self.conv.site_param,
                                     snapshot=snapshot, fields=fields, totals=totals, reconciler=reconciler,
                                     first_page=self.conv.first_page)
            pipeline = UnifiedPipeline(self.lane.transport, self.task.config, scheduler=self.lane.scheduler,
                                       cancellation=ctx.cancellation, logger=self.logger, tenant=self.lane.tenant,
                                       abortable=ctx.abortable)
            run_started = datetime.now(timezone.utc)
            note: dict[str, str] = {}

            def through(step: Callable[[], Any]) -> Any:
                saved = writer.save_state()
                return slot.run(lambda conn: (writer.bind(conn), step())[1],
                                on_retry=lambda: writer.restore_state(saved))

            def write(rows: list) -> WriteResult:
                try:
                    return through(lambda: writer.write(rows))
                except Exception:
                    writer.batch_lost(rows)
                    raise

            def on_scope(scope: Any, ok: bool) -> WriteResult | None:
                return through(lambda: self._scope_done(writer, site_id, scope, ok, snapshot, run_started, note,
                                                        reconciler))

            seeds = list(self._seeds(site_id, pending))
            recheck = _Recheck(spec, rechecks, writer, site_id, self.task.recheck_budget)
            self._live = (totals, writer, recheck, len(pending))
            self.logger.info("start: %s, %d window segment(s), %d owed detail(s)",
                             spec.kind, len(self.task.windows), len(pending))
            self._pipeline = pipeline
            result = self._result = pipeline.run(_Seeds(seeds, recheck), processor, write,
                                                 on_scope_complete=on_scope, on_request_failed=self._detail_failed)
            drift = self._drift(slot, fields)
        finally:
            slot.close()
        guard = note.get("deletions")
        if guard is not None and guard.held:  # issue 25 part 4: the task ends PARTIAL naming the share and rows
            rules = GuardRules(ctx.integrity.max_delete_share, ctx.integrity.max_delete_rows)
            result.errors.append({"error": guard.describe(spec.code, site_id, rules), "stage": "deletion guard",
                                  "held_deletions": guard.held, "live_rows": guard.live})
            result.processing_failures += 1
            if result.status == Status.SUCCESS:
                result.status = Status.PARTIAL.value
        for gap in result.unreconciled():  # docs/guides/run-results.md "Counts that add up": a bookkeeping bug, never expected
            self.logger.error("counts do not add up: %s", gap)
        for parent in writer.given_up:
            self.logger.warning("owed detail %s given up after %d failed attempts", parent, ctx.detail_max_attempts)
        if processor.nul_removed:  # text from outside changed: said once per task, with the count
            self.logger.warning("removed %d NUL character(s) from the upstream's text before storing it (PostgreSQL "
                                "cannot store them; the stored payload and its hash are without them)",
                                processor.nul_removed)
        detail_table = spec.detail.target_table if spec.detail else None
        return TaskRun(spec.code, site_id, spec.table, detail_table, result,
                       [(fmt(w.start), fmt(w.end)) for w in self.task.windows], note.get("snapshot"),
                       lane=self.lane.name, first_load=self.task.first_load,
                       owed_details=len(pending), details_given_up=list(writer.given_up),
                       recheck={"budget": self.task.recheck_budget, "used": recheck.used,
                                "credit": self.task.recheck_credit} if spec.detail else None,
                       schema_drift=drift, deferred_details=writer.deferred,
                       reconcile=reconcile.summary(reconciler.recorded, reconciler.refetches,
                                                   ctx.integrity.refetch_listings),
                       deletions=guard.to_dict() if guard is not None else None, nul_removed=processor.nul_removed)

    def live_estimate(self) -> Estimate:
        """The task's requests as known now (any thread): the plan's estimate until the task starts, then
        re-estimated from page 1's ``total`` of each listing and the details its rows asked for
        (:func:`feiqiu_etl.estimates.live_estimate`). What a live ETA should use."""
        live = self._live
        if live is None:
            return self.task.estimate
        totals, writer, recheck, owed = live
        seen, pages, rows = totals.progress()
        scopes = len(self.task.windows) if self.spec.kind == "windowed" else 1
        progress = ListProgress(scopes=scopes, scopes_seen=seen, pages_needed=pages, rows_expected=rows,
                                parents_written=writer.parents_seen, new_details=writer.details_queued,
                                owed=owed, rechecks=recheck.budget)
        return live_estimate(self.task.estimate, progress, has_detail=self.spec.detail is not None)

    def _reconciler(self, conn: psycopg.Connection, site_id: int) -> Reconciler:
        """The task's :class:`Reconciler` with the rows expected per window segment, for the unexpected-zero
        verdict (tasks/ods/reconcile.py): the trailing median, or more where the warehouse already holds more
        live rows inside the window, or — no history at all — the contract's lower bound per day over the
        window; and the segments an earlier run already found zero (a second zero is believed). Nothing for a
        snapshot or with ``integrity.zero_floor`` 0. A few queries, no request."""
        spec, rules = self.spec, self.ctx.integrity
        if spec.kind != "windowed" or not spec.window_column or rules.zero_floor <= 0 or not self.task.windows:
            return Reconciler(rules, spec.page_size)
        scopes = [("segment", spec.code, site_id, w.start, w.end) for w in self.task.windows]
        expected = reconcile.trailing_expectations(conn, spec.table, spec.window_column, site_id, scopes,
                                                   rules.zero_weeks)
        reconciler = Reconciler(rules, spec.page_size, expected,
                                reconcile.zeros_before(conn, self.conv.connector, spec.code, site_id,
                                                       self.ctx.run_id, scopes))
        for scope, held in reconcile.held_rows(conn, spec.table, spec.window_column, site_id, scopes).items():
            if held > reconciler.expected.get(scope, 0):
                reconciler.expected[scope] = float(held)
                reconciler.basis[scope] = "the warehouse already holds"
        first_load = not conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE site_id = %s)").format(
            sql.Identifier(*spec.table.split(".", 1))), (site_id,)).fetchone()[0]
        conn.commit()
        if first_load and spec.expected_daily_rows:
            for scope in scopes:
                if scope not in reconciler.expected:
                    days = (scope[4] - scope[3]).total_seconds() / 86400
                    reconciler.expected[scope] = round(spec.expected_daily_rows[0] * days, 1)
                    reconciler.basis[scope] = "the contract's lower bound over the window is"
        return reconciler

    def _drift(self, slot, fields: FieldTracker) -> list[dict]:
        """Schema drift report of this run (tasks/ods/drift.py); a failure to record it is logged, not fatal."""
        try:
            return slot.run(lambda conn: record_drift(conn, connector=self.conv.connector, task_code=self.spec.code,
                                                      run_id=self.ctx.run_id, tracker=fields, logger=self.logger))
        except Exception as exc:  # noqa: BLE001 - the data is loaded; only the report is missing
            self.logger.error("schema drift not recorded: %s", exc)
            return []

    # ----------------------------------------------------------------- planning leftovers (I/O)
    def _record_horizon(self, conn: psycopg.Connection) -> None:
        """Record the incremental horizon before any request, so a failed first segment stays a hole."""
        horizon = self.task.horizon
        if horizon is not None:
            conn.execute(
                "INSERT INTO etl_meta.window_horizon (connector, task_code, site_id, horizon_start) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id) "
                "DO UPDATE SET horizon_start = LEAST(window_horizon.horizon_start, EXCLUDED.horizon_start)",
                (self.conv.connector, self.spec.code, self.task.site_id, to_aware(horizon)))
        conn.commit()

    def _pending_details(self, conn: psycopg.Connection, site_id: int) -> list[PipelineRequest]:
        """Details owed by earlier runs whose parent is still live (others are forgotten)."""
        from psycopg import sql

        spec = self.spec
        schema, name = split_table(spec.table)
        key = spec.keys[0]
        rows = conn.execute(
            sql.SQL(
                "SELECT p.record FROM etl_meta.detail_pending p JOIN {t} t ON t.site_id = p.site_id "
                "AND t.{k}::text = p.parent_key AND NOT t.is_deleted "
                "WHERE p.connector = %s AND p.task_code = %s AND p.site_id = %s ORDER BY p.updated_at"
            ).format(t=sql.Identifier(schema, name), k=sql.Identifier(key.column)),
            (self.conv.connector, spec.code, site_id),
        ).fetchall()
        conn.commit()
        return [detail_request(spec, record) for (record,) in rows]

    def _recheck_candidates(self, conn: psycopg.Connection, site_id: int, pending: list) -> list[dict]:
        """List records of live parents whose details were checked longest ago (never first), at most twice
        the budget (some may be fetched anyway as new or changed parents; those are skipped)."""
        from psycopg import sql

        spec = self.spec
        schema, name = split_table(spec.table)
        key = spec.keys[0]
        owed = [r.context["parent_key"] for r in pending]
        rows = conn.execute(
            sql.SQL(
                "SELECT t.payload FROM {t} t LEFT JOIN etl_meta.detail_checked c ON c.connector = %s "
                "AND c.task_code = %s AND c.site_id = t.site_id AND c.parent_key = t.{k}::text "
                "WHERE t.site_id = %s AND NOT t.is_deleted AND NOT (t.{k}::text = ANY(%s)) "
                "ORDER BY c.checked_at NULLS FIRST, t.{k} LIMIT %s"
            ).format(t=sql.Identifier(schema, name), k=sql.Identifier(key.column)),
            (self.conv.connector, spec.code, site_id, owed, 2 * self.task.recheck_budget),
        ).fetchall()
        conn.commit()
        return [r for (r,) in rows]

    def _seeds(self, site_id: int, pending: list[PipelineRequest]) -> Iterator[PipelineRequest]:
        c = self.conv
        base = {c.site_param: site_id, c.page_param: c.first_page, c.limit_param: self.spec.page_size}
        if self.spec.is_snapshot and self.task.phase in ("all", "recent"):
            yield self._list_request(base, ("snapshot", self.spec.code, site_id))
        for w in self.task.windows:
            params = {**base, c.start_param: fmt(w.start), c.end_param: fmt(w.end)}
            yield self._list_request(params, ("segment", self.spec.code, site_id, w.start, w.end))
        yield from pending

    def _list_request(self, params: dict, scope: tuple) -> PipelineRequest:
        return PipelineRequest(
            endpoint=self.spec.endpoint, params=params, page_size=self.spec.page_size,
            data_path=self.spec.data_path, list_key=self.spec.list_key, scope=scope, gap_class=self.spec.gap_class,
        )

    def _detail_failed(self, request: PipelineRequest, exc: BaseException) -> list | None:
        """A detail request failed for good: the owed entry learns of it (or leaves, for "not found").

        A failure that stops the lane or the store rather than saying anything about this detail — the token
        or the store refused (40101/40103), the lane tripped (upstream unreachable, stopped from outside),
        the upstream unreachable — counts no attempt: the detail stays owed as it was, and a token revoked
        for a few nights never gives up a detail (issue 21)."""
        if not request.is_detail or self.spec.detail is None or stops_the_lane(exc):
            return None
        gone = not getattr(exc, "counts_as_failure", True)
        text = one_line(exc, with_type=False)
        if gone:
            self.logger.info("detail of %s %s no longer exists upstream (40401): recorded, no longer owed",
                             self.spec.detail.id_column, request.context["parent_key"])
        return [DetailFailed(self.spec.detail.target_table, self.spec.code, self.task.site_id,
                             request.context["parent_key"], text, gone, request.scope)]

    # ----------------------------------------------------------------- scope completions (writer thread)
    def _scope_done(self, writer: OdsWriter, site_id: int, scope: Any, ok: bool,
                    snapshot: SnapshotState | None, run_started: datetime, note: dict,
                    reconciler: Reconciler | None = None) -> WriteResult | None:
        if not isinstance(scope, tuple) or scope[0] not in ("segment", "snapshot"):
            return None
        deleted = None
        try:
            if scope[0] == "segment":
                doubted = reconciler is not None and reconciler.verdict(scope)[0] == reconcile.UNEXPECTED_ZERO
                if doubted:  # not blocked, not believed either: the next run asks again (a second opinion)
                    self.logger.warning("window %s - %s left unfinished: it answered 0 rows where rows are "
                                        "expected; the next run asks again", fmt(scope[3]), fmt(scope[4]))
                if ok and not doubted:
                    # Only the part before the task started is complete: later records may still come (a
                    # window that reaches into the future must not hide them from the next incremental run).
                    end = min(scope[4], from_aware(run_started).replace(microsecond=0))
                    if scope[3] < end:
                        writer.checkpoint_window(site_id, to_aware(scope[3]), to_aware(end))
                return None
            if snapshot is None:
                return None
            deleted = self._snapshot_done(writer, site_id, ok, snapshot, run_started, note)
            return WriteResult(deleted=deleted) if deleted is not None else None
        finally:
            if reconciler is not None:
                self._record_listing(writer, site_id, scope, reconciler, deleted or 0)

    def _record_listing(self, writer: OdsWriter, site_id: int, scope: tuple, reconciler: Reconciler,
                        deleted: int) -> None:
        """The listing's row of ``etl_meta.listing_reconcile`` (issue 25), with its ODS outcome."""
        outcome = reconciler.outcome(scope)
        outcome.ods_inserted, outcome.ods_updated, outcome.ods_unchanged = writer.scope_counts.pop(scope, (0, 0, 0))
        outcome.ods_soft_deleted = deleted
        with writer.conn.transaction():
            reconcile.record(writer.conn, run_id=self.ctx.run_id, connector=self.conv.connector,
                             task_code=self.spec.code, site_id=site_id, outcome=outcome)
        reconciler.recorded.append(outcome)
        if outcome.verdict in reconcile.ALERTED:
            self.logger.warning("listing %s: %s (%s)", outcome.verdict, outcome.reason,
                                "snapshot" if scope[0] == "snapshot" else f"{fmt(scope[3])} - {fmt(scope[4])}")
        elif outcome.verdict == reconcile.REFETCHED:
            self.logger.info("listing fetched again and now exact: %s", outcome.reason)

    def _snapshot_done(self, writer: OdsWriter, site_id: int, ok: bool, snapshot: SnapshotState,
                       run_started: datetime, note: dict) -> int | None:
        if self.ctx.cancellation.is_cancelled:
            reason = "the lane reached its deadline" if self.ctx.cancellation.reason == "deadline" \
                else "the run was cancelled"
        else:
            reason = ("a page or record failed" if not ok else None) or snapshot.incomplete_reason()
        if reason:
            note["snapshot"] = f"soft delete skipped: {reason}"
            self.logger.warning("snapshot incomplete, soft delete skipped: %s", reason)
            return None
        rules = GuardRules(self.ctx.integrity.max_delete_share, self.ctx.integrity.max_delete_rows)
        guard = writer.guarded_delete(site_id, snapshot.keys, run_started, rules, complete_at=run_started)
        note["snapshot"] = f"complete; {guard.deleted} row(s) soft-deleted" + (
            f" ({guard.confirmed} held back earlier, now confirmed)" if guard.confirmed else "") + (
            f"; {guard.held} of {guard.live} live row(s) held back" if guard.held else "")
        note["deletions"] = guard
        if guard.held:
            self.logger.warning("%s", guard.describe(self.spec.code, site_id, rules))
        elif guard.confirmed:
            self.logger.info("%d held-back deletion(s) confirmed by this complete snapshot and applied",
                             guard.confirmed)
        return guard.deleted



def stops_the_lane(exc: BaseException) -> bool:
    """True for a failure of the lane, the store or the run rather than of one request: ``AbortPipeline``
    (40101, 40103, a tripped lane, a wrong configuration) or a request that reached no server at all."""
    return isinstance(exc, AbortPipeline) or bool(getattr(exc, "transport_failure", False))


class _Recheck:
    """Detail re-checks of a task, handed out lazily after every other seed: a parent already requested
    in this run (new, changed or owed) is skipped, until the budget is used."""

    def __init__(self, spec, records: list[dict], writer: OdsWriter, site_id: int, budget: int):
        self._spec = spec
        self._records = list(records)
        self._requested = writer.requested_details
        self._in_flight = writer.in_flight
        self._site_id = site_id
        self.budget = budget
        self.used = 0

    def __iter__(self) -> Iterator[PipelineRequest]:
        for record in self._records:
            if self.used >= self.budget:
                return
            request = detail_request(self._spec, record)
            key = (self._site_id, request.context["parent_key"])
            if key in self._requested:
                continue
            self._requested.add(key)
            self._in_flight.add(key)
            request.context["recheck"] = True
            self.used += 1
            yield request


class _Seeds:
    """The seeds of a task: its list requests and owed details, then the lazy re-checks. Sized (by the
    first part) so progress can show seeds left."""

    def __init__(self, seeds: list[PipelineRequest], recheck: _Recheck):
        self._seeds = seeds
        self._recheck = recheck

    def __len__(self) -> int:
        return len(self._seeds)

    def __iter__(self) -> Iterator[PipelineRequest]:
        yield from self._seeds
        yield from self._recheck
