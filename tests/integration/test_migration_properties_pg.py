"""Property 9 at the integration tier: the real ODS task writes the same database state and counts whether
its pipeline is ``UnifiedPipeline`` or the old serial loop (``SerialReference``).

Each example runs the real :class:`BaseOdsTask` — window segments, seeds, details owed from earlier runs,
``OdsProcessor``, ``OdsWriter`` (COPY + upsert on real PostgreSQL), segment checkpoints, the snapshot
soft delete — against a fake upstream, once per engine (the engine is swapped in ``tasks.ods.task``).
Both start from the same state: a previous run (serial) over different data. Compared: every ODS row
(keys, payload, hash, deleted flag), the checkpoints, the details still owed, and the counters.

One database per test, truncated between runs. Fewer examples than the unit tier (``max_examples=25``,
marked below) because each example is four task runs with real transactions.

Generated data keeps a key at most once per window segment unless ``batch_size == 1``: ``OdsWriter``
counts a row superseded by a later row *of the same batch* as ``skipped`` (last one wins), where writing
them in two batches counts insert + update, so those counts depend on where batches are cut — which
legitimately differs between a pipelined and a serial writer (reported to the ODS owner). Across
segments keys repeat freely (an edited record moves to a later ``updateTime`` window).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from unittest import mock

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from feiqiu_etl.connector.model import load_connector
from feiqiu_etl.db.schema import ensure_ods_tables
from feiqiu_etl.pipeline import CancellationToken, FakeClock, RequestScheduler, UnifiedPipeline
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.testing.serial_reference import SerialReference
from feiqiu_etl.tasks.ods import task as task_module
from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.tasks.ods.task import BaseOdsTask, LaneAccess, TaskContext
from feiqiu_etl.connector.windows import Window, fmt, split
from feiqiu_etl.plan.model import TaskPlan

pytestmark = pytest.mark.integration

SITE = 7
DAY0 = datetime(2026, 3, 1)
QUIET = logging.getLogger("tests.integration.p9.quiet")
QUIET.disabled = True
COUNTERS = (
    "status", "total_requests", "completed_requests", "total_fetched", "total_inserted", "total_updated",
    "total_skipped", "total_deleted", "request_failures", "processing_failures", "write_failures",
    "detail_success", "detail_failure", "detail_skipped",
)


@dataclass(frozen=True)
class Rec:
    id: int
    day: int
    hour: int
    content: int


@dataclass(frozen=True)
class Case:
    code: str
    page_size: int
    days: int
    previous: tuple[Rec, ...]
    current: tuple[Rec, ...]
    detail_version: int
    failing: frozenset


def spec_for(case: Case) -> OdsTaskSpec:
    return replace(load_connector().task(case.code), page_size=case.page_size)


def records(draw, code: str, days: int, unique_per_segment: bool) -> tuple[Rec, ...]:
    recs = draw(st.lists(st.builds(Rec, st.integers(1, 9), st.integers(0, days - 1), st.integers(0, 23),
                                   st.integers(0, 2)), max_size=10))
    seen, out = set(), []
    for r in recs:
        bucket = (r.id,) if code == "ODS_MEMBER" else (r.id, r.day) if unique_per_segment else (r.id, r.day, r.hour)
        if bucket not in seen:  # a snapshot lists a key once; an updateTime window can list it twice
            seen.add(bucket)
            out.append(r)
    return tuple(out)


@st.composite
def cases(draw, batch_size: int) -> Case:
    code = draw(st.sampled_from(["ODS_SETTLEMENT", "ODS_MEMBER"]))
    days = draw(st.integers(1, 3))
    unique = batch_size > 1
    return Case(code, draw(st.integers(1, 3)), days, records(draw, code, days, unique),
                records(draw, code, days, unique), draw(st.integers(0, 1)),
                frozenset(draw(st.sets(st.integers(1, 9), max_size=2))))


class FakeFeiqiu:
    """Answers list pages (filtered to the window, ordered as upstream-api §1.3, paged) and details."""

    def __init__(self, spec: OdsTaskSpec, recs: tuple[Rec, ...], detail_version: int, failing: frozenset):
        self.spec, self.detail_version, self.failing = spec, detail_version, failing
        self.records = [self.record(r) for r in recs]

    def record(self, r: Rec) -> dict:
        if self.spec.code == "ODS_MEMBER":
            return {"memberId": r.id, "siteId": SITE, "name": f"member {r.id}", "level": r.content}
        when = DAY0 + timedelta(days=r.day, hours=r.hour)
        return {"settleId": r.id, "siteId": SITE, "updateTime": fmt(when), "payAmount": f"{r.content}.50"}

    @staticmethod
    def envelope(path, list_key, items, total):
        node = {list_key: items, "total": total}
        for key in reversed(path):
            node = {key: node}
        return {"code": 0, "msg": "ok", **node}

    def transport(self, req, send):
        return send(lambda: self.answer(req))

    def answer(self, req) -> dict:
        p = req.params
        if req.is_detail:
            d = self.spec.detail
            parent = p[d.id_column]
            if parent in self.failing:
                raise RuntimeError(f"detail {parent}: 50001 busy")
            n = (parent + self.detail_version) % 3
            if self.spec.code == "ODS_MEMBER":
                items = [{"memberId": parent, "cardId": f"C{parent}{j}", "balance": f"{self.detail_version}.00"}
                         for j in range(n)]
            else:
                items = [{"itemId": parent * 10 + j, "settleId": parent, "qty": j + self.detail_version}
                         for j in range(n)]
            return self.envelope(d.data_path, d.list_key, items, len(items))
        rows = self.records
        if self.spec.window_field:
            f = self.spec.window_field
            rows = sorted((r for r in rows if p["startTime"] <= r[f] < p["endTime"]),
                          key=lambda r: (r[f], r["settleId"]))
        else:
            rows = sorted(rows, key=lambda r: r["memberId"])
        page, limit = p["page"], p["limit"]
        return self.envelope(self.spec.data_path, self.spec.list_key, rows[(page - 1) * limit: page * limit], len(rows))


def run_task(dsn: str, case: Case, recs, detail_version: int, engine, config: PipelineConfig, run_id: str):
    spec = spec_for(case)
    api = FakeFeiqiu(spec, recs, detail_version, case.failing)
    window = Window(DAY0, DAY0 + timedelta(days=case.days))
    with mock.patch.object(task_module, "UnifiedPipeline", engine):
        windows = tuple(split(window, timedelta(days=1))) if spec.kind == "windowed" else ()
        task = BaseOdsTask(TaskPlan(spec, SITE, config, windows), LaneAccess(RequestScheduler(FakeClock()), api.transport),
                           TaskContext(dsn, run_id, CancellationToken()), QUIET)
        return task.execute()


def state(dsn: str, spec: OdsTaskSpec) -> dict:
    out = {}
    with psycopg.connect(dsn) as conn:
        for table in spec.tables():
            rows = conn.execute(sql.SQL("SELECT to_jsonb(t) - 'fetched_at' - 'deleted_at' FROM {} t").format(
                sql.Identifier(*split_table(table)))).fetchall()
            out[table] = sorted(repr(sorted(r[0].items())) for r in rows)
        out["windows"] = conn.execute(
            "SELECT window_start, window_end FROM etl_meta.window_progress ORDER BY 1").fetchall()
        out["pending"] = conn.execute(
            "SELECT parent_key, record FROM etl_meta.detail_pending ORDER BY 1").fetchall()
    return out


def reset(dsn: str, spec: OdsTaskSpec) -> None:
    with psycopg.connect(dsn) as conn:
        ensure_ods_tables(conn, [spec])
        names = [sql.Identifier(*split_table(t)) for t in spec.tables()]
        names += [sql.Identifier("etl_meta", "window_progress"), sql.Identifier("etl_meta", "detail_pending")]
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(names)))
        conn.commit()


BATCH_SIZES = st.sampled_from([1, 1, 2, 3, 100])


# Feature: etl-unified-pipeline, Property 9: 迁移前后输出等价
@settings(max_examples=25)  # smaller than the unit tier's 100: each example is 4 task runs on PostgreSQL
@given(data=st.data(), batch_size=BATCH_SIZES, workers=st.integers(1, 3), queue_size=st.integers(1, 3))
def test_p9_ods_task_on_postgres_same_with_unified_and_serial(pg_dsn, data, batch_size, workers, queue_size):
    case = data.draw(cases(batch_size))
    spec = spec_for(case)
    config = PipelineConfig(workers=workers, queue_size=queue_size, batch_size=batch_size,
                            rate_min=0.0, rate_max=0.0, max_consecutive_failures=1000)
    outcomes = {}
    for name, engine in (("unified", UnifiedPipeline), ("serial", SerialReference)):
        reset(pg_dsn, spec)
        run_task(pg_dsn, case, case.previous, 0, SerialReference, config, "previous")
        run = run_task(pg_dsn, case, case.current, case.detail_version, engine, config, "current")
        outcomes[name] = ({k: getattr(run.result, k) for k in COUNTERS}, run.snapshot_note, state(pg_dsn, spec))

    (new_counts, new_note, new_state), (old_counts, old_note, old_state) = outcomes["unified"], outcomes["serial"]
    assert new_state == old_state
    assert new_counts == old_counts
    assert new_note == old_note
