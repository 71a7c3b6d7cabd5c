"""Bounded database use (issue 19 items 1-2, issue 21 "no hang"): the lanes of a run share one bounded pool, a
pause for the database always ends (resumed or given up within ``db.unavailable_limit``), and a server that stops
answering becomes "database unavailable" instead of a hang."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from feiqiu_etl.db.connection import DbLimits, connect
from feiqiu_etl.db.health import DatabaseHealth, DatabaseUnavailable
from feiqiu_etl.pipeline import RateLimiter, RequestScheduler


def _terminate_others(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "  # gone on return
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]


def _lost_once(tries: list, statement: str):
    """An operation whose first try loses its connection (its backend terminated), then runs ``statement``."""
    def op(conn):
        tries.append(1)
        if len(tries) == 1:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        conn.execute(statement)
    return op


def _connections(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()").fetchone()[0]


def test_200_lanes_paused_by_a_flapping_database_all_resume_and_finish(pg_dsn):
    """The 200-lane hang of issue 19: lanes waiting in ``_wait_unpaused`` while nothing resumes them. Here 200 real
    lanes send while 60 writers write through a pool of 4 connections whose backends are terminated over and over
    (every termination pauses all lanes); every lane must finish its requests, nobody may stay paused, and the
    health object never holds more than the pool's 4 connections and its watchdog's probe."""
    lanes = [RequestScheduler(name=f"l{i}") for i in range(200)]
    paused_now = [0]

    def down(reason: str) -> None:
        paused_now[0] += 1
        for lane in lanes:
            lane.pause(reason)

    def up() -> None:
        paused_now[0] -= 1
        for lane in lanes:
            lane.resume()

    health = DatabaseHealth(pg_dsn, lambda dsn: connect(dsn, limits=DbLimits()), on_down=down, on_up=up,
                            limits=DbLimits(unavailable_limit=20, pool_size=4))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (writer int, n int, PRIMARY KEY (writer, n))")
    stop_killing = threading.Event()
    peak = [0]
    kills = []

    def killer() -> None:
        until = time.monotonic() + 3
        while not stop_killing.wait(0.05) and time.monotonic() < until:
            kills.append(_terminate_others(pg_dsn))
            peak[0] = max(peak[0], _connections(pg_dsn))

    def writer(w: int) -> None:
        slot = health.slot()
        for n in range(30):
            slot.run(lambda c: c.execute("INSERT INTO t VALUES (%s, %s) ON CONFLICT DO NOTHING", (w, n)))
            time.sleep(random.random() * 0.01)

    sent = [0] * len(lanes)

    def lane_thread(i: int) -> None:
        limiter = RateLimiter(0.0, 0.002)
        for _ in range(40):
            lanes[i].send(lambda: None, limiter)
            sent[i] += 1

    kill = threading.Thread(target=killer, daemon=True)
    kill.start()
    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(60)]
    threads += [threading.Thread(target=lane_thread, args=(i,), daemon=True) for i in range(len(lanes))]
    for t in threads:
        t.start()
    for t in threads[:60]:
        t.join(60)
    stop_killing.set()
    kill.join(5)
    deadline = time.monotonic() + 10  # after the last writer, the lanes finish (they are resumed)
    for t in threads[60:]:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    stats = health.statistics()
    health.close()
    assert not alive, f"{len(alive)} threads still waiting; lanes sent {sorted(set(sent))[:5]}…"
    assert sum(kills) > 0 and stats.outages > 0, (kills, stats)
    assert stats.available and stats.retrying == 0 and paused_now[0] == 0, stats
    assert sent == [40] * len(lanes)
    assert peak[0] <= 4 + 1, peak  # the pool, and the watchdog's probe (opened only while in doubt)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 60 * 30


def test_a_success_reported_while_the_lanes_are_being_paused_still_resumes_them(pg_dsn):
    """The race behind issue 19's hang, made deterministic: writer A's connection is terminated, and while the
    lanes are being paused (``on_down`` runs), writer B's statement succeeds. B's "the database is back" must not
    be spent before the pause is complete: afterwards the lane sends again."""
    lane = RequestScheduler(name="l")
    b_may_finish, b_finished = threading.Event(), threading.Event()

    def down(reason: str) -> None:
        b_may_finish.set()
        b_finished.wait(5)
        time.sleep(0.2)  # B reports its success now, in its own thread
        lane.pause(reason)

    health = DatabaseHealth(pg_dsn, lambda dsn: connect(dsn), on_down=down, on_up=lane.resume,
                            limits=DbLimits(unavailable_limit=10, pool_size=4))
    tries: list = []

    def b(conn):
        conn.execute("SELECT 1")
        b_may_finish.wait(5)
        conn.execute("SELECT 1")

    def b_thread():
        health.slot().run(b)
        b_finished.set()

    threading.Thread(target=b_thread, daemon=True).start()
    time.sleep(0.2)  # B holds its connection and waits
    health.slot().run(_lost_once(tries, "SELECT 1"))  # A
    sent = threading.Event()
    threading.Thread(target=lambda: (lane.send(lambda: None, RateLimiter(0.0, 0.0)), sent.set()), daemon=True).start()
    assert sent.wait(2), "the lane stayed paused although the database answered"
    assert len(tries) == 2 and health.statistics().available
    health.close()


def test_an_operation_that_fails_for_good_after_a_reconnect_still_resumes_the_lanes(pg_dsn):
    """Whatever ends the last retrying operation ends the pause: here its retry meets a data error."""
    lane = RequestScheduler(name="l")
    health = DatabaseHealth(pg_dsn, lambda dsn: connect(dsn), on_down=lane.pause, on_up=lane.resume,
                            limits=DbLimits(unavailable_limit=10, pool_size=2))
    calls: list = []
    with pytest.raises(psycopg.errors.DivisionByZero):
        health.slot().run(_lost_once(calls, "SELECT 1/0"))
    started = time.monotonic()
    lane.send(lambda: None, RateLimiter(0.0, 0.0))  # not paused: sends at once
    assert time.monotonic() - started < 0.5 and len(calls) == 2
    assert health.statistics().available and health.statistics().outages == 1
    health.close()


def test_a_pool_checkout_waits_within_the_limit_and_then_gives_up_with_one_line(pg_dsn, pg_server_dsn):
    """The database refuses every new connection: a checkout ends within db.unavailable_limit (and the lanes,
    paused meanwhile, are told to stop)."""
    with psycopg.connect(pg_dsn) as conn:
        name = conn.info.dbname
    gone = []
    health = DatabaseHealth(pg_dsn, lambda dsn: connect(dsn, connect_timeout=2), on_gave_up=gone.append,
                            limits=DbLimits(unavailable_limit=3, pool_size=2))
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as err:
            health.slot().run(lambda c: c.execute("SELECT 1"))
        took = time.monotonic() - started
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        health.close()
    assert 2.5 < took < 3 + 2.5, took
    assert "database unavailable for more than 3 s" in str(err.value) and "\n" not in str(err.value)
    assert gone and gone[0] == str(err.value)


def test_waiting_for_a_busy_pool_is_not_the_database_being_away_and_is_shown(pg_dsn):
    """Issue 28 item 9: 300 lanes at load ~100 all ended FAILED with "couldn't get a connection after 60 s" while
    the database was fine (the pool was merely busy). Now a checkout that waits past ``db.unavailable_limit`` for
    a pool whose connections are busy, while connects work, goes on waiting: no outage, no give-up, and the
    wait is in the statistics (and so in ``status``)."""
    from feiqiu_etl.cli.views.progress import progress_view
    from feiqiu_etl.statistics import RunStatistics

    gone = []
    health = DatabaseHealth(pg_dsn, lambda dsn: connect(dsn, connect_timeout=2), on_gave_up=gone.append,
                            limits=DbLimits(unavailable_limit=2, pool_size=1))
    holding = threading.Event()

    def hold(conn):
        holding.set()
        conn.execute("SELECT pg_sleep(4.5)")  # the only connection, busy on a live server for > 2 x the limit

    holder = threading.Thread(target=lambda: health.slot().run(hold))
    holder.start()
    try:
        assert holding.wait(30)
        seen = {}

        def look():
            while holder.is_alive():
                pool = health.statistics().pool
                if pool.get("waiting"):
                    seen.update(pool)
                time.sleep(0.1)

        looker = threading.Thread(target=look)
        looker.start()
        started = time.monotonic()
        value = health.slot().run(lambda c: c.execute("SELECT 42").fetchone()[0])
        took = time.monotonic() - started
        holder.join(30)
        looker.join(30)
        stats = health.statistics()
    finally:
        health.close()
    assert value == 42 and took > 2.0, took  # it waited past the limit ...
    assert not gone and stats.outages == 0 and not stats.gave_up and stats.available  # ... and that was no outage
    assert seen.get("waiting") == 1 and seen.get("longest_wait", 0) >= 1.0, seen
    assert stats.pool["waits"] >= 1 and stats.pool["wait_seconds"] >= 2.0, stats.pool
    line = progress_view(RunStatistics("r1", phase="ods", pool_waiting=3, pool_wait_s=75, pool_in_use=19,
                                       pool_size=19)).renderables[0].plain
    assert "3 waiting for a database connection (19/19 in use, longest " in line, line


def test_a_run_of_30_lanes_on_a_pool_of_4_whose_connections_are_terminated_ends_exact_and_bounded(pg_dsn, tmp_path):
    """The run as a whole: 30 lanes (30 tokens, one store each) share a pool of 4 connections while every backend
    of the database is terminated again and again; the run ends SUCCESS (nobody left paused), ODS is exact, and the
    run never held more than the pool + 3 connections (registry/LISTEN, lane guard, the watchdog's probe)."""
    from feiqiu_etl.simulator import Simulator
    from flowkit import CONNECTOR, expected_detail_rows, expected_rows, fleet_file, ods_rows, options, run_opts, sim_config

    sites = tuple(8640015201005000 + i for i in range(30))
    tokens = {f"fq_{i}": (site,) for i, site in enumerate(sites)}
    cfg = sim_config(seed=88, site_ids=sites, tokens=tokens, token="fq_admin", days=1)
    fleet = fleet_file(tmp_path / "fleet.yaml", {f"l{i}": (f"FQ_{i}", (site,)) for i, site in enumerate(sites)})
    tasks = ["ODS_SETTLEMENT"]  # a list and a detail per record: a batch committed but its answer lost matters here
    kills, peak = [], [0]
    with Simulator(cfg) as sim:
        stop = threading.Event()

        def killer() -> None:
            while not stop.wait(0.05):
                peak[0] = max(peak[0], _connections(pg_dsn))
                if len(kills) < 5 and len(sim.request_log()) > 60 * (len(kills) + 1):
                    kills.append(_terminate_others(pg_dsn))

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        opts = options(sim, tasks=tasks, token=None, site_ids=[], fleet_path=fleet,
                       environ={f"FQ_{i}": f"fq_{i}" for i in range(len(sites))},
                       overrides={"db.pool_size": 4, "db.unavailable_limit": 30})
        started = time.monotonic()
        result = run_opts(opts, pg_dsn)
        took = time.monotonic() - started
        stop.set()
        thread.join(5)
        assert len(kills) >= 3 and all(n > 0 for n in kills), kills
        assert result.status == "SUCCESS", result.error or result.first_reason()
        assert peak[0] <= 4 + 3, peak
        spec = CONNECTOR.task("ODS_SETTLEMENT")
        stored, details = ods_rows(pg_dsn, spec.table), ods_rows(pg_dsn, spec.detail.target_table)
        want, want_details = {}, {}
        for site in sites:
            want.update(expected_rows(sim, spec, site))
            want_details.update(expected_detail_rows(sim, spec, site))
        assert stored == want and details == want_details
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 0
    print(f"30 lanes, pool of 4, {len(kills)} rounds of terminated backends: SUCCESS in {took:.1f} s, "
          f"at most {peak[0]} connections")


def test_a_bounded_session_ends_a_statement_that_outlives_its_bound(pg_dsn):
    """The end-of-run work's connections (issue 28 item 1): the socket is shut when the bound passes, so a
    statement the server never answers (here one that sleeps past it) ends with a connection error; a session
    closed in time is left alone."""
    from feiqiu_etl.db.connection import bounded_session

    conn = bounded_session(connect(pg_dsn), 1.0)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT pg_sleep(10)")
    took = time.monotonic() - started
    conn.close()
    assert 0.8 < took < 5.0, took
    quick = bounded_session(connect(pg_dsn), 1.0)
    assert quick.execute("SELECT 1").fetchone() == (1,)
    quick.close()
    time.sleep(1.2)  # the timer fires on a closed connection: nothing happens
    assert quick.closed
