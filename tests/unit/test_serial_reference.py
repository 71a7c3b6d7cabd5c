"""``SerialReference``, the oracle of Property 9: order, batching, scopes and status rules, checked directly."""

from __future__ import annotations

from feiqiu_etl.pipeline import (
    CancellationToken, FakeClock, PipelineRequest, ProcessOutput, RequestScheduler, WriteResult,
)
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.testing.serial_reference import SerialReference


def make(cfg: PipelineConfig, fail=(), token=None):
    clock, sent = FakeClock(), []

    def transport(req, send):
        def call():
            sent.append((req.endpoint, req.params.get("n"), clock.monotonic()))
            clock.advance(1.0)
            if (req.endpoint, req.params.get("n")) in fail:
                raise RuntimeError("boom")
            return req.params
        return send(call)

    return sent, SerialReference(transport, cfg, scheduler=RequestScheduler(clock), cancellation=token)


def test_follow_ups_run_fifo_before_the_next_seed_and_rows_are_written_per_response():
    cfg = PipelineConfig(workers=3, batch_size=2, rate_min=2.0, rate_max=2.0)
    sent, ref = make(cfg)
    batches, scopes = [], []

    def process(item):
        n = item.payload["n"]
        pages = [PipelineRequest("page", {"n": n * 10 + 1})] if n < 10 else []
        return ProcessOutput(rows=[(n, i) for i in range(3)], follow_ups=pages)

    def write(rows):
        batches.append(list(rows))
        details = [PipelineRequest("detail", {"n": 100 + n}, is_detail=True) for n, i in rows if i == 0 and n < 10]
        return WriteResult(inserted=len(rows), follow_ups=details)

    result = ref.run([PipelineRequest("seed", {"n": n}, scope=n) for n in (1, 2)], process, write,
                     on_scope_complete=lambda s, ok: scopes.append((s, ok, len(sent))))
    assert [(e, n) for e, n, _ in sent] == [("seed", 1), ("page", 11), ("detail", 101), ("seed", 2),
                                           ("page", 21), ("detail", 102)]
    assert all(b - a == 3.0 for (_, _, a), (_, _, b) in zip(sent, sent[1:]))  # 1 s response + 2 s gap
    assert [len(b) for b in batches] == [2, 1] * 6  # one response at a time, split at batch_size
    assert scopes == [(1, True, 3), (2, True, 6)]
    assert (result.status, result.total_requests, result.total_inserted, result.detail_success) == ("SUCCESS", 6, 18, 2)


def test_failures_partial_consecutive_limit_failed_and_cancel():
    sent, ref = make(PipelineConfig(rate_min=0, rate_max=0, max_consecutive_failures=2), fail={("seed", 1)})
    result = ref.run([PipelineRequest("seed", {"n": n}) for n in range(3)], lambda i: [i.payload],
                     lambda r: WriteResult(inserted=len(r)))
    assert (result.status, result.request_failures, len(result.errors), result.total_inserted) == ("PARTIAL", 1, 1, 2)

    sent, ref = make(PipelineConfig(rate_min=0, rate_max=0, max_consecutive_failures=2),
                     fail={("seed", 0), ("seed", 1)})
    result = ref.run([PipelineRequest("seed", {"n": n}) for n in range(5)], lambda i: [], lambda r: WriteResult())
    assert result.status == "FAILED" and len(sent) == 2

    token = CancellationToken()
    sent, ref = make(PipelineConfig(rate_min=0, rate_max=0), token=token)

    def process(item):
        token.cancel()
        return ProcessOutput(rows=[1], follow_ups=[PipelineRequest("detail", {"n": 9}, is_detail=True)])

    result = ref.run([PipelineRequest("seed", {"n": 0}), PipelineRequest("seed", {"n": 1})], process,
                     lambda r: WriteResult(inserted=len(r)))
    assert (result.status, result.cancelled, len(sent), result.total_inserted, result.detail_skipped) == (
        "CANCELLED", True, 1, 1, 1)
