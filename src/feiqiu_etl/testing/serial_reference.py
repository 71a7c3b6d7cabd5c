"""``SerialReference``: the plain synchronous loop that ``UnifiedPipeline`` replaces (spec §3.5, Property 9).

One request at a time: send it through the lane, process the response, write its rows (in batches of at
most ``batch_size``, right away), then take the next request. Follow-ups from ``process_fn`` and from a
``WriteResult`` join a FIFO frontier that is emptied before the next seed is pulled. Statistics, error
records and status rules are the engine's, so a run of both on the same responses can be compared
field by field.

It is the oracle of the equivalence property and the baseline of the benchmarks: keep it short and
obviously correct, never clever or fast. It starts no threads. It inherits only the constructor wiring
(transport, config, scheduler, cancellation, logger, limiter) from ``UnifiedPipeline``; the counting is restated here
on purpose, so that a mistake in the engine's cannot hide in the comparison. The final status rule is
shared (``PipelineResult.finish``); Properties 8, 11 and 12 check it against their own expectations.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Hashable, Iterable, Iterator

from feiqiu_etl.pipeline.errors import AbortPipeline, Cancelled
from feiqiu_etl.pipeline.models import (PipelineRequest, PipelineResult, ProcessOutput, ResponseItem, WriteResult,
                                         is_record)
from feiqiu_etl.pipeline.unified_pipeline import (
    FailureFn, ProcessFn, ScopeFn, UnifiedPipeline, WriteFn, describe_error, safe_params,
)
from feiqiu_etl.common.status import Status


class SerialReference(UnifiedPipeline):
    """Same constructor and ``run()`` contract as :class:`UnifiedPipeline`, executed in the caller's thread."""

    def run(
        self,
        requests: Iterable[PipelineRequest],
        process_fn: ProcessFn,
        write_fn: WriteFn,
        *,
        on_scope_complete: ScopeFn | None = None,
        on_request_failed: FailureFn | None = None,
    ) -> PipelineResult:
        """Execute every request and everything it spawns, one after the other; see ``UnifiedPipeline.run``."""
        if self.cancellation.is_cancelled:
            return PipelineResult(status=Status.CANCELLED, cancelled=True)
        run = _SerialRun(self, process_fn, write_fn, on_scope_complete)
        run.on_failure = on_request_failed
        return run.execute(iter(requests))


