"""UnifiedPipeline end to end with a fake transport, fake clock and an in-memory sink."""

from __future__ import annotations

import threading

import pytest

from feiqiu_etl.pipeline import (
    AbortPipeline, CancellationToken, FakeClock, PipelineRequest, ProcessOutput, RequestScheduler,
    UnifiedPipeline, WriteResult,
)
from feiqiu_etl.pipeline.config import PipelineConfig

FAST = PipelineConfig(workers=2, queue_size=4, batch_size=3, batch_timeout=0.05, rate_min=1.0, rate_max=2.0)


class Recorder:
    """Fake upstream: answers each request from ``pages``; records send intervals on the fake clock."""

    def __init__(self, clock, fail=()):
        self.clock = clock
        self.calls: list[tuple[float, float, str]] = []
        self.fail = set(fail)
        self.active = 0
        self.lock = threading.Lock()

    def transport(self, req, send):
        def call():
            with self.lock:
                self.active += 1
                assert self.active == 1, "parallel request"
            start = self.clock.monotonic()
            self.clock.advance(0.25)
            with self.lock:
                self.active -= 1
            self.calls.append((start, self.clock.monotonic(), req.endpoint))
            key = (req.endpoint, req.params.get("page"), req.params.get("id"))
            if key in self.fail:
                raise RuntimeError(f"boom {key}")
            return req.params
        return send(call)


def make(clock, cfg=FAST, token=None):
    lane = RequestScheduler(clock)
    rec = Recorder(clock)
    return rec, UnifiedPipeline(rec.transport, cfg, scheduler=lane, cancellation=token)


def test_pages_and_details_terminate_exactly_and_write_everything():
    clock = FakeClock()
    rec, pipe = make(clock)
    written: list[dict] = []

    def process(item):
        p = item.payload
        if item.request.is_detail:
            return ProcessOutput(rows=[{"detail": p["id"]}])
        page = p["page"]
        rows = [{"id": f"{page}-{i}"} for i in range(3 if page < 4 else 1)]
        nxt = [PipelineRequest("list", {"page": page + 1})] if page < 4 else []
        return ProcessOutput(rows=rows, follow_ups=nxt)

    def write(rows):
        written.extend(rows)
        follow = [PipelineRequest("detail", {"id": r["id"]}, is_detail=True) for r in rows if "id" in r]
        return WriteResult(inserted=len(rows), follow_ups=follow)

    result = pipe.run([PipelineRequest("list", {"page": 1})], process, write)
    assert result.status == "SUCCESS"
    list_ids = [r["id"] for r in written if "id" in r]
    assert sorted(list_ids) == sorted(f"{p}-{i}" for p in range(1, 4) for i in range(3)) + ["4-0"]
    assert sorted(r["detail"] for r in written if "detail" in r) == sorted(list_ids)
    assert result.total_requests == 4 + len(list_ids) == len(rec.calls)
    assert result.detail_success == len(list_ids)
    assert result.total_inserted == len(written) == result.total_fetched
    # strictly serial with a gap >= rate_min measured from the previous response's end
    for (s0, e0, _), (s1, _, _) in zip(rec.calls, rec.calls[1:]):
        assert s1 - e0 >= FAST.rate_min - 1e-9
        assert s1 - e0 <= FAST.rate_max + 1e-9


def test_cancel_during_gap_keeps_fetched_rows_and_sends_nothing_more():
    clock = FakeClock()
    token = CancellationToken()
    rec, pipe = make(clock, token=token)
    written = []

    def process(item):
        page = item.payload["page"]
        if page == 2:
            token.cancel()
        return ProcessOutput(rows=[{"page": page}], follow_ups=[PipelineRequest("list", {"page": page + 1})])

    result = pipe.run([PipelineRequest("list", {"page": 1})], process, lambda rows: written.extend(rows) or WriteResult(inserted=len(rows)))
    assert result.status == "CANCELLED" and result.cancelled
    sent_pages = [c for c in rec.calls]
    assert len(sent_pages) == 2  # page 3 was never sent
    assert sorted(r["page"] for r in written) == [1, 2]


