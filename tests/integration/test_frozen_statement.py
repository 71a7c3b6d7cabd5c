"""A database that freezes *inside* a writer's statement (issue 28 item 1): every writer statement of the run
sleeps in the server (a statement trigger with ``pg_sleep`` on every ODS table, installed here), the test waits
until one is in flight, picks a random moment in it and freezes the server (``SIGSTOP`` of its postmaster and
every child). At each of 10 random points the run ends exit 7 within ``db.unavailable_limit`` + 5 s — or, at
the points where the test sends SIGTERM 1 s into the freeze, exit 5 within 5 s of the signal — with its
``--json`` and no traceback; after the last point, a clean rerun (the trigger dropped) is exact.

Before: a freeze that landed during ``OdsWriter._upsert``'s read of its result kept the run alive past 117 s with
``db.unavailable_limit`` 60 s, and SIGTERM then took 22 s; one backend stopped alone hung the run for ever. Kept cheap: a 4 s limit, one server, one database loaded once, four tasks."""

from __future__ import annotations

import random
import signal
import time

import psutil
import psycopg
import pytest

from clikit import env_for, finish, run_args, start, wait_for
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, expected_detail_rows, expected_rows, ods_rows, sim_config
from freezekit import Freezer

LIMIT = 4
BOUNDS = {"db.unavailable_limit": LIMIT, "db.connect_timeout": 2}
POINTS = 10
SIGTERM_AT = {1, 3, 5, 7, 9}  # of the 10 points: SIGTERM 1 s into the freeze instead of waiting for the limit
SLEEP = 0.4  # s every writer statement spends in the server
SEED = 128
TASKS = "ODS_MEMBER,ODS_SETTLEMENT,ODS_PAYMENT,ODS_GOODS"  # a few tasks, some with details: the runs stay short


@pytest.fixture(scope="module")
def private_pg():
    with temporary_server(prefix="feiqiu-frozen-stmt-") as server:
        yield server


@pytest.fixture(scope="module")
def loaded(private_pg, tmp_path_factory):
    """One database of this module's server, loaded once by a clean run (the tables exist, the data is exact);
    every test leaves it exact again."""
    create_database(private_pg.dsn("postgres"), "frozen_stmt")
    dsn = private_pg.dsn("frozen_stmt")
    home = tmp_path_factory.mktemp("frozen-stmt-home")
    with Simulator(sim_config(seed=SEED)) as sim:
        code, _, err = finish(start(_args(sim, dsn), env_for(sim.config.token, FEIQIU_ETL_HOME=str(home))),
                              timeout=180)
    assert code == 0, err[-2000:]
    return dsn, home


def _args(sim, dsn: str, bounds: dict = BOUNDS) -> list[str]:
    return run_args(sim, dsn, "--tasks", TASKS, settings=bounds, gaps=(0.02, 0.03))


def _tables(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
                                           "WHERE schemaname = 'ods'").fetchall()]


def _slow_writes(dsn: str, on: bool) -> None:
    """Every INSERT/UPDATE statement on an ODS table sleeps ``SLEEP`` s in the server (or no more)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE OR REPLACE FUNCTION public.slow_write() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN PERFORM pg_sleep({SLEEP}); RETURN NULL; END $$")
        for table in _tables(dsn):
            conn.execute(f"DROP TRIGGER IF EXISTS slow_write ON {table}")
            if on:
                conn.execute(f"CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON {table} "
                             "FOR EACH STATEMENT EXECUTE FUNCTION public.slow_write()")


def _arm(dsn: str, statements: int, seconds: float) -> None:
    """The next ``statements`` INSERT/UPDATE statements on an ODS table sleep ``seconds`` s in the server each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.freeze_arm")  # read only by the trigger: no lock is taken
        conn.execute("CREATE TABLE public.freeze_arm (n int NOT NULL, seconds float8 NOT NULL)")
        conn.execute("INSERT INTO public.freeze_arm VALUES (%s, %s)", (statements, seconds))
        conn.execute("DROP SEQUENCE IF EXISTS public.freeze_seq")
        conn.execute("CREATE SEQUENCE public.freeze_seq")  # nextval is outside transactions: no lock either
        conn.execute("CREATE OR REPLACE FUNCTION public.armed_write() RETURNS trigger LANGUAGE plpgsql AS $$ "
                     "DECLARE a record; BEGIN SELECT * INTO a FROM public.freeze_arm; "
                     "IF nextval('public.freeze_seq') <= a.n THEN PERFORM pg_sleep(a.seconds); END IF; "
                     "RETURN NULL; END $$")
        for table in _tables(dsn):
            conn.execute(f"DROP TRIGGER IF EXISTS armed_write ON {table}")
            if statements:
                conn.execute(f"CREATE TRIGGER armed_write BEFORE INSERT OR UPDATE ON {table} "
                             "FOR EACH STATEMENT EXECUTE FUNCTION public.armed_write()")


def _sleeping_pid(watch: psycopg.Connection) -> int | None:
    row = watch.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                        "AND datname = current_database() AND pid <> pg_backend_pid()").fetchone()
    return row[0] if row else None


def _in_sleep(watch: psycopg.Connection) -> int:
    return watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                         "AND datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]


