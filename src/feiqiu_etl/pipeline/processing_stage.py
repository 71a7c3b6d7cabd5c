"""``ProcessingStage``: the processing workers of one pipeline run — they take responses off a bounded queue,
call ``process_fn``, send its follow-up requests back to the lane and hand its rows to the writer in response
order."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from feiqiu_etl.pipeline.callbacks import ProcessFn
from feiqiu_etl.pipeline.error_records import describe_error, safe_params
from feiqiu_etl.pipeline.models import PipelineRequest, ProcessOutput, ResponseItem
from feiqiu_etl.pipeline.run_book import RunBook
from feiqiu_etl.pipeline.write_worker import FLUSH_HINT, SENTINEL, RowChunk


class ProcessingStage:
    """Workers over ``queue`` (at most ``queue_size`` responses: the lane blocks when it is full, backpressure);
    every response was counted in ``book``'s tracker and carries its ``seq`` (1, 2, …) in fetch order."""

    def __init__(self, book: RunBook, process_fn: ProcessFn, queue_size: int):
        self.book = book
        self.process_fn = process_fn
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.busy_workers = 0  # under book.lock
        self._release_lock = threading.Lock()
        self._next_release = 1
        self._held: dict[int, RowChunk | None] = {}

    def threads(self, workers: int) -> list[threading.Thread]:
        """``workers`` daemon threads running :meth:`worker_loop` (not started)."""
        return [threading.Thread(target=self.worker_loop, name=f"pipeline-worker-{i}", daemon=True)
                for i in range(workers)]

    def upstream_idle(self) -> bool:
        """True when no worker is busy and no response waits: the writer may flush a partial batch."""
        with self.book.lock:
            busy = self.busy_workers
        return busy == 0 and self.queue.empty()

    def worker_loop(self) -> None:
        """Process responses until a ``SENTINEL`` comes."""
        book = self.book
        while True:
            item = self.queue.get()
            if item is SENTINEL:
                return
            with book.lock:
                self.busy_workers += 1
            try:
                self._process(item)
            finally:
                with book.lock:
                    self.busy_workers -= 1
                if self.queue.empty():
                    book.write_q.put(FLUSH_HINT)

    def _process(self, item: ResponseItem) -> None:
        book = self.book
        scope = item.request.scope
        failed = False
        chunk: RowChunk | None = None
        t0 = time.monotonic()

        def emit(follow: PipelineRequest) -> None:  # a follow-up for the lane now (see ResponseItem.emit)
            if follow.scope is None:
                follow.scope = scope
            book.push(follow)

        item.emit = emit
        try:
            out = self.process_fn(item)
            if not isinstance(out, ProcessOutput):
                out = ProcessOutput(rows=list(out or []))
            failed = self._count(item, out)
            for follow in out.follow_ups:
                if follow.scope is None:
                    follow.scope = scope
                book.push(follow)
            if out.rows:
                book.tracker.add(len(out.rows), scope)
                book.count_queued(out.rows)
                chunk = RowChunk(list(out.rows), scope)
        except Exception as exc:
            failed = True
            book.record("processing", {
                "endpoint": item.request.endpoint,
                "params": safe_params(item.request.params),
                "error": describe_error(exc),
            })
        finally:
            self._release(item.seq, chunk)
            with book.lock:
                book.timing["processing"] += time.monotonic() - t0
            book.finish_item(scope, failed=failed)

    def _count(self, item: ResponseItem, out: ProcessOutput) -> bool:
        """Count what ``out`` fetched and rejected and record its errors; True if it has any."""
        book = self.book
        fetched = out.fetched if out.fetched is not None else len(out.rows) + len(out.errors)
        rejected = out.rejected if out.rejected is not None else len(out.errors)
        with book.lock:
            book.result.total_fetched += fetched
            book.result.rows_failed += rejected
            if item.request.is_detail:
                book.result.detail_fetched += fetched
        for err in out.errors:
            book.record("processing", {"endpoint": item.request.endpoint, **err})
        return bool(out.errors)

    def _release(self, seq: int, chunk: RowChunk | None) -> None:
        """Hand rows to the writer in response order, whatever order the workers finish in, so that the
        content fetched last is written last (upstream-api §1.5) exactly as in the serial loop. Every
        response calls this once (``chunk`` None when it has no rows); blocking in ``put`` while holding
        the lock only stalls other workers, never the writer."""
        with self._release_lock:
            self._held[seq] = chunk
            while self._next_release in self._held:
                ready = self._held.pop(self._next_release)
                self._next_release += 1
                if ready is not None:
                    self.book.write_q.put(ready)
