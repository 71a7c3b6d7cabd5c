"""The CLI as a separate process: SIGINT cancels gracefully (exit 5, data kept); SIGKILL at several points
then a rerun gives the same ODS content as an uninterrupted run (resume from the gaps)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
import pytest

from feiqiu_etl.simulator import Simulator
from feiqiu_etl.connector.windows import fmt, local_now
from flowkit import CONNECTOR, FAST, SIM_RISK, ods_rows, run_flow

RESUME = {"window.initial_days": 3, "window.lookback_hours": 0, "window.segment_days": 0.5}


@pytest.fixture(scope="module")
def live_sim():
    """A simulator whose history ends now, so that incremental (no-window) runs see all of it."""
    from feiqiu_etl.simulator import SimulatorConfig

    cfg = SimulatorConfig(seed=31, scale="small", days=2, anchor=local_now() - timedelta(minutes=5), risk=SIM_RISK)
    with Simulator(cfg) as sim:
        yield sim


def _cli(sim, dsn: str, *extra: str) -> subprocess.Popen:
    sets = [f"--set={k}={v}" for k, v in {**FAST, **RESUME}.items()]
    env = {**os.environ, "FEIQIU_API_TOKEN": sim.config.token}
    cmd = [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url,
           "--site-id", str(sim.config.site_ids[0]), "--dsn", dsn, "--no-dwd", "--json", "--unsafe-gaps", *sets, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def _wait_requests(sim, n: int, proc: subprocess.Popen, deadline: float = 60) -> float:
    end = time.monotonic() + deadline
    while len(sim.request_log()) < n:
        assert proc.poll() is None, f"process ended early: {proc.stderr.read()}"
        assert time.monotonic() < end, "timed out waiting for requests"
        time.sleep(0.003)
    return time.monotonic()


def _expected(sim) -> dict:
    site = sim.config.site_ids[0]
    start = fmt(sim.config.anchor - timedelta(days=sim.config.days))
    out = {}
    for spec in CONNECTOR.tasks:
        records = (sim.dataset.records(spec.code, site) if spec.kind == "snapshot"
                   else sim.dataset.window(spec.code, site, start, fmt(sim.config.anchor)))
        out[spec.table] = {(site, *(k.convert(r[k.field]) for k in spec.keys)): r for r in records}
        if spec.detail:
            d = spec.detail
            rows = {}
            for r in records:
                for row in sim.dataset.detail_rows(spec.code, site, r[d.id_column]):
                    row = {d.parent.field: r[d.id_column], **row}
                    rows[(site, *(k.convert(row[k.field]) for k in d.keys))] = row
            out[d.target_table] = rows
    return out


def _fetched_rows(dsn: str) -> int:
    tables = [t.table for t in CONNECTOR.tasks] + [t.detail.target_table for t in CONNECTOR.tasks if t.detail]
    with psycopg.connect(dsn) as conn:
        return sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)


def test_sigint_cancels_gracefully_and_keeps_fetched_data(live_sim, pg_dsn):
    live_sim.clear_log()
    proc = _cli(live_sim, pg_dsn)
    _wait_requests(live_sim, 30, proc)
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    result = json.loads(out)
    assert result["status"] == "CANCELLED"
    assert "fq_" not in out + err  # the token never leaks
    log = live_sim.request_log()
    assert [e for e in log if e.started > signalled + 0.05] == []
    fetched = sum(e.record_count for e in log if e.outcome == "accepted" and e.code == 0)
    assert _fetched_rows(pg_dsn) == fetched == sum(t["total_fetched"] for t in result["tasks"])


@pytest.mark.parametrize("kill_after", [6, 30, 70])
def test_sigkill_then_rerun_equals_uninterrupted_run(live_sim, pg_dsn, kill_after):
    live_sim.clear_log()
    proc = _cli(live_sim, pg_dsn)
    _wait_requests(live_sim, kill_after, proc)
    proc.kill()
    proc.wait(timeout=30)
    killed_requests = len(live_sim.request_log())
    live_sim.clear_log()
    t0 = time.monotonic()
    result = run_flow(live_sim, pg_dsn, window=False, overrides=RESUME)
    resume_seconds = time.monotonic() - t0
    assert result.status == "SUCCESS", [t.result.errors for t in result.tasks if t.result.errors]
    expected = _expected(live_sim)
    for table, rows in expected.items():
        assert ods_rows(pg_dsn, table, live_only=False) == rows, table  # no loss, no duplicate, nothing deleted
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 0
    print(f"kill after {kill_after} (sent {killed_requests}): resume {resume_seconds:.2f} s, "
          f"{len(live_sim.request_log())} requests")


def test_a_failed_first_segment_is_fetched_by_the_next_incremental_run(live_sim, pg_dsn):
    site = live_sim.config.site_ids[0]
    settings = {**RESUME, "window.initial_days": 2, "window.segment_days": 1}  # a whole day: never empty
    live_sim.inject(path="/api/payment/list", kind="http500", count=3)  # the first segment's only attempts
    first = run_flow(live_sim, pg_dsn, window=False, tasks=["ODS_PAYMENT"], overrides=settings)
    assert first.status == "PARTIAL"
    start, end = first.tasks[0].windows[0]
    assert live_sim.dataset.window("ODS_PAYMENT", site, start, end), "the failed segment must hold payments"
    second = run_flow(live_sim, pg_dsn, window=False, tasks=["ODS_PAYMENT"], overrides=settings)
    assert second.status == "SUCCESS"
    assert second.tasks[0].windows and second.tasks[0].windows[0] == first.tasks[0].windows[0]
    since_horizon = live_sim.dataset.window("ODS_PAYMENT", site, start, fmt(live_sim.config.anchor))
    spec = CONNECTOR.task("ODS_PAYMENT")
    assert ods_rows(pg_dsn, "ods.payment") == {(site, *(k.convert(r[k.field]) for k in spec.keys)): r
                                               for r in since_horizon}


def test_an_explicit_window_into_the_future_is_checkpointed_only_up_to_now(live_sim, pg_dsn):
    start = fmt(local_now() - timedelta(days=1))
    end = fmt(local_now() + timedelta(days=2))
    before = local_now()
    result = run_flow(live_sim, pg_dsn, window=False, tasks=["ODS_PAYMENT"], overrides=RESUME,
                      window_start=start, window_end=end)
    assert result.status == "SUCCESS"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET TIME ZONE 'Asia/Shanghai'")
        ends = [r[0].replace(tzinfo=None) for r in conn.execute(
            "SELECT window_end FROM etl_meta.window_progress WHERE task_code = 'ODS_PAYMENT'")]
    assert ends and max(ends) <= local_now() and max(ends) >= before
    # so an incremental run tomorrow still fetches everything after this run
    from feiqiu_etl.connector.windows import Window, plan_incremental

    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET TIME ZONE 'Asia/Shanghai'")
        done = [Window(a.replace(tzinfo=None), b.replace(tzinfo=None)) for a, b in conn.execute(
            "SELECT window_start, window_end FROM etl_meta.window_progress WHERE task_code = 'ODS_PAYMENT'")]
    tomorrow = local_now() + timedelta(days=1)
    plan = plan_incremental(tomorrow, done, lookback=timedelta(0), initial=timedelta(days=2))
    assert plan[-1].end == tomorrow and plan[-1].start <= local_now()


@pytest.mark.parametrize("delay", [0.15, 0.6])  # importing; imported but no run handler yet
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_cli_is_still_importing_ends_in_one_line(sig, delay):
    import subprocess
    import sys

    silent = socket.socket()  # a database that never answers: the command waits in its connect timeout
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    dsn = f"postgresql://x@127.0.0.1:{silent.getsockname()[1]}/x?connect_timeout=20"
    proc = subprocess.Popen([sys.executable, "-m", "feiqiu_etl", "runs", "--dsn", dsn],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def caught() -> bool:  # our launcher has installed its handlers (before that the OS default would kill it)
        try:
            mask = next(line for line in open(f"/proc/{proc.pid}/status") if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return False
        return bool(int(mask.split()[1], 16) & (1 << (signal.SIGTERM - 1)))

    deadline = time.monotonic() + 20
    while not caught() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay - 0.15)  # 0: still importing; 0.45 s later: imported, no run handler yet
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    silent.close()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 5 and len(err.strip().splitlines()) == 1, (proc.returncode, err)


# The CLI with its output held until the test says so (a file appears): the window between the run's recorded
# end and the process's exit, where a signal used to become a KeyboardInterrupt (exit 5, "interrupted").
_HELD = """
import os, sys, time
import feiqiu_etl.cli.run as command
shown = command.emit
def held(result, as_json):
    open(os.environ["HOLD_UNTIL"] + ".held", "w").close()
    end = time.monotonic() + 60
    while not os.path.exists(os.environ["HOLD_UNTIL"]) and time.monotonic() < end:
        time.sleep(0.02)
    shown(result, as_json)
