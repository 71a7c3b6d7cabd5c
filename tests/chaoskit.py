"""The chaos harness: run the real CLI against the simulator under a fault, then (when asked) one clean rerun,
and compare ODS and DWD with the simulator's data. Used by ``benchmarks/chaos_matrix.py`` (every cell) and by
``tests/integration/test_chaos_subset.py`` (a fast subset).

A cell reports: runs made, records lost (expected list/detail rows missing or different in ODS), records
duplicated (rows in ODS that the upstream does not have, or more DWD fact rows than ODS rows), owed details
left, SCD2 invariant violations (warehouse-model §4.3), the statuses and exit codes, and tracebacks seen.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import psycopg

from dwd_support import scd2_violations
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.tasks.dwd import load_dwd_mapping
from flowkit import ANCHOR, CONNECTOR, FAST, expected_detail_rows, expected_rows, ods_rows, sim_config

MAPPING = load_dwd_mapping()
GAPS = {**FAST, "pipeline.rate_min": 0.02, "pipeline.rate_max": 0.03, "api.timeout": 2, "api.retry_attempts": 4,
        "db.unavailable_limit": 45}


@dataclass
class Context:
    sim: Simulator
    server: object
    dsn: str
    proc: subprocess.Popen | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class CellResult:
    name: str
    runs: int = 0
    lost: int = 0
    duplicated: int = 0
    owed: int = 0
    scd2: int = 0
    statuses: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    tracebacks: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.lost == self.duplicated == self.owed == self.scd2 == self.tracebacks == 0

    def row(self) -> str:
        return (f"| {self.name} | {self.runs} | {self.lost} | {self.duplicated} | {self.owed} | {self.scd2} | "
                f"{', '.join(self.statuses)} | {', '.join(map(str, self.exit_codes))} | {self.tracebacks} | "
                f"{'; '.join(self.notes)} |")


HEADER = ("| cell | runs | lost | duplicated | owed details | SCD2 violations | statuses | exit codes | tracebacks | "
          "notes |\n|---|---|---|---|---|---|---|---|---|---|")


def cli_args(ctx: Context, extra: dict | None = None) -> list[str]:
    sets = [f"--set={k}={v}" for k, v in {**GAPS, **(extra or {})}.items()]
    return [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", ctx.sim.base_url, "--site-id",
            str(ctx.sim.config.site_ids[0]), "--dsn", ctx.dsn, "--json", "--no-progress", "--unsafe-gaps",
            "--window-start", fmt(ANCHOR - timedelta(days=ctx.sim.config.days)), "--window-end", fmt(ANCHOR), *sets]


def launch(ctx: Context, extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "FEIQIU_API_TOKEN": ctx.sim.config.token}
    ctx.proc = subprocess.Popen(cli_args(ctx, extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                text=True)
    return ctx.proc


def collect(proc: subprocess.Popen, result: CellResult, timeout: float = 180) -> dict | None:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        result.notes.append("timed out")
    result.runs += 1
    result.exit_codes.append(proc.returncode)
    result.tracebacks += err.count("Traceback (most recent call last)")
    try:
        data = json.loads(out) if out.strip() else None
    except ValueError:
        data = None
    result.statuses.append(data["status"] if data else ("killed" if proc.returncode == -9 else "-"))
    return data


def wait_requests(sim: Simulator, n: int, proc: subprocess.Popen | None = None, timeout: float = 60) -> bool:
    end = time.monotonic() + timeout
    while len(sim.request_log()) < n and time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.005)
    return len(sim.request_log()) >= n


def verify(ctx: Context, result: CellResult) -> None:
    site = ctx.sim.config.site_ids[0]
    for spec in CONNECTOR.tasks:
        pairs = [(expected_rows(ctx.sim, spec, site), ods_rows(ctx.dsn, spec.table))]
        if spec.detail:
            pairs.append((expected_detail_rows(ctx.sim, spec, site), ods_rows(ctx.dsn, spec.detail.target_table)))
        for want, got in pairs:
            result.lost += sum(1 for k, v in want.items() if got.get(k) != v)
            result.duplicated += sum(1 for k in got if k not in want)
    with psycopg.connect(ctx.dsn) as conn:
        result.owed += conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0]
        exists = {r[0] for r in conn.execute("SELECT table_schema || '.' || table_name FROM information_schema.tables "
                                             "WHERE table_schema = 'dwd'")}
        for t in MAPPING.tables:
            if t.target not in exists:
                result.lost += 1
                result.notes.append(f"{t.target} missing")
                continue
            if t.is_dimension:
                result.scd2 += len(scd2_violations(conn, t.target.split(".")[1], list(t.business_key)))
                current = conn.execute(f"SELECT count(*) FROM {t.target} WHERE is_current").fetchone()[0]
                live = conn.execute(f"SELECT count(*) FROM {t.source} WHERE NOT is_deleted").fetchone()[0]
                result.lost += max(0, live - current)
                result.duplicated += max(0, current - live)
            else:
                facts = conn.execute(f"SELECT count(*) FROM {t.target}").fetchone()[0]
                source = conn.execute(f"SELECT count(*) FROM {t.source}").fetchone()[0]
                result.lost += max(0, source - facts)
                result.duplicated += max(0, facts - source)


def fresh_database(server, name: str) -> str:
    from feiqiu_etl.db.embedded import create_database

    create_database(server.dsn("postgres"), name, drop_first=True)
    return server.dsn(name)


def run_cell(name: str, server, fault: Callable[[Context], None], *, seed: int = 7, rerun: bool = True,
             sim_kwargs: dict | None = None, extra: dict | None = None, database: str | None = None,
             timeout: float = 180) -> CellResult:
    """One cell: a faulty run (``fault(ctx)`` starts it with :func:`launch` and disturbs it), then one clean
    rerun when ``rerun`` (or when the faulty run did not end SUCCESS), then :func:`verify`."""
    result = CellResult(name)
    dsn = fresh_database(server, database or f"chaos_{abs(hash(name)) % 10**8}_{seed}")
    with Simulator(sim_config(seed=seed, **(sim_kwargs or {}))) as sim:
        ctx = Context(sim, server, dsn)
        try:
            fault(ctx)
            first = collect(ctx.proc, result, timeout) if ctx.proc is not None else None
            result.notes.extend(ctx.notes)
            if rerun or not first or first.get("status") != "SUCCESS":
                ctx.sim.faults.clear()
                collect(launch(ctx, extra), result)
            verify(ctx, result)
        finally:
            if ctx.sim is not sim:
                ctx.sim.stop()
    return result


# ------------------------------------------------------------------------------------------------ faults
def kill_at(seconds: float) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        proc = launch(ctx)
        time.sleep(seconds)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        else:
            ctx.notes.append("ended before the kill")
    return fault


def signal_after(requests: int, *signals: int) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        proc = launch(ctx)
        wait_requests(ctx.sim, requests, proc)
        for sig in signals:
            if proc.poll() is None:
                proc.send_signal(sig)
                time.sleep(0.05)
    return fault


def timeout_after(seconds: float) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        env = {**os.environ, "FEIQIU_API_TOKEN": ctx.sim.config.token}
        ctx.proc = subprocess.Popen([*cli_args(ctx), "--timeout", str(seconds)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, text=True)
    return fault


def terminate_connections(times: int, every: int = 25) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        proc = launch(ctx)
        name = psycopg.conninfo.conninfo_to_dict(ctx.dsn)["dbname"]
        for i in range(times):
            if not wait_requests(ctx.sim, every * (i + 1), proc):
                ctx.notes.append(f"ended after {i} kills")
                return
            with psycopg.connect(ctx.server.dsn("postgres"), autocommit=True) as conn:
                n = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                                 (name,)).fetchone()[0]
            ctx.notes.append(f"terminated {n}")
    return fault


def restart_server(down_seconds: float = 2.0, mode: int = signal.SIGINT) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        from feiqiu_etl.db.embedded import EmbeddedPostgres

        proc = launch(ctx)
        wait_requests(ctx.sim, 30, proc)
        pid = int((ctx.server.pgdata / "postmaster.pid").read_text().split()[0])  # the live postmaster
        os.kill(pid, mode)  # SIGINT: pg_ctl stop -m fast; SIGQUIT: -m immediate
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        time.sleep(down_seconds)
        restarted = EmbeddedPostgres(ctx.server.pgdata).start()  # same data folder, same socket, same DSN
        import atexit

        atexit.unregister(restarted.stop)  # the harness's own server object stops it at the end
        ctx.notes.append(f"server down {down_seconds:.0f} s")
    return fault


def restart_simulator(down_seconds: float = 1.0) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        proc = launch(ctx)
        wait_requests(ctx.sim, 30, proc)
        port = int(ctx.sim.base_url.rsplit(":", 1)[1])
        ctx.sim.stop()
        time.sleep(down_seconds)
        from dataclasses import replace

        # the same seed and history: the same data, as a real upstream would have after a restart
        ctx.sim = Simulator(replace(ctx.sim.config, port=port)).start()
        ctx.notes.append(f"simulator down {down_seconds:.0f} s")
    return fault


def inject(kind: str, count: int, path: str | None = None, **kw) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        ctx.sim.inject(path=path, kind=kind, count=count, **kw)
        launch(ctx)
    return fault


def injections(*faults: tuple) -> Callable[[Context], None]:
    def fault(ctx: Context) -> None:
        for kind, count, path, kw in faults:
            ctx.sim.inject(path=path, kind=kind, count=count, **kw)
        launch(ctx)
    return fault


def disk_full(fill_seconds: float = 3.0) -> Callable[[Context], None]:
    """Fill the filesystem of the server's data folder while the run writes, then free it."""
    def fault(ctx: Context) -> None:
        proc = launch(ctx)
        wait_requests(ctx.sim, 20, proc)
        ballast = ctx.server.pgdata.parent / "ballast"
        try:
            with open(ballast, "wb") as fh:
                block = b"\0" * (1 << 20)
                while True:
                    fh.write(block)
                    fh.flush()
        except OSError:
            pass
        ctx.notes.append("disk filled")
        time.sleep(fill_seconds)
        ballast.unlink(missing_ok=True)
    return fault


def random_moments(n: int, low: float, high: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return sorted(round(rng.uniform(low, high), 2) for _ in range(n))


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t
