"""Fakes and hypothesis strategies shared by the pipeline property tests (spec §5, §7.2).

The central model is a *fan-out forest*: every seed request is a :class:`Node`; its response holds rows
and follow-up requests emitted by ``process_fn`` (next pages) and, per row, follow-ups emitted by
``write_fn`` (detail requests) — the cyclic pipeline of spec 002. :class:`FakeUpstream` answers the
requests of one forest on a :class:`FakeClock`, records every attempt (start/end on the virtual clock),
every write call and a global event log, and never asserts inside engine threads (an assertion there
would only become a "request failure"): it counts violations for the test to check afterwards.

``expected_run`` is the oracle: which nodes are sent and which rows are written when nothing is lost to
batching (no poisoned batches) and nothing is cancelled.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import strategies as st

from feiqiu_etl.pipeline import (
    CancellationToken, FakeClock, PipelineRequest, ProcessOutput, RequestScheduler, UnifiedPipeline, WriteResult,
)
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.testing.serial_reference import SerialReference

QUIET = logging.getLogger("tests.properties.quiet")
QUIET.disabled = True

RUN_DEADLINE = 20.0
"""Seconds a single ``run()`` may take before the property calls it a hang (examples take milliseconds)."""

ENGINES = {"unified": UnifiedPipeline, "serial": SerialReference}


# ---------------------------------------------------------------------------------------------- forest model
@dataclass(frozen=True)
class Row:
    """A record of a response. ``flag``: None, "poison" (write_fn raises for its batch), "reject"
    (write_fn reports it in ``WriteResult.errors``) or "skip" (its detail follow-ups are not needed)."""

    key: int
    value: int
    flag: str | None = None


@dataclass(frozen=True)
class Node:
    """One request and its canned response.

    ``fail``: None, "request" (the transport raises) or "process" (``process_fn`` raises).
    ``bad_records``: record-level errors returned in ``ProcessOutput.errors``.
    ``retry_after``: the first attempt fails with this retry hint; the transport retries once.
    """

    id: str
    detail: bool
    rows: tuple[Row, ...]
    fail: str | None = None
    bad_records: int = 0
    duration: float = 0.0
    retry_after: float | None = None
    children: tuple["Node", ...] = ()
    row_children: tuple[tuple["Node", ...], ...] = ()

    def __post_init__(self) -> None:
        missing = len(self.rows) - len(self.row_children)
        if missing > 0:  # rows without listed details have none
            object.__setattr__(self, "row_children", self.row_children + ((),) * missing)

    def request(self) -> PipelineRequest:
        return PipelineRequest(
            "detail" if self.detail else "list", {"node": self.id}, is_detail=self.detail,
            detail_id=self.id if self.detail else None,
        )

    def row_dict(self, i: int) -> dict:
        r = self.rows[i]
        return {"node": self.id, "row": i, "key": r.key, "value": r.value, "flag": r.flag}


def walk(seeds: tuple[Node, ...]):
    for node in seeds:
        yield node
        yield from walk(node.children)
        for kids in node.row_children:
            yield from walk(kids)


@st.composite
def forests(
    draw,
    *,
    max_nodes: int = 24,
    max_depth: int = 3,
    max_seeds: int = 4,
    fail: st.SearchStrategy = st.just(None),
    row_flag: st.SearchStrategy = st.just(None),
    bad_records: st.SearchStrategy = st.just(0),
    retry: st.SearchStrategy = st.just(None),
    keys: st.SearchStrategy = st.integers(0, 5),
    max_width: int = 2,
    detail_width: int = 2,
) -> tuple[Node, ...]:
    """A random fan-out forest: 0..max_seeds seeds, depth <= max_depth, about max_nodes nodes in all.

    Each node has up to ``max_width`` process follow-ups (pages) and, per row, up to ``detail_width``
    write follow-ups (details)."""
    budget = draw(st.integers(0, max_nodes))
    ids = itertools.count()

    def node(depth: int, detail: bool) -> Node:
        nonlocal budget
        budget -= 1
        nid = f"n{next(ids)}"
        rows = tuple(
            Row(draw(keys), draw(st.integers(0, 2)), draw(row_flag)) for _ in range(draw(st.integers(0, 3)))
        )
        kw: dict[str, Any] = dict(
            fail=draw(fail), bad_records=draw(bad_records), retry_after=draw(retry),
            duration=draw(st.sampled_from([0.0, 0.01, 0.4, 3.0])),
        )
        children: list[Node] = []
        row_children: list[tuple[Node, ...]] = []
        for _ in range(draw(st.integers(0, max_width)) if depth < max_depth else 0):
            if budget > 0:
                children.append(node(depth + 1, False))
        for _ in rows:
            kids = []
            for _ in range(draw(st.integers(0, detail_width)) if depth < max_depth else 0):
                if budget > 0:
                    kids.append(node(depth + 1, True))
            row_children.append(tuple(kids))
        return Node(nid, detail, rows, children=tuple(children), row_children=tuple(row_children), **kw)

    return tuple(node(0, False) for _ in range(draw(st.integers(0, max_seeds))))


FAILURES = st.sampled_from([None, None, None, "request", "process"])


@st.composite
def pipeline_configs(
    draw,
    *,
    workers: tuple[int, int] = (1, 4),
    batch_size: tuple[int, int] = (1, 6),
    rates: bool = True,
    max_consecutive_failures: int = 1000,
) -> PipelineConfig:
    """Small queues (backpressure), batch_size from 1, one or many workers, a random gap range."""
    rate_min = draw(st.sampled_from([0.0, 0.5, 5.0])) if rates else 0.0
    rate_max = rate_min + (draw(st.sampled_from([0.0, 1.0, 15.0])) if rates else 0.0)
    return PipelineConfig(
        workers=draw(st.integers(*workers)),
        queue_size=draw(st.integers(1, 4)),
        batch_size=draw(st.integers(*batch_size)),
        batch_timeout=60.0,  # a missed idle flush would make run() hang past RUN_DEADLINE, not pass slowly
        rate_min=rate_min,
        rate_max=rate_max,
        max_consecutive_failures=max_consecutive_failures,
    )


# ---------------------------------------------------------------------------------------------- stores
def content_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class KeyedStore:
    """In-memory ODS table: key → (payload, hash). Applies rows one by one in order, counting insert /
    update (hash changed) / skip (same hash) like warehouse-model §2.3. Not thread-safe: the writer is one."""

    def __init__(self, initial: dict | None = None):
        self.rows: dict[Any, tuple[Any, str]] = {}
        for key, payload in (initial or {}).items():
            self.rows[key] = (payload, content_hash(payload))

    def upsert(self, key: Any, payload: Any) -> str:
        digest = content_hash(payload)
        old = self.rows.get(key)
        self.rows[key] = (payload, digest)
        if old is None:
            return "inserted"
        return "skipped" if old[1] == digest else "updated"

    def snapshot(self) -> dict:
        return {k: v[0] for k, v in self.rows.items()}


# ---------------------------------------------------------------------------------------------- upstream
class UpstreamError(RuntimeError):
    pass


class RetryLater(UpstreamError):
    def __init__(self, node_id: str, after: float):
        super().__init__(f"{node_id}: retry after {after}s")
        self.after = after


class FakeUpstream:
    """Transport, ``process_fn`` and ``write_fn`` for one forest (see module docstring).

    ``hooks[stage](k)`` runs at the k-th (0-based) event of ``stage`` ("request", "process", "write");
    tests use it to cancel at a chosen point. ``store``: a :class:`KeyedStore` for real counts; without
    one, every accepted row counts as inserted.
    """

    def __init__(self, seeds: tuple[Node, ...], clock: FakeClock, *, store: KeyedStore | None = None):
        self.seeds = seeds
        self.index = {n.id: n for n in walk(seeds)}
        self.clock = clock
        self.store = store
        self.lock = threading.Lock()
        self.attempts: list[tuple[str, float, float]] = []
        self.min_waits: list[float] = []
        self.events: list[tuple[str, Any]] = []
        self.batches: list[list[dict]] = []
        self.failed_batches: list[list[dict]] = []
        self.written: list[dict] = []
        self.responded: list[str] = []
        self.detail_created = 0
        self.detail_skipped = 0
        self.active = 0
        self.overlaps = 0
        self.hooks: dict[str, Callable[[int], None]] = {}
        self._counts: Counter[str] = Counter()

    def requests(self) -> list[PipelineRequest]:
        return [n.request() for n in self.seeds]

    def event(self, kind: str, detail: Any = None) -> None:
        with self.lock:
            self.events.append((kind, detail))

    def _hook(self, stage: str) -> None:
        with self.lock:
            k = self._counts[stage]
            self._counts[stage] += 1
        if stage in self.hooks:
            self.hooks[stage](k)

    def transport(self, req: PipelineRequest, send) -> Node:
        node = self.index[req.params["node"]]
        retried = False

        def call() -> Node:
            with self.lock:
                self.active += 1
                self.overlaps += self.active > 1
                start = self.clock.monotonic()
                self.events.append(("send", node.id))
            self._hook("request")
            self.clock.advance(node.duration)
            with self.lock:
                self.attempts.append((node.id, start, self.clock.monotonic()))
                self.active -= 1
            if node.retry_after is not None and not retried:
                raise RetryLater(node.id, node.retry_after)
            if node.fail == "request":
                raise UpstreamError(f"request {node.id} failed")
            with self.lock:
                self.responded.append(node.id)
            return node

        try:
            return send(call)
        except RetryLater as exc:
            retried = True
            with self.lock:
                self.min_waits.append(exc.after)
            return send(call, min_wait=exc.after)

    def process(self, item) -> ProcessOutput:
        node: Node = item.payload
        self._hook("process")
        if node.fail == "process":
            raise ValueError(f"process {node.id} failed")
        return ProcessOutput(
            rows=[node.row_dict(i) for i in range(len(node.rows))],
            follow_ups=[c.request() for c in node.children],
            errors=[{"node": node.id, "error": f"bad record {j}"} for j in range(node.bad_records)],
        )

    def write(self, rows: list[dict]) -> WriteResult:
        self._hook("write")
        batch = list(rows)
        if any(r["flag"] == "poison" for r in batch):
            with self.lock:
                self.batches.append(batch)
                self.failed_batches.append(batch)
            raise UpstreamError(f"constraint violated in a batch of {len(batch)}")
        result = WriteResult()
        for r in batch:
            if r["flag"] == "reject":
                result.errors += 1
                continue
            if self.store is None:
                result.inserted += 1
            else:
                outcome = self.store.upsert(r["key"], r["value"])
                setattr(result, outcome, getattr(result, outcome) + 1)
            kids = self.index[r["node"]].row_children[r["row"]]
            if r["flag"] == "skip":
                result.follow_ups_skipped += 1
            else:
                result.follow_ups.extend(k.request() for k in kids)
        with self.lock:
            self.batches.append(batch)
            self.written.extend(r for r in batch if r["flag"] != "reject")
            self.detail_created += len(result.follow_ups)
            self.detail_skipped += result.follow_ups_skipped
        return result

    def sent_ids(self) -> Counter:
        return Counter(a[0] for a in self.attempts)


@dataclass
class Expected:
    sent: list[Node] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    @property
    def request_failures(self) -> int:
        return sum(n.fail == "request" for n in self.sent)

    @property
    def processing_failures(self) -> int:
        return sum((n.fail == "process") + (n.fail is None) * n.bad_records for n in self.sent)


def expected_run(seeds: tuple[Node, ...]) -> Expected:
    """Nodes sent and rows written when no batch is poisoned and nothing is cancelled or aborted."""
    out = Expected()
    todo = list(seeds)
    while todo:
        node = todo.pop()
        out.sent.append(node)
        if node.fail:
            continue
        todo.extend(node.children)
        for i, row in enumerate(node.rows):
            if row.flag != "reject":
                out.rows.append(node.row_dict(i))
            if row.flag is None:
                todo.extend(node.row_children[i])
    return out


def row_ids(rows: list[dict]) -> Counter:
    return Counter((r["node"], r["row"]) for r in rows)


class HookedClock(FakeClock):
    """A ``FakeClock`` that calls ``on_wait(k)`` at the k-th lane wait (0-based), before waiting: a test
    cancels there to model a cancel signal arriving while the lane sleeps its gap."""

    def __init__(self) -> None:
        super().__init__()
        self.on_wait: Callable[[int], None] | None = None
        self._n = 0

    def wait(self, event: threading.Event | None, timeout: float) -> bool:
        if self.on_wait is not None and timeout > 0:
            k, self._n = self._n, self._n + 1
            self.on_wait(k)
        return super().wait(event, timeout)


CANCEL_POINTS = st.sampled_from(["before", "request", "gap", "process", "write"])


def arm_cancel(up: FakeUpstream, clock: HookedClock, token: CancellationToken, point: str | None, k: int) -> None:
    """Cancel ``token`` at the k-th event of ``point``: "before" the run, inside the k-th request, while
    the lane waits its k-th gap, inside the k-th ``process_fn`` or ``write_fn`` call. Logs a "cancel"
    event in ``up.events`` at the moment it fires; ``point`` None never cancels."""

    def cancel(n: int) -> None:
        if n == k and not token.is_cancelled:
            up.event("cancel", point)
            token.cancel()

    if point == "before":
        cancel(k)
    elif point == "gap":
        clock.on_wait = cancel
    elif point is not None:
        up.hooks[point] = cancel


# ---------------------------------------------------------------------------------------------- running
def call_with_deadline(fn: Callable[[], Any], seconds: float = RUN_DEADLINE) -> Any:
    """Run ``fn`` in a daemon thread; fail the example if it does not return within ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the test thread
            box["error"] = exc

    t = threading.Thread(target=target, name="property-run", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"run() did not return within {seconds} s (hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_engine(
    engine: str,
    upstream: FakeUpstream,
    config: PipelineConfig,
    *,
    token: CancellationToken | None = None,
    on_scope: Callable | None = None,
    requests: list[PipelineRequest] | None = None,
):
    """Run ``UnifiedPipeline`` ("unified") or ``SerialReference`` ("serial") over ``upstream``."""
    lane = RequestScheduler(upstream.clock)
    pipe = ENGINES[engine](upstream.transport, config, scheduler=lane, cancellation=token, logger=QUIET)
    seeds = upstream.requests() if requests is None else requests
    return call_with_deadline(
        lambda: pipe.run(seeds, upstream.process, upstream.write, on_scope_complete=on_scope)
    )


def gaps(attempts: list[tuple[str, float, float]]) -> list[tuple[str, int, float]]:
    """(node id, attempt number from 1, virtual seconds since the previous attempt ended) for every attempt
    but the first. ``attempts`` is in lane order (appended when each attempt ended)."""
    seen: Counter[str] = Counter()
    out = []
    for prev, cur in zip([None, *attempts], attempts):
        seen[cur[0]] += 1
        if prev is not None:
            out.append((cur[0], seen[cur[0]], cur[1] - prev[2]))
    return out
