"""The run statuses are one table (runner/results.py): how they combine, their exit codes, and a busy lane that is
no failure (issue 18 item 3)."""

from __future__ import annotations

from feiqiu_etl.common import exitcodes
from feiqiu_etl.common.status import RECORDED, STATUSES, Status, combine
from feiqiu_etl.runner.results import LaneResult, RunResult, StoreResult

SUCCESS, PARTIAL, FAILED, CANCELLED, BUSY, DEADLINE = (Status.SUCCESS, Status.PARTIAL, Status.FAILED, Status.CANCELLED,
                                                       Status.BUSY, Status.DEADLINE)


def _lane(name: str, *, busy: bool = False, reason: str | None = None) -> LaneResult:
    return LaneResult(name, f"feiqiu:{name}", stores=[StoreResult(1, None)], reason=reason, busy=busy)


def test_every_final_status_has_its_exit_code_and_is_a_registry_status():
    assert {name: s.exit_code for name, s in STATUSES.items()} == {
        SUCCESS: 0, PARTIAL: 3, FAILED: 4, CANCELLED: 5, BUSY: exitcodes.LANE_BUSY, DEADLINE: 9}
    assert set(STATUSES) <= set(RECORDED)


def test_combine_follows_the_table():
    assert combine([]) == SUCCESS
    assert combine([SUCCESS, SUCCESS]) == SUCCESS
    assert combine([BUSY, BUSY]) == BUSY
    assert combine([FAILED, BUSY]) == FAILED     # every part stopped: nothing loaded
    assert combine([SUCCESS, BUSY]) == PARTIAL
    assert combine([SUCCESS, FAILED]) == PARTIAL
    assert combine([BUSY, CANCELLED]) == CANCELLED
    assert combine([SUCCESS], cancelled=True) == CANCELLED
    assert combine([SUCCESS, DEADLINE]) == DEADLINE  # nothing failed; something left for the next run
    assert combine([DEADLINE, DEADLINE]) == DEADLINE
    assert combine([DEADLINE, FAILED]) == PARTIAL
    assert combine([DEADLINE, BUSY]) == PARTIAL
    assert combine([DEADLINE], cancelled=True) == CANCELLED


def test_a_run_whose_every_lane_is_busy_is_busy_exit_6_and_says_so_once():
    reason = "lane default (feiqiu:ab) is in use by run R (host h, pid 1, since …)"
    run = RunResult("r", "feiqiu", lanes=[_lane("default", busy=True, reason=reason)])
    assert run.finish(False) == BUSY and run.exit_code == 6
    data = run.to_dict()
    assert data["status"] == BUSY and data["exit_code"] == 6
    assert data["error"] == reason  # not "lane default: lane default (…) …"
    assert data["lanes"][0]["status"] == BUSY and data["lanes"][0]["stores"][0]["status"] == BUSY


def test_one_busy_lane_in_a_fleet_is_partial_and_busy_with_a_failed_lane_is_failed():
    ok = RunResult("r", "feiqiu", lanes=[_lane("north", busy=True, reason="x"), _lane("south")])
    assert ok.finish(False) == PARTIAL and ok.exit_code == 3
    bad = RunResult("r", "feiqiu", lanes=[_lane("north", busy=True, reason="x"),
                                          _lane("south", reason="invalid token (40101)")])
    assert bad.finish(False) == FAILED and bad.exit_code == 4
    lost = RunResult("r", "feiqiu", lanes=[_lane("north", busy=True, reason="x")], database_lost=True)
    assert lost.finish(False) == FAILED and lost.exit_code == exitcodes.DATABASE_LOST


def test_the_summary_of_a_busy_run_prints_the_holder_once():
    import io

    from rich.console import Console

    from feiqiu_etl.cli.views.summary import render_summary

    reason = "lane default (feiqiu:ab) is in use by run 20261201T000000Z-aaaaaaaa (host h, pid 1)"
    run = RunResult("r", "feiqiu", lanes=[_lane("default", busy=True, reason=reason)])
    run.finish(False)
    out = io.StringIO()
    render_summary(run.to_dict(), Console(width=300, file=out, color_system=None))
    text = out.getvalue()
    assert text.count("20261201T000000Z-aaaaaaaa") == 1 and "BUSY" in text, text
    assert "lane default: lane default" not in text
