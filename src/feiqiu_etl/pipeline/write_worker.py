"""``WriteWorker``: the ONE thread that writes (spec §2.2, §3.4).

It takes row chunks from the bounded write queue, cuts them into batches of at most ``batch_size`` rows
(Property 6) and calls ``write_fn`` once per batch. Batches adapt to the load: the writer takes every row
already queued, up to ``batch_size``, and writes as soon as nothing more is queued. So a busy writer writes
big batches (few transactions per row) and an idle one writes each response at once (rows never wait
while the lane sleeps its gap). A partial batch also goes when ``batch_timeout`` seconds passed since its
first row, or when the pipeline upstream of it is idle. A failing batch is one write failure: its rows stay
counted as failed and the next batch is unaffected (Property 13; the transaction is ``write_fn``'s).

It also runs scope completions (e.g. checkpoint a window segment) in order with the writes, on the
same thread, so they may use the writer's own database connection. It never sends requests.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from feiqiu_etl.pipeline.models import PipelineRequest, WriteResult
from feiqiu_etl.pipeline.work_tracker import ScopeCompletion

SENTINEL = None


@dataclass
class RowChunk:
    """Rows produced from one response, all in one scope."""

    rows: list
    scope: Hashable | None


class FlushHint:
    """Put by a worker that found the processing queue empty: flush now if nothing else is coming."""


FLUSH_HINT = FlushHint()


@dataclass(frozen=True)
class WriteStatistics:
    """Snapshot of a :class:`WriteWorker`: ``batches_written`` calls of ``write_fn`` (failed ones included),
    ``rows_written`` rows handed to it, ``seconds_writing`` seconds spent in it, ``rows_pending`` rows of the
    open batch (not handed yet)."""

    batches_written: int
    rows_written: int
    seconds_writing: float
    rows_pending: int


@dataclass
class _Batch:
    rows: list = field(default_factory=list)
    scopes: list = field(default_factory=list)
    started: float | None = None


class WriteWorker:
    """Single writer thread body. ``callbacks`` is the owning pipeline (see ``UnifiedPipeline``)."""

    def __init__(
        self,
        write_queue: "queue.Queue[Any]",
        write_fn: Callable[[list], WriteResult | None],
        *,
        batch_size: int,
        batch_timeout: float,
        upstream_idle: Callable[[], bool],
        on_written: Callable[[list, list, WriteResult | None, Exception | None], None],
        on_scope: Callable[[ScopeCompletion], None],
    ):
        self._q = write_queue
        self._write_fn = write_fn
        self._batch_size = batch_size
        self._batch_timeout = batch_timeout
        self._upstream_idle = upstream_idle
        self._on_written = on_written
        self._on_scope = on_scope
        self._batch = _Batch()
        self.batches_written = 0
        self.rows_written = 0
        self.seconds_writing = 0.0

    def run(self) -> None:
        while True:
            item = self._next_item()
            if item is _TIMEOUT:
                self._flush()
                continue
            if item is SENTINEL:
                self._flush()
                return
            if isinstance(item, FlushHint):
                if self._q.empty() and self._upstream_idle():
                    self._flush()
                continue
            if isinstance(item, ScopeCompletion):
                self._on_scope(item)
                continue
            self._add(item)
            if self._q.empty():  # nothing more queued: write what we have now (adaptive batches)
                self._flush()

    def statistics(self) -> WriteStatistics:
        """Snapshot (a read: it changes nothing): batches and rows handed to ``write_fn``, seconds spent in it,
        rows waiting in the open batch."""
        return WriteStatistics(batches_written=self.batches_written, rows_written=self.rows_written,
                               seconds_writing=round(self.seconds_writing, 3), rows_pending=len(self._batch.rows))

    def _next_item(self) -> Any:
        if not self._batch.rows:
            return self._q.get()
        remaining = self._batch_timeout - (time.monotonic() - (self._batch.started or 0.0))
        if remaining <= 0:
            return _TIMEOUT
        try:
            return self._q.get(timeout=remaining)
        except queue.Empty:
            return _TIMEOUT

    def _add(self, chunk: RowChunk) -> None:
        for row in chunk.rows:
            if not self._batch.rows:
                self._batch.started = time.monotonic()
            self._batch.rows.append(row)
            self._batch.scopes.append(chunk.scope)
            if len(self._batch.rows) >= self._batch_size:
                self._flush()

    def _flush(self) -> None:
        if not self._batch.rows:
            return
        batch, self._batch = self._batch, _Batch()
        result: WriteResult | None = None
        error: Exception | None = None
        started = time.monotonic()
        try:
            result = self._write_fn(batch.rows)
        except Exception as exc:  # a failed batch never stops the writer (spec §6.1)
            error = exc
        self.seconds_writing += time.monotonic() - started
        self.batches_written += 1
        self.rows_written += len(batch.rows)
        self._on_written(batch.rows, batch.scopes, result, error)


class _Timeout:
    pass


_TIMEOUT = _Timeout()


def follow_up_scope(req: PipelineRequest, scopes: list) -> Hashable | None:
    """Scope for a write-created request: its own, else the batch's single scope, else None."""
    if req.scope is not None:
        return req.scope
    distinct = set(scopes)
    return next(iter(distinct)) if len(distinct) == 1 else None
