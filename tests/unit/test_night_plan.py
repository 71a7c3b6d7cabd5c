"""Issue 20 (the night), the planning half, pure: which windows a task reads again (its look-back is connector
data), how long a segment is, what a re-check budget may cost, and what a plan estimates before a store has
history (the contract's volumes) and while a task runs (page 1's ``total``)."""

from __future__ import annotations

import functools
import math
from datetime import datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from feiqiu_etl.connector.model import ConnectorError, load_connector
from feiqiu_etl.connector.windows import Window
from feiqiu_etl.estimates import Estimate, ListProgress, live_estimate, pages_for, plan_estimate
from feiqiu_etl.plan import PlanHistory, RunOptions, TaskHistory, build_plan, prepare

CONNECTOR = load_connector()
SITE = 8640015201004417
NOW = datetime(2024, 3, 8, 2, 0, 0)
UPDATE_TIME = [t.code for t in CONNECTOR.tasks if t.window_field == "updateTime"]
LEDGERS = ["ODS_INVENTORY_CHANGE", "ODS_MEMBER_BALANCE_CHANGE", "ODS_SHIFT_HANDOVER"]  # no status: never change
OTHER_WINDOWED = [t.code for t in CONNECTOR.tasks if t.kind == "windowed" and t.window_field != "updateTime"
                  and t.code not in LEDGERS]


def _inputs(tasks=None, **overrides):
    return prepare(RunOptions(api_base="http://127.0.0.1:9", token="tok", site_ids=[SITE], task_codes=tasks or [],
                              overrides=overrides, environ={}))


def _done(hw: datetime) -> TaskHistory:
    return TaskHistory(done=(Window(hw - timedelta(days=7), hw),), horizon=hw - timedelta(days=7),
                       runs=({"task": "x", "first_load": True},))


def test_the_connector_says_which_lists_need_a_look_back():
    assert sorted(UPDATE_TIME) == ["ODS_ASSISTANT_SERVICE", "ODS_SETTLEMENT", "ODS_TABLE_USE"]
    for code in UPDATE_TIME + LEDGERS:  # Q13: an updateTime list shows every change again, a ledger without a
        assert CONNECTOR.task(code).lookback == timedelta(minutes=10)  # status never changes: a small overlap only
    for code in OTHER_WINDOWED:  # the window field can stay put when the record changes: the setting's look-back
        assert CONNECTOR.task(code).lookback is None
    volatile = {t.code: t.volatile_fields for t in CONNECTOR.tasks if t.volatile_fields}
    assert volatile == {"ODS_MEMBER": ("points",), "ODS_GOODS": ("stockQty",), "ODS_ASSISTANT": ("onShift",),
                        "ODS_COUPON": ("issuedCount",), "ODS_BILLIARD_TABLE": ("currentStatus",)}  # Q11
    assert all((t.expected_rows is None) == (t.kind == "windowed") for t in CONNECTOR.tasks)  # §4.1, every task
    assert all((t.expected_daily_rows is None) == (t.kind == "snapshot") for t in CONNECTOR.tasks)


def test_a_night_reads_again_only_what_can_change_unseen():
    hw = NOW - timedelta(days=1)
    inputs = _inputs()
    history = PlanHistory({(t.code, SITE): _done(hw) for t in CONNECTOR.tasks})
    plan = build_plan(inputs, history, now=NOW)
    starts = {t.code: t.windows[0].start for t in plan.lanes[0].tasks if t.windows}
    assert {starts[c] for c in UPDATE_TIME + LEDGERS} == {hw - timedelta(minutes=10)}
    assert {starts[c] for c in OTHER_WINDOWED} == {hw - timedelta(hours=48)}  # window.lookback_hours (default)
    shorter = build_plan(_inputs(**{"window.lookback_hours": 6}), history, now=NOW)
    starts = {t.code: t.windows[0].start for t in shorter.lanes[0].tasks if t.windows}
    assert {starts[c] for c in OTHER_WINDOWED} == {hw - timedelta(hours=6)}  # the setting: the default of these
    assert {starts[c] for c in UPDATE_TIME} == {hw - timedelta(minutes=10)}  # the connector's own stays


