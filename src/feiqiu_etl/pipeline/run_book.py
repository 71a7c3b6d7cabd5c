"""``RunBook``: the shared books of one :class:`~feiqiu_etl.pipeline.unified_pipeline.UnifiedPipeline` run.

It holds what every stage (the lane driver, the processing workers, the writer) reads and changes: the counts
(a :class:`PipelineResult`), the :class:`WorkTracker` whose count reaching zero ends the run, the frontier of
follow-up requests, the write queue, and the rules of failure and abort. It also takes the writer's
callbacks: a batch written (:meth:`RunBook.on_written`) and a scope finished (:meth:`RunBook.on_scope`).
Shared between threads under its ``lock``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Hashable

from feiqiu_etl.pipeline.callbacks import ScopeFn
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.error_records import describe_error
from feiqiu_etl.pipeline.models import PipelineRequest, PipelineResult, WriteResult, is_record
from feiqiu_etl.pipeline.work_tracker import Frontier, ScopeCompletion, WorkTracker
from feiqiu_etl.pipeline.write_worker import follow_up_scope


class RunBook:
    """The books of one run. ``failure_limit`` consecutive failed batches abort it; the write queue holds up to
    ``2 × queue_size`` items; ``on_scope_fn(scope, ok)`` is the caller's hook of a finished scope (None: none)."""

    def __init__(self, cancellation: CancellationToken, log: logging.Logger, *, failure_limit: int,
                 queue_size: int, on_scope_fn: ScopeFn | None):
        self.cancellation = cancellation
        self.log = log
        self.failure_limit = failure_limit
        self.on_scope_fn = on_scope_fn
        self.tracker = WorkTracker()
        self.frontier: Frontier[PipelineRequest] = Frontier(self.tracker)
        self.write_q: queue.Queue[Any] = queue.Queue(maxsize=queue_size * 2)
        self.result = PipelineResult()
        self.lock = threading.Lock()
        self.aborted = False
        self.consecutive_write_failures = 0
        self.writer_thread: threading.Thread | None = None
        self.timing = {"request": 0.0, "processing": 0.0, "write": 0.0}
        self.records_queued = 0  # fetched records handed towards the writer (rows_not_written: those never done)
        self.records_done = 0

    # ------------------------------------------------------------------ counts and failures (any thread)
    def stopping(self) -> bool:
        """True once the run is cancelled or aborted: the lane sends nothing more."""
        return self.cancellation.is_cancelled or self.aborted

    def abort(self, reason: str) -> None:
        """Fail the run (once; the first reason is logged)."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
        self.log.error("pipeline aborted: %s", reason)

    def record(self, stage: str, error: dict, level: int = logging.WARNING) -> None:
        """Count and log one failure of ``stage`` (``request``, ``processing`` or ``write``); ``error`` is the
        record kept in ``result.errors`` (its ``params`` are named in the log line)."""
        with self.lock:
            if stage == "request":
                self.result.request_failures += 1
            elif stage == "processing":
                self.result.processing_failures += 1
            else:
                self.result.write_failures += 1
            self.result.errors.append({"stage": stage, **error})
        params = error.get("params")
        where = (" [" + ", ".join(f"{k}={v}" for k, v in params.items()) + "]") if params else ""
        self.log.log(level, "%s failure: %s%s", stage, error.get("error"), where)

    def dropped(self, request: PipelineRequest) -> None:
        """A request given up on cancel/abort. A detail one counts as ``detail_skipped`` and ``detail_dropped``
        (not fetched, no error), so success + failure + skipped still equals ``detail_asked`` (Property 14)."""
        if request.is_detail:
            with self.lock:
                self.result.detail_skipped += 1
                self.result.detail_dropped += 1

    def push(self, follow: PipelineRequest) -> None:
        """A follow-up for the lane (``follow.scope`` set): counted as asked when it is a detail request."""
        if follow.is_detail:
            with self.lock:
                self.result.detail_asked += 1
        self.frontier.push(follow, follow.scope)

    def count_queued(self, rows: list) -> None:
        """``rows`` are on their way to the writer (their records count towards ``rows_not_written``)."""
        records = sum(1 for row in rows if is_record(row))
        with self.lock:
            self.records_queued += records

    def add_write_counts(self, result: WriteResult) -> None:
        """Add a write's counts to the run's (lock held)."""
        self.result.total_inserted += result.inserted
        self.result.total_updated += result.updated
        self.result.total_skipped += result.skipped
        self.result.total_deleted += result.deleted
        self.result.detail_skipped += result.follow_ups_skipped
        self.result.detail_asked += result.follow_ups_skipped  # parents that asked and needed none

    # ------------------------------------------------------------------ termination
    def finish_item(self, scope: Hashable | None, *, failed: bool) -> None:
        """One item of ``scope`` is done; a scope left without work has its hook run on the writer thread."""
        completion = self.tracker.done(1, scope, failed=failed)
        if completion is not None:
            if threading.current_thread() is self.writer_thread:
                self.on_scope(completion)
            else:
                self.write_q.put(completion)

    def finish(self, started: float, seconds_writing: float) -> PipelineResult:
        """The run's result, its status decided, ``started`` (monotonic s) to now its elapsed time."""
        self.timing["write"] = seconds_writing
        with self.lock:  # only a writer stuck past JOIN_DEADLINE leaves records on their way (docs/operations/troubleshooting.md)
            self.result.rows_not_written = max(0, self.records_queued - self.records_done)
        return self.result.finish(aborted=self.aborted, cancelled=self.cancellation.is_cancelled, timing=self.timing,
                                  elapsed=time.monotonic() - started)

    # ------------------------------------------------------------------ writer callbacks (writer thread)
    def on_written(self, rows: list, scopes: list, result: WriteResult | None, error: Exception | None) -> None:
        """A batch of ``rows`` (one scope each, ``scopes``) was written with ``result``, or failed with ``error``."""
        failed = error is not None or (result is not None and result.errors > 0)
        records = sum(1 for row in rows if is_record(row))
        if error is not None:
            self.record("write", {"rows": len(rows), "error": describe_error(error)})
        elif result is not None and result.errors:
            self.record("write", {"rows": len(rows), "error": f"{result.errors} row(s) rejected by write_fn"})
        with self.lock:
            self.records_done += records
            if error is None and result is not None:
                self.add_write_counts(result)
                self.result.rows_failed += min(result.errors, records)  # rows the write_fn rejected
            elif error is not None:
                self.result.rows_failed += records  # the batch failed: none of its records was written
            if failed:
                self.consecutive_write_failures += 1
                limit_hit = self.consecutive_write_failures >= self.failure_limit
            else:
                self.consecutive_write_failures = 0
                limit_hit = False
        if limit_hit:
            self.abort(f"{self.failure_limit} consecutive write failures")
        if result is not None and error is None:
            for follow in result.follow_ups:
                follow.scope = follow_up_scope(follow, scopes)
                self.push(follow)
        self._done_by_scope(scopes, failed)

    def _done_by_scope(self, scopes: list, failed: bool) -> None:
        counts: dict[Hashable | None, int] = {}
        for s in scopes:
            counts[s] = counts.get(s, 0) + 1
        for s, n in counts.items():
            completion = self.tracker.done(n, s, failed=failed)
            if completion is not None:
                self.on_scope(completion)

    def on_scope(self, completion: ScopeCompletion) -> None:
        """Run the caller's scope hook on the writer thread, then finish the completion item."""
        try:
            if self.on_scope_fn is not None:
                extra = self.on_scope_fn(completion.scope, completion.ok)
                if extra is not None:
                    with self.lock:
                        self.add_write_counts(extra)
        except Exception as exc:
            self.record("write", {"scope": repr(completion.scope), "error": describe_error(exc)})
        finally:
            self.tracker.done(1)
