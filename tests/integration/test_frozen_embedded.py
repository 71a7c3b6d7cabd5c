"""An embedded server that is already running (kept up by another process) but frozen (``SIGSTOP`` of its
postmaster and children): every command that opens it — ``runs``, ``run`` — ends with one line and exit 2 within
``db.connect_timeout`` + a few seconds instead of waiting for ever, and SIGTERM ends a ``run`` waiting for it
within 5 s (issue 21 "nothing waits unbounded")."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from clikit import PY, env_for, finish, run_args, start, wait_for
from feiqiu_etl.db.embedded import default_embedded
from feiqiu_etl.simulator import Simulator
from flowkit import sim_config
from freezekit import Freezer

CONNECT = 2


@pytest.fixture
def frozen_home(fresh_home, monkeypatch):
    """A fresh home whose embedded server this test keeps running (as another command would), frozen."""
    monkeypatch.setenv("FEIQIU_ETL_HOME", str(fresh_home))
    server = default_embedded().start()
    try:
        server.ensure_database()
        with Freezer(server) as freezer:
            freezer.freeze()
            yield fresh_home
    finally:
        server.stop()


def _embedded_run(sim) -> list[str]:
    args = run_args(sim, "-")
    at = args.index("--dsn")
    return args[:at] + args[at + 2:]


def _talks_to_the_server(pid: int) -> bool:
    """The process holds a Unix socket (it has none before it connects to the embedded server, and Linux does not
    name a client socket's peer): it waits for the server to answer."""
    try:
        return bool(psutil.Process(pid).net_connections(kind="unix"))
    except (psutil.Error, AttributeError):
        return False


def _connecting(proc) -> float:
    """When ``proc`` began talking to the server (monotonic s), or now if it ended first: a loaded machine
    spends seconds starting an interpreter before the command connects (seen: 11.2 s in all at load 30)."""
    end = time.monotonic() + 120
    while proc.poll() is None and not _talks_to_the_server(proc.pid) and time.monotonic() < end:
        time.sleep(0.02)
    return time.monotonic()


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_commands_on_a_frozen_embedded_server_end_with_one_line_within_the_connect_timeout(frozen_home):
    with Simulator(sim_config(seed=94)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(frozen_home), DB_CONNECT_TIMEOUT=str(CONNECT))
        took = {}
        for name, args in (("runs", [*PY, "runs"]), ("run", _embedded_run(sim))):
            started = time.monotonic()
            proc = start(args, env)
            began = _connecting(proc)  # the product's time: from its first connect, not from the interpreter's start
            code, _, err = finish(proc, timeout=60)
            took[name] = time.monotonic() - began
            line = _one_line(err)
            assert code == 2 and took[name] < CONNECT + 8, (name, code, took[name], err[-2000:])
            assert time.monotonic() - started < 60, (name, "a hang before or after connecting")  # a hang guard
            assert "PostgreSQL" in line and "password" not in line, line
            assert f"PostgreSQL did not answer within {CONNECT} s" in line, line  # not "cannot create database"
        assert sim.request_log() == []
    print(f"frozen embedded server, db.connect_timeout={CONNECT} s: " +
          ", ".join(f"{k} exit 2 after {v:.1f} s" for k, v in took.items()))


def test_sigterm_ends_a_run_waiting_for_a_frozen_embedded_server_within_5_s(frozen_home):
    with Simulator(sim_config(seed=95)) as sim:
        env = env_for(sim.config.token, FEIQIU_ETL_HOME=str(frozen_home), DB_CONNECT_TIMEOUT="30")
        proc = start(_embedded_run(sim), env)
        wait_for(lambda: proc.poll() is not None or _talks_to_the_server(proc.pid), timeout=120,
                 what="the run connected to the frozen server")  # a state, not a guessed 2.5 s (busy machine)
        time.sleep(0.3)
        assert proc.poll() is None
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc, timeout=60)
        took = time.monotonic() - signalled
    assert code == 5 and took < 5.0, (code, took, err[-3000:])
    assert "Traceback" not in err and "nothing was run" in err, err[-3000:]
    print(f"SIGTERM while the embedded server is frozen: exit 5 after {took:.2f} s")