def test_a_first_load_or_backfill_reads_31_day_segments_unless_configured():
    backfill = {"window_start": "2024-01-01 00:00:00", "window_end": "2024-03-02 00:00:00"}  # 61 days
    options = dict(api_base="http://127.0.0.1:9", token="tok", site_ids=[SITE], task_codes=["ODS_PAYMENT"],
                   environ={}, **backfill)
    plan = build_plan(prepare(RunOptions(**options)), now=NOW)
    assert [w.length for w in plan.lanes[0].tasks[0].windows] == [timedelta(days=31), timedelta(days=30)]
    plan = build_plan(prepare(RunOptions(**options, overrides={"window.segment_days": 7})), now=NOW)
    assert len(plan.lanes[0].tasks[0].windows) == 9


@pytest.mark.parametrize("patch,match", [
    ("kind: snapshot\n    lookback_minutes: 10", "snapshot task has no lookback_minutes"),
    ("kind: windowed\n    window_field: updateTime\n    lookback_minutes: -1", "greater than or equal to 0"),
    ("kind: windowed\n    window_field: updateTime\n    expected_rows: [1, 2]", "use expected_daily_rows"),
    ("kind: snapshot\n    expected_rows: [5, 2]", "low 5 is above high 2"),
    ("kind: snapshot\n    expected_rows: [5]", r"expected \[low, high\]"),
    ("kind: snapshot\n    volatile_fields: [a]", "volatile_fields"),
    ("kind: windowed\n    window_field: updateTime\n    volatile_fields: [updateTime]", "volatile_fields"),
])
def test_night_settings_in_a_connector_are_checked(tmp_path, patch, match):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\ntasks:\n  - code: ODS_A\n    endpoint: /a\n    {patch}\n"
                    "    keys: [{field: a, column: a, type: text}]\n", encoding="utf-8")
    with pytest.raises(ConnectorError, match=match) as info:
        load_connector(path)
    assert "\n" not in str(info.value) and "tasks[0] (ODS_A)" in str(info.value)


def test_a_re_check_budget_never_costs_more_than_its_share_and_carries_the_rest():
    inputs = _inputs(["ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT"], **{"detail.recheck_share": 0.02})
    steady = {"first_load": False, "total_requests": 40, "total_fetched": 4000, "detail_fetched": 0,
              "windows": [["2024-03-06 00:00:00", "2024-03-07 00:00:00"]]}

    def plan(credit: float):
        runs = ({**steady, "recheck": {"budget": 0, "used": 0, "credit": credit}},)
        history = PlanHistory({(c, SITE): TaskHistory(runs=runs) for c in ("ODS_MEMBER", "ODS_SETTLEMENT",
                                                                           "ODS_PAYMENT")})
        return {t.code: t for t in build_plan(inputs, history, now=NOW).lanes[0].tasks}

    tasks = plan(0.0)
    before = sum(t.estimate.requests - t.recheck_budget for t in tasks.values())
    part = 0.02 * before / 2  # two tasks with details share 2 % of the lane's requests
    for code in ("ODS_MEMBER", "ODS_SETTLEMENT"):
        assert tasks[code].recheck_budget == math.floor(part)  # rounded down: never above the share
        assert tasks[code].recheck_credit == pytest.approx(part - math.floor(part))
    assert tasks["ODS_PAYMENT"].recheck_budget == 0
    carried = plan(0.9)  # the fraction left by the last run is spent now
    assert carried["ODS_MEMBER"].recheck_budget == math.floor(part + 0.9)
    assert sum(t.recheck_budget for t in carried.values()) <= 0.02 * before + 2 * 0.9


