"""The asset checks' verdicts (feiqiu_etl.dagster.checks) and the Dagster instance file
(feiqiu_etl.dagster.instance): pure functions, no Dagster process."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.connector.windows import to_aware
from feiqiu_etl.dagster.checks import (CheckVerdict, PlannedTask, completeness_verdict, fresh_check_name,
                                       freshness_verdicts, uncovered)
from feiqiu_etl.dagster.instance import InstanceSettings, instance_config, instance_yaml, storage_url
from feiqiu_etl.registry.freshness import Schedule, judge

T0 = datetime(2024, 3, 1)


def _t(hours: float) -> datetime:
    return to_aware(T0 + timedelta(hours=hours))


# --------------------------------------------------------------------------------------------- uncovered
def test_uncovered_names_exactly_the_parts_no_finished_segment_covers():
    window = (_t(0), _t(10))
    assert uncovered(window, [(_t(0), _t(10))]) == []
    assert uncovered(window, [(_t(-5), _t(3)), (_t(3), _t(20))]) == []
    assert uncovered(window, [(_t(2), _t(4)), (_t(6), _t(8))]) == [(_t(0), _t(2)), (_t(4), _t(6)), (_t(8), _t(10))]
    assert uncovered(window, []) == [window]
    assert uncovered(window, [(_t(11), _t(12)), (_t(-3), _t(0))]) == [window]


@given(st.lists(st.tuples(st.integers(-20, 40), st.integers(1, 15)), max_size=8), st.integers(0, 10),
       st.integers(1, 20))
def test_the_uncovered_parts_and_the_finished_segments_make_up_the_window(segments, start, length):
    window = (_t(start), _t(start + length))
    finished = [(_t(s), _t(s + n)) for s, n in segments]
    gaps = uncovered(window, finished)
    for hour in range(start * 4, (start + length) * 4):  # every quarter hour of the window: covered xor a gap
        at = _t(hour / 4)
        in_gap = any(a <= at < b for a, b in gaps)
        covered = any(a <= at < b for a, b in finished)
        assert in_gap != covered, (at, gaps)
    assert all(window[0] <= a < b <= window[1] for a, b in gaps)


# ------------------------------------------------------------------------------------------- completeness
def _windowed(site=1, task="ODS_SETTLEMENT", hours=((0, 24), (24, 48)), **kw) -> PlannedTask:
    return PlannedTask(site, task, False, tuple((T0 + timedelta(hours=a), T0 + timedelta(hours=b)) for a, b in hours),
                       **kw)


def test_a_run_is_complete_when_every_window_and_snapshot_finished_and_no_detail_was_given_up():
    planned = [_windowed(), PlannedTask(1, "ODS_MEMBER", True)]
    finished = {(1, "ODS_SETTLEMENT"): [(_t(0), _t(24)), (_t(24), _t(48))]}
    verdict = completeness_verdict(planned, finished, {(1, "ODS_MEMBER")})
    assert verdict.passed, verdict
    assert verdict.metadata["windows"] == verdict.metadata["windows_finished"] == 2
    assert verdict.metadata["snapshots"] == verdict.metadata["snapshots_complete"] == 1


@pytest.mark.parametrize("planned, finished, snapshots, problem", [
    ([_windowed()], {(1, "ODS_SETTLEMENT"): [(_t(0), _t(24)), (_t(30), _t(48))]}, set(),
     "ODS_SETTLEMENT store 1: window 2024-03-02 00:00 … 2024-03-03 00:00 not finished"),
    ([PlannedTask(1, "ODS_MEMBER", True)], {}, set(), "ODS_MEMBER store 1: snapshot not completed"),
    ([_windowed(hours=((0, 24),), given_up=("S1", "S2"))], {(1, "ODS_SETTLEMENT"): [(_t(0), _t(24))]}, set(),
     "ODS_SETTLEMENT store 1: 2 owed detail(s) given up"),
    ([_windowed(skipped="store refused (40103)")], {}, set(), "ODS_SETTLEMENT store 1: not run (store refused"),
    ([_windowed(site=2)], {(1, "ODS_SETTLEMENT"): [(_t(0), _t(48))]}, set(), "store 2: window"),  # another store's
])
def test_what_makes_a_run_incomplete_is_named(planned, finished, snapshots, problem):
    verdict = completeness_verdict(planned, finished, snapshots)
    assert not verdict.passed
    assert problem in verdict.description and problem in verdict.metadata["problems"]


def test_a_window_reaching_past_the_runs_start_needs_finishing_only_up_to_it():
    planned = [_windowed(hours=((0, 24), (24, 48)))]
    finished = {(1, "ODS_SETTLEMENT"): [(_t(0), _t(24)), (_t(24), _t(30))]}  # checkpointed up to the task's start
    assert completeness_verdict(planned, finished, set(), run_started=_t(30)).passed
    assert not completeness_verdict(planned, finished, set(), run_started=_t(31)).passed
    assert not completeness_verdict(planned, finished, set()).passed


# ---------------------------------------------------------------------------------------------- freshness
def test_freshness_per_store_follows_the_one_rule():
    schedule = Schedule(by_store={1: ("ODS_MEMBER", "ODS_SETTLEMENT"), 2: ("ODS_MEMBER",), 3: ()})
    rows = [{"site_id": 1, "task": "ODS_MEMBER", "kind": "snapshot", "fresh_until": None, "age_seconds": 3600,
             "owed_details": 2},
            {"site_id": 1, "task": "ODS_SETTLEMENT", "kind": "windowed", "fresh_until": None,
             "age_seconds": 30 * 3600, "owed_details": 0},
            {"site_id": 2, "task": "ODS_MEMBER", "kind": "snapshot", "fresh_until": None, "age_seconds": 7200,
             "owed_details": 0},
            {"site_id": 9, "task": "ODS_MEMBER", "kind": "snapshot", "fresh_until": None, "age_seconds": 1,
             "owed_details": 0}]
    judged = judge(rows, schedule, 26 * 3600)
    verdicts = freshness_verdicts(judged, [1, 2, 3, 4], 26)
    assert verdicts[2] == CheckVerdict(True, "store 2: all 1 scheduled task(s) newer than 26 h", verdicts[2].metadata)
    assert not verdicts[1].passed
    assert "1 task(s) older than 26 h (oldest ODS_SETTLEMENT: 30.0 h)" in verdicts[1].description
    assert verdicts[1].metadata["stale_tasks"] == "ODS_SETTLEMENT" and verdicts[1].metadata["owed_details"] == 2
    assert not verdicts[3].passed and "scheduled for no task" in verdicts[3].description
    assert not verdicts[4].passed  # not in the schedule at all: nothing judged, nothing fresh
    never = freshness_verdicts(judge([], Schedule(by_store={5: ("ODS_MEMBER", "ODS_GOODS")}), 3600), [5], 1)[5]
    assert not never.passed and "2 task(s) never loaded (ODS_GOODS, ODS_MEMBER)" in never.description
    assert fresh_check_name(8640015201004417) == "fresh_8640015201004417"


# ------------------------------------------------------------------------------------------------- instance
def test_the_instance_file_says_storage_queue_pools_and_run_monitoring():
    config = yaml.safe_load(instance_yaml(InstanceSettings(dequeue_interval=2, free_slots_after=7)))
    assert config == instance_config(InstanceSettings(dequeue_interval=2, free_slots_after=7))
    assert config["storage"] == {"postgres": {"postgres_url": {"env": "FEIQIU_DAGSTER_PG_URL"}}}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["run_coordinator"]["config"] == {"dequeue_interval_seconds": 2}
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "op", "op_granularity_run_buffer": 0}
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_monitoring"]["free_slots_after_run_end_seconds"] == 7
    assert config["run_monitoring"]["max_runtime_seconds"] == 86400 and config["telemetry"] == {"enabled": False}
    url = "postgresql+psycopg2://dagster@db/dagster"
    assert instance_config(InstanceSettings(storage_url=url))["storage"]["postgres"]["postgres_url"] == url
    with pytest.raises(ValueError, match="free_slots_after"):
        InstanceSettings(free_slots_after=0)


def test_storage_urls_name_the_driver_and_never_hold_a_password():
    embedded = "host=/home/u/.local/share/feiqiu-etl/run port=5432 dbname=dagster user=postgres " \
               "passfile=/home/u/.local/share/feiqiu-etl/pgpass password=''"
    assert storage_url(embedded) == ("postgresql+psycopg2://postgres@/dagster?host=%2Fhome%2Fu%2F.local%2Fshare%2F"
                                     "feiqiu-etl%2Frun&passfile=%2Fhome%2Fu%2F.local%2Fshare%2Ffeiqiu-etl%2Fpgpass"
                                     "&port=5432")
    assert storage_url("postgresql://etl@db.example:5433/dagster?sslmode=require") == \
        "postgresql+psycopg2://etl@db.example:5433/dagster?sslmode=require"
    with pytest.raises(ValueError, match="password") as info:
        storage_url("postgresql://etl:s3cret@db/dagster")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ValueError, match="not a PostgreSQL connection string"):
        storage_url("host=db dbname='unterminated")
