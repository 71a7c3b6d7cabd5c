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
from typing import Any, Callable

import psycopg

from feiqiu_etl.common.status import Status
from feiqiu_etl.connector.windows import fmt, to_aware
from feiqiu_etl.db.health import DirectSlot
from feiqiu_etl.errortext import one_line
from feiqiu_etl.estimates import Estimate, ListProgress, live_estimate
from feiqiu_etl.pipeline.errors import AbortPipeline
from feiqiu_etl.pipeline.models import PipelineRequest, PipelineResult, WriteResult
from feiqiu_etl.pipeline.unified_pipeline import UnifiedPipeline
from feiqiu_etl.statistics import Queues, TaskStatistics
from feiqiu_etl.tasks.ods import reconcile
from feiqiu_etl.tasks.ods.completions import ScopeCompletion, report_held
from feiqiu_etl.tasks.ods.context import ApiConventions, LaneAccess, PlannedTask, TaskContext
from feiqiu_etl.tasks.ods.drift import FieldTracker, record_drift
from feiqiu_etl.tasks.ods.listings import task_reconciler
from feiqiu_etl.tasks.ods.processing import OdsProcessor, PageTotals, SnapshotState
from feiqiu_etl.tasks.ods.reconcile import Reconciler
from feiqiu_etl.tasks.ods.rows import DetailFailed, layouts_for
from feiqiu_etl.tasks.ods.seeds import Recheck, Seeds, list_seeds, pending_details, recheck_candidates
from feiqiu_etl.tasks.ods.writer import OdsWriter

