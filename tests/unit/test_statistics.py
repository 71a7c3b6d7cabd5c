"""The typed status (``feiqiu_etl.statistics``): snapshots are reads without side effects, rows/s comes from the
owner's samples (two readers never change each other's figure), and the JSON that leaves the process — what
the heartbeat stores, ``/api/status`` serves and ``web/static/live.js`` reads — is the same type."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import feiqiu_etl
from feiqiu_etl.api.client import RetryPolicy
from feiqiu_etl.connector.model import load_connector
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.models import PipelineResult
from feiqiu_etl.plan.model import Estimate, LanePlan, Secret, StorePlan, TaskPlan
from feiqiu_etl.runner.flow_runner import envelope_rules
from feiqiu_etl.runner.lane import LaneRunner, LaneRuntime
from feiqiu_etl.statistics import (CurrentRequest, LaneStatistics, LaneTotals, Queues, RateMeter, RunStatistics,
                                   StoreProgress, TaskStatistics)
from feiqiu_etl.tasks.ods.task import TaskContext, TaskRun

LIVE_JS = Path(feiqiu_etl.__file__).parent / "web" / "static" / "live.js"


class _NoClient:
    def close(self) -> None:
        pass


def _lane(stores=(11, 12), tasks_per_store=2) -> LaneRunner:
    specs = load_connector().tasks[:tasks_per_store]
    config = PipelineConfig(rate_min=0.0, rate_max=0.0)
    tasks = tuple(TaskPlan(spec, site, config, estimate=Estimate(list_requests=4)) for site in stores
                  for spec in specs)
    plan = LanePlan(name="north", token=Secret("fq_x"), token_source="FQ_X", api_base="http://127.0.0.1:1",
                    stores=tuple(StorePlan(s) for s in stores), tasks=tasks, connector="feiqiu", timeout=1.0,
                    connect_timeout=1.0, retry=RetryPolicy(), max_transport_failures=5, max_active_stores=8)
    runtime = LaneRuntime(TaskContext("dbname=none", "run-1", CancellationToken()), envelope_rules(load_connector()),
                          lambda *a: None, client_factory=lambda *a, **kw: _NoClient())
    return LaneRunner(plan, runtime)


def _finish(lane: LaneRunner, store: int, rows: int) -> None:
    """A finished task of ``store`` that wrote ``rows`` rows (as the lane records it)."""
    planned = lane.plan.tasks_of(lane.plan.stores[store].site_id)
    target = lane.result.stores[store]
    task = planned[len(target.tasks)]
    target.tasks.append(TaskRun(task.code, task.site_id, task.spec.table, None,
                                PipelineResult(total_requests=3, total_inserted=rows)))


def test_a_rate_is_read_from_the_owners_samples_and_reading_changes_nothing():
    meter = RateMeter(window=15.0, every=0.5)
    meter.record(100.0, 0)
    meter.record(110.0, 900)
    assert meter.rate(120.0, 1000) == 50.0  # base: the newest sample at least 15 s old
    for at in (120.0, 120.0, 120.0):  # however often it is read, by whom
        assert meter.rate(at, 1000) == 50.0
    meter.record(110.2, 950)  # closer than `every` to the last sample: skipped
    assert meter.rate(130.0, 1300) == (1300 - 900) / 20  # now the 110 s sample is the newest 15 s old
    meter.record(126.0, 1200)  # the 100 s sample is no longer needed: the 110 s one is 16 s old
    assert meter.rate(126.0, 1200) == 300 / 16
    assert RateMeter().rate(5.0, 10) == 0.0  # no sample yet
    early = RateMeter()
    early.record(5.0, 0)
    assert early.rate(5.3, 10) == 0.0  # under half a second of history
    assert early.rate(7.0, 10) == 5.0


def test_two_pollers_of_a_lane_see_the_same_snapshot_and_do_not_change_each_others_rows_per_second():
    lane = _lane()
    now = time.monotonic()
    lane.sample(now - 1000)  # the run's loop records the lane's rows on its own clock
    _finish(lane, 0, 900)
    lane.sample(now - 10)
    _finish(lane, 1, 100)
    first = lane.statistics()
    # 1000 rows since the sample 1000 s ago (not 100 rows in 10 s: the newest sample is too young for a base)
    assert first.rows_written == 1000 and first.rows_per_s == 1.0
    seen: list[LaneStatistics] = []

    def poll() -> None:
        for _ in range(200):
            seen.append(lane.statistics())

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for p in pollers:
        p.start()
    for p in pollers:
        p.join()
    assert len(seen) == 400 and all(s == first for s in seen)  # 400 reads: the very same figures
    assert lane.statistics().rows_per_s == 1.0
    assert (first.tasks_done, first.tasks, first.requests_remaining) == (2, 4, 8)  # 2 tasks left, 4 requests each
    assert [(s.site_id, s.tasks_done, s.tasks) for s in first.stores] == [(11, 1, 2), (12, 1, 2)]
    assert first.state == "waiting for lane" and first.current is None and first.running == ()


def test_the_json_of_a_snapshot_is_the_type_and_reads_back_equal():
    task = TaskStatistics("ODS_MEMBER", 11, state="running", requests=3, requests_planned=9, requests_remaining=6,
                          rows_written=120, queues=Queues(2, 1, 0), seeds_left=1, elapsed_s=4.2)
    lane = LaneStatistics("north", "feiqiu:0123", state="running",
                          current=CurrentRequest("ODS_MEMBER", 11, "/api/member page 2", True), next_due_in=1.5,
                          wait_reason="gap", requests_sent=3, floors={"standard": 3.5}, queues=Queues(2, 1, 0),
                          rows_written=120, rows_per_s=12.5, requests_remaining=6, tasks=2,
                          stores=(StoreProgress(11, "旗舰店", 0, 2, "ODS_MEMBER"),), running=(task,))
    run = RunStatistics("run-1", phase="ods", lanes=(lane,), rows_written=120, rows_per_s=12.5)
    data = run.to_dict()
    assert RunStatistics.from_dict(data) == run
    assert data["lanes"][0]["current"] == {"task": "ODS_MEMBER", "site_id": 11, "request": "/api/member page 2",
                                           "in_flight": True}
    assert data["lanes"][0]["queues"] == {"frontier": 2, "processing": 1, "write": 0}
    # the keys the docs and live.js know since before the typed status, in their order
    assert list(data) == ["run_id", "phase", "cancelling", "tasks_done", "tasks", "lanes", "elapsed_s",
                          "rows_written", "rows_per_s", "requests_sent", "requests_remaining", "eta_s",
                          "rows_unchanged",  # issue 27: rows written are inserted + updated, unchanged apart
                          "pool_waiting", "pool_wait_s", "pool_in_use", "pool_size"]  # the pool's: issue 28 item 9
    assert list(data["lanes"][0])[:20] == [
        "name", "key", "state", "current", "next_due_in", "wait_reason", "requests_sent", "throttled", "banned",
        "banned_seconds", "floors", "tripped", "queues", "rows_written", "rows_per_s", "requests_remaining",
        "tasks_done", "tasks", "eta_s", "stores"]
    older = {"run_id": "run-0", "phase": "ods", "tasks_done": 0, "tasks": 1, "rows_written": 0, "lanes": []}
    assert RunStatistics.from_dict(older) == RunStatistics("run-0", "ods", tasks=1)  # a record of an older run
    assert LaneTotals.from_dict(LaneTotals(seconds=1.5, floors={"a": 1.0}).to_dict()).seconds == 1.5


def _properties(schema: dict, name: str) -> set[str]:
    node = schema if name == schema.get("title") else schema["$defs"][name]
    return set(node["properties"])


def test_live_js_reads_only_fields_of_the_json_schema():
    schema = RunStatistics.json_schema()
    text = LIVE_JS.read_text(encoding="utf-8")
    used = {var: set(re.findall(rf"\b{var}\.([a-z_]+)\b", text)) for var in ("live", "lane", "cur", "q")}
    assert used["live"] and used["lane"] and used["cur"] and used["q"]  # the page reads all four levels
    assert used["live"] <= _properties(schema, "RunStatistics"), used["live"] - _properties(schema, "RunStatistics")
    assert used["lane"] <= _properties(schema, "LaneStatistics")
    assert used["cur"] <= _properties(schema, "CurrentRequest")
    assert used["q"] <= _properties(schema, "Queues")
    queries = (LIVE_JS.parent.parent / "queries.py").read_text(encoding="utf-8")  # the Runs page's live totals
    in_sql = set(re.findall(r"live->>'([a-z_]+)'", queries))
    assert in_sql and in_sql <= _properties(schema, "RunStatistics")
