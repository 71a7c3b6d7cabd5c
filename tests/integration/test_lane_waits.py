"""Waits the upstream demands bind the lane (a Retry-After on a request's last attempt holds the next request
of any task), and a cancel aborts a stalled request at once (real simulator, real processes)."""

from __future__ import annotations

import signal
import time

import psycopg

from clikit import env_for, finish, run_args, start, wait_for
from feiqiu_etl.simulator import Simulator
from flowkit import run_flow, sim_config


def test_a_retry_after_on_the_last_attempt_holds_the_next_request_of_another_task(pg_dsn):
    with Simulator(sim_config(seed=71)) as sim:
        sim.inject(path="/api/payment/list", kind="http429", count=3, retry_after=2)
        result = run_flow(sim, pg_dsn, tasks=["ODS_PAYMENT", "ODS_REFUND"], overrides={"api.retry_attempts": 3})
        log = sorted(sim.request_log(), key=lambda e: e.started)
    payment = {t.task_code: t.result for t in result.tasks}["ODS_PAYMENT"]
    assert payment.request_failures == 1 and payment.rate_limited == 3
    last_429 = max(e.ended for e in log if e.path == "/api/payment/list")
    refund = min(e.started for e in log if e.path == "/api/refund/list")
    assert refund - last_429 >= 2.0 - 0.01  # the demanded wait binds the lane, not the request
    with psycopg.connect(pg_dsn) as conn:  # the timeline keeps the gap drawn beside the gap waited
        rows = conn.execute("SELECT task, gap, drawn, wait_reason FROM etl_meta.run_request WHERE run_id = %s "
                            "ORDER BY started_at, seq", (result.run_id,)).fetchall()
    assert rows and all(drawn is not None and drawn >= 0 for _, _, drawn, _ in rows)
    first_refund = next(r for r in rows if r[0] == "ODS_REFUND")
    assert first_refund[3] == "retry-after" and first_refund[1] >= 2.0 - 0.01  # the hold, not ...
    assert 0.02 <= first_refund[2] <= 0.028 + 1e-6  # ... the gap drawn (flowkit's 20-28 ms)
    assert all(gap >= drawn - 0.01 for _, gap, drawn, _ in rows if gap is not None)  # waited at least the draw


def test_sigterm_during_a_stalled_response_exits_within_two_seconds(pg_dsn):
    with Simulator(sim_config(seed=72)) as sim:
        sim.inject(path="/api/settlement/list", kind="stall", count=1, stall_seconds=25)
        proc = start(run_args(sim, pg_dsn, "--tasks", "ODS_MEMBER,ODS_SETTLEMENT,ODS_PAYMENT",
                              settings={"api.timeout": 30}), env_for(sim.config.token))
        members = len(sim.dataset.records("ODS_MEMBER", sim.config.site_ids[0]))
        wait_for(lambda: sum(1 for e in sim.request_log() if e.path == "/api/member/detail") >= members,
                 timeout=60, what="the member task")  # the settlement list goes out next, and stalls
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, data, err = finish(proc, timeout=30)
        took = time.monotonic() - sent
    assert code == 5 and took < 2.0, (took, err[-500:])
    assert data["status"] == "CANCELLED"
    settlement = {t["task"]: t for t in data["tasks"]}["ODS_SETTLEMENT"]
    assert settlement["total_fetched"] == 0 and settlement["windows"]  # nothing of it arrived; it stays owed



def test_a_lane_with_no_progress_is_reported_stalled_in_status_and_the_log(pg_dsn):
    """The run control's watchdog: a response that stalls for 10 s with ``run.stall_after`` = 2 makes the lane
    report ``stalled_for`` in the live status (what ``status`` and the web page show), and the log says when it
    stalled and when it moved again."""
    import io

    from rich.console import Console

    from clikit import cli_json
    from feiqiu_etl.cli.views.status import render_status

    with Simulator(sim_config(seed=73)) as sim:
        sim.inject(path="/api/settlement/list", kind="stall", count=1, stall_seconds=10)
        proc = start(run_args(sim, pg_dsn, "--tasks", "ODS_SETTLEMENT", settings={"api.timeout": 30,
                                                                                 "run.stall_after": 2}),
                     env_for(sim.config.token))

        def stalled():
            runs = cli_json("status", "--dsn", pg_dsn)
            lanes = runs[0]["live"]["lanes"] if runs and runs[0].get("live") else []
            return runs if any(lane.get("stalled_for") for lane in lanes) else None

        runs = wait_for(stalled, timeout=30, every=0.2, what="a stalled lane in status")
        code, data, err = finish(proc, timeout=60)
    lane = runs[0]["live"]["lanes"][0]
    assert lane["name"] == "default" and lane["stalled_for"] > 2 and lane["current"]["in_flight"]
    shown = io.StringIO()
    render_status(runs, Console(file=shown, width=120))  # what `status` printed for it
    assert "default: ODS_SETTLEMENT" in shown.getvalue() and "stalled: no progress for" in shown.getvalue()
    assert code == 0 and data["status"] == "SUCCESS", err[-800:]
    assert "lane default: no progress for" in err and "waiting for the upstream's response" in err
    assert "lane default: moving again" in err


def test_a_released_lane_is_free_at_once_for_the_next_run(pg_dsn):
    """The next run of a token (a Dagster step its pool starts the moment the last one ended) finds the lane free
    the moment release() returns: the guard unlocks explicitly before it closes its session (closing alone frees
    the locks only once the server has ended the backend)."""
    import psycopg

    from feiqiu_etl.db.schema import ensure_schemas
    from feiqiu_etl.registry.lane_guard import LaneGuard, lock_key

    with psycopg.connect(pg_dsn, connect_timeout=5) as conn:
        ensure_schemas(conn)
    for attempt in range(20):
        guard = LaneGuard(pg_dsn, f"r{attempt}", connect=lambda dsn: psycopg.connect(dsn, connect_timeout=5))
        guard.acquire("north", "feiqiu:north")
        guard.release()
        with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=5) as conn:
            free = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key("feiqiu:north"),)).fetchone()[0]
            assert free, f"attempt {attempt}: the lane was still held right after release()"
            conn.execute("SELECT pg_advisory_unlock_all()")