command.emit = held
from feiqiu_etl.launcher import main
sys.argv[0] = "feiqiu-etl"
main()
"""


@pytest.mark.parametrize("when", ["recorded", "printing"])
def test_a_signal_after_the_run_recorded_success_exits_as_success(live_sim, pg_dsn, tmp_path, when):
    """Adversarial trial: a SIGTERM landing after the run's DWD load finished exited 5 ("interrupted: stopped
    before finishing") while the run was recorded SUCCESS. The exit code agrees with the record, and stderr says
    the signal came after the end — sent as soon as the registry says SUCCESS (the run is finishing: it said
    "cancelling", although nothing was), or while the result is being printed (it exited 5)."""
    go = tmp_path / "go"
    sets = [f"--set={k}={v}" for k, v in {**FAST, **RESUME}.items()]
    env = {**os.environ, "FEIQIU_API_TOKEN": live_sim.config.token, "HOLD_UNTIL": str(go)}
    cmd = [sys.executable, "-c", _HELD, "run", "--api-base", live_sim.base_url, "--site-id",
           str(live_sim.config.site_ids[0]), "--dsn", pg_dsn, "--tasks", "ODS_PAYMENT", "--dwd-tables",
           "dwd.dwd_payment", "--json", "--unsafe-gaps", "--no-progress", *sets]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    end = time.monotonic() + 240  # a hang guard; the run takes seconds
    status = None
    while status is None:
        assert proc.poll() is None, f"process ended early: {proc.communicate()}"
        assert time.monotonic() < end, "the run never recorded its end"
        time.sleep(0.05)
        with contextlib.suppress(psycopg.Error), psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT status, exit_code FROM etl_meta.run WHERE finished_at IS NOT NULL").fetchone()
            status = row and tuple(row)
    assert status == ("SUCCESS", 0)
    while when == "printing" and not (tmp_path / "go.held").exists():
        assert proc.poll() is None and time.monotonic() < end, f"never reached the output: {proc.communicate()}"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the handler runs in the held process meanwhile
    go.touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "SUCCESS"
    assert "interrupted" not in err and "cancelling" not in err
    assert f"signal after run {json.loads(out)['run_id']} had ended SUCCESS: nothing is cancelled, exiting as it " \
           "ended (exit 0)" in err
