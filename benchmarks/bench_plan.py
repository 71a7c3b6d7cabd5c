"""A plan that knows (issue 20.4): the plan's request estimate for the first run of a new fleet, and the live ETA.

A fleet of ``--tokens`` lanes with one ``medium`` store each (the contract's lower-bound volumes, upstream-api.md
§4.1) on the simulator, no history: ``plan`` estimates every task from the connector's documented volumes
(``expected_rows`` / ``expected_daily_rows``); then the run, in this process, with tiny gaps (``--gap``; risk
control off: only lane time matters here, not the upstream's floor). Prints, per lane and in all:

* requests estimated by the plan (``basis=contract``) and — for comparison — by the catalog alone (one page per
  window segment or snapshot, details unknown: the behaviour before), against the requests sent;
* the live ETA: at 25 %, 50 % and 75 % of the run's wall time, the end it predicted (elapsed + ``eta_s`` of
  ``FlowRunner.statistics()``, whose remaining requests come from each running task's ``live_estimate``: page
  1's ``total``) against the actual end.

Usage: python benchmarks/bench_plan.py [--tokens 3] [--days 7] [--gap 0.02] [--output FILE]
(starts its own PostgreSQL; about 30 s per store on 2 cores)
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import psycopg

from feiqiu_etl.db.embedded import create_database, temporary_server
from feiqiu_etl.app.planning import plan_run, prepare_inputs
from feiqiu_etl.pipeline import CancellationToken
from feiqiu_etl.plan import RunOptions, build_plan
from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

ANCHOR = datetime(2024, 3, 4)
FIRST_SITE = 8640015201004417


def catalog_estimate(inputs, now) -> int:
    """What the plan estimated before the contract's volumes were connector data (basis ``catalog``)."""
    lanes = tuple(replace(lane, specs=tuple(replace(s, expected_rows=None, expected_daily_rows=None)
                                            for s in lane.specs)) for lane in inputs.lanes)
    return sum(lane.estimate_requests for lane in build_plan(replace(inputs, lanes=lanes), now=now).lanes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3, help="lanes, one medium store each (default 3)")
    parser.add_argument("--days", type=int, default=7, help="first load, days (default 7)")
    parser.add_argument("--gap", type=float, default=0.02, help="the lanes' gap, s (default 0.02: gaps, not the "
                        "machine, dominate a request's lane time, as in production)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    sites = [FIRST_SITE + i for i in range(args.tokens)]
    tokens = {f"fq_lane{i}": (site,) for i, site in enumerate(sites)}
    cfg = SimulatorConfig(seed=7, scale="medium", days=args.days, anchor=ANCHOR, site_ids=tuple(sites),
                          tokens=tokens, token="fq_admin", risk=RiskControlConfig(enabled=False))
    lines = [f"command: python benchmarks/bench_plan.py {shlex.join(sys.argv[1:])}".rstrip(),
             f"fleet: {args.tokens} lane(s), one medium store each (members 2000, 150 settlements/day, ...), first "
             f"load of {args.days} days, no history; gaps {args.gap:g} s, risk control off (unsafe gaps on purpose)",
             ""]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="fq-bench-plan-") as tmp, \
            temporary_server(prefix="fq-bench-plan-pg-") as server, Simulator(cfg) as sim:
        fleet = Path(tmp) / "fleet.yaml"
        fleet.write_text("lanes:\n" + "".join(
            f"  - name: lane{i}\n    token_env: FQ_LANE{i}\n    stores: [{{site_id: {site}}}]\n"
            for i, site in enumerate(sites)), encoding="utf-8")
        create_database(server.dsn("postgres"), "bench_plan", drop_first=True)
        dsn = server.dsn("bench_plan")
        settings = {"pipeline.rate_min": args.gap, "pipeline.rate_max": args.gap,
                    "pipeline.ods_group_package.rate_min": args.gap, "pipeline.ods_group_package.rate_max": args.gap,
                    "window.initial_days": args.days, "pipeline.batch_timeout": 0.2}
        opts = RunOptions(api_base=sim.base_url, fleet_path=str(fleet), overrides=settings, unsafe_gaps=True,
                          load_dwd=False, now=ANCHOR, environ={f"FQ_LANE{i}": f"fq_lane{i}" for i in range(len(sites))})
        inputs = prepare_inputs(opts)
        with psycopg.connect(dsn) as conn:
            plan = plan_run(inputs, conn, now=ANCHOR)
        catalog = catalog_estimate(inputs, ANCHOR)
        runner = FlowRunner(plan, dsn, cancellation=CancellationToken(), wiring=RunnerWiring(heartbeat=0.5))
        samples: list[tuple[float, float]] = []  # (elapsed, predicted end)
        done = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not done.wait(0.25):
                try:
                    snap = runner.statistics()
                except Exception:  # noqa: BLE001 - not started yet
                    continue
                if snap.phase == "ods" and snap.requests_sent:
                    elapsed = time.monotonic() - t0
                    samples.append((elapsed, elapsed + snap.eta_s))

        watcher = threading.Thread(target=sample, daemon=True)
        began = time.monotonic()
        watcher.start()
        result = runner.run()
        end = time.monotonic() - began
        done.set()
        watcher.join()
        log = sim.request_log()
    sent = len(log)
    estimated = sum(lane.estimate_requests for lane in plan.lanes)
    body = [f"run: {result.status}, {sent} requests sent in {end:.1f} s"]
    for lane in plan.lanes:
        mine = sum(1 for e in log if e.site_id in {s.site_id for s in lane.stores})
        body.append(f"  lane {lane.name}: plan {lane.estimate_requests} vs sent {mine} "
                    f"({(lane.estimate_requests - mine) / mine:+.1%})")
    body.append(f"plan (basis contract): {estimated} requests vs {sent} sent: {(estimated - sent) / sent:+.1%}")
    body.append(f"before (basis catalog: a page per segment or snapshot, no details): {catalog} requests: "
                f"{(catalog - sent) / sent:+.1%}")
    body.append("live ETA (predicted end = elapsed + eta_s of the run's status) against the actual end "
                f"{end:.1f} s:")
    for share in (0.25, 0.5, 0.75):
        at = min(samples, key=lambda s: abs(s[0] - share * end)) if samples else None
        if at is not None:
            body.append(f"  at {share:.0%} ({at[0]:.1f} s): predicted end {at[1]:.1f} s, error "
                        f"{(at[1] - end) / end:+.1%}")
    print("\n".join(body), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("\n".join(lines + body) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
