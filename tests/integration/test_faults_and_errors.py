"""Faults the gateway and the service inject (upstream-api.md §2), bad configuration and bad credentials."""

from __future__ import annotations

import os
import subprocess
import time
import sys

import psycopg
import pytest

from feiqiu_etl.pipeline import CancellationToken
from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, FAST, SERVER_CLOCK_SLACK, expected_detail_rows, expected_rows, lane_violations, ods_rows, run_flow, sim_config

SETTLEMENT = CONNECTOR.task("ODS_SETTLEMENT")


@pytest.fixture
def sim():
    with Simulator(sim_config(seed=5)) as s:
        yield s


def test_transient_faults_are_retried_inside_the_lane(sim, pg_dsn):
    """(A 42901 is retried too, but teaches the lane a floor of whole seconds for the rest of the run; that is
    tested in test_risk_control.py and test_lane_sharing.py.)"""
    site = sim.config.site_ids[0]
    for kind in ("http500", "http502", "http503", "http504", "code50001"):
        sim.inject(path="/api/settlement/list", kind=kind, count=1)
    sim.inject(path="/api/settlement/detail", kind="http429", count=1, retry_after=1)
    sim.inject(path="/api/settlement/detail", kind="stall", count=1, stall_seconds=0.8)
    result = run_flow(sim, pg_dsn, tasks=["ODS_SETTLEMENT"], overrides={"api.timeout": 0.5, "api.retry_attempts": 6})
    assert result.lanes[0].statistics.floors == {}  # a gateway 429 teaches no floor
    assert result.status == "SUCCESS", result.to_dict()
    assert ods_rows(pg_dsn, "ods.settlement") == expected_rows(sim, SETTLEMENT, site)
    assert ods_rows(pg_dsn, "ods.settlement_item") == expected_detail_rows(sim, SETTLEMENT, site)
    log = sim.request_log()
    kinds = sorted(e.fault for e in log if e.fault is not None and e.fault != "stall")
    assert kinds == sorted(["http500", "http502", "http503", "http504", "code50001", "http429"])
    # (the stalled request's own log entry may land late: its client gave up after 0.5 s)
    # strictly serial from the server's point of view, even around the stall and the retries
    assert lane_violations(log, FAST["pipeline.rate_min"]) == []
    after_429 = [b for a, b in zip(log, log[1:]) if a.http_status == 429]
    assert after_429 and all(b.started - a.ended >= 1.0 - SERVER_CLOCK_SLACK
                             for a, b in zip(log, log[1:]) if a.http_status == 429)


def test_failed_detail_is_recorded_and_fetched_by_the_next_run(sim, pg_dsn):
    site = sim.config.site_ids[0]
    sim.inject(path="/api/settlement/detail", kind="code50001", count=3)  # exhausts the 3 attempts once
    first = run_flow(sim, pg_dsn, tasks=["ODS_SETTLEMENT"])
    r = first.tasks[0].result
    assert first.status == "PARTIAL" and r.detail_failure == 1 and r.request_failures == 1 == len(r.errors)
    assert ods_rows(pg_dsn, "ods.settlement") == expected_rows(sim, SETTLEMENT, site)  # the parent is kept
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 1
    sim.clear_log()
    second = run_flow(sim, pg_dsn, tasks=["ODS_SETTLEMENT"])
    assert second.status == "SUCCESS"
    assert second.tasks[0].result.detail_success == 1  # only the owed detail
    assert ods_rows(pg_dsn, "ods.settlement_item") == expected_detail_rows(sim, SETTLEMENT, site)


def test_invalid_token_fails_the_run_after_one_request(sim, pg_dsn):
    from flowkit import options, run_opts

    opts = options(sim)
    opts.token = "fq_wrong"
    result = run_opts(opts, pg_dsn)
    assert result.status == "FAILED"
    assert len(sim.request_log()) == 1
    assert len(result.skipped) == len(CONNECTOR.tasks) - 1
    assert "fq_wrong" not in repr(result.to_dict())


