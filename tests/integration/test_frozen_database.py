"""A database that stops answering (issue 21 item 2): ``SIGSTOP`` of a real PostgreSQL started here — its postmaster
and every child — while a real ``feiqiu-etl run`` process uses it. The run ends FAILED with exit 7 within
``db.unavailable_limit`` + 15 s and prints its ``--json``; its record, which the frozen database could not take,
is written by the next command once the database answers again (and ``runs`` says it was recorded late);
SIGTERM ends it within 5 s, a second signal at once; frozen while the run starts, the same; a rerun loses nothing.
"""

from __future__ import annotations

import signal
import time

import httpx
import psycopg
import pytest

from clikit import cli_json, env_for, finish, run_args, signal_twice, start, wait_for
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.simulator import Simulator
from freezekit import Freezer
from webkit import WebServer
from flowkit import CONNECTOR, expected_detail_rows, expected_rows, ods_rows, sim_config

LIMIT = 5
BOUNDS = {"db.unavailable_limit": LIMIT, "db.connect_timeout": 2}


@pytest.fixture(scope="module")
def private_pg():
    """A PostgreSQL server of this module's own: freezing it stops no other test."""
    with temporary_server(prefix="feiqiu-frozen-pg-") as server:
        yield server


@pytest.fixture
def dsn(private_pg, request):
    name = f"f_{request.node.name[-20:].lower().replace('[', '_').replace(']', '')}_{int(time.time() * 1000) % 100000}"
    create_database(private_pg.dsn("postgres"), name)
    return private_pg.dsn(name)


def _run(sim, dsn: str, *extra: str, bounds: dict = BOUNDS):
    return run_args(sim, dsn, *extra, settings=bounds, gaps=(0.05, 0.06))


def _frozen_run(sim, dsn: str, env: dict, freezer: Freezer, bounds: dict = BOUNDS):
    """A run started, and its database frozen after 20 more requests (~2 s into it)."""
    before = len(sim.request_log())
    proc = start(_run(sim, dsn, bounds=bounds), env)
    wait_for(lambda: len(sim.request_log()) >= before + 20, timeout=60, what="the run's requests")
    freezer.freeze()
    return proc


def _recorded(dsn: str, env: dict, run_id: str) -> dict:
    runs = {r["run_id"]: r for r in cli_json("runs", "--dsn", dsn, env=env)}
    return runs[run_id]


def _exact(sim, dsn: str) -> None:
    site = sim.config.site_ids[0]
    for spec in CONNECTOR.tasks:
        assert ods_rows(dsn, spec.table) == expected_rows(sim, spec, site), spec.code
        if spec.detail:
            assert ods_rows(dsn, spec.detail.target_table) == expected_detail_rows(sim, spec, site), spec.code


def test_a_run_whose_database_freezes_ends_exit_7_in_time_and_is_recorded_when_it_answers_again(
        private_pg, dsn, fresh_home):
    with Simulator(sim_config(seed=91)) as sim, Freezer(private_pg) as freezer:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = _frozen_run(sim, dsn, env, freezer)
        code, data, err = finish(proc, timeout=LIMIT + 60)
        took = time.monotonic() - freezer.at
        sent_frozen = len(sim.request_log())
        freezer.thaw()
        assert code == 7 and took < LIMIT + 15, (code, took, err[-2000:])
        assert data["status"] == "FAILED" and data["exit_code"] == 7, err[-2000:]
        assert f"database unavailable for more than {LIMIT} s" in data["error"]
        assert "Traceback" not in err and "record is kept" in err
        record = _recorded(dsn, env, data["run_id"])  # the next command writes the kept record
        assert record["status"] == "FAILED" and record["exit_code"] == 7 and record["recorded_late_at"]
        assert not list((fresh_home / "late-records").glob("*.json"))
        rerun = start(_run(sim, dsn), env)
        code, again, err = finish(rerun, timeout=120)
        assert code == 0 and again["status"] == "SUCCESS", err[-2000:]
        _exact(sim, dsn)
    print(f"frozen 2 s into the run ({sent_frozen} requests): exit 7 after {took:.1f} s (limit {LIMIT} s)")