@functools.lru_cache(maxsize=1)
def _member_inputs():
    return _inputs(["ODS_MEMBER"])


@given(share=st.floats(0.001, 0.5), requests=st.integers(1, 400), runs=st.integers(1, 60))
@example(share=1 / 3, requests=1, runs=57)  # a credit rounded each run drifted one re-check short
def test_re_checks_over_many_runs_are_the_share_rounded_down_never_more(share, requests, runs):
    from feiqiu_etl.plan.builder import _with_rechecks
    from feiqiu_etl.plan.model import LanePlan, TaskPlan

    spec = CONNECTOR.task("ODS_MEMBER")
    inputs = _member_inputs()
    cfg = inputs.lanes[0].configs["ODS_MEMBER"]
    last: dict = {}
    total = 0
    for _ in range(runs):
        task = TaskPlan(spec=spec, site_id=SITE, config=cfg, estimate=Estimate(requests, 0, 1.0, "history"))
        lane = LanePlan("default", inputs.lanes[0].token, "", "", (), (task,), "feiqiu", 1, 1, None, 1, 1)
        history = PlanHistory({("ODS_MEMBER", SITE): TaskHistory(runs=(last,) if last else ())})
        (planned,) = _with_rechecks(lane, share, history).tasks
        total += planned.recheck_budget
        last = {"recheck": {"budget": planned.recheck_budget, "used": planned.recheck_budget,
                            "credit": planned.recheck_credit}}
    assert total == math.floor(share * requests * runs + 1e-6)  # exactly the share over time, never more


def test_without_history_the_plan_estimates_from_the_contracts_volumes():
    spec = CONNECTOR.task("ODS_SETTLEMENT")
    cfg = _inputs(["ODS_SETTLEMENT"]).lanes[0].configs["ODS_SETTLEMENT"]
    week = [Window(NOW - timedelta(days=7), NOW)]
    e = plan_estimate(spec, cfg, week, (), owed=0, request_seconds=0.1)
    assert (e.basis, e.rows, e.list_requests, e.detail_requests) == ("contract", 1050, 6, 1050)  # 150 a day
    member = plan_estimate(CONNECTOR.task("ODS_MEMBER"), cfg, (), (), owed=3, request_seconds=0.1)
    assert (member.list_requests, member.detail_requests) == (11, 2003)  # 2000 members: 10 full pages + 1
    assert pages_for(0, 200) == 1 and pages_for(199, 200) == 1 and pages_for(200, 200) == 2
    gaps = (cfg.rate_min + cfg.rate_max) / 2
    assert e.seconds == pytest.approx(e.requests * (gaps + 0.1))


def test_a_running_task_knows_its_pages_from_page_one_and_its_details_from_its_rows():
    planned = Estimate(list_requests=4, detail_requests=100, seconds=104.0, basis="contract", rows=600)
    # two windows planned; page 1 of the first said total=450: 3 pages exactly; the other keeps its share
    first = live_estimate(planned, ListProgress(scopes=2, scopes_seen=1, pages_needed=3, rows_expected=450),
                          has_detail=True)
    assert (first.list_requests, first.basis) == (3 + 2, "live")
    assert first.detail_requests == 100  # nothing written yet: as planned
    # 200 parents written so far asked for 20 details: 10 % of the 450 + 300 rows expected
    later = live_estimate(planned, ListProgress(scopes=2, scopes_seen=2, pages_needed=5, rows_expected=750,
                                                parents_written=200, new_details=20, owed=4, rechecks=1),
                          has_detail=True)
    assert (later.list_requests, later.detail_requests) == (5, 75 + 4 + 1)
    assert later.seconds == pytest.approx(later.requests * 1.0)
    plain = live_estimate(Estimate(2, 0, 2.0, "history", 10), ListProgress(scopes=1, scopes_seen=1, pages_needed=1,
                                                                           rows_expected=5), has_detail=False)
    assert (plain.list_requests, plain.detail_requests) == (1, 0)
