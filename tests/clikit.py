"""Helpers for tests that drive the CLI as real processes (cross-process lane guard, cancel, status)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

from datetime import timedelta

from feiqiu_etl.connector.windows import fmt
from flowkit import ANCHOR, FAST

PY = [sys.executable, "-m", "feiqiu_etl"]


def run_args(sim, dsn: str, *extra: str, site: int | None = None, settings: dict | None = None,
             gaps: tuple[float, float] | None = None, window: bool = True, dwd: bool = False) -> list[str]:
    """``feiqiu-etl run`` against ``sim`` over its whole history (FAST gaps unless ``gaps``: below the
    upstream's minimum on purpose, hence ``--unsafe-gaps``), ODS only unless ``dwd``."""
    values = {**FAST, **(settings or {})}
    if gaps is not None:
        values.update({"pipeline.rate_min": gaps[0], "pipeline.rate_max": gaps[1]})
    sets = [f"--set={k}={v}" for k, v in values.items()]
    span = ["--window-start", fmt(ANCHOR - timedelta(days=sim.config.days)), "--window-end", fmt(ANCHOR)] if window else []
    return [*PY, "run", "--api-base", sim.base_url, "--site-id", str(site or sim.config.site_ids[0]), "--dsn", dsn,
            *([] if dwd else ["--no-dwd"]), "--json", "--unsafe-gaps", "--no-progress", *span, *sets, *extra]


def env_for(token: str, **more: str) -> dict:
    return {**os.environ, "FEIQIU_API_TOKEN": token, **more}


def start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, dict | None, str]:
    out, err = proc.communicate(timeout=timeout)
    try:
        data = json.loads(out) if out.strip() else None
    except ValueError:
        data = None
    return proc.returncode, data, err


def signal_twice(proc: subprocess.Popen, gap: float = 0.3) -> tuple[int, str, float]:
    """SIGTERM, and another ``gap`` s later: ``(exit code, stderr, seconds from the second signal to the exit)``."""
    import signal

    proc.send_signal(signal.SIGTERM)
    time.sleep(gap)
    second = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc, timeout=30)
    return code, err, time.monotonic() - second


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *args], capture_output=True, text=True, env=env or dict(os.environ), timeout=timeout)


def cli_json(*args: str, env: dict | None = None, timeout: float = 60):
    proc = cli(*args, "--json", env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_for(predicate: Callable[[], object], timeout: float = 30, every: float = 0.02, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def held_upstream(sim, after: int, step: float = 1.0) -> Iterator[threading.Event]:
    """A slow upstream until the test lets go: once ``sim`` has logged ``after`` requests, each accepted request
    waits inside the simulator (at most ``step`` s: far below the run's ``api.timeout``, so nothing fails) until
    the yielded event is set. A run holding its lane then outlasts however long another process takes to start
    on a loaded machine, instead of a guessed duration (issue 28 item 8)."""
    release = threading.Event()
    service = sim.service
    accepted = service._accepted

    def held(*args, **kwargs):
        if not release.is_set() and len(sim.request_log()) >= after:
            release.wait(step)
        return accepted(*args, **kwargs)

    service._accepted = held
    try:
        yield release
    finally:
        release.set()
        service._accepted = accepted


def waiting_for_a_lane(dsn: str) -> bool:
    """A session of ``dsn``'s database has tried a lane's lock and holds none: a run refused its lane at least
    once and still polling for it (the lane guard's ``pg_try_advisory_lock``, every 0.25 s)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> "
            "pg_backend_pid() AND a.query LIKE 'SELECT pg_try_advisory_lock(%' AND NOT EXISTS (SELECT 1 FROM "
            "pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)").fetchone()[0] > 0


def running_run(dsn: str, timeout: float = 30) -> dict:
    """The first RUNNING run of the database at ``dsn`` (from ``feiqiu-etl status --json``)."""
    return wait_for(lambda: (cli_json("status", "--dsn", dsn) or [None])[0], timeout, every=0.1, what="a running run")


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed on stderr (asserts there is exactly one, and no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def open_folder(fresh_home) -> "Iterator[object]":
    """A folder next to ``fresh_home`` every account can write to (so only the database server's privileges
    decide whether a program it runs can write there); removed afterwards. Use as a fixture body."""
    import shutil

    folder = fresh_home.with_name(fresh_home.name + "-out")
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
