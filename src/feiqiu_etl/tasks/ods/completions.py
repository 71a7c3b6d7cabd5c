"""What happens when a listing of an ODS task ends (spec §3.5; the pipeline's ``on_scope_complete``, run on the
writer thread inside the writer's transaction retry): a window segment whose pages and details all committed is
checkpointed — only up to the task's start, and not when it answered an unexpected zero (issue 25: the next run
asks again); a snapshot that is provably complete soft-deletes what it did not show, through the deletion guard
(:mod:`feiqiu_etl.tasks.ods.deletions`), never when the run was cancelled. Either way the listing's reconcile
row is recorded (:func:`~feiqiu_etl.tasks.ods.listings.record_listing`). :func:`report_held` turns deletions the
guard held back into the task's PARTIAL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from feiqiu_etl.common.status import Status
from feiqiu_etl.connector.windows import fmt, from_aware, to_aware
from feiqiu_etl.pipeline.models import PipelineResult, WriteResult
from feiqiu_etl.tasks.ods import reconcile
from feiqiu_etl.tasks.ods.context import TaskContext
from feiqiu_etl.tasks.ods.deletions import GuardOutcome, GuardRules
from feiqiu_etl.tasks.ods.listings import record_listing
from feiqiu_etl.tasks.ods.processing import SnapshotState
from feiqiu_etl.tasks.ods.reconcile import Reconciler
from feiqiu_etl.tasks.ods.writer import OdsWriter


def guard_rules(ctx: TaskContext) -> GuardRules:
    """The deletion guard's thresholds of the run (``integrity.max_delete_share`` / ``max_delete_rows``)."""
    return GuardRules(ctx.integrity.max_delete_share, ctx.integrity.max_delete_rows)


@dataclass
class ScopeCompletion:
    """``on_scope_complete`` of one task and store: call it as ``(scope, ok) -> WriteResult | None`` (the rows
    soft-deleted, for a snapshot). ``note`` collects what the task's result reports: ``"snapshot"`` (a text)
    and ``"deletions"`` (the guard's :class:`GuardOutcome`)."""

    writer: OdsWriter
    ctx: TaskContext
    site_id: int
    run_started: datetime
    logger: logging.Logger
    snapshot: SnapshotState | None = None
    reconciler: Reconciler | None = None
    note: dict = field(default_factory=dict)

    def __call__(self, scope: Any, ok: bool) -> WriteResult | None:
        if not isinstance(scope, tuple) or scope[0] not in ("segment", "snapshot"):
            return None
        deleted = None
        try:
            if scope[0] == "segment":
                self._segment_done(scope, ok)
                return None
            if self.snapshot is None:
                return None
            deleted = self._snapshot_done(ok)
            return WriteResult(deleted=deleted) if deleted is not None else None
        finally:
            if self.reconciler is not None:
                record_listing(self.writer, self.ctx, self.site_id, scope, self.reconciler, deleted or 0,
                               self.logger)

    def _segment_done(self, scope: tuple, ok: bool) -> None:
        reconciler = self.reconciler
        doubted = reconciler is not None and reconciler.verdict(scope)[0] == reconcile.UNEXPECTED_ZERO
        if doubted:  # not blocked, not believed either: the next run asks again (a second opinion)
            self.logger.warning("window %s - %s left unfinished: it answered 0 rows where rows are "
                                "expected; the next run asks again", fmt(scope[3]), fmt(scope[4]))
        if ok and not doubted:
            # Only the part before the task started is complete: later records may still come (a
            # window that reaches into the future must not hide them from the next incremental run).
            end = min(scope[4], from_aware(self.run_started).replace(microsecond=0))
            if scope[3] < end:
                self.writer.checkpoint_window(self.site_id, to_aware(scope[3]), to_aware(end))

    def _snapshot_done(self, ok: bool) -> int | None:
        cancellation, note = self.ctx.cancellation, self.note
        if cancellation.is_cancelled:
            reason = "the lane reached its deadline" if cancellation.reason == "deadline" \
                else "the run was cancelled"
        else:
            reason = ("a page or record failed" if not ok else None) or self.snapshot.incomplete_reason()
        if reason:
            note["snapshot"] = f"soft delete skipped: {reason}"
            self.logger.warning("snapshot incomplete, soft delete skipped: %s", reason)
            return None
        rules = guard_rules(self.ctx)
        guard = self.writer.guarded_delete(self.site_id, self.snapshot.keys, self.run_started, rules,
                                           complete_at=self.run_started)
        note["snapshot"] = f"complete; {guard.deleted} row(s) soft-deleted" + (
            f" ({guard.confirmed} held back earlier, now confirmed)" if guard.confirmed else "") + (
            f"; {guard.held} of {guard.live} live row(s) held back" if guard.held else "")
        note["deletions"] = guard
        if guard.held:
            self.logger.warning("%s", guard.describe(self.writer.spec.code, self.site_id, rules))
        elif guard.confirmed:
            self.logger.info("%d held-back deletion(s) confirmed by this complete snapshot and applied",
                             guard.confirmed)
        return guard.deleted


def report_held(result: PipelineResult, guard: GuardOutcome | None, ctx: TaskContext, task_code: str,
                site_id: int) -> None:
    """Deletions the guard held back end the task PARTIAL naming the share and rows (issue 25 part 4): one
    processing failure and an error of stage ``deletion guard`` on ``result``. Nothing without a hold."""
    if guard is None or not guard.held:
        return
    rules = guard_rules(ctx)
    result.errors.append({"error": guard.describe(task_code, site_id, rules), "stage": "deletion guard",
                          "held_deletions": guard.held, "live_rows": guard.live})
    result.processing_failures += 1
    if result.status == Status.SUCCESS:
        result.status = Status.PARTIAL.value
