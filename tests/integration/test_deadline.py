"""A deadline (issue 20 item 3), against the simulator over HTTP with real PostgreSQL: a run that cannot meet its
deadline starts anyway, says at the start what will be left, stops at the deadline within one gap, loses nothing
(real processes), and the next run completes it — the warehouse then equals the simulator's data; recent data comes
first for every store (yesterday before any history, the snapshots' details in between)."""

from __future__ import annotations

import re

import json
import subprocess
import time
from datetime import datetime, timedelta

import psycopg
import pytest

from clikit import cli, cli_json, env_for, run_args
from feiqiu_etl.connector.windows import fmt, parse_local
from feiqiu_etl.simulator import RiskControlConfig, Simulator
from feiqiu_etl.simulator.catalog import DETAIL_BY_PATH, LIST_BY_PATH
from flowkit import ANCHOR, CONNECTOR, lane_violations, run_flow, scaled_connector, sim_config, store_exact

pytestmark = pytest.mark.integration

DAYS = 2
SITES = (8640015201004417, 8640015201004418)
TASKS = ("ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT")  # a snapshot and a windowed list with details, a plain list
RISK = RiskControlConfig(gap_standard=0.01, gap_groupbuy=0.02)
GAP = (0.05, 0.08)
NIGHT = {"window.initial_days": DAYS, "window.lookback_hours": 0, "lane.safety_margin_seconds": 0.03,
         "pipeline.rate_min": GAP[0], "pipeline.rate_max": GAP[1]}
YESTERDAY = ANCHOR - timedelta(days=1)


def _run(sim: Simulator, dsn: str, connector: str, *extra: str) -> tuple[int, dict, str]:
    args = run_args(sim, dsn, "--site-id", str(SITES[1]), "--tasks", ",".join(TASKS), "--now", fmt(ANCHOR),
                    "--connector", connector, *extra, window=False, settings=NIGHT)
    done = subprocess.run(args, env=env_for(sim.config.token), capture_output=True, text=True, timeout=180)
    return done.returncode, json.loads(done.stdout), done.stderr


def _stored_rows(dsn: str) -> int:
    tables = [CONNECTOR.task(t).table for t in TASKS] + [CONNECTOR.task(t).detail.target_table for t in TASKS
                                                         if CONNECTOR.task(t).detail]
    with psycopg.connect(dsn) as conn:
        return sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)


def _done_windows(dsn: str) -> dict[tuple[str, int], list[tuple[datetime, datetime]]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT task_code, site_id, window_start AT TIME ZONE 'Asia/Shanghai', "
                            "window_end AT TIME ZONE 'Asia/Shanghai' FROM etl_meta.window_progress").fetchall()
    out: dict = {}
    for task, site, a, b in rows:
        out.setdefault((task, site), []).append((a, b))
    return out


def _monotonic(iso: str) -> float:
    """A wall-clock instant (ISO) on this machine's monotonic clock, which the simulator's log uses."""
    return datetime.fromisoformat(iso).timestamp() - (time.time() - time.monotonic())


def test_a_deadline_that_cannot_be_met_stops_in_time_loses_nothing_and_the_next_run_completes_it(pg_dsn, tmp_path):
    connector = scaled_connector(tmp_path / "feiqiu.yaml", RISK.gap_standard, RISK.gap_groupbuy)
    with Simulator(sim_config(seed=61, days=DAYS, site_ids=SITES, risk=RISK)) as sim:
        # 1 s was all spent starting on a busy machine, and 2 s at load 20-30 (nothing fetched): the deadline
        # counts from the start, so a run that fetched nothing is tried again with twice the time (still short
        # of what the work needs: it must not fit, asserted below)
        for budget in ("2s", "4s", "8s"):
            sim.clear_log()
            code, first, err = _run(sim, pg_dsn, connector, "--deadline", budget)
            if not first or first["rows_written"] + first["rows_unchanged"] > 0:
                break
        log = sim.request_log()
        # it started anyway, said what will be left, and ended DEADLINE (exit 9): not a failure
        assert code == 9 and first["status"] == "DEADLINE", err[-3000:]
        assert "left for the next night" in err and f"until the deadline {budget} (" in err
        deadline = first["lanes"][0]["deadline"]
        assert deadline["reached"] and deadline["fit"]["fits"] is False and deadline["left_requests"] > 0
        assert {t["status"] for t in first["tasks"]} <= {"SUCCESS", "DEADLINE"} and not first["errors"]
        # it stopped at the deadline within one gap: no request started later than that
        late = [e for e in log if e.started > _monotonic(deadline["at"]) + GAP[1] + 0.1]
        assert late == [], [(e.path, e.started - _monotonic(deadline["at"])) for e in late]
        assert lane_violations(log, RISK.gap_standard) == []  # narrowed, never below the upstream's minimum
        # nothing fetched was lost: every record the upstream sent is stored
        fetched = sum(e.record_count for e in log if e.outcome == "accepted" and e.code == 0)
        assert _stored_rows(pg_dsn) == fetched == first["rows_written"] + first["rows_unchanged"] > 0
        _visible(pg_dsn, first["run_id"], budget)
        done_first = _done_windows(pg_dsn)
        with psycopg.connect(pg_dsn) as conn:
            owed = conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0]

        sim.clear_log()
        code, second, err = _run(sim, pg_dsn, connector)
        assert code == 0 and second["status"] == "SUCCESS", err[-3000:]
        resumed = sim.request_log()
        window = (fmt(ANCHOR - timedelta(days=DAYS)), fmt(ANCHOR))
        for site in SITES:  # the warehouse holds exactly the simulator's records, lists and details
            store_exact(pg_dsn, sim, site, TASKS, window)
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 0
    # the next run went on where the first stopped: no window the first run finished was asked for again —
    # but the task's own look-back before its high-water mark (connector lookback_minutes, issue 30: it wins
    # over window.lookback_hours 0) — and every detail the first run left owed was fetched
    for e in resumed:
        if e.path in LIST_BY_PATH and "startTime" in (e.body or {}):
            task = LIST_BY_PATH[e.path].task_code
            start, end = parse_local(e.body["startTime"]), parse_local(e.body["endTime"])
            finished = done_first.get((task, e.site_id), [])
            lookback = CONNECTOR.task(task).lookback or timedelta(0)
            high = max((b for _, b in finished), default=None)
            if high is not None and start >= high - lookback and end <= high:
                assert end - start <= lookback, (task, start, end)  # the look-back, and no more
                continue
            assert not any(a <= start and end <= b for a, b in finished), (task, start)
    assert sum(1 for e in resumed if e.path in DETAIL_BY_PATH) >= owed