class _SerialRun:
    def __init__(self, owner: SerialReference, process_fn: ProcessFn, write_fn: WriteFn, on_scope: ScopeFn | None):
        self.owner = owner
        self.cfg = owner.config
        self.cancellation = owner.cancellation
        self.process_fn = process_fn
        self.write_fn = write_fn
        self.on_scope = on_scope
        self.result = PipelineResult()
        self.frontier: deque[PipelineRequest] = deque()
        self.open_scopes: dict[Hashable, int] = {}
        self.failed_scopes: set[Hashable] = set()
        self.aborted = False
        self.request_streak = 0
        self.write_streak = 0
        self.seq = 0
        self.timing = {"request": 0.0, "processing": 0.0, "write": 0.0}
        self.on_failure: FailureFn | None = None

    def execute(self, source: Iterator[PipelineRequest]) -> PipelineResult:
        started = time.monotonic()
        while True:
            if self.frontier:
                request = self.frontier.popleft()
            else:
                request = self._next_seed(source)
                if request is None:
                    break
                self._open(request.scope)
            if self._stopping():
                self._dropped(request)  # never sent
                self._close(request.scope, failed=True)
                continue
            failed = self._handle(request)
            self._close(request.scope, failed=failed)
        return self._finish(started)

    # ------------------------------------------------------------------ one request, start to finish
    def _handle(self, request: PipelineRequest) -> bool:
        """Send, process and write one request. Returns True if anything about it failed."""
        t0 = time.monotonic()
        try:
            payload = self.owner.transport(request, self._sender(request))
        except Cancelled:
            self._dropped(request)
            return True
        except AbortPipeline as exc:
            self._request_failed(request, exc, abort=True)
            return True
        except Exception as exc:
            self._request_failed(request, exc)
            return True
        finally:
            self.timing["request"] += time.monotonic() - t0
        self.result.completed_requests += 1
        self.result.detail_success += int(request.is_detail)
        self.request_streak = 0
        self.seq += 1
        return self._process(ResponseItem(request, payload, self.seq))

    def _sender(self, request: PipelineRequest):
        dispatched = False

        def send(fn, min_wait: float = 0.0):
            def attempt():
                nonlocal dispatched
                self.result.attempts += 1
                if not dispatched:
                    dispatched = True
                    self.result.total_requests += 1
                try:
                    return fn()
                except Exception as exc:
                    backoff = getattr(exc, "lane_backoff", None)
                    if backoff is not None:
                        self.result.rate_limited += 1
                        self.result.banned_seconds += backoff.seconds if backoff.kind == "banned" else 0.0
                    raise
            return self.owner.scheduler.send(attempt, self.owner.rate_limiter, self.cancellation.event,
                                             min_wait=min_wait, gap_class=request.gap_class, tenant=self.owner.tenant)

        return send

    def _request_failed(self, request: PipelineRequest, exc: Exception, *, abort: bool = False) -> None:
        self.result.detail_failure += int(request.is_detail)
        self.request_streak += int(getattr(exc, "counts_as_failure", True))
        self._record("request", {
            "endpoint": request.endpoint, "params": safe_params(request.params),
            "is_detail": request.is_detail, "error": describe_error(exc),
        })
        rows = list(self.on_failure(request, exc) or []) if self.on_failure is not None else []
        if rows:
            self._write(rows, request.scope)
        if abort or self.request_streak >= self.cfg.max_consecutive_failures:
            self.aborted = True

    def _process(self, item: ResponseItem) -> bool:
        scope = item.request.scope
        t0 = time.monotonic()
        try:
            out = self.process_fn(item)
        except Exception as exc:
            self._record("processing", {
                "endpoint": item.request.endpoint, "params": safe_params(item.request.params),
                "error": describe_error(exc),
            })
            return True
        finally:
            self.timing["processing"] += time.monotonic() - t0
        if not isinstance(out, ProcessOutput):
            out = ProcessOutput(rows=list(out or []))
        fetched = out.fetched if out.fetched is not None else len(out.rows) + len(out.errors)
        self.result.total_fetched += fetched
        self.result.detail_fetched += fetched if item.request.is_detail else 0
        self.result.rows_failed += out.rejected if out.rejected is not None else len(out.errors)
        for err in out.errors:
            self._record("processing", {"endpoint": item.request.endpoint, **err})
        for follow in out.follow_ups:
            if follow.scope is None:
                follow.scope = scope
            self._push(follow)
        size = self.cfg.batch_size
        write_failed = [self._write(out.rows[i:i + size], scope) for i in range(0, len(out.rows), size)]
        return bool(out.errors) or any(write_failed)

    def _write(self, rows: list, scope: Hashable | None) -> bool:
        t0 = time.monotonic()
        result: WriteResult | None = None
        try:
            result = self.write_fn(rows)
        except Exception as exc:
            self._record("write", {"rows": len(rows), "error": describe_error(exc)})
            self.result.rows_failed += sum(1 for row in rows if is_record(row))
            failed = True
        else:
            failed = result is not None and result.errors > 0
            if failed:
                self._record("write", {"rows": len(rows), "error": f"{result.errors} row(s) rejected by write_fn"})
            if result is not None:
                self._add_counts(result)
                self.result.rows_failed += min(result.errors, sum(1 for row in rows if is_record(row)))
                for follow in result.follow_ups:
                    if follow.scope is None:
                        follow.scope = scope
                    self._push(follow)
        finally:
            self.timing["write"] += time.monotonic() - t0
        self.write_streak = self.write_streak + 1 if failed else 0
        if self.write_streak >= self.cfg.max_consecutive_failures:
            self.aborted = True
        return failed

    # ------------------------------------------------------------------ scopes and bookkeeping
    def _dropped(self, request: PipelineRequest) -> None:
        self.result.detail_skipped += int(request.is_detail)
        self.result.detail_dropped += int(request.is_detail)

    def _push(self, request: PipelineRequest) -> None:
        self.result.detail_asked += int(request.is_detail)
        self._open(request.scope)
        self.frontier.append(request)

    def _open(self, scope: Hashable | None) -> None:
        if scope is not None:
            self.open_scopes[scope] = self.open_scopes.get(scope, 0) + 1

    def _close(self, scope: Hashable | None, *, failed: bool) -> None:
        """Finish one request of ``scope``; when none is left, report the scope (spec §6.3)."""
        if scope is None:
            return
        if failed:
            self.failed_scopes.add(scope)
        self.open_scopes[scope] -= 1
        if self.open_scopes[scope]:
            return
        del self.open_scopes[scope]
        ok = scope not in self.failed_scopes
        self.failed_scopes.discard(scope)
        if self.on_scope is None:
            return
        try:
            extra = self.on_scope(scope, ok)
        except Exception as exc:
            self._record("write", {"scope": repr(scope), "error": describe_error(exc)})
        else:
            if extra is not None:
                self._add_counts(extra)

    def _add_counts(self, result: WriteResult) -> None:
        r = self.result
        r.total_inserted += result.inserted
        r.total_updated += result.updated
        r.total_skipped += result.skipped
        r.total_deleted += result.deleted
        r.detail_skipped += result.follow_ups_skipped
        r.detail_asked += result.follow_ups_skipped

    def _next_seed(self, source: Iterator[PipelineRequest]) -> PipelineRequest | None:
        if self._stopping():
            return None
        try:
            request = next(source)
            self.result.detail_asked += int(request.is_detail)
            return request
        except StopIteration:
            return None
        except Exception as exc:
            self._record("request", {"stage": "seed", "error": describe_error(exc)})
            return None

    def _stopping(self) -> bool:
        return self.cancellation.is_cancelled or self.aborted

    def _record(self, stage: str, error: dict[str, Any]) -> None:
        counter = {"request": "request_failures", "processing": "processing_failures"}.get(stage, "write_failures")
        setattr(self.result, counter, getattr(self.result, counter) + 1)
        self.result.errors.append({"stage": stage, **error})
        self.owner.logger.warning("%s failure: %s", stage, error.get("error"))

    def _finish(self, started: float) -> PipelineResult:
        return self.result.finish(aborted=self.aborted, cancelled=self.cancellation.is_cancelled, timing=self.timing,
                                  elapsed=time.monotonic() - started)
