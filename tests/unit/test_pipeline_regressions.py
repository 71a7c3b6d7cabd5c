"""Regression tests for engine bugs found by the property suite (tests/properties/SABOTAGE.md).

1. Seeds interleaved: the lane pulled the next seed whenever the frontier was momentarily empty (a worker
   still parsing the response that yields the next page), so segment 2 was fetched in the middle of
   segment 1, changing which content is written last (Property 9), and write batches mixed scopes so
   detail follow-ups lost their scope and a segment was checkpointed before its details were written.
2. Rows reached the writer in the order workers finished, not in response order (Property 9).
3. A detail request dropped on cancel/abort was counted nowhere (Property 14).
"""

from __future__ import annotations

import threading

from feiqiu_etl.pipeline import (
    CancellationToken, FakeClock, PipelineRequest, ProcessOutput, RequestScheduler, UnifiedPipeline, WriteResult,
)
from feiqiu_etl.pipeline.config import PipelineConfig

NO_GAP = dict(rate_min=0.0, rate_max=0.0)


def echo_transport(clock: FakeClock, sent: list | None = None):
    def transport(req, send):
        def call():
            if sent is not None:
                sent.append(dict(req.params))
            clock.advance(0.1)
            return req.params
        return send(call)
    return transport


def test_next_seed_starts_only_after_the_previous_seed_tree_is_written():
    clock, sent = FakeClock(), []
    cfg = PipelineConfig(workers=1, queue_size=1, batch_size=1, **NO_GAP)
    pipe = UnifiedPipeline(echo_transport(clock, sent), cfg, scheduler=RequestScheduler(clock))

    def process(item):
        seg, page = item.payload["seg"], item.payload["page"]
        more = [PipelineRequest("list", {"seg": seg, "page": page + 1})] if page < 1 else []
        return ProcessOutput(rows=[(seg, page)], follow_ups=more)

    result = pipe.run([PipelineRequest("list", {"seg": s, "page": 0}) for s in range(2)], process,
                      lambda rows: WriteResult(inserted=len(rows)))
    assert result.status == "SUCCESS"
    assert sent == [{"seg": 0, "page": 0}, {"seg": 0, "page": 1}, {"seg": 1, "page": 0}, {"seg": 1, "page": 1}]


def test_segment_is_complete_only_after_its_detail_rows_are_written():
    clock, log = FakeClock(), []
    cfg = PipelineConfig(workers=2, queue_size=4, batch_size=10, **NO_GAP)

    def process(item):
        p = item.payload
        return ProcessOutput(rows=[("detail", p["parent"])] if item.request.is_detail else [("list", p["seg"])])

    def write(rows):
        log.append(("write", list(rows)))
        details = [PipelineRequest("detail", {"parent": k}, is_detail=True) for t, k in rows if t == "list"]
        return WriteResult(inserted=len(rows), follow_ups=details)

    for _ in range(20):
        log.clear()
        pipe = UnifiedPipeline(echo_transport(clock), cfg, scheduler=RequestScheduler(clock))
        pipe.run([PipelineRequest("list", {"seg": s}, scope=("seg", s)) for s in range(3)], process, write,
                 on_scope_complete=lambda scope, ok: log.append(("done", scope)))
        for s in range(3):
            wrote = next(i for i, e in enumerate(log) if e[0] == "write" and ("detail", s) in e[1])
            assert log.index(("done", ("seg", s))) > wrote


def test_rows_reach_the_writer_in_response_order_even_when_workers_finish_out_of_order():
    clock, written = FakeClock(), []
    second_done = threading.Event()
    cfg = PipelineConfig(workers=2, queue_size=4, batch_size=1, **NO_GAP)
    pipe = UnifiedPipeline(echo_transport(clock), cfg, scheduler=RequestScheduler(clock))

    def process(item):
        name = item.payload["name"]
        if name == "root":
            return ProcessOutput(follow_ups=[PipelineRequest("x", {"name": "first"}),
                                             PipelineRequest("x", {"name": "second"})])
        if name == "first":
            second_done.wait(5.0)  # the later response is processed first
        else:
            second_done.set()
        return ProcessOutput(rows=[{"key": 1, "content": name}])

    result = pipe.run([PipelineRequest("x", {"name": "root"})], process,
                      lambda rows: written.extend(r["content"] for r in rows) or WriteResult(updated=len(rows)))
    assert result.status == "SUCCESS" and second_done.is_set()
    assert written == ["first", "second"]  # the content fetched last is written last


def test_detail_requests_dropped_on_cancel_count_as_skipped():
    clock = FakeClock()
    token = CancellationToken()
    cfg = PipelineConfig(workers=1, **NO_GAP)
    pipe = UnifiedPipeline(echo_transport(clock), cfg, scheduler=RequestScheduler(clock), cancellation=token)

    def process(item):
        token.cancel()
        return ProcessOutput(rows=[1, 2, 3])

    def write(rows):
        return WriteResult(inserted=len(rows), follow_ups=[
            PipelineRequest("detail", {"id": r}, is_detail=True) for r in rows])

    result = pipe.run([PipelineRequest("list", {})], process, write)
    assert result.status == "CANCELLED" and result.total_requests == 1
    assert (result.detail_success, result.detail_failure, result.detail_skipped) == (0, 0, 3)
