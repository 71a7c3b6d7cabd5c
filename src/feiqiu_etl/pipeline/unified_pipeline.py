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

import contextlib
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Sized, TypeVar

from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.errors import AbortPipeline, Cancelled, LaneBackoff
from feiqiu_etl.pipeline.models import (
    PipelineRequest,
    PipelineResult,
    ProcessOutput,
    ResponseItem,
    WriteResult,
    is_record,
)
from feiqiu_etl.pipeline.rate_limiter import RateLimiter, RateLimiterStatistics
from feiqiu_etl.pipeline.request_scheduler import SchedulerStatistics, RequestScheduler
from feiqiu_etl.pipeline.work_tracker import Frontier, ScopeCompletion, WorkTracker
from feiqiu_etl.pipeline.write_worker import (FLUSH_HINT, SENTINEL, RowChunk, WriteStatistics, WriteWorker,
                                              follow_up_scope)
from feiqiu_etl.common.status import Status

T = TypeVar("T")
SendFn = Callable[..., Any]
"""``send(fn, min_wait=0.0)``: run ``fn()`` in the lane after the gap (raises ``Cancelled``)."""
Transport = Callable[[PipelineRequest, SendFn], Any]
ProcessFn = Callable[[ResponseItem], "ProcessOutput | list"]
WriteFn = Callable[[list], "WriteResult | None"]
ScopeFn = Callable[[Hashable, bool], "WriteResult | None"]
FailureFn = Callable[[PipelineRequest, BaseException], "list | None"]