def _visible(dsn: str, run_id: str, budget: str = "2s") -> None:
    """``runs``, ``show`` (real processes) and the web page say the run ended DEADLINE and why."""
    from starlette.testclient import TestClient

    from feiqiu_etl.web import WebSettings, create_app

    runs = cli_json("runs", "--dsn", dsn)
    assert (runs[0]["run_id"], runs[0]["status"], runs[0]["exit_code"]) == (run_id, "DEADLINE", 9)
    shown = cli("show", run_id, "--dsn", dsn)
    reached = re.compile(rf"deadline {budget} \([^)]*[+-]\d\d:\d\d\) reached")  # the instant, with its offset (issue 28)
    assert shown.returncode == 0 and "DEADLINE" in shown.stdout and reached.search(shown.stdout), shown.stdout
    app = create_app(WebSettings(dsn=dsn, connector="feiqiu", task_codes=TASKS))
    with TestClient(app, base_url="http://127.0.0.1:8080") as web:
        assert 'class="badge deadline"' in web.get("/runs").text
        page = web.get(f"/runs/{run_id}").text
        assert reached.search(page) and "Why it stopped" in page
        assert web.get("/api/runs?status=DEADLINE").json()["runs"][0]["run_id"] == run_id


def _kind(entry) -> str | None:
    """``recent`` (a snapshot page, or a window that reaches into yesterday), ``history`` (a window before
    yesterday), ``snapshot detail`` (what the owed phase fetches), or None (a windowed task's detail)."""
    if entry.path in LIST_BY_PATH:
        body = entry.body or {}
        if "endTime" not in body:
            return "recent"
        return "history" if parse_local(body["endTime"]) <= YESTERDAY else "recent"
    api = DETAIL_BY_PATH.get(entry.path)
    if api is not None and CONNECTOR.task(api.parent_task).is_snapshot:
        return "snapshot detail"
    return None


def test_recent_data_comes_first_for_every_store_then_the_owed_details_then_history(pg_dsn):
    sites = (*SITES, 8640015201004419)
    with Simulator(sim_config(seed=62, days=DAYS + 1, site_ids=sites)) as sim:
        result = run_flow(sim, pg_dsn, window=False, tasks=list(TASKS), now=ANCHOR,
                          overrides={"window.initial_days": DAYS + 1, "window.lookback_hours": 0,
                                     "window.segment_days": 1, "lane.max_active_stores": 2, "run.deadline": "10m"})
        log = sorted((e for e in sim.request_log() if e.outcome == "accepted"), key=lambda e: e.started)
    assert result.status == "SUCCESS"
    kinds = [(k, e.site_id) for e in log if (k := _kind(e)) is not None]
    order = [k for k, _ in kinds]
    last_recent = max(i for i, k in enumerate(order) if k == "recent")
    first_detail = min(i for i, k in enumerate(order) if k == "snapshot detail")
    last_detail = max(i for i, k in enumerate(order) if k == "snapshot detail")
    first_history = min(i for i, k in enumerate(order) if k == "history")
    # yesterday's data of every store (three stores, two at a time) before any owed detail or history
    assert {site for k, site in kinds[:last_recent + 1] if k == "recent"} == set(sites)
    assert last_recent < first_detail <= last_detail < first_history
    # history newest to oldest, per task and store
    history = [(LIST_BY_PATH[e.path].task_code, e.site_id, e.body["startTime"]) for e in log
               if _kind(e) == "history"]
    for task in ("ODS_SETTLEMENT", "ODS_PAYMENT"):
        for site in sites:
            starts = [s for t, st, s in history if t == task and st == site]
            assert starts == sorted(starts, reverse=True) and len(starts) == 2, (task, site, starts)
    assert {t.task_code: t.status for t in result.tasks} == {t: "SUCCESS" for t in TASKS}
