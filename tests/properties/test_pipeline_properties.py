"""Property tests of ``UnifiedPipeline`` (spec §5: Properties 1, 5, 6, 8, 11, 12, 13, 14).

Every example runs the real engine (threads, bounded queues, the writer) against a fake upstream on a
``FakeClock``: gaps are checked on virtual time without sleeping, and every ``run()`` has a real-time
deadline so a hang fails the example instead of the suite. Example counts come from the "ci" profile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st

from feiqiu_etl.pipeline import CancellationToken, FakeClock, WriteResult
from feiqiu_etl.pipeline.config import PipelineConfig

from pipeline_support import (
    CANCEL_POINTS, FAILURES, FakeUpstream, HookedClock, KeyedStore, Node, Row, arm_cancel, expected_run,
    forests, gaps, pipeline_configs, row_ids, run_engine,
)

EPS = 1e-9
RETRY_HINTS = st.sampled_from([None] * 6 + [0.0, 2.0, 30.0])


def error_node(error: dict) -> str | None:
    """The fake node an error entry is about (request/processing entries carry it in params or inline)."""
    return (error.get("params") or {}).get("node") or error.get("node")


# Feature: etl-unified-pipeline, Property 1: 请求严格串行
@given(seeds=forests(fail=FAILURES, retry=RETRY_HINTS, max_nodes=30), config=pipeline_configs())
def test_p1_requests_strictly_serial_each_sent_once_and_run_ends_after_last_write(seeds, config):
    up = FakeUpstream(seeds, FakeClock())
    result = run_engine("unified", up, config)
    exp = expected_run(seeds)

    # every generated request (pages from process_fn, details from write_fn) is sent exactly once,
    # plus the one retry attempt its retry hint asks for
    assert up.sent_ids() == Counter({n.id: 1 + (n.retry_after is not None) for n in exp.sent})
    assert result.total_requests == len(exp.sent)
    # strictly one at a time; each attempt starts a drawn gap after the previous one ended
    assert up.overlaps == 0
    for node_id, attempt, gap in gaps(up.attempts):
        hint = up.index[node_id].retry_after if attempt == 2 else 0.0
        assert max(config.rate_min, hint) - EPS <= gap <= max(config.rate_max, hint) + EPS, (node_id, gap)
    # run() returned only after the last row was written, each row exactly once
    assert row_ids(up.written) == row_ids(exp.rows)
    failures = exp.request_failures + exp.processing_failures
    assert result.request_failures == exp.request_failures
    assert result.processing_failures == exp.processing_failures
    assert result.completed_requests == len(exp.sent) - exp.request_failures
    assert result.detail_success == sum(n.detail and n.fail != "request" for n in exp.sent)
    assert result.detail_failure == sum(n.detail and n.fail == "request" for n in exp.sent)
    assert result.status == ("PARTIAL" if failures else "SUCCESS")


# Feature: etl-unified-pipeline, Property 5: 管道完成语义
@given(
    seeds=forests(max_nodes=30),
    config=pipeline_configs(),
    initial=st.dictionaries(st.integers(0, 5), st.integers(0, 2), max_size=6),
)
def test_p5_fetched_equals_records_and_every_record_is_inserted_updated_or_skipped(seeds, config, initial):
    store = KeyedStore(initial)
    up = FakeUpstream(seeds, FakeClock(), store=store)
    result = run_engine("unified", up, config)
    exp = expected_run(seeds)

    assert result.status == "SUCCESS" and not result.errors
    assert result.total_fetched == sum(len(n.rows) for n in exp.sent) == len(exp.rows)
    assert result.total_inserted + result.total_updated + result.total_skipped == result.total_fetched
    # each key new to the table is inserted exactly once, and every record reached the table
    assert result.total_inserted == len({r["key"] for r in exp.rows} - set(initial))
    assert row_ids(up.written) == row_ids(exp.rows)
    assert set(store.rows) == set(initial) | {r["key"] for r in exp.rows}


# Feature: etl-unified-pipeline, Property 6: WriteWorker 批量大小约束
@given(
    seeds=forests(max_nodes=30, max_seeds=6),
    config=pipeline_configs(batch_size=(1, 8)),
)
def test_p6_write_fn_never_gets_more_than_batch_size_rows(seeds, config):
    up = FakeUpstream(seeds, FakeClock())
    result = run_engine("unified", up, config)

    assert all(1 <= len(batch) <= config.batch_size for batch in up.batches), [len(b) for b in up.batches]
    assert sum(len(b) for b in up.batches) == len(expected_run(seeds).rows) == result.total_inserted


# two list pages, the first with a detail per row: every cancel point has something left to drop
EDGE_TREE = (
    Node("p1", False, (Row(1, 0), Row(2, 0)), children=(Node("p2", False, (Row(3, 0),)),),
         row_children=((Node("d1", True, (Row(4, 0),)),), (Node("d2", True, (Row(5, 0),)),))),
    Node("s2", False, (Row(6, 0),)),
)
EDGE_CONFIG = PipelineConfig(workers=2, queue_size=1, batch_size=1, batch_timeout=60.0, rate_min=1.0, rate_max=2.0)


# Feature: etl-unified-pipeline, Property 8: 取消后已入队数据不丢失
@given(
    seeds=forests(fail=FAILURES, retry=RETRY_HINTS, max_nodes=24),
    config=pipeline_configs(),
    point=CANCEL_POINTS,
    k=st.sampled_from([0, 0, 1, 1, 2, 3, 5, 8, 12]),
)
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="before", k=0)
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="request", k=0)  # during the first request
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="gap", k=0)      # during the first gap
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="process", k=0)
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="write", k=0)
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, point="request", k=5)  # during the last request
def test_p8_cancel_sends_nothing_more_and_writes_everything_fetched(seeds, config, point, k):
    clock = HookedClock()
    token = CancellationToken()
    up = FakeUpstream(seeds, clock)
    arm_cancel(up, clock, token, point, k)
    result = run_engine("unified", up, config, token=token)

    cancelled = token.is_cancelled
    kinds = [kind for kind, _ in up.events]
    # (a) no request is sent after the cancel signal
    if cancelled:
        assert "send" not in kinds[kinds.index("cancel"):]
    # (b)+(c) every response received is processed and its rows written
    received = [up.index[i] for i in up.responded]
    fetched_rows = [n.row_dict(i) for n in received if n.fail is None for i in range(len(n.rows))]
    assert row_ids(up.written) == row_ids(fetched_rows)
    assert result.completed_requests == len(received)
    # (d) status
    assert result.cancelled is cancelled
    if cancelled:
        assert result.status == "CANCELLED"
    else:
        assert result.status in ("SUCCESS", "PARTIAL")
    if point == "before":
        assert up.attempts == [] and result.total_requests == 0


KINDS = st.sampled_from(["request", "process", "record", "detail"])


@st.composite
def failure_plans(draw) -> list[str | None]:
    """One failure kind (or None) per item: none, on the first, on the last, on every, or at random."""
    n = draw(st.integers(1, 10))
    pattern = draw(st.sampled_from(["none", "first", "last", "every", "random"]))
    plan: list[str | None] = [None] * n
    if pattern == "first":
        plan[0] = draw(KINDS)
    elif pattern == "last":
        plan[-1] = draw(KINDS)
    elif pattern == "every":
        plan = [draw(KINDS) for _ in range(n)]
    elif pattern == "random":
        plan = [draw(st.one_of(st.none(), KINDS)) for _ in range(n)]
    return plan


def plan_items(plan: list[str | None]) -> tuple[Node, ...]:
    """Item i: a list request with one row whose detail request fails when the plan says "detail"."""
    items = []
    for i, kind in enumerate(plan):
        detail = Node(f"d{i}", True, (Row(100 + i, 0),), fail="request" if kind == "detail" else None)
        items.append(Node(
            f"s{i}", False, (Row(i, 0),), fail=kind if kind in ("request", "process") else None,
            bad_records=int(kind == "record"), row_children=((detail,),),
        ))
    return tuple(items)


# Feature: etl-unified-pipeline, Property 11: 单项失败不中断整体
@given(plan=failure_plans(), config=pipeline_configs())
def test_p11_a_failed_item_is_recorded_and_the_rest_continues(plan, config):
    config = replace(config, max_consecutive_failures=2 * len(plan) + 1)
    items = plan_items(plan)
    up = FakeUpstream(items, FakeClock())
    result = run_engine("unified", up, config)
    exp = expected_run(items)

    # every item is attempted and every non-failed item is fully written (its detail included)
    assert set(up.sent_ids()) == {n.id for n in exp.sent}
    assert row_ids(up.written) == row_ids(exp.rows)
    # each failure is in errors, once, under its stage, naming the failed item
    failed = Counter()
    for n in exp.sent:
        if n.fail == "request":
            failed[("request", n.id)] += 1
        elif n.fail == "process":
            failed[("processing", n.id)] += 1
        else:
            failed.update({("processing", n.id): n.bad_records} if n.bad_records else {})
    assert Counter((e["stage"], error_node(e)) for e in result.errors) == failed
    assert result.status == ("PARTIAL" if failed else "SUCCESS")


@st.composite
def failure_runs(draw) -> tuple[int, list[bool]]:
    """A threshold and an outcome sequence built from failure runs just below, at and above it."""
    limit = draw(st.integers(1, 5))
    outcomes: list[bool] = []
    for _ in range(draw(st.integers(0, 4))):
        outcomes += [False] * draw(st.integers(0, 2))
        outcomes += [True] * draw(st.sampled_from([limit - 1, limit, limit + 1, 0, 1]))
    return limit, outcomes


# Feature: etl-unified-pipeline, Property 12: 连续失败触发中断
@given(run=failure_runs(), stage=st.sampled_from(["request", "write"]), workers=st.integers(1, 3))
def test_p12_reaching_the_consecutive_failure_limit_fails_the_run(run, stage, workers):
    limit, outcomes = run
    config = PipelineConfig(workers=workers, queue_size=2, batch_size=1, batch_timeout=60.0,
                            rate_min=0.0, rate_max=1.0, max_consecutive_failures=limit)
    items = tuple(
        Node(f"s{i}", False, (Row(i, 0, "poison" if bad and stage == "write" else None),),
             fail="request" if bad and stage == "request" else None)
        for i, bad in enumerate(outcomes)
    )
    up = FakeUpstream(items, FakeClock())
    result = run_engine("unified", up, config)

    if stage == "request":
        # oracle: the run stops right after the request that completes `limit` failures in a row
        streak, sent = 0, len(outcomes)
        for i, bad in enumerate(outcomes):
            streak = streak + 1 if bad else 0
            if streak >= limit:
                sent = i + 1
                break
        assert [a[0] for a in up.attempts] == [f"s{i}" for i in range(sent)]
        assert result.request_failures == sum(outcomes[:sent])
        assert (result.status == "FAILED") == (streak >= limit)
    else:
        # the writer sees the batches in its own order; the verdict follows that order
        streak = longest = 0
        for batch in up.batches:
            streak = streak + 1 if batch in up.failed_batches else 0
            longest = max(longest, streak)
        assert result.write_failures == len(up.failed_batches)
        assert (result.status == "FAILED") == (longest >= limit)
        if longest < limit:
            assert len(up.attempts) == len(outcomes)


class TransactionalTable:
    """In-memory table whose ``write`` applies a batch in a staged copy and commits it only at the end:
    a row that violates a constraint mid-batch raises and leaves the table exactly as it was."""

    def __init__(self) -> None:
        self.committed: dict[tuple, int] = {}
        self.calls: list[list[dict]] = []

    def write(self, rows: list[dict]) -> WriteResult:
        self.calls.append(list(rows))
        staged = dict(self.committed)
        for r in rows:
            if r["flag"] == "poison":
                raise RuntimeError(f"integrity error at row {r['node']}/{r['row']}")
            staged[(r["node"], r["row"])] = r["value"]
        self.committed = staged
        return WriteResult(inserted=len(rows))


POISON = st.sampled_from([None, None, None, "poison"])


def poisoned(*flags: str | None) -> tuple[Node, ...]:
    """Two list pages whose rows carry ``flags`` (first page) and one clean row (second page)."""
    first = tuple(Row(i, 0, f) for i, f in enumerate(flags))
    return (Node("a", False, first, children=(Node("b", False, (Row(9, 0),)),)),)


# Feature: etl-unified-pipeline, Property 13: 写入失败回滚当前批次
@given(
    seeds=forests(max_nodes=20, max_seeds=6, row_flag=POISON, detail_width=0),
    config=pipeline_configs(batch_size=(1, 5)),
)
@example(seeds=poisoned("poison", None, None), config=replace(EDGE_CONFIG, batch_size=2))  # the first row
@example(seeds=poisoned(None, None, "poison"), config=replace(EDGE_CONFIG, batch_size=2))  # the last row
@example(seeds=poisoned("poison", "poison", "poison"), config=replace(EDGE_CONFIG, batch_size=1))  # every row
def test_p13_failed_batch_leaves_nothing_and_later_batches_commit(seeds, config):
    table = TransactionalTable()
    up = FakeUpstream(seeds, FakeClock())
    up.write = table.write
    result = run_engine("unified", up, config)
    exp = expected_run(seeds)

    failed = [c for c in table.calls if any(r["flag"] == "poison" for r in c)]
    ok = [c for c in table.calls if c not in failed]
    # every row went to exactly one write call; no partial batch in the table
    assert row_ids([r for c in table.calls for r in c]) == row_ids(exp.rows)
    assert set(table.committed) == {(r["node"], r["row"]) for c in ok for r in c}
    # the failed batches, and only they, are counted and described; the others are unaffected
    assert result.write_failures == len(failed)
    assert sorted(e["rows"] for e in result.errors if e["stage"] == "write") == sorted(len(c) for c in failed)
    assert result.total_inserted == sum(len(c) for c in ok) == len(table.committed)
    assert result.status == ("PARTIAL" if failed else "SUCCESS")


# Feature: etl-unified-pipeline, Property 14: 结果统计完整性
@given(
    seeds=forests(
        max_nodes=30, fail=FAILURES, retry=RETRY_HINTS, bad_records=st.sampled_from([0, 0, 0, 1, 2]),
        row_flag=st.sampled_from([None, None, None, "poison", "reject", "skip"]),
    ),
    config=pipeline_configs(),
    limit=st.sampled_from([1, 2, 3, 1000]),
    point=st.sampled_from([None, "request", "gap", "process", "write"]),
    k=st.integers(0, 4),
)
@example(seeds=EDGE_TREE, config=EDGE_CONFIG, limit=1000, point="process", k=0)  # details dropped by a cancel
@example(seeds=poisoned("poison", "poison"), config=EDGE_CONFIG, limit=1, point=None, k=0)  # abort on a write
def test_p14_statistics_are_complete_and_consistent(seeds, config, limit, point, k):
    """Any run — failures of every kind, aborts at low thresholds, cancels at any point — keeps its books."""
    config = replace(config, max_consecutive_failures=limit)
    clock = HookedClock()
    token = CancellationToken()
    up = FakeUpstream(seeds, clock)
    arm_cancel(up, clock, token, point, k)
    result = run_engine("unified", up, config, token=token)

    assert result.request_failures + result.processing_failures + result.write_failures == len(result.errors)
    by_stage = Counter(e["stage"] for e in result.errors)
    assert by_stage == +Counter({"request": result.request_failures, "processing": result.processing_failures,
                                 "write": result.write_failures})
    # every detail request created (or declared unnecessary) is accounted for exactly once
    assert result.detail_success + result.detail_failure + result.detail_skipped == (
        up.detail_created + up.detail_skipped)
    assert result.detail_asked == up.detail_created + up.detail_skipped
    # issue 18 item 5: both identities hold whatever stopped the run; every fetched record is in one bucket
    assert result.unreconciled() == []
    assert result.total_requests == len(set(up.sent_ids()))
    assert result.completed_requests == len(up.responded)
    assert result.total_inserted == len(up.written)
    assert (result.status == "SUCCESS") == (not result.errors and not token.is_cancelled)
    assert result.cancelled is token.is_cancelled
