"""The freshness rule (issue 18.2): only the tasks each store is scheduled for are judged — a fleet lane's
``tasks:``, else every task of the connector — so a lane that runs three tasks raises no false alarm."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from feiqiu_etl.connector import load_connector
from feiqiu_etl.plan.fleet import FleetError
from feiqiu_etl.plan.fleet import schedule_from_fleet
from feiqiu_etl.registry.freshness import Schedule, judge

CODES = [t.code for t in load_connector().tasks]
SOUTH = (8640015201004421, 8640015201004422)
NORTH = 8640015201004417
LANE_TASKS = ["ODS_SETTLEMENT", "ODS_PAYMENT", "ODS_MEMBER"]


def _fleet(tmp_path, tasks="[ODS_SETTLEMENT, ods_payment, ODS_MEMBER]") -> str:
    p = tmp_path / "fleet.yaml"
    p.write_text(f"""lanes:
  - name: north
    token_env: FQ_NORTH
    stores: [{{site_id: {NORTH}}}]
  - name: south
    token_env: FQ_SOUTH
    stores: [{{site_id: {SOUTH[0]}}}, {{site_id: {SOUTH[1]}}}]
    tasks: {tasks}
""", encoding="utf-8")
    return str(p)


def _fresh(site: int, task: str, age: float = 3600.0) -> dict:
    return {"site_id": site, "task": task, "kind": "windowed", "fresh_until": datetime.now(timezone.utc),
            "age_seconds": age, "owed_details": 0, "max_attempts": None}


def test_a_lane_with_some_tasks_is_judged_on_those_tasks_only(tmp_path):
    schedule = schedule_from_fleet(_fleet(tmp_path), CODES)
    rows = [_fresh(s, t) for s in SOUTH for t in LANE_TASKS] + [_fresh(NORTH, t) for t in CODES]
    rows.append(_fresh(999, "ODS_PAYMENT", age=10**7))               # a store outside the fleet: not judged
    judged = judge(rows, schedule, 26 * 3600)
    assert len(judged) == 2 * 3 + len(CODES) and sum(r["stale"] for r in judged) == 0
    assert {r["task"] for r in judged if r["site_id"] in SOUTH} == set(LANE_TASKS)
    everything = judge(rows, Schedule.everything(CODES), 26 * 3600)  # the old rule: the false alarm
    assert sum(r["stale"] for r in everything) == 2 * (len(CODES) - 3) + len(CODES)  # 36 + store 999


def test_scheduled_but_never_loaded_and_old_are_stale(tmp_path):
    schedule = schedule_from_fleet(_fleet(tmp_path), CODES)
    judged = judge([_fresh(SOUTH[0], "ODS_PAYMENT", age=30 * 3600)], schedule, 26 * 3600)
    stale = {(r["site_id"], r["task"]) for r in judged if r["stale"]}
    assert (SOUTH[0], "ODS_PAYMENT") in stale and (SOUTH[1], "ODS_MEMBER") in stale and (NORTH, CODES[0]) in stale
    assert len(judged) == 2 * 3 + len(CODES) == len(stale)
    never = next(r for r in judged if r["site_id"] == SOUTH[1] and r["task"] == "ODS_MEMBER")
    assert never["kind"] is None and never["age_seconds"] is None


def test_a_fleet_naming_an_unknown_task_is_one_line(tmp_path):
    with pytest.raises(FleetError) as err:
        schedule_from_fleet(_fleet(tmp_path, "[ODS_PAYMENT, ODS_NOPE]"), CODES)
    assert "lanes[1] (south).tasks: unknown task ODS_NOPE" in str(err.value)
