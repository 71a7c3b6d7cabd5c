"""A deadline in the plan (issue 20 item 3), pure: how it is written and read, where a lane with a deadline puts
recent data (yesterday first, history newest to oldest, resumable across nights), what fits before it, and how the
statuses of a run that stopped at its deadline combine."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

import pytest

from feiqiu_etl.config import ConfigError, load_settings
from feiqiu_etl.connector.windows import Window, recent_and_history, split_back
from feiqiu_etl.deadline import Deadline
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import Gap
from feiqiu_etl.plan import RunOptions, build_plan, prepare
from feiqiu_etl.plan.fit import Work, lane_seconds, pace_for
from feiqiu_etl.plan.history import PlanHistory, TaskHistory
from feiqiu_etl.common.status import Status, combine, task_status

NOW = datetime(2024, 3, 4, 1, 30)  # Asia/Shanghai, the plan's data clock
START = datetime(2024, 3, 3, 17, 30, tzinfo=timezone.utc)  # the wall clock the deadline counts from
UTC8 = timezone(timedelta(hours=8))

DEADLINE, FAILED, PARTIAL, SUCCESS = Status.DEADLINE, Status.FAILED, Status.PARTIAL, Status.SUCCESS


# ------------------------------------------------------------------------------------------ the value
@pytest.mark.parametrize("text, seconds", [("45m", 2700), ("90s", 90), ("2h", 7200), ("1h30m", 5400),
                                           ("0.5h", 1800), (" 45M ", 2700), ("1h0m30s", 3630)])
def test_a_duration_counts_from_the_start(text, seconds):
    d = Deadline.parse(text)
    assert d.seconds == seconds and d.at(START) == START + timedelta(seconds=seconds)


def test_a_time_of_day_is_the_next_one_in_the_display_zone():
    d = Deadline.parse("06:00")
    assert d.time_of_day == time(6) and d.text == "06:00"
    assert d.at(START, UTC8) == datetime(2024, 3, 4, 6, 0, tzinfo=UTC8)  # 01:30 → 06:00 the same morning
    late = datetime(2024, 3, 3, 15, 10, tzinfo=timezone.utc)  # 23:10 at +08:00 → 06:00 the next morning
    assert Deadline.parse("6:00").at(late, UTC8) == datetime(2024, 3, 4, 6, 0, tzinfo=UTC8)
    on_time = datetime(2024, 3, 3, 22, 0, tzinfo=timezone.utc)  # exactly 06:00: the next 06:00, 24 h on
    assert d.at(on_time, UTC8) == datetime(2024, 3, 5, 6, 0, tzinfo=UTC8)
    assert Deadline.parse("05:30:15").at(START, UTC8) == datetime(2024, 3, 4, 5, 30, 15, tzinfo=UTC8)


@pytest.mark.parametrize("text", ["", "45", "25:00", "06:60", "0s", "-5m", "45 minutes", "31d", "1h 30m", "999h"])
def test_anything_else_is_one_line_naming_the_forms(text):
    with pytest.raises(ValueError, match=r"06:00|time of day|after the start") as info:
        Deadline.parse(text)
    assert "\n" not in str(info.value)


def test_the_settings_read_it_from_every_layer_and_a_bad_one_is_a_config_error():
    assert load_settings(environ={"RUN_DEADLINE": "06:00"}).run.deadline == "06:00"
    s = load_settings(environ={"RUN_DEADLINE": "06:00"}, flags={"run.deadline": "45m"})
    assert (s.run.deadline, s.source("run.deadline")) == ("45m", "flag")
    lane = s.for_lane("north", {}, deadline="05:00")
    assert (lane.run.deadline, lane.source("run.deadline")) == ("05:00", "fleet lane north")
    with pytest.raises(ConfigError, match=r"^run.deadline: expected a time of day"):
        load_settings(environ={}, sets={"run.deadline": "soon"})


def test_a_fleet_lane_deadline_is_checked_with_the_file(tmp_path):
    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    path = tmp_path / "fleet.yaml"
    path.write_text("lanes:\n  - {name: north, token_env: FQ_N, deadline: '05:30', stores: [{site_id: 1}]}\n")
    assert load_fleet(path).lanes[0].deadline == "05:30"
    path.write_text("lanes:\n  - {name: north, token_env: FQ_N, deadline: 6:30:00, stores: [{site_id: 1}]}\n")
    with pytest.raises(FleetError, match=r"lanes\[0\] \(north\)\.deadline: .*in quotes"):
        load_fleet(path)


# ------------------------------------------------------------------------------------------ windows
def test_a_first_load_gives_yesterday_first_and_history_newest_first():
    now, yesterday = datetime(2024, 3, 4), datetime(2024, 3, 3)
    recent, history = recent_and_history(now, [], lookback=timedelta(hours=48), initial=timedelta(days=90),
                                         recent_from=yesterday)
    assert recent == [Window(yesterday, now)] and history == [Window(now - timedelta(days=90), yesterday)]
    segments = split_back(history[0], timedelta(days=31))
    assert [s.end for s in segments] == sorted((s.end for s in segments), reverse=True)
    assert segments[0].end == yesterday and segments[-1].start == now - timedelta(days=90)
    assert all(s.length == timedelta(days=31) for s in segments[:-1])  # the oldest one is the short one


def test_the_next_night_fetches_the_tail_first_and_the_history_left_over_after_it():
    night1, night2 = datetime(2024, 3, 4), datetime(2024, 3, 5)
    horizon = night1 - timedelta(days=90)
    done = [Window(night1 - timedelta(days=1), night1), Window(night1 - timedelta(days=32), night1 - timedelta(days=1))]
    recent, history = recent_and_history(night2, done, lookback=timedelta(hours=2), initial=timedelta(days=90),
                                         horizon=horizon, recent_from=night2 - timedelta(days=1))
    assert recent == [Window(night1 - timedelta(hours=2), night2)]  # the look-back tail, as every night
    assert history == [Window(horizon, night1 - timedelta(days=32))]  # what night 1 left, never fetched twice


def _inputs(deadline: str | None = "06:00", sites=(11, 12), tasks=("ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT"),
            **sets):
    overrides = {"window.initial_days": 90, "window.segment_days": 31, **sets}
    if deadline:
        overrides["run.deadline"] = deadline
    return prepare(RunOptions(api_base="http://127.0.0.1:9", token="fq_t", site_ids=list(sites),
                              task_codes=list(tasks), overrides=overrides, load_dwd=False, environ={}))


def test_a_lane_with_a_deadline_runs_its_tasks_in_parts_recent_owed_history():
    history = PlanHistory({("ODS_SETTLEMENT", 11): TaskHistory(owed_details=4)})
    plan = build_plan(_inputs(), history, now=NOW, started=START)
    lane = plan.lanes[0]
    assert lane.phased and lane.deadline.text == "06:00" and lane.safe_gaps == {"standard": 3.3, "groupbuy": 8.8}
    phases = [(phase, t.code) for phase, t in lane.schedule(11)]
    assert phases[:3] == [("recent", "ODS_MEMBER"), ("recent", "ODS_SETTLEMENT"), ("recent", "ODS_PAYMENT")]
    assert phases[3:5] == [("owed", "ODS_MEMBER"), ("owed", "ODS_SETTLEMENT")]
    assert {p for p, _ in phases[5:]} == {"history"}
    settlement = lane.tasks_of(11)[1]
    recent = settlement.parts[0]
    assert recent.windows == (Window(datetime(2024, 3, 3), NOW),)  # since yesterday 00:00
    ends = [t.windows[0].end for p, t in lane.schedule(11) if p == "history" and t.code == "ODS_SETTLEMENT"]
    assert ends == sorted(ends, reverse=True) and ends[0] == datetime(2024, 3, 3)
    owed = settlement.parts[1]
    assert owed.phase == "owed" and owed.windows == () and owed.estimate.detail_requests == 4
    member = lane.tasks_of(11)[0]
    assert member.parts[0].defers_details and not member.parts[1].defers_details
    assert settlement.estimate.requests == sum(p.estimate.requests for p in settlement.parts)
    covered = sorted(w for p in settlement.parts for w in p.windows)
    assert covered[0].start == NOW - timedelta(days=90) and all(a.end == b.start for a, b in zip(covered, covered[1:]))


def test_a_snapshot_defers_its_details_on_its_first_load_only_and_two_stores_take_turns():
    entry = {"task": "ODS_MEMBER", "site_id": 11, "status": "SUCCESS", "total_requests": 60, "total_fetched": 2050,
             "detail_fetched": 0, "detail_success": 50, "detail_failure": 0, "owed_details": 0}
    plan = build_plan(_inputs(sites=(11, 12, 13)), PlanHistory({("ODS_MEMBER", 11): TaskHistory(runs=(entry,))}),
                      now=NOW, started=START)
    lane = plan.lanes[0]
    assert not lane.tasks_of(11)[0].parts[0].defers_details  # a night: the changed members' details come with it
    assert lane.tasks_of(12)[0].parts[0].defers_details  # a first load: 2,000 new members, owed for later
    assert lane.max_active_stores == 8 and lane.active_stores == 2
    assert build_plan(_inputs(None), now=NOW, started=START).lanes[0].active_stores == 8


def test_a_night_without_owed_details_has_no_owed_part_its_rechecks_come_with_the_recent_data():
    entry = {"task": "ODS_MEMBER", "site_id": 11, "status": "SUCCESS", "total_requests": 60, "total_fetched": 2050,
             "detail_fetched": 0, "detail_success": 50, "detail_failure": 0, "owed_details": 0,
             "recheck": {"budget": 0, "used": 0, "credit": 0.99}}
    night = {("ODS_MEMBER", s): TaskHistory(runs=({**entry, "site_id": s},), owed_details=owed)
             for s, owed in ((11, 0), (12, 3))}
    lane = build_plan(_inputs(sites=(11, 12), tasks=("ODS_MEMBER",)), PlanHistory(night), now=NOW,
                      started=START).lanes[0]
    quiet, owing = lane.tasks_of(11)[0], lane.tasks_of(12)[0]
    assert quiet.recheck_budget >= 1 and [p.phase for p in quiet.parts] == ["recent"]
    assert quiet.parts[0].recheck_budget == quiet.recheck_budget  # a store whose recent part is done is done
    assert quiet.estimate.requests == quiet.parts[0].estimate.requests
    assert [p.phase for p in owing.parts] == ["recent", "owed"]
    assert owing.parts[1].estimate.detail_requests == 3 and owing.parts[1].recheck_budget == 0
    assert owing.parts[0].recheck_budget == owing.recheck_budget >= 1


def test_without_a_deadline_nothing_changes():
    plan = build_plan(_inputs(None), now=NOW, started=START)
    lane = plan.lanes[0]
    assert not lane.phased and lane.deadline is None and lane.fit is None
    assert [t.windows[0].start for t in lane.tasks_of(11) if t.windows][0] == NOW - timedelta(days=90)


def test_the_plan_says_what_fits_and_what_is_left(monkeypatch):
    zone = {"display.timezone": "Etc/GMT-8"}  # +08:00: the display zone, from the settings
    small = _inputs("06:00", tasks=("ODS_PAYMENT", "ODS_GOODS"), **{"window.initial_days": 1}, **zone)
    plan = build_plan(small, now=NOW, started=START)  # 4.5 h until 06:00 at +08:00 for a few pages
    fit = plan.lanes[0].fit
    assert fit.available == pytest.approx(4.5 * 3600) and fit.fits and not fit.narrowed and fit.pace == 1.0
    data = plan.lanes[0].to_dict()["deadline"]
    assert data["text"] == "06:00" and data["fit"]["fits"] is True and "it fits" in data["summary"][0]
    # a first load of 90 days (contract volumes: thousands of details) by 06:00: narrowed, and still too much
    tight = build_plan(_inputs("06:00", **zone), now=NOW, started=START).lanes[0].fit
    assert not tight.fits and tight.pace == 0.0 and tight.seconds_narrowest < tight.seconds
    first, last = tight.stores
    assert first.done_at < last.done_at or first.left != last.left or first.left
    assert any(item.startswith("history ") for item in last.left)
    assert not any(item.startswith("recent data") for s in tight.stores for item in s.left)  # yesterday fits
    text = "\n".join(tight.lines("default", "06:00"))
    assert "left for the next night" in text and "narrowest safe gaps (groupbuy 8.8 s, standard 3.3 s)" in text


def test_a_time_of_day_is_read_in_display_timezone_not_the_hosts_zone_and_said_with_its_offset(monkeypatch):
    """Issue 28 item 2: ``--deadline 06:00`` with ``display.timezone`` Asia/Shanghai on a UTC host stops at 06:00
    Shanghai time (22:00 UTC), not 06:00 UTC (14:00 Shanghai), and every deadline message names the offset."""
    import time as clock

    from feiqiu_etl.cli.views.summary import deadline_line
    from feiqiu_etl.formats import use_display_zone

    monkeypatch.setenv("TZ", "UTC")
    clock.tzset()
    try:
        assert datetime.now().astimezone().utcoffset() == timedelta(0)  # a UTC host
        plan = build_plan(_inputs("06:00", **{"display.timezone": "Asia/Shanghai"}), now=NOW, started=START)
        lane = plan.lanes[0]
        assert lane.deadline_at == datetime(2024, 3, 3, 22, 0, tzinfo=timezone.utc)  # 06:00 +08:00
        use_display_zone("Asia/Shanghai")
        try:
            assert lane.until() == "06:00 (2024-03-04 06:00:00 +08:00)", lane.until()
            line = deadline_line("north", {"text": "06:00", "at": lane.deadline_at.isoformat(), "reached": True})
            assert "06:00 (2024-03-04 06:00:00 +08:00) reached" in line, line
            assert "+08:00" in "\n".join(lane.to_dict()["deadline"]["summary"])
        finally:
            use_display_zone("local")
        # the host's own zone only when display.timezone is local (the default)
        assert build_plan(_inputs("06:00"), now=NOW, started=START).lanes[0].deadline_at == \
            datetime(2024, 3, 4, 6, 0, tzinfo=timezone.utc)
    finally:
        monkeypatch.delenv("TZ")
        clock.tzset()


def test_a_floor_the_token_learnt_binds_the_narrowest_gap():
    inputs = _inputs()
    key = f"feiqiu:{inputs.lanes[0].token.fingerprint()}"
    plan = build_plan(inputs, PlanHistory(floors={key: {"standard": 4.3}}), now=NOW, started=START)
    assert plan.lanes[0].safe_gaps == {"standard": 4.3, "groupbuy": 8.8}


# ------------------------------------------------------------------------------------------ pace
def test_the_pace_is_the_least_narrowing_that_fits():
    work = [Work(1, "T", "recent", 100, Gap(5, 20), 3.3), Work(1, "G", "recent", 10, Gap(8.5, 25), 8.8)]
    wide, narrow = lane_seconds(work, 1, 0.1), lane_seconds(work, 0, 0.1)
    assert pace_for(work, wide, 0.1) == 1.0 and pace_for(work, narrow - 1, 0.1) == 0.0
    middle = pace_for(work, (wide + narrow) / 2, 0.1)
    assert lane_seconds(work, middle, 0.1) == pytest.approx((wide + narrow) / 2)
    # a gap drawn below its floor stays: the mean of 8.5-25 s narrowed to 8.8 s keeps its draws under 8.8 s
    assert Gap(8.5, 25).mean_toward(8.8, 0) == pytest.approx((0.3 / 16.5) * 8.65 + (16.2 / 16.5) * 8.8)
    unsafe = [Work(1, "T", "recent", 100, Gap(0.05, 0.2), 3.3)]
    assert pace_for(unsafe, 1.0, 0.0) == 1.0  # nothing to narrow: the gaps stay


# ------------------------------------------------------------------------------------------ statuses
def test_a_run_that_stopped_at_its_deadline_is_deadline_unless_something_failed():
    assert combine([SUCCESS, DEADLINE]) == DEADLINE and combine([DEADLINE, DEADLINE]) == DEADLINE
    assert combine([DEADLINE, PARTIAL]) == PARTIAL and combine([DEADLINE, FAILED]) == PARTIAL
    assert combine([DEADLINE], cancelled=True) == "CANCELLED"
    assert task_status([SUCCESS, DEADLINE]) == DEADLINE and task_status([PARTIAL, DEADLINE]) == PARTIAL
    assert task_status([SUCCESS, SUCCESS]) == SUCCESS and task_status(["CANCELLED", DEADLINE]) == "CANCELLED"


def test_a_lane_token_stops_with_the_run_or_alone_at_its_deadline():
    run = CancellationToken()
    lane, other = run.child(), run.child()
    lane.cancel_after(0, "deadline")
    assert lane.reason == "deadline" and not run.is_cancelled and not other.is_cancelled
    run.cancel("signal")
    assert other.reason == "signal" and lane.reason == "deadline"
    assert run.child().reason == "signal"  # a child of a cancelled token starts cancelled
