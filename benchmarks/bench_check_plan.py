"""A plan that knows a new store (issue 27.2): the first run's plan after ``feiqiu-etl check`` against the requests
the run sent, for a new ``small`` and a new ``medium`` simulator store; and the plan before the check (the
contract's lower bound) for comparison.

For each scale: a new warehouse (a database of its own), one store with ``--days`` of history; ``plan`` (no history,
no size: basis ``contract``); ``check`` (one page-1 per list endpoint: the sizes recorded); ``plan`` again (basis
``check``); the first run (ODS, incremental: ``window.initial_days`` = ``--days``) — all in this process, with
tiny gaps and the simulator's risk control off (only request counts matter here). Target: within ±30 %.

Usage: python benchmarks/bench_check_plan.py [--days 7] [--output FILE]   (starts its own PostgreSQL; ~1 min)
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import psycopg

from benchlib import emit
from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.pipeline import CancellationToken
from feiqiu_etl.plan import RunOptions
from feiqiu_etl.runner.check import run_check
from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring
from feiqiu_etl.app.database import connector_for
from feiqiu_etl.app.planning import plan_run, prepare_inputs
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

ANCHOR = datetime(2024, 3, 4)
GAP = 0.002


def one(scale: str, days: int, server, seed: int) -> list[str]:
    cfg = SimulatorConfig(seed=seed, scale=scale, days=days, anchor=ANCHOR, risk=RiskControlConfig(enabled=False))
    name = f"bench_check_{scale}"
    create_database(server.dsn("postgres"), name, drop_first=True)
    dsn = server.dsn(name)
    settings = {"pipeline.rate_min": GAP, "pipeline.rate_max": GAP, "pipeline.ods_group_package.rate_min": GAP,
                "pipeline.ods_group_package.rate_max": GAP, "window.initial_days": days,
                "pipeline.batch_timeout": 0.2, "detail.recheck_share": 0}
    with Simulator(cfg) as sim:
        opts = RunOptions(api_base=sim.base_url, token=cfg.token, site_ids=list(cfg.site_ids), overrides=settings,
                          unsafe_gaps=True, load_dwd=False, now=ANCHOR, environ={})
        inputs = prepare_inputs(opts)
        with psycopg.connect(dsn) as conn:
            before = plan_run(inputs, conn, now=ANCHOR)
        t0 = time.monotonic()
        checked = run_check(inputs, dsn, connect=connector_for(10.0))
        check_s = time.monotonic() - t0
        check_requests = len(sim.request_log())
        with psycopg.connect(dsn) as conn:
            after = plan_run(inputs, conn, now=ANCHOR)
        sim.clear_log()
        t0 = time.monotonic()
        result = FlowRunner(after, dsn, cancellation=CancellationToken(), wiring=RunnerWiring(heartbeat=0.5)).run()
        run_s = time.monotonic() - t0
        sent = len(sim.request_log())
    plan_before = sum(lane.estimate_requests for lane in before.lanes)
    plan_after = sum(lane.estimate_requests for lane in after.lanes)
    bases = sorted({t.estimate.basis for lane in after.lanes for t in lane.tasks})
    error = (plan_after - sent) / sent
    out = [f"{scale} store (new, {days} days of history), first run {result.status}: {sent} requests in {run_s:.1f} s",
           f"  check: exit {checked.verdict()[0]}, {check_requests} requests in {check_s:.1f} s, "
           f"{checked.sizes_recorded} sizes recorded",
           f"  plan before check (basis contract): {plan_before} requests: {(plan_before - sent) / sent:+.1%}",
           f"  plan after check (basis {', '.join(bases)}): {plan_after} requests: {error:+.1%} "
           f"({'within' if abs(error) <= 0.30 else 'OUTSIDE'} ±30 %)"]
    per_task = []
    for lane in after.lanes:
        for t in lane.tasks:
            per_task.append(f"{t.code} {t.estimate.requests}")
    out.append("  plan after check per task: " + ", ".join(per_task))
    print("\n".join(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7, help="history and first load, days (default 7)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    head = [f"command: python benchmarks/bench_check_plan.py {shlex.join(sys.argv[1:])}".rstrip(),
            f"gaps {GAP:g} s, risk control off (unsafe gaps on purpose: request counts, not time); "
            f"anchor {ANCHOR:%Y-%m-%d %H:%M}, re-check share 0", ""]
    print("\n".join(head), flush=True)
    body: list[str] = []
    with temporary_server(prefix="fq-bench-check-pg-") as server:
        for seed, scale in ((17, "small"), (23, "medium")):
            body += one(scale, args.days, server, seed) + [""]
    emit("\n".join(head + body), args.output)


if __name__ == "__main__":
    main()