def test_sigterm_while_the_database_is_frozen_ends_the_run_within_5_s_and_a_second_signal_at_once(
        private_pg, dsn, fresh_home):
    with Simulator(sim_config(seed=92)) as sim, Freezer(private_pg) as freezer:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = _frozen_run(sim, dsn, env, freezer)
        time.sleep(1.0)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, data, err = finish(proc, timeout=60)
        took = time.monotonic() - signalled

        freezer.thaw()
        second = _frozen_run(sim, dsn, env, freezer)  # the same with a second signal: it ends at once
        time.sleep(1.0)
        code2, err2, took2 = signal_twice(second)
        freezer.thaw()
    assert code == 5 and took < 5.0, (code, took, err[-6000:])
    assert data["status"] == "CANCELLED" and "Traceback" not in err
    assert code2 == 130 and took2 < 1.0 and "aborting now" in err2, (code2, took2, err2[-1000:])
    print(f"SIGTERM during the freeze: exit {code} after {took:.2f} s; a second signal: exit 130 after {took2:.2f} s")


def test_sigterm_during_the_freeze_ends_the_run_within_5_s_with_the_default_connect_timeout_and_retention(
        private_pg, dsn, fresh_home):
    """The end-of-run work (retention, the alerts' history) waits for no frozen database after a signal: the
    default ``db.connect_timeout`` (10 s) and ``run.retention_days`` set change nothing."""
    bounds = {"db.unavailable_limit": LIMIT, "run.retention_days": 30}
    with Simulator(sim_config(seed=96)) as sim, Freezer(private_pg) as freezer:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = _frozen_run(sim, dsn, env, freezer, bounds)
        time.sleep(1.0)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, data, err = finish(proc, timeout=60)
        took = time.monotonic() - signalled
    assert code == 5 and took < 5.0, (code, took, err[-6000:])
    assert data["status"] == "CANCELLED" and "Traceback" not in err
    print(f"SIGTERM during the freeze (db.connect_timeout 10 s, retention on): exit {code} after {took:.2f} s")


def test_a_database_that_freezes_while_the_run_starts_ends_it_exit_7_with_its_json(private_pg, dsn, fresh_home):
    """The run waits for the DDL lock (held here) when the server freezes: it is in its start-up, planning."""
    with Simulator(sim_config(seed=93)) as sim, Freezer(private_pg) as freezer:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        holder = psycopg.connect(dsn, autocommit=True)
        holder.execute("SELECT pg_advisory_lock(hashtext('feiqiu_etl.ddl'))")
        watcher = psycopg.connect(dsn, autocommit=True)
        proc = start(_run(sim, dsn), env)
        wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                 .fetchone()[0], timeout=60, what="the run waiting for the DDL lock")
        watcher.close()
        freezer.freeze()
        code, data, err = finish(proc, timeout=LIMIT + 60)
        took = time.monotonic() - freezer.at
        freezer.thaw()
        holder.close()
        assert code == 7 and took < LIMIT + 15, (code, took, err[-2000:])
        assert data["status"] == "FAILED" and data["exit_code"] == 7 and data["tasks"] == [], err[-2000:]
        assert "database unavailable while preparing the run" in data["error"] and "Traceback" not in err
        assert sim.request_log() == []  # nothing was requested
        record = _recorded(dsn, env, data["run_id"])
        assert record["status"] == "FAILED" and record["recorded_late_at"]
    print(f"frozen during start-up: exit 7 after {took:.1f} s (limit {LIMIT} s)")


def test_metrics_and_pages_answer_503_within_6_s_while_the_database_is_frozen_and_work_again_after(private_pg, dsn):
    """``/metrics`` and the web's other reads are bounded client-side (the server-side ``statement_timeout`` never
    fires on a frozen server): 503 within ``read_timeout`` (5 s) + 1, and the next scrape after the thaw works."""
    with WebServer(dsn) as web, Freezer(private_pg) as freezer:
        assert httpx.get(web.url + "/metrics", timeout=10).status_code == 200
        freezer.freeze()
        took = {}
        for path in ("/metrics", "/api/runs", "/metrics"):
            began = time.monotonic()
            answer = httpx.get(web.url + path, timeout=60)
            took.setdefault(path, []).append(time.monotonic() - began)
            assert answer.status_code == 503 and took[path][-1] < 6.5, (path, answer.status_code, took)
        freezer.thaw()
        began = time.monotonic()
        answer = httpx.get(web.url + "/metrics", timeout=30)
        after = time.monotonic() - began
        assert answer.status_code == 200 and "feiqiu_etl_runs" in answer.text and after < 5, (after, answer.text[:500])
        lines = "".join(web.lines)
    assert "Traceback" not in lines, lines[-3000:]
    print(f"frozen database: /metrics 503 after {took['/metrics'][0]:.1f} s, again {took['/metrics'][1]:.1f} s, "
          f"/api/runs 503 after {took['/api/runs'][0]:.1f} s; after the thaw 200 in {after:.2f} s")