__all__ = ["ApiConventions", "BaseOdsTask", "LaneAccess", "PlannedTask", "TaskContext", "TaskRun", "stops_the_lane"]


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

        ctx = self.ctx
        slot = ctx.health.slot() if ctx.health is not None else DirectSlot(ctx.dsn, ctx.connect or connect)
        try:
            parts = self._prepare(slot)
            result = self._run(slot, parts)
            drift = self._drift(slot, parts.fields)
        finally:
            slot.close()
        return self._finish(result, parts, drift)

    def _prepare(self, slot) -> "_Parts":
        """Before any request: the horizon recorded, the owed details and re-check candidates read, the writer,
        the reconciler (its expectations read) and the processor built."""
        spec, site_id, ctx, conv = self.spec, self.task.site_id, self.ctx, self.conv
        layouts = layouts_for(spec)
        slot.run(self._record_horizon)
        owes = spec.detail is not None and self.task.phase in ("all", "owed")
        pending = slot.run(lambda c: pending_details(c, spec, conv.connector, site_id)) if owes else []
        rechecks = slot.run(lambda c: recheck_candidates(c, spec, conv.connector, site_id, pending,
                                                         self.task.recheck_budget)) \
            if spec.detail and self.task.recheck_budget > 0 else []
        snapshot = SnapshotState() if spec.is_snapshot else None
        writer = OdsWriter(None, spec, layouts, ctx.run_id, conv.connector,
                           detail_scope_follows_rows=not spec.is_snapshot,
                           detail_max_attempts=ctx.detail_max_attempts, defer_details=self.task.defers_details)
        writer.owe((site_id, r.context["parent_key"]) for r in pending)
        fields, totals = FieldTracker(), PageTotals()
        reconciler = slot.run(lambda c: task_reconciler(c, self.task, ctx))
        processor = OdsProcessor(spec, site_id, layouts, conv.max_pages + conv.first_page - 1,
                                 page_param=conv.page_param, site_field=conv.site_param,
                                 snapshot=snapshot, fields=fields, totals=totals, reconciler=reconciler,
                                 first_page=conv.first_page)
        recheck = Recheck(spec, rechecks, writer, site_id, self.task.recheck_budget)
        return _Parts(pending, snapshot, writer, fields, totals, reconciler, processor, recheck)

    def _run(self, slot, parts: "_Parts") -> PipelineResult:
        """The pipeline over the task's seeds: every batch and scope completion through ``slot`` (a lost
        connection restores the writer's bookkeeping and runs the step again)."""
        ctx, writer = self.ctx, parts.writer
        pipeline = UnifiedPipeline(self.lane.transport, self.task.config, scheduler=self.lane.scheduler,
                                   cancellation=ctx.cancellation, logger=self.logger, tenant=self.lane.tenant,
                                   abortable=ctx.abortable)
        parts.completion = ScopeCompletion(writer, ctx, self.task.site_id, datetime.now(timezone.utc), self.logger,
                                           parts.snapshot, parts.reconciler)

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
            return through(lambda: parts.completion(scope, ok))

        seeds = [*list_seeds(self.task, self.conv), *parts.pending]
        self._live = (parts.totals, writer, parts.recheck, len(parts.pending))
        self.logger.info("start: %s, %d window segment(s), %d owed detail(s)",
                         self.spec.kind, len(self.task.windows), len(parts.pending))
        self._pipeline = pipeline
        result = self._result = pipeline.run(Seeds(seeds, parts.recheck), parts.processor, write,
                                             on_scope_complete=on_scope, on_request_failed=self._detail_failed)
        return result

    def _finish(self, result: PipelineResult, parts: "_Parts", drift: list[dict]) -> TaskRun:
        """The task's :class:`TaskRun`: held deletions make it PARTIAL; given-up details, NUL characters removed
        and counts that do not add up are logged."""
        spec, site_id, ctx, writer = self.spec, self.task.site_id, self.ctx, parts.writer
        note = parts.completion.note if parts.completion is not None else {}
        guard = note.get("deletions")
        report_held(result, guard, ctx, spec.code, site_id)
        for gap in result.unreconciled():  # docs/guides/run-results.md "Counts that add up": a bookkeeping bug, never expected
            self.logger.error("counts do not add up: %s", gap)
        for parent in writer.given_up:
            self.logger.warning("owed detail %s given up after %d failed attempts", parent, ctx.detail_max_attempts)
        nul_removed = parts.processor.nul_removed
        if nul_removed:  # text from outside changed: said once per task, with the count
            self.logger.warning("removed %d NUL character(s) from the upstream's text before storing it (PostgreSQL "
                                "cannot store them; the stored payload and its hash are without them)", nul_removed)
        reconciler = parts.reconciler
        return TaskRun(spec.code, site_id, spec.table, spec.detail.target_table if spec.detail else None, result,
                       [(fmt(w.start), fmt(w.end)) for w in self.task.windows], note.get("snapshot"),
                       lane=self.lane.name, first_load=self.task.first_load,
                       owed_details=len(parts.pending), details_given_up=list(writer.given_up),
                       recheck={"budget": self.task.recheck_budget, "used": parts.recheck.used,
                                "credit": self.task.recheck_credit} if spec.detail else None,
                       schema_drift=drift, deferred_details=writer.deferred,
                       reconcile=reconcile.summary(reconciler.recorded, reconciler.refetches,
                                                   ctx.integrity.refetch_listings),
                       deletions=guard.to_dict() if guard is not None else None, nul_removed=nul_removed)

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


def stops_the_lane(exc: BaseException) -> bool:
    """True for a failure of the lane, the store or the run rather than of one request: ``AbortPipeline``
    (40101, 40103, a tripped lane, a wrong configuration) or a request that reached no server at all."""
    return isinstance(exc, AbortPipeline) or bool(getattr(exc, "transport_failure", False))


@dataclass
class _Parts:
    """What one ``execute`` builds before its first request, and the scope completion the run adds."""

    pending: list[PipelineRequest]
    snapshot: SnapshotState | None
    writer: OdsWriter
    fields: FieldTracker
    totals: PageTotals
    reconciler: Reconciler
    processor: OdsProcessor
    recheck: Recheck
    completion: ScopeCompletion | None = None