def _exact(sim, dsn: str) -> None:
    site = sim.config.site_ids[0]
    for spec in (t for t in CONNECTOR.tasks if t.code in TASKS.split(",")):
        assert ods_rows(dsn, spec.table) == expected_rows(sim, spec, site), spec.code
        if spec.detail:
            assert ods_rows(dsn, spec.detail.target_table) == expected_detail_rows(sim, spec, site), spec.code


@pytest.mark.timeout(900)  # a hang guard: 10 runs, each a process start (~20 s apiece at load 14)
def test_a_freeze_inside_a_writer_statement_at_10_random_points_ends_each_run_in_time_and_loses_nothing(
        private_pg, loaded):
    rng = random.Random(2028)
    dsn, home = loaded
    timings = []
    began = time.monotonic()
    with Simulator(sim_config(seed=SEED)) as sim, Freezer(private_pg) as freezer:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(home))
        args = _args(sim, dsn)
        _slow_writes(dsn, on=True)
        for point in range(POINTS):
            statement = rng.randint(1, 2)   # the 1st or 2nd writer statement seen in flight
            into = rng.uniform(0.0, SLEEP * 0.6)  # how far into it
            with psycopg.connect(dsn, autocommit=True) as watch:
                # the last point's backend, thawed, may still sleep: its statement is no point of this run
                wait_for(lambda: _in_sleep(watch) == 0, timeout=60, what="no statement left in flight")
                proc = start(args, env)
                seen, last = 0, False
                deadline = time.monotonic() + 120
                while seen < statement and time.monotonic() < deadline and proc.poll() is None:
                    now = _in_sleep(watch) > 0
                    seen += 1 if now and not last else 0
                    last = now
                    time.sleep(0.005)
            assert seen >= statement, (point, proc.poll(), "no writer statement in flight")
            time.sleep(into)
            freezer.freeze()
            if point in SIGTERM_AT:
                time.sleep(1.0)
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code, data, err = finish(proc, timeout=120)
                took, bound, want = time.monotonic() - signalled, 5.0, 5
            else:
                code, data, err = finish(proc, timeout=LIMIT + 120)
                took, bound, want = time.monotonic() - freezer.at, LIMIT + 5.0, 7
            freezer.thaw()
            timings.append((point, statement, round(into, 2), "SIGTERM" if want == 5 else "limit", code,
                            round(took, 2)))
            assert code == want and took < bound, (timings[-1], err[-4000:])
            assert data is not None and data["exit_code"] == want and "Traceback" not in err, err[-3000:]
        _slow_writes(dsn, on=False)
        code, again, err = finish(start(args, env), timeout=180)
        assert code == 0 and again["status"] == "SUCCESS", err[-2000:]
        _exact(sim, dsn)
    print(f"frozen inside a writer statement, {POINTS} points in {time.monotonic() - began:.1f} s "
          "(point, statement, s into it, end, exit, s to exit):")
    for row in timings:
        print("  ", row)


@pytest.mark.parametrize("signalled", [False, True], ids=["goes-on", "sigterm"])
def test_one_frozen_backend_while_the_server_answers_is_dropped_past_its_bound(loaded, signalled):
    """Only the writer's backend stops (``SIGSTOP`` of that one process): the heartbeat and every other session
    still answer, so "nothing answers" never holds, and no server-side timeout can end the frozen statement.
    Before, the run waited for ever. Now the writer's operation is dropped past its client-side bound
    (``db.statement_timeout`` + the stall), retried on another connection, and the run completes, exact; a SIGTERM
    in that state ends it within 5 s."""
    dsn, home = loaded
    statement_timeout = 3
    bounds = {**BOUNDS, "db.statement_timeout": statement_timeout}
    bound = statement_timeout + 2  # + the stall of a 4 s limit (2 s at least)
    with Simulator(sim_config(seed=SEED)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(home))
        args = _args(sim, dsn, bounds)
        _arm(dsn, 1, 2.0)  # the next writer statement sleeps 2 s: its backend is stopped meanwhile
        with psycopg.connect(dsn, autocommit=True) as watch:
            proc = start(args, env)
            pid = wait_for(lambda: _sleeping_pid(watch) or proc.poll() is not None, timeout=120,
                           what="the writer's statement in flight")
        assert pid is not True, "the run ended before its writer slept"
        backend = psutil.Process(pid)
        backend.suspend()
        stopped = time.monotonic()
        try:
            if signalled:
                time.sleep(1.0)
                signalled_at = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code, data, err = finish(proc, timeout=120)
                took = time.monotonic() - signalled_at
            else:
                code, data, err = finish(proc, timeout=bound + 120)
                took = time.monotonic() - stopped
        finally:
            backend.resume()
        _arm(dsn, 0, 0)
        assert "Traceback" not in err and data is not None, err[-3000:]
        if signalled:
            assert code == 5 and took < 5.0, (code, took, err[-4000:])
        else:
            assert code == 0 and data["status"] == "SUCCESS", (code, err[-4000:])
            assert "dropping its connection" in err and f"more than its bound of {bound} s" in err, err[-3000:]
            _exact(sim, dsn)
    print(f"one backend stopped in a writer statement ({'SIGTERM 1 s later' if signalled else 'left stopped'}): "
          f"exit {code} after {took:.2f} s (bound {bound} s)")
