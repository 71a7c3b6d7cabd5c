"""Issue 2 acceptance: the real flow against the real simulator (HTTP over loopback) into real PostgreSQL."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from feiqiu_etl.pipeline import CancellationToken
from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, FAST, expected_detail_rows, expected_rows, lane_violations, ods_rows, run_flow, sim_config


@pytest.fixture(scope="module")
def sim():
    with Simulator(sim_config()) as s:
        yield s


def test_full_flow_loads_exactly_the_simulated_records_then_rerun_changes_nothing(sim, pg_dsn):
    sim.clear_log()
    first = run_flow(sim, pg_dsn)
    assert first.status == "SUCCESS", first.to_dict()
    log = sim.request_log()
    assert lane_violations(log, FAST["pipeline.rate_min"]) == []
    assert len(log) == sum(t.result.total_requests for t in first.tasks)
    site = sim.config.site_ids[0]
    for spec in CONNECTOR.tasks:
        want = expected_rows(sim, spec, site)
        got = ods_rows(pg_dsn, spec.table)
        assert got == want, spec.code
        if spec.detail:
            assert ods_rows(pg_dsn, spec.detail.target_table) == expected_detail_rows(sim, spec, site), spec.code
    big = [k for k in ods_rows(pg_dsn, "ods.settlement") if k[1] > 2**53]
    assert big, "the simulator should produce ids above 2^53"

    sim.clear_log()
    second = run_flow(sim, pg_dsn, overrides={"detail.recheck_share": 0.02})  # twice the default share
    assert second.status == "SUCCESS"
    for t in second.tasks:
        r = t.result
        assert (r.total_inserted, r.total_updated, r.total_deleted) == (0, 0, 0), t.task_code
        assert r.total_skipped == r.total_fetched
        assert r.detail_success == (t.recheck["used"] if t.recheck else 0)  # only the periodic re-checks
    assert second.totals()["rows_written"] == 0 and second.totals()["rows_unchanged"] == sum(
        t.result.total_fetched for t in second.tasks)  # an unchanged rerun writes nothing
    assert first.totals()["rows_written"] > 0
    rechecks = sum(t.recheck["used"] for t in second.tasks if t.recheck)
    parts = [t.recheck["budget"] + t.recheck["credit"] for t in second.tasks if t.recheck]
    # 2 % of the lane's estimated requests, in equal parts for the 3 tasks with details, each rounded down
    # (the rest is carried to the next run): never more re-checks than the share of the requests sent
    assert len(parts) == 3 and max(parts) - min(parts) < 1e-6
    assert rechecks == sum(t.recheck["budget"] for t in second.tasks if t.recheck) <= 0.02 * len(sim.request_log())
    assert sum(e.path.endswith("/detail") for e in sim.request_log()) == rechecks
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 0


def _count_all(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        tables = [t.table for t in CONNECTOR.tasks] + [t.detail.target_table for t in CONNECTOR.tasks if t.detail]
        return sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)


def test_cancel_mid_run_sends_nothing_more_and_keeps_everything_fetched(sim, pg_dsn):
    sim.clear_log()
    token = CancellationToken()
    fired: list[float] = []
    import time

    def cancel_later():
        while len(sim.request_log()) < 25:
            time.sleep(0.002)
        fired.append(time.monotonic())
        token.cancel()

    t = threading.Thread(target=cancel_later)
    t.start()
    result = run_flow(sim, pg_dsn, token=token)
    t.join()
    assert result.status == "CANCELLED"
    log = sim.request_log()
    late = [e for e in log if e.started > fired[0] + 0.001]
    assert late == [], "a request started after the cancel"
    fetched = sum(e.record_count for e in log if e.outcome == "accepted" and e.code == 0)
    assert _count_all(pg_dsn) == fetched
    assert fetched == sum(t.result.total_fetched for t in result.tasks)


def test_timeout_cancels_the_run(sim, pg_dsn):
    token = CancellationToken()
    before = len(sim.request_log())

    def time_out_once_started() -> None:  # 0.3 s after the run's first request, not after the call: on a busy
        end = time.monotonic() + 120      # machine connecting alone can take that long (CancelledEarly)
        while len(sim.request_log()) == before and time.monotonic() < end:
            time.sleep(0.01)
        token.cancel_after(0.3, "timeout")

    threading.Thread(target=time_out_once_started, daemon=True).start()
    result = run_flow(sim, pg_dsn, token=token)
    assert result.status == "CANCELLED"
    assert result.skipped  # tasks after the timeout were not started
