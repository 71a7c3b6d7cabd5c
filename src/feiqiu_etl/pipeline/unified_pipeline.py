"""``UnifiedPipeline`` (spec §3.4): serial requests → parallel processing → one writer, with exact
termination even though processing and writing feed new requests back into the lane (spec 002).

Threads of one ``run()``:

* the calling thread is the **lane driver**: it takes the next request (follow-ups first, then the
  next seed), sends it through the shared :class:`RequestScheduler` (gap + strict serialism) and puts
  the response into the bounded processing queue (backpressure);
* ``config.workers`` **processing workers** call ``process_fn`` and emit rows (to the writer) and
  follow-up requests (next pages, details — back to the unbounded frontier);
* ONE **writer** (:class:`WriteWorker`) batches rows into ``write_fn`` and may emit follow-ups too.

Every item is counted in a :class:`WorkTracker`; the run ends exactly when the count reaches zero.
On cancel (or a FAILED abort) the lane stops sending and drops waiting requests, while everything
already fetched is still processed and written (Property 8). This module never touches HTTP or SQL.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Sized, TypeVar

from feiqiu_etl.pipeline.callbacks import FailureFn, ProcessFn, ScopeFn, SendFn, Transport, WriteFn
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.error_records import describe_error, safe_params
from feiqiu_etl.pipeline.errors import AbortPipeline, Cancelled, LaneBackoff
from feiqiu_etl.pipeline.gil_switch import GIL_SWITCH_INTERVAL, short_gil_switch
from feiqiu_etl.pipeline.models import PipelineRequest, PipelineResult, ResponseItem
from feiqiu_etl.pipeline.processing_stage import ProcessingStage
from feiqiu_etl.pipeline.rate_limiter import RateLimiter, RateLimiterStatistics
from feiqiu_etl.pipeline.request_scheduler import SchedulerStatistics, RequestScheduler
from feiqiu_etl.pipeline.run_book import RunBook
from feiqiu_etl.pipeline.write_worker import SENTINEL, RowChunk, WriteStatistics, WriteWorker
from feiqiu_etl.common.status import Status

__all__ = ["GIL_SWITCH_INTERVAL", "JOIN_DEADLINE", "FailureFn", "PipelineStatistics", "ProcessFn", "ScopeFn",
           "SendFn", "Transport", "UnifiedPipeline", "WriteFn", "describe_error", "safe_params"]

T = TypeVar("T")

JOIN_DEADLINE = 30.0
"""Seconds ``run()`` waits for each worker and the writer to stop after the lane is done."""


class UnifiedPipeline:
    """Serial-request / parallel-process / single-writer engine.

    ``transport(request, send)`` performs one logical request, calling ``send(fn, min_wait=...)`` for
    every attempt so each attempt waits its gap in the lane; it returns the parsed response, raises
    ``AbortPipeline`` to fail the run, or any other exception for a failed request. ``scheduler`` is the
    lane's :class:`RequestScheduler`; this pipeline's gaps come from ``config.rate_min/max``.
    """

    def __init__(
        self,
        transport: Transport,
        config: PipelineConfig,
        *,
        scheduler: RequestScheduler | None = None,
        cancellation: CancellationToken | None = None,
        logger: logging.Logger | None = None,
        rate_limiter: RateLimiter | None = None,
        tenant: Hashable | None = None,
        abortable: bool = False,
    ):
        """``tenant`` identifies this pipeline's share of a lane used by several (e.g. its store): the lane
        is granted round-robin between tenants. ``abortable`` lets a cancel abort the request in flight."""
        self.transport = transport
        self.config = config
        self.scheduler = scheduler or RequestScheduler()
        self.cancellation = cancellation or CancellationToken()
        self.logger = logger or logging.getLogger(__name__)
        self.rate_limiter = rate_limiter or RateLimiter(gap=config.gap)
        self.tenant = tenant
        self.abortable = abortable
        self._run: _Run | None = None

    def run(
        self,
        requests: Iterable[PipelineRequest],
        process_fn: ProcessFn,
        write_fn: WriteFn,
        *,
        on_scope_complete: ScopeFn | None = None,
        on_request_failed: FailureFn | None = None,
    ) -> PipelineResult:
        """Execute the pipeline until all work (seeds and everything they spawn) is written.

        ``on_scope_complete(scope, ok)`` runs on the writer thread when a scope has no outstanding
        work left; ``ok`` is False if any of its items failed or was dropped. ``on_request_failed(request,
        exc)`` may return rows to write for a request that failed for good (e.g. bookkeeping of an owed
        detail); they go through the writer like any rows. Returns the statistics; status is FAILED
        (aborted) > CANCELLED > PARTIAL (some failure) > SUCCESS.
        """
        if self.cancellation.is_cancelled:
            return PipelineResult(status=Status.CANCELLED, cancelled=True)
        run = _Run(self, process_fn, write_fn, on_scope_complete, on_request_failed)
        self._run = run
        try:
            with short_gil_switch():
                return run.execute(iter(requests), len(requests) if isinstance(requests, Sized) else None)
        finally:
            self._run = None

    def statistics(self) -> "PipelineStatistics":
        """Live snapshot: queue depths, outstanding work, counts so far, lane state (progress, status, tests)."""
        run = self._run
        scheduler = self.scheduler.statistics()
        if run is None:
            return PipelineStatistics(running=False, scheduler=scheduler, rate_limiter=self.rate_limiter.statistics())
        book = run.book
        with book.lock:
            r = book.result
            return PipelineStatistics(
                running=True, scheduler=scheduler, rate_limiter=self.rate_limiter.statistics(),
                outstanding=book.tracker.outstanding, frontier=len(book.frontier),
                processing_queue=run.stage.queue.qsize(), write_queue=book.write_q.qsize(),
                busy_workers=run.stage.busy_workers, requests=r.total_requests, attempts=r.attempts,
                completed_requests=r.completed_requests, fetched=r.total_fetched,
                rows_written=r.total_inserted + r.total_updated, rows_unchanged=r.total_skipped,
                rate_limited=r.rate_limited,
                banned_seconds=r.banned_seconds, failures=len(r.errors), seeds_left=run.seeds_left,
                elapsed=time.monotonic() - run.started,
                writer=run.writer.statistics() if run.writer is not None else None,
            )


@dataclass(frozen=True)
class PipelineStatistics:
    """Snapshot of one ``UnifiedPipeline`` (counts are requests or rows; ``elapsed`` in seconds).

    ``frontier`` requests wait for the lane (next pages, details); ``seeds_left`` is the number of seeds
    not pulled yet when the seed source has a length (else None); ``rows_written`` counts rows committed
    that changed the table (inserted + updated), ``rows_unchanged`` those the writer found unchanged; ``writer`` is the :class:`WriteWorker`'s own snapshot (None before it
    started).
    """

    running: bool
    scheduler: SchedulerStatistics
    rate_limiter: RateLimiterStatistics
    outstanding: int = 0
    frontier: int = 0
    processing_queue: int = 0
    write_queue: int = 0
    busy_workers: int = 0
    requests: int = 0
    attempts: int = 0
    completed_requests: int = 0
    fetched: int = 0
    rows_written: int = 0
    rows_unchanged: int = 0
    rate_limited: int = 0
    banned_seconds: float = 0.0
    failures: int = 0
    seeds_left: int | None = None
    elapsed: float = 0.0
    writer: WriteStatistics | None = None


class _Run:
    """One ``UnifiedPipeline.run`` call: it starts the processing workers (:class:`ProcessingStage`) and the
    writer, drives the lane on the calling thread, and stops them; the shared counts are in ``book``."""

    def __init__(self, owner: UnifiedPipeline, process_fn: ProcessFn, write_fn: WriteFn, on_scope: ScopeFn | None,
                 on_failure: FailureFn | None = None):
        self.owner = owner
        self.on_failure_fn = on_failure
        self.started = time.monotonic()
        self.seeds_left: int | None = None
        self.cfg = owner.config
        self.cancellation = owner.cancellation
        self.log = owner.logger
        self.write_fn = write_fn
        self.book = RunBook(owner.cancellation, owner.logger, failure_limit=self.cfg.max_consecutive_failures,
                            queue_size=self.cfg.queue_size, on_scope_fn=on_scope)
        self.stage = ProcessingStage(self.book, process_fn, self.cfg.queue_size)
        self.consecutive_request_failures = 0
        self.seq = 0
        self.writer: WriteWorker | None = None

    # ------------------------------------------------------------------ start and stop the stages
    def execute(self, source: Iterator[PipelineRequest], seeds: int | None = None) -> PipelineResult:
        started = self.started = time.monotonic()
        self.seeds_left = seeds
        book = self.book
        workers = self.stage.threads(self.cfg.workers)
        self.writer = writer = WriteWorker(
            book.write_q,
            self.write_fn,
            batch_size=self.cfg.batch_size,
            batch_timeout=self.cfg.batch_timeout,
            upstream_idle=self.stage.upstream_idle,
            on_written=book.on_written,
            on_scope=book.on_scope,
        )
        book.writer_thread = writer_thread = threading.Thread(target=writer.run, name="pipeline-writer", daemon=True)
        for t in workers:
            t.start()
        writer_thread.start()
        try:
            self._drive(source)
        finally:
            for _ in workers:
                self.stage.queue.put(SENTINEL)
            for t in workers:
                t.join(JOIN_DEADLINE)
            book.write_q.put(SENTINEL)
            writer_thread.join(JOIN_DEADLINE)
            stuck = [t.name for t in [*workers, writer_thread] if t.is_alive()]
            if stuck:
                self.log.error("threads did not stop within %.0f s: %s", JOIN_DEADLINE, ", ".join(stuck))
        return book.finish(started, writer.seconds_writing)

    # ------------------------------------------------------------------ driver (lane) thread
    def _drive(self, source: Iterator[PipelineRequest]) -> None:
        book = self.book
        book.tracker.add(1)  # the seed source itself is outstanding until exhausted
        source_open = True
        while True:
            request, pull = book.frontier.next_or_idle(has_source=source_open)
            if pull:
                request = self._next_seed(source)
                if request is None:
                    source_open = False
                    book.tracker.done(1)
                    continue
            elif request is None:
                return
            if book.stopping():
                book.dropped(request)
                book.finish_item(request.scope, failed=True)
                continue
            self._send(request)

    def _next_seed(self, source: Iterator[PipelineRequest]) -> PipelineRequest | None:
        book = self.book
        if book.stopping():
            return None
        try:
            request = next(source)
        except StopIteration:
            return None
        except Exception as exc:  # a broken request generator ends the seeds, recorded once
            book.record("request", {"stage": "seed", "error": describe_error(exc)})
            return None
        book.tracker.add(1, request.scope)
        with book.lock:
            book.result.detail_asked += int(request.is_detail)
            if self.seeds_left is not None:
                self.seeds_left = max(0, self.seeds_left - 1)
        return request

    def _send(self, request: PipelineRequest) -> None:
        dispatched = False
        owner = self.owner
        book = self.book
        label = request.label()

        def send(fn: Callable[[], T], min_wait: float = 0.0) -> T:
            def attempt() -> T:
                nonlocal dispatched
                with book.lock:
                    book.result.attempts += 1
                    if not dispatched:
                        dispatched = True
                        book.result.total_requests += 1
                try:
                    return fn()
                except Exception as exc:
                    self._note_backoff(request, exc)
                    raise
            return owner.scheduler.send(attempt, owner.rate_limiter, self.cancellation.event, min_wait=min_wait,
                                        gap_class=request.gap_class, tenant=owner.tenant, label=label,
                                        abortable=owner.abortable)

        t0 = time.monotonic()
        failed = False
        try:
            payload = owner.transport(request, send)
        except Cancelled:
            failed = True  # dropped, not a failure: nothing (more) was sent
            book.dropped(request)
        except AbortPipeline as exc:
            failed = True
            self._request_failed(request, exc, abort=True)
        except Exception as exc:
            failed = True
            self._request_failed(request, exc)
        else:
            self._request_ok(request, payload)
        finally:
            with book.lock:
                book.timing["request"] += time.monotonic() - t0
            book.finish_item(request.scope, failed=failed)

    def _note_backoff(self, request: PipelineRequest, exc: Exception) -> None:
        """Count and log, at once, an answer that demanded a wait (rate limiting, a ban)."""
        backoff: LaneBackoff | None = getattr(exc, "lane_backoff", None)
        if backoff is None:
            return
        with self.book.lock:
            self.book.result.rate_limited += 1
            if backoff.kind == "banned":
                self.book.result.banned_seconds += backoff.seconds
        what = "banned by upstream" if backoff.kind == "banned" else "rate limited by upstream"
        self.log.warning("%s: %s %s, waiting %.0f s", what, request.endpoint, backoff.detail or "", backoff.seconds)

    def _request_ok(self, request: PipelineRequest, payload: Any) -> None:
        book = self.book
        with book.lock:
            book.result.completed_requests += 1
            if request.is_detail:
                book.result.detail_success += 1
            self.consecutive_request_failures = 0
            self.seq += 1
            seq = self.seq
        book.tracker.add(1, request.scope)
        self.stage.queue.put(ResponseItem(request, payload, seq))  # blocks when full: backpressure

    def _request_failed(self, request: PipelineRequest, exc: BaseException, *, abort: bool = False) -> None:
        book = self.book
        error = {
            "stage": "request",
            "endpoint": request.endpoint,
            "params": safe_params(request.params),
            "is_detail": request.is_detail,
            "error": describe_error(exc),
        }
        counts = getattr(exc, "counts_as_failure", True)
        with book.lock:
            if request.is_detail:
                book.result.detail_failure += 1
            if counts:
                self.consecutive_request_failures += 1
            limit_hit = self.consecutive_request_failures >= self.cfg.max_consecutive_failures
        # A request the upstream answered "does not exist" (counts_as_failure False) is an expected outcome
        # (e.g. a detail whose parent is gone; the caller's on_request_failed says what it means): recorded,
        # logged at DEBUG; the others at WARNING.
        book.record("request", error, level=logging.WARNING if counts else logging.DEBUG)
        self._failure_rows(request, exc)
        if abort or limit_hit:
            reason = "fatal error" if abort else f"{self.cfg.max_consecutive_failures} consecutive request failures"
            book.abort(reason)

    def _failure_rows(self, request: PipelineRequest, exc: BaseException) -> None:
        if self.on_failure_fn is None:
            return
        book = self.book
        try:
            rows = list(self.on_failure_fn(request, exc) or [])
        except Exception as hook_error:  # noqa: BLE001 - a broken hook is one more recorded failure
            book.record("processing", {"endpoint": request.endpoint, "error": describe_error(hook_error)})
            return
        if rows:
            book.tracker.add(len(rows), request.scope)
            book.count_queued(rows)
            book.write_q.put(RowChunk(rows, request.scope))
