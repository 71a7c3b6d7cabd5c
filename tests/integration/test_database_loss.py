"""Losing the database mid-run: every connection reconnects, the lanes pause meanwhile, the failed batch
or statement runs again, and the data is exact; past ``db.unavailable_limit`` the run ends FAILED (exit 7)
with one line and its results so far."""

from __future__ import annotations

import threading
import time

import psycopg

from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, expected_detail_rows, expected_rows, ods_rows, run_flow, sim_config


def _terminate_others(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]


def test_a_run_whose_connections_are_terminated_three_times_ends_success_with_exact_data(pg_dsn):
    killed = []
    with Simulator(sim_config(seed=81)) as sim:
        stop = threading.Event()

        def killer():
            for _ in range(3):
                while not stop.is_set() and len(sim.request_log()) < 25 * (len(killed) + 1):
                    time.sleep(0.01)
                if stop.is_set():
                    return
                killed.append(_terminate_others(pg_dsn))

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        result = run_flow(sim, pg_dsn, overrides={"pipeline.rate_min": 0.03, "pipeline.rate_max": 0.04})
        stop.set()
        thread.join(5)
        site = sim.config.site_ids[0]
        assert len(killed) == 3 and all(n > 0 for n in killed), killed
        assert result.status == "SUCCESS", [(t.task_code, t.result.errors) for t in result.tasks if t.result.errors]
        for spec in CONNECTOR.tasks:
            assert ods_rows(pg_dsn, spec.table) == expected_rows(sim, spec, site), spec.code
            if spec.detail:
                assert ods_rows(pg_dsn, spec.detail.target_table) == expected_detail_rows(sim, spec, site)
    with psycopg.connect(pg_dsn) as conn:
        status, = conn.execute("SELECT status FROM etl_meta.run WHERE run_id = %s", (result.run_id,)).fetchone()
        owed, = conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()
    assert status == "SUCCESS" and owed == 0


def test_a_database_that_stays_away_fails_the_run_with_its_results_so_far(pg_dsn, pg_server_dsn):
    with Simulator(sim_config(seed=82)) as sim:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            name = admin.info.dbname

        def block_then_kill():
            while len(sim.request_log()) < 10:
                time.sleep(0.01)
            with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))

        thread = threading.Thread(target=block_then_kill, daemon=True)
        thread.start()
        started = time.monotonic()
        try:
            result = run_flow(sim, pg_dsn, overrides={"db.unavailable_limit": 3, "pipeline.rate_min": 0.03,
                                                      "pipeline.rate_max": 0.04})
        finally:
            thread.join(5)
            with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        took = time.monotonic() - started
        requests_after = len(sim.request_log())
    assert result.status == "FAILED" and result.exit_code == 7 and took < 30
    assert "database unavailable for more than 3 s" in result.error
    assert 10 <= requests_after < 20  # the lanes paused instead of fetching rows they could not store
    assert result.to_dict()["tasks"]  # the results so far


def test_an_embedded_server_killed_mid_run_is_started_again_and_the_run_ends_exact(fresh_home):
    import json
    import os
    import signal
    import subprocess
    import sys

    from clikit import env_for, finish, run_args, start, wait_for

    with Simulator(sim_config(seed=83)) as sim:
        args = run_args(sim, "-", "--tasks", "ODS_SETTLEMENT", gaps=(0.05, 0.06))
        i = args.index("--dsn")
        del args[i:i + 2]  # the embedded server of the home, started (and revived) by the run itself
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = start(args, env)
        wait_for(lambda: len(sim.request_log()) >= 15, timeout=60, what="the run's requests")
        pid = int((fresh_home / "pgdata" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        code, data, err = finish(proc, timeout=180)
        want = len(expected_rows(sim, CONNECTOR.task("ODS_SETTLEMENT"), sim.config.site_ids[0]))
    assert code == 0 and data["status"] == "SUCCESS", err[-1500:]
    assert "starting it again" in err
    # the server it started again was stopped at the end like the first one (no server left running)
    assert not (fresh_home / "pgdata" / "postmaster.pid").exists()
    counted = subprocess.run([sys.executable, "-m", "feiqiu_etl", "sql", "--json",
                              "SELECT count(*) AS n FROM ods.settlement"], capture_output=True, text=True, env=env)
    assert json.loads(counted.stdout) == [{"n": want}], counted.stderr