def test_unauthorised_store_fails_only_that_store(pg_dsn):
    allowed, other = 8640015201004417, 8640015201009999
    cfg = sim_config(site_ids=(allowed, other), tokens={"fq_one_store": (allowed,)})
    with Simulator(cfg) as s:
        from flowkit import options, run_opts

        opts = options(s, tasks=["ODS_PAYMENT", "ODS_REFUND"])
        opts.token, opts.site_ids = "fq_one_store", [allowed, other]
        result = run_opts(opts, pg_dsn)
    statuses = {(t.site_id, t.task_code): t.result.status for t in result.tasks}
    assert statuses[(allowed, "ODS_PAYMENT")] == statuses[(allowed, "ODS_REFUND")] == "SUCCESS"
    assert statuses[(other, "ODS_PAYMENT")] == "FAILED"
    assert [s["task"] for s in result.skipped] == ["ODS_REFUND"]
    stores = {s.site_id: s for s in result.lanes[0].stores}
    assert stores[other].status == "FAILED" and "40103" in stores[other].reason
    assert stores[allowed].status == "SUCCESS"
    assert result.status == "PARTIAL"  # the refused store fails alone


@pytest.mark.parametrize("args,message", [
    (["--set", "pipeline.rate_min=30"], "rate_min"),
    (["--set", "pipeline.workers=0"], "workers"),
    (["--set", "pipeline.wrokers=2"], "unknown configuration key"),
    (["--tasks", "ODS_NOPE"], "unknown task"),
    (["--window-start", "2024-13-01 00:00:00", "--window-end", "2024-03-02 00:00:00"], "--window-start: month 13 is not 01..12"),
    (["--window-start", "2024-03-01 00:00:00"], "go together"),
    (["--connector", "/nonexistent.yaml"], "cannot read connector"),
    (["--site-id", "abc"], "--site-id"),
    (["--api-base", "ftp://x"], "http"),
    (["--api-base", "http://[::1"], "--api-base is no valid URL"),  # adversarial trial: was exit 1, internal error
    (["--api-base", "http://127.0.0.1:8765/ x"], "whitespace or a control character"),  # sent requests (404)
    (["--api-base", "http://127.0.0.1:99999"], "Port out of range"),
])
def test_bad_configuration_exits_2_with_one_line_before_any_request(sim, args, message):
    env = {**os.environ, "FEIQIU_API_TOKEN": sim.config.token, "ETL_DB_DSN": "postgresql://unused.invalid/db"}
    base = ["--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0])]
    if args[0] in ("--site-id", "--api-base"):
        base = ["--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0])]
        base[base.index(args[0]) + 1] = args[1]
        args = []
    proc = subprocess.run([sys.executable, "-m", "feiqiu_etl", "run", *base, *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert sim.request_log() == []


def test_unreachable_database_is_a_one_line_config_error_without_leaking_the_password(sim):
    env = {**os.environ, "FEIQIU_API_TOKEN": sim.config.token,
           "ETL_DB_DSN": "postgresql://etl:s3cret-pw@127.0.0.1:1/warehouse?connect_timeout=2"}
    proc = subprocess.run([sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url,
                           "--site-id", str(sim.config.site_ids[0])], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot connect to PostgreSQL" in lines[0]
    assert "s3cret-pw" not in proc.stderr + proc.stdout
    assert sim.request_log() == []


def test_timeouts_never_make_two_requests_overlap_at_the_server(sim, pg_dsn):
    sim.inject(path="/api/payment/list", kind="stall", count=3, stall_seconds=0.45)
    result = run_flow(sim, pg_dsn, tasks=["ODS_PAYMENT", "ODS_REFUND"], overrides={"api.timeout": 0.25})
    statuses = {t.task_code: t.result.status for t in result.tasks}
    assert statuses == {"ODS_PAYMENT": "PARTIAL", "ODS_REFUND": "SUCCESS"}
    time.sleep(0.5)  # let the last stalled response finish so that its log entry is complete
    log = sorted(sim.request_log(), key=lambda e: e.started)
    assert [e for e in log if e.outcome == "rejected"] == []
    assert all(b.started >= a.ended - SERVER_CLOCK_SLACK for a, b in zip(log, log[1:]))


def test_unreachable_api_is_failed_not_partial(pg_dsn):
    from flowkit import options, run_opts

    with Simulator(sim_config(seed=5)) as sim:
        opts = options(sim, tasks=["ODS_PAYMENT", "ODS_REFUND"], overrides={"api.retry_attempts": 1})
    opts.api_base = "http://127.0.0.1:9"  # nothing listens there
    result = run_opts(opts, pg_dsn)
    assert result.status == "FAILED"
