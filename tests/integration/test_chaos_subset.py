"""A fast subset of the chaos matrix (benchmarks/chaos_matrix.py): kill -9 at three moments, the run's
connections terminated, the server crashed (stopped ``immediate``) and restarted, a response stalled past
the timeout. Each ends exact — 0 records lost or duplicated,
0 owed details, 0 SCD2 violations, no traceback — after at most one clean rerun."""

from __future__ import annotations

import pytest

import signal

from chaoskit import inject, kill_at, restart_server, run_cell, terminate_connections


@pytest.fixture(scope="module")
def chaos_server():
    from feiqiu_etl.db.embedded import temporary_server

    with temporary_server("fq-chaos-test-") as server:
        yield server


@pytest.mark.parametrize("moment", [0.8, 2.5, 4.5])
def test_kill_9_then_one_rerun_is_exact(chaos_server, moment):
    result = run_cell(f"kill -9 at {moment}", chaos_server, kill_at(moment), seed=int(moment * 10))
    assert result.exact, result
    assert result.statuses[-1] == "SUCCESS" and result.exit_codes[-1] == 0


def test_terminated_connections_end_success_without_a_rerun(chaos_server):
    result = run_cell("connections terminated", chaos_server, terminate_connections(2), rerun=False)
    assert result.exact, result
    assert result.statuses == ["SUCCESS"] and result.exit_codes == [0], result


def test_a_server_crash_and_restart_ends_success_without_a_rerun(chaos_server):
    # An immediate stop discards WAL not yet flushed: a batch commit that returned must already be durable, as
    # the run goes on after it reconnects (asynchronous batch commits lost rows here).
    result = run_cell("server crashed", chaos_server, restart_server(1, signal.SIGQUIT), rerun=False)
    assert result.exact, result
    assert result.statuses == ["SUCCESS"] and result.exit_codes == [0], result


def test_a_stalled_response_then_one_rerun_is_exact(chaos_server):
    result = run_cell("stall", chaos_server, inject("stall", 1, "/api/settlement/list", stall_seconds=4))
    assert result.exact, result
    assert result.tracebacks == 0 and result.statuses[-1] == "SUCCESS"
