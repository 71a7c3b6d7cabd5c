"""The run summary fits an 80-column terminal: no cut cells, stores told apart, lanes shown for a fleet."""

from __future__ import annotations

import io

from rich.console import Console

from feiqiu_etl.cli.views.summary import render_summary

TASKS = ("ODS_MEMBER", "ODS_MEMBER_BALANCE_CHANGE", "ODS_SETTLEMENT", "ODS_GROUP_BUY_REDEMPTION")


def _task(code: str, site: int, status: str = "SUCCESS") -> dict:
    return {"task": code, "site_id": site, "status": status, "total_requests": 123, "total_fetched": 4200,
            "detail_fetched": 200 if code == "ODS_MEMBER" else 0,
            "detail_table": "member_detail" if code == "ODS_MEMBER" else None, "total_inserted": 4000,
            "total_updated": 120, "total_skipped": 80, "total_deleted": 3, "detail_success": 200,
            "detail_failure": 2 if code == "ODS_MEMBER" else 0, "detail_skipped": 0, "rate_limited": 1, "errors": [],
            "timing": {"total": 1234.5}}


def _fleet() -> dict:
    lanes = [("north", [8640015201004417, 8640015201004418]), ("south", [8640015201004419])]
    tasks = [_task(code, site, "CANCELLED" if site % 2 else "SUCCESS") for _, sites in lanes for site in sites
             for code in TASKS]
    return {"run_id": "20261201T020000Z-abcdef12", "status": "CANCELLED", "error": "cancelled (signal)",
            "tasks": tasks, "lanes": [{"name": n, "stores": [{"site_id": s} for s in sites]} for n, sites in lanes]}


def _render(data: dict, width: int = 80) -> str:
    out = io.StringIO()
    render_summary(data, Console(width=width, file=out, color_system=None))
    return out.getvalue()


def test_a_fleet_summary_fits_80_columns_without_cutting_a_cell():
    text = _render(_fleet())
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    assert "…" not in "".join(line for line in lines if "…441" not in line), text  # only the site tails
    for site in ("…4417", "…4418", "…4419"):
        assert site in text
    assert "CANCELLED" in text and "SUCCESS" in text and "lanes: north = …4417 …4418, south = …4419" in text
    assert "20m34s" in text  # durations are readable, not cut
    assert "run 20261201T020000Z-abcdef12: CANCELLED (signal)" in text


def test_a_fleet_of_small_numbers_shows_its_lanes_in_80_columns():
    data = _fleet()
    for t in data["tasks"]:
        t.update(total_requests=3, total_fetched=42, detail_fetched=2 if t["detail_table"] else 0, total_inserted=40,
                 total_updated=2, total_skipped=0, timing={"total": 8.2})
    text = _render(data)
    assert all(len(line) <= 80 for line in text.splitlines()) and "ODS_MEMBER_BALANCE_CHANGE" in text, text
    header = next(line for line in text.splitlines() if line.startswith("task"))
    assert "same" in header.split()  # what tells a rerun changed nothing stays longest
    assert "lanes: north = …4417 …4418, south = …4419" in " ".join(text.split())


def test_a_wide_terminal_keeps_every_column():
    text = _render(_fleet(), width=200)
    header = next(line for line in text.splitlines() if line.startswith("task"))
    assert header.split() == ["task", "lane", "site", "status", "req", "rows", "new", "chg", "same", "del",
                              "details", "rl", "err", "s"]
    assert "ODS_MEMBER_BALANCE_CHANGE" in text


def test_a_finished_lane_says_done_without_a_rate_or_eta_and_queues_are_labelled():
    from feiqiu_etl.cli.views.progress import lane_lines
    from feiqiu_etl.statistics import LaneStatistics

    lane = LaneStatistics.from_dict(
        {"name": "south", "state": "finished", "current": None, "rows_written": 73, "rows_per_s": 0.0,
         "eta_s": 0.0, "queues": {"frontier": 38, "processing": 0, "write": 0}, "throttled": 0, "banned": 0,
         "tasks_done": 21, "tasks": 21, "requests_sent": 99, "requests_remaining": 0})
    text = " / ".join(line.plain for line in lane_lines(lane))
    assert "south: finished" in text and "done · 73 rows" in text
    assert "working" not in text and "ETA" not in text and "0/s" not in text
    assert "queued 38 req/0 proc/0 write" in text


def test_show_lists_every_error_without_pointing_at_itself():
    data = _fleet()
    data["tasks"][0]["errors"] = [{"stage": "request", "error": f"boom {i}"} for i in range(9)]
    hinted, inside_show = _render(data, 200), io.StringIO()
    render_summary(data, Console(width=200, file=inside_show, color_system=None), more_hint=False)
    assert "more; feiqiu-etl show" in hinted and "more; feiqiu-etl show" not in inside_show.getvalue()


def test_the_runs_table_fits_80_columns_with_whole_run_ids():
    from datetime import datetime, timezone

    from feiqiu_etl.cli.views.runs import render_runs

    rows = [{"run_id": f"20261201T14251{i}Z-23b43c0{i}", "status": "INTERRUPTED", "duration": 95.2,
             "started_at": datetime(2026, 12, 1, 14, 25, tzinfo=timezone.utc), "stores": [8640015201004417 + i],
             "tasks": ["ODS_MEMBER"] * 21, "rows_written": 71234, "requests": 1234, "rejections": 12, "errors": 3}
            for i in range(3)]
    out = io.StringIO()
    render_runs(rows, Console(width=80, file=out, color_system=None))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text.replace("…441", ""), text
    assert all(r["run_id"] in text for r in rows) and "INTERRUPTED" in text and "71,234" in text


def _runs_text(rows: list[dict], zone: str) -> str:
    from feiqiu_etl.formats import use_display_zone
    from feiqiu_etl.cli.views.runs import render_runs

    out = io.StringIO()
    use_display_zone(zone)
    try:
        render_runs(rows, Console(width=120, file=out, color_system=None))
    finally:
        use_display_zone("local")
    return out.getvalue()


def test_an_empty_runs_table_names_the_display_zones_offset_not_utc():
    text = _runs_text([], "Asia/Shanghai")
    assert "started (+08:00)" in text and "(UTC)" not in text and "no runs recorded yet" in text, text
    assert "started (UTC)" in _runs_text([], "UTC")


def test_runs_in_winter_and_summer_of_a_dst_zone_show_their_own_offsets():
    from datetime import datetime, timezone

    rows = [{"run_id": f"20260{m}01T120000Z-0000000{m}", "status": "SUCCESS", "duration": 5.0,
             "started_at": datetime(2026, m, 1, 12, 0, tzinfo=timezone.utc), "stores": [1], "tasks": ["ODS_MEMBER"]}
            for m in (7, 1)]
    text = _runs_text(rows, "America/New_York")
    header = text.splitlines()[0]
    assert "started" in header and "(" not in header, text  # no one offset for both
    july = next(line for line in text.splitlines() if "00000007" in line)
    january = next(line for line in text.splitlines() if "00000001" in line)
    assert "07-01 08:00:00 -04:00" in july and "01-01 07:00:00 -05:00" in january, text