def test_consecutive_failures_abort_with_failed():
    clock = FakeClock()
    lane = RequestScheduler(clock)

    def transport(req, send):
        return send(lambda: (_ for _ in ()).throw(RuntimeError("down")))

    cfg = PipelineConfig(workers=1, rate_min=0, rate_max=0, max_consecutive_failures=3)
    pipe = UnifiedPipeline(transport, cfg, scheduler=lane)
    seeds = [PipelineRequest("x", {"i": i}) for i in range(10)]
    result = pipe.run(seeds, lambda item: [], lambda rows: WriteResult())
    assert result.status == "FAILED"
    assert result.request_failures == 3 == len(result.errors)
    assert result.total_requests == 3


def test_abort_pipeline_exception_fails_fast():
    clock = FakeClock()
    lane = RequestScheduler(clock)

    def transport(req, send):
        def call():
            raise AbortPipeline("40101 token invalid")
        return send(call)

    pipe = UnifiedPipeline(transport, PipelineConfig(rate_min=0, rate_max=0), scheduler=lane)
    result = pipe.run([PipelineRequest("x", {"i": i}) for i in range(5)], lambda i: [], lambda r: WriteResult())
    assert result.status == "FAILED" and result.total_requests == 1


def test_write_failure_counts_and_scope_not_ok():
    clock = FakeClock()
    rec, pipe = make(clock, cfg=PipelineConfig(workers=1, batch_size=1, rate_min=0, rate_max=0))
    scopes = {}

    def write(rows):
        if rows[0]["v"] == 2:
            raise RuntimeError("db down")
        return WriteResult(inserted=1)

    seeds = [PipelineRequest("x", {"page": i}, scope=("seg", i)) for i in range(4)]
    result = pipe.run(seeds, lambda item: [{"v": item.payload["page"]}], write,
                      on_scope_complete=lambda s, ok: scopes.__setitem__(s, ok))
    assert result.status == "PARTIAL"
    assert result.write_failures == 1 and result.total_inserted == 3
    assert scopes == {("seg", 0): True, ("seg", 1): True, ("seg", 2): False, ("seg", 3): True}


def test_pre_cancelled_token_sends_nothing():
    clock = FakeClock()
    token = CancellationToken()
    token.cancel()
    rec, pipe = make(clock, token=token)
    result = pipe.run([PipelineRequest("x", {})], lambda i: [], lambda r: WriteResult())
    assert result.status == "CANCELLED" and rec.calls == []


def test_processing_exception_is_recorded_and_others_continue():
    clock = FakeClock()
    rec, pipe = make(clock)

    def process(item):
        if item.payload["page"] == 1:
            raise ValueError("bad data")
        return [{"p": item.payload["page"]}]

    out = []
    result = pipe.run([PipelineRequest("x", {"page": i}) for i in range(3)], process,
                      lambda rows: out.extend(rows) or WriteResult(inserted=len(rows)))
    assert result.status == "PARTIAL" and result.processing_failures == 1
    assert sorted(r["p"] for r in out) == [0, 2]
    assert len(result.errors) == 1 and "bad data" in result.errors[0]["error"]


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_batches_never_exceed_batch_size(batch_size):
    clock = FakeClock()
    cfg = PipelineConfig(workers=3, batch_size=batch_size, rate_min=0, rate_max=0)
    rec, pipe = make(clock, cfg=cfg)
    sizes = []
    result = pipe.run([PipelineRequest("x", {"page": i}) for i in range(6)],
                      lambda item: [{"n": j} for j in range(7)],
                      lambda rows: sizes.append(len(rows)) or WriteResult(inserted=len(rows)))
    assert max(sizes) <= batch_size and sum(sizes) == 42 == result.total_inserted


def test_timing_reports_every_stage():
    clock = FakeClock()
    rec, pipe = make(clock)

    def slow_write(rows):
        import time
        time.sleep(0.01)
        return WriteResult(inserted=len(rows))

    result = pipe.run([PipelineRequest("x", {"page": 1})], lambda item: [{"a": 1}], slow_write)
    assert set(result.timing) == {"request", "processing", "write", "total"}
    assert result.timing["write"] >= 0.01
