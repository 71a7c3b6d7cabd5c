"""The embedded server does not outlive its users (issue 21 item 11): after ``kill -9`` of the run that started
it, its watcher stops it within seconds; while another command still uses it, it stays. A frozen embedded server
(``SIGSTOP``) does not hold a signalled run up: SIGTERM ends it within 5 s, a second signal at once, and the
server, asked to stop without waiting, shuts down as soon as it continues."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from clikit import env_for, finish, run_args, signal_twice, start, wait_for
from feiqiu_etl.simulator import Simulator
from flowkit import sim_config


def _embedded_run(sim, *extra: str) -> list[str]:
    args = run_args(sim, "-", *extra, gaps=(0.05, 0.06))
    i = args.index("--dsn")
    del args[i:i + 2]  # the embedded server of the home, started by the run itself
    return args


def _postmaster(home) -> psutil.Process | None:
    try:
        pid = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
        proc = psutil.Process(pid)
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def _gone_within(proc: psutil.Process, seconds: float) -> float | None:
    started = time.monotonic()
    while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() - started < seconds:
        time.sleep(0.1)
    return None if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE else time.monotonic() - started


def test_after_kill_9_of_the_run_that_started_it_the_server_stops_unless_another_command_uses_it(fresh_home):
    import json

    with Simulator(sim_config(seed=95)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        # 1. nobody else uses it: the server's watcher stops it
        proc = start(_embedded_run(sim, "--tasks", "ODS_SETTLEMENT,ODS_MEMBER"), env)
        wait_for(lambda: len(sim.request_log()) >= 5, timeout=60, what="the run's requests")
        server = _postmaster(fresh_home)
        proc.kill()
        proc.wait(10)
        alone = _gone_within(server, 10)

        # 2. another command uses it meanwhile (a `sql` session that sleeps 4 s): it stays until that one leaves
        before = len(sim.request_log())
        proc = start(_embedded_run(sim, "--tasks", "ODS_SETTLEMENT,ODS_MEMBER"), env)
        wait_for(lambda: len(sim.request_log()) >= before + 5, timeout=60, what="the second run's requests")
        server2 = _postmaster(fresh_home)
        other = subprocess.Popen([sys.executable, "-m", "feiqiu_etl", "sql", "SELECT pg_sleep(4)"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        users = fresh_home / "pgdata" / ".handle_pids.json"
        wait_for(lambda: users.exists() and other.pid in json.loads(users.read_text() or "[]"), timeout=30,
                 what="the sql command joining the server")
        proc.kill()
        proc.wait(10)
        time.sleep(2.5)  # more than twice the watcher's interval
        alive_while_used = server2.is_running()
        out, err = other.communicate(timeout=60)
        after_other = _gone_within(server2, 10)
    assert alone is not None and alone < 5.0, alone
    assert alive_while_used, "the server stopped while another command used it"
    assert other.returncode == 0, err
    assert after_other is not None and after_other < 5.0, after_other
    assert not (fresh_home / "pgdata" / "postmaster.pid").exists()
    print(f"after kill -9 of its only user, the embedded server stopped within {alone:.1f} s")


def test_a_frozen_embedded_server_does_not_hold_a_signal_up_and_stops_when_it_continues(fresh_home):
    with Simulator(sim_config(seed=96)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = start(_embedded_run(sim, "--set", "db.unavailable_limit=5", "--set", "db.connect_timeout=2"), env)
        wait_for(lambda: len(sim.request_log()) >= 10, timeout=60, what="the run's requests")
        server = _postmaster(fresh_home)
        frozen = [server, *server.children(recursive=True)]
        for p in frozen:
            p.send_signal(signal.SIGSTOP)
        try:
            time.sleep(1.0)
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code, data, err = finish(proc, timeout=60)
            took = time.monotonic() - signalled
        finally:
            for p in frozen:
                if p.is_running():
                    p.send_signal(signal.SIGCONT)
        thawed = time.monotonic()
        while server.is_running() and time.monotonic() - thawed < 15:
            time.sleep(0.1)
        stopped_after = time.monotonic() - thawed
    assert code == 5 and took < 5.0, (code, took, err[-2000:])
    assert data["status"] == "CANCELLED" and "Traceback" not in err
    assert not server.is_running() and stopped_after < 10, stopped_after
    print(f"frozen embedded server: SIGTERM → exit after {took:.2f} s; server gone {stopped_after:.1f} s after it "
          "continued")


def test_a_second_signal_leaves_at_once_and_the_server_it_started_stops_without_it(fresh_home):
    with Simulator(sim_config(seed=97)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(fresh_home))
        proc = start(_embedded_run(sim), env)
        wait_for(lambda: len(sim.request_log()) >= 10, timeout=60, what="the run's requests")
        server = _postmaster(fresh_home)
        code, err, took = signal_twice(proc, gap=0.2)
        gone = _gone_within(server, 10)
    assert code == 130 and took < 1.0 and "aborting now" in err, (code, took, err[-1000:])
    assert gone is not None and gone < 10, gone