JOIN_DEADLINE = 30.0


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
            with _short_gil_switch():
                return run.execute(iter(requests), len(requests) if isinstance(requests, Sized) else None)
        finally:
            self._run = None

    def statistics(self) -> "PipelineStatistics":
        """Live snapshot: queue depths, outstanding work, counts so far, lane state (progress, status, tests)."""
        run = self._run
        scheduler = self.scheduler.statistics()
        if run is None:
            return PipelineStatistics(running=False, scheduler=scheduler, rate_limiter=self.rate_limiter.statistics())
        with run.lock:
            r = run.result
            return PipelineStatistics(
                running=True, scheduler=scheduler, rate_limiter=self.rate_limiter.statistics(),
                outstanding=run.tracker.outstanding, frontier=len(run.frontier),
                processing_queue=run.processing_q.qsize(), write_queue=run.write_q.qsize(),
                busy_workers=run.busy_workers, requests=r.total_requests, attempts=r.attempts,
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
    """State of one ``UnifiedPipeline.run`` call."""

    def __init__(self, owner: UnifiedPipeline, process_fn: ProcessFn, write_fn: WriteFn, on_scope: ScopeFn | None,
                 on_failure: FailureFn | None = None):
        self.owner = owner
        self.on_failure_fn = on_failure
        self.started = time.monotonic()
        self.seeds_left: int | None = None
        self.cfg = owner.config
        self.cancellation = owner.cancellation
        self.log = owner.logger
        self.process_fn = process_fn
        self.write_fn = write_fn
        self.on_scope_fn = on_scope
        self.tracker = WorkTracker()
        self.frontier: Frontier[PipelineRequest] = Frontier(self.tracker)
        self.processing_q: queue.Queue[Any] = queue.Queue(maxsize=self.cfg.queue_size)
        self.write_q: queue.Queue[Any] = queue.Queue(maxsize=self.cfg.queue_size * 2)
        self.result = PipelineResult()
        self.lock = threading.Lock()
        self.busy_workers = 0
        self.aborted = False
        self.consecutive_request_failures = 0
        self.consecutive_write_failures = 0
        self.seq = 0
        self.release_lock = threading.Lock()
        self.next_release = 1
        self.held: dict[int, RowChunk | None] = {}
        self.writer_thread: threading.Thread | None = None
        self.writer: WriteWorker | None = None
        self.timing = {"request": 0.0, "processing": 0.0, "write": 0.0}
        self.records_queued = 0  # fetched records handed towards the writer (rows_not_written: those never done)
        self.records_done = 0

    # ------------------------------------------------------------------ driver (lane) thread
    def execute(self, source: Iterator[PipelineRequest], seeds: int | None = None) -> PipelineResult:
        started = self.started = time.monotonic()
        self.seeds_left = seeds
        workers = [
            threading.Thread(target=self._worker_loop, name=f"pipeline-worker-{i}", daemon=True)
            for i in range(self.cfg.workers)
        ]
        self.writer = writer = WriteWorker(
            self.write_q,
            self.write_fn,
            batch_size=self.cfg.batch_size,
            batch_timeout=self.cfg.batch_timeout,
            upstream_idle=self._upstream_idle,
            on_written=self._on_written,
            on_scope=self._on_scope,
        )
        self.writer_thread = threading.Thread(target=writer.run, name="pipeline-writer", daemon=True)
        for t in workers:
            t.start()
        self.writer_thread.start()
        try:
            self._drive(source)
        finally:
            for _ in workers:
                self.processing_q.put(SENTINEL)
            for t in workers:
                t.join(JOIN_DEADLINE)
            self.write_q.put(SENTINEL)
            self.writer_thread.join(JOIN_DEADLINE)
            stuck = [t.name for t in [*workers, self.writer_thread] if t.is_alive()]
            if stuck:
                self.log.error("threads did not stop within %.0f s: %s", JOIN_DEADLINE, ", ".join(stuck))
        return self._finish(started)

    def _drive(self, source: Iterator[PipelineRequest]) -> None:
        self.tracker.add(1)  # the seed source itself is outstanding until exhausted
        source_open = True
        while True:
            request, pull = self.frontier.next_or_idle(has_source=source_open)
            if pull:
                request = self._next_seed(source)
                if request is None:
                    source_open = False
                    self.tracker.done(1)
                    continue
            elif request is None:
                return
            if self._stopping():
                self._dropped(request)
                self._finish_item(request.scope, failed=True)
                continue
            self._send(request)

    def _next_seed(self, source: Iterator[PipelineRequest]) -> PipelineRequest | None:
        if self._stopping():
            return None
        try:
            request = next(source)
        except StopIteration:
            return None
        except Exception as exc:  # a broken request generator ends the seeds, recorded once
            self._record("request", {"stage": "seed", "error": describe_error(exc)})
            return None
        self.tracker.add(1, request.scope)
        with self.lock:
            self.result.detail_asked += int(request.is_detail)
            if self.seeds_left is not None:
                self.seeds_left = max(0, self.seeds_left - 1)
        return request

    def _send(self, request: PipelineRequest) -> None:
        dispatched = False
        owner = self.owner
        label = request.label()

        def send(fn: Callable[[], T], min_wait: float = 0.0) -> T:
            def attempt() -> T:
                nonlocal dispatched
                with self.lock:
                    self.result.attempts += 1
                    if not dispatched:
                        dispatched = True
                        self.result.total_requests += 1
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
            self._dropped(request)
        except AbortPipeline as exc:
            failed = True
            self._request_failed(request, exc, abort=True)
        except Exception as exc:
            failed = True
            self._request_failed(request, exc)
        else:
            self._request_ok(request, payload)
        finally:
            with self.lock:
                self.timing["request"] += time.monotonic() - t0
            self._finish_item(request.scope, failed=failed)

    def _note_backoff(self, request: PipelineRequest, exc: Exception) -> None:
        """Count and log, at once, an answer that demanded a wait (rate limiting, a ban)."""
        backoff: LaneBackoff | None = getattr(exc, "lane_backoff", None)
        if backoff is None:
            return
        with self.lock:
            self.result.rate_limited += 1
            if backoff.kind == "banned":
                self.result.banned_seconds += backoff.seconds
        what = "banned by upstream" if backoff.kind == "banned" else "rate limited by upstream"
        self.log.warning("%s: %s %s, waiting %.0f s", what, request.endpoint, backoff.detail or "", backoff.seconds)

    def _dropped(self, request: PipelineRequest) -> None:
        """A request given up on cancel/abort. A detail one counts as ``detail_skipped`` and ``detail_dropped``
        (not fetched, no error), so success + failure + skipped still equals ``detail_asked`` (Property 14)."""
        if request.is_detail:
            with self.lock:
                self.result.detail_skipped += 1
                self.result.detail_dropped += 1

    def _push(self, follow: PipelineRequest) -> None:
        """A follow-up for the lane (``follow.scope`` set): counted as asked when it is a detail request."""
        if follow.is_detail:
            with self.lock:
                self.result.detail_asked += 1
        self.frontier.push(follow, follow.scope)

    def _request_ok(self, request: PipelineRequest, payload: Any) -> None:
        with self.lock:
            self.result.completed_requests += 1
            if request.is_detail:
                self.result.detail_success += 1
            self.consecutive_request_failures = 0
            self.seq += 1
            seq = self.seq
        self.tracker.add(1, request.scope)
        self.processing_q.put(ResponseItem(request, payload, seq))  # blocks when full: backpressure

    def _request_failed(self, request: PipelineRequest, exc: BaseException, *, abort: bool = False) -> None:
        error = {
            "stage": "request",
            "endpoint": request.endpoint,
            "params": safe_params(request.params),
            "is_detail": request.is_detail,
            "error": describe_error(exc),
        }
        counts = getattr(exc, "counts_as_failure", True)
        with self.lock:
            if request.is_detail:
                self.result.detail_failure += 1
            if counts:
                self.consecutive_request_failures += 1
            limit_hit = self.consecutive_request_failures >= self.cfg.max_consecutive_failures
        # A request the upstream answered "does not exist" (counts_as_failure False) is an expected outcome
        # (e.g. a detail whose parent is gone; the caller's on_request_failed says what it means): recorded,
        # logged at DEBUG; the others at WARNING.
        self._record("request", error, level=logging.WARNING if counts else logging.DEBUG)
        self._failure_rows(request, exc)
        if abort or limit_hit:
            reason = "fatal error" if abort else f"{self.cfg.max_consecutive_failures} consecutive request failures"
            self._abort(reason)

    def _failure_rows(self, request: PipelineRequest, exc: BaseException) -> None:
        if self.on_failure_fn is None:
            return
        try:
            rows = list(self.on_failure_fn(request, exc) or [])
        except Exception as hook_error:  # noqa: BLE001 - a broken hook is one more recorded failure
            self._record("processing", {"endpoint": request.endpoint, "error": describe_error(hook_error)})
            return
        if rows:
            self.tracker.add(len(rows), request.scope)
            self._count_queued(rows)
            self.write_q.put(RowChunk(rows, request.scope))

    # ------------------------------------------------------------------ processing workers
    def _worker_loop(self) -> None:
        while True:
            item = self.processing_q.get()
            if item is SENTINEL:
                return
            with self.lock:
                self.busy_workers += 1
            try:
                self._process(item)
            finally:
                with self.lock:
                    self.busy_workers -= 1
                if self.processing_q.empty():
                    self.write_q.put(FLUSH_HINT)

    def _process(self, item: ResponseItem) -> None:
        scope = item.request.scope
        failed = False
        chunk: RowChunk | None = None
        t0 = time.monotonic()

        def emit(follow: PipelineRequest) -> None:  # a follow-up for the lane now (see ResponseItem.emit)
            if follow.scope is None:
                follow.scope = scope
            self._push(follow)

        item.emit = emit
        try:
            out = self.process_fn(item)
            if not isinstance(out, ProcessOutput):
                out = ProcessOutput(rows=list(out or []))
            fetched = out.fetched if out.fetched is not None else len(out.rows) + len(out.errors)
            rejected = out.rejected if out.rejected is not None else len(out.errors)
            with self.lock:
                self.result.total_fetched += fetched
                self.result.rows_failed += rejected
                if item.request.is_detail:
                    self.result.detail_fetched += fetched
            for err in out.errors:
                failed = True
                self._record("processing", {"endpoint": item.request.endpoint, **err})
            for follow in out.follow_ups:
                if follow.scope is None:
                    follow.scope = scope
                self._push(follow)
            if out.rows:
                self.tracker.add(len(out.rows), scope)
                self._count_queued(out.rows)
                chunk = RowChunk(list(out.rows), scope)
        except Exception as exc:
            failed = True
            self._record("processing", {
                "endpoint": item.request.endpoint,
                "params": safe_params(item.request.params),
                "error": describe_error(exc),
            })
        finally:
            self._release(item.seq, chunk)
            with self.lock:
                self.timing["processing"] += time.monotonic() - t0
            self._finish_item(scope, failed=failed)

    def _release(self, seq: int, chunk: RowChunk | None) -> None:
        """Hand rows to the writer in response order, whatever order the workers finish in, so that the
        content fetched last is written last (upstream-api §1.5) exactly as in the serial loop. Every
        response calls this once (``chunk`` None when it has no rows); blocking in ``put`` while holding
        the lock only stalls other workers, never the writer."""
        with self.release_lock:
            self.held[seq] = chunk
            while self.next_release in self.held:
                ready = self.held.pop(self.next_release)
                self.next_release += 1
                if ready is not None:
                    self.write_q.put(ready)

    def _count_queued(self, rows: list) -> None:
        records = sum(1 for row in rows if is_record(row))
        with self.lock:
            self.records_queued += records

    # ------------------------------------------------------------------ writer callbacks (writer thread)
    def _on_written(self, rows: list, scopes: list, result: WriteResult | None, error: Exception | None) -> None:
        failed = error is not None or (result is not None and result.errors > 0)
        records = sum(1 for row in rows if is_record(row))
        if error is not None:
            self._record("write", {"rows": len(rows), "error": describe_error(error)})
        elif result is not None and result.errors:
            self._record("write", {"rows": len(rows), "error": f"{result.errors} row(s) rejected by write_fn"})
        with self.lock:
            self.records_done += records
            if error is None and result is not None:
                self._add_write_counts(result)
                self.result.rows_failed += min(result.errors, records)  # rows the write_fn rejected
            elif error is not None:
                self.result.rows_failed += records  # the batch failed: none of its records was written
            if failed:
                self.consecutive_write_failures += 1
                limit_hit = self.consecutive_write_failures >= self.cfg.max_consecutive_failures
            else:
                self.consecutive_write_failures = 0
                limit_hit = False
        if limit_hit:
            self._abort(f"{self.cfg.max_consecutive_failures} consecutive write failures")
        if result is not None and error is None:
            for follow in result.follow_ups:
                follow.scope = follow_up_scope(follow, scopes)
                self._push(follow)
        counts: dict[Hashable | None, int] = {}
        for s in scopes:
            counts[s] = counts.get(s, 0) + 1
        for s, n in counts.items():
            completion = self.tracker.done(n, s, failed=failed)
            if completion is not None:
                self._on_scope(completion)

    def _add_write_counts(self, result: WriteResult) -> None:
        self.result.total_inserted += result.inserted
        self.result.total_updated += result.updated
        self.result.total_skipped += result.skipped
        self.result.total_deleted += result.deleted
        self.result.detail_skipped += result.follow_ups_skipped
        self.result.detail_asked += result.follow_ups_skipped  # parents that asked and needed none

    def _on_scope(self, completion: ScopeCompletion) -> None:
        """Run the caller's scope hook on the writer thread, then finish the completion item."""
        try:
            if self.on_scope_fn is not None:
                extra = self.on_scope_fn(completion.scope, completion.ok)
                if extra is not None:
                    with self.lock:
                        self._add_write_counts(extra)
        except Exception as exc:
            self._record("write", {"scope": repr(completion.scope), "error": describe_error(exc)})
        finally:
            self.tracker.done(1)

    # ------------------------------------------------------------------ shared helpers
    def _finish_item(self, scope: Hashable | None, *, failed: bool) -> None:
        completion = self.tracker.done(1, scope, failed=failed)
        if completion is not None:
            if threading.current_thread() is self.writer_thread:
                self._on_scope(completion)
            else:
                self.write_q.put(completion)

    def _upstream_idle(self) -> bool:
        with self.lock:
            busy = self.busy_workers
        return busy == 0 and self.processing_q.empty()

    def _stopping(self) -> bool:
        return self.cancellation.is_cancelled or self.aborted

    def _abort(self, reason: str) -> None:
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
        self.log.error("pipeline aborted: %s", reason)

    def _record(self, stage: str, error: dict, level: int = logging.WARNING) -> None:
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

    def _finish(self, started: float) -> PipelineResult:
        self.timing["write"] = self.writer.seconds_writing
        with self.lock:  # only a writer stuck past JOIN_DEADLINE leaves records on their way (docs/operations/troubleshooting.md)
            self.result.rows_not_written = max(0, self.records_queued - self.records_done)
        return self.result.finish(aborted=self.aborted, cancelled=self.cancellation.is_cancelled, timing=self.timing,
                                  elapsed=time.monotonic() - started)


GIL_SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits, during a run (Python's default is 0.005). The lane
driver is latency-bound: after every response it waited up to 5 ms for the GIL behind a processing worker; at
gap 0 that was most of a page's time (bench_vs_peers: re-run 5.5 s -> 3.7 s for 100k rows, and less CPU)."""

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.005


@contextlib.contextmanager
def _short_gil_switch() -> Iterator[None]:
    """Lower ``sys.setswitchinterval`` while at least one run is active; restore it after the last one."""
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, GIL_SWITCH_INTERVAL))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


def safe_params(params: dict) -> dict:
    """``params`` with the values of secret-looking keys (token, password, sig, …) replaced by ``***``
    (:func:`feiqiu_etl.textsafe.redact_mapping`: the one redaction rule, issue 28 item 5)."""
    from feiqiu_etl.textsafe import redact_mapping

    return redact_mapping(params)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` (the type alone when the message is empty), as an error record stores it."""
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if str(exc) else text
