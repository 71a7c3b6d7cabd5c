"""What one process can carry: CPU, memory, threads and PostgreSQL connections per lane, for N lanes of one small
store each, side by side — up to hundreds of lanes (issue 19).

Each configuration runs in a fresh child process (so its RSS is its own): a fleet of N lanes (N tokens), one
small store per lane, against the simulator serving every token (in another process, so its CPU is not counted)
and an embedded PostgreSQL (its own processes, not counted either). The gaps are given (``--gap``); below the
upstream's 3 s minimum on purpose (the run's ``--unsafe-gaps``), against a simulator whose risk control uses
1 ms gaps. A sampler counts the run's PostgreSQL connections in ``pg_stat_activity`` every 50 ms (its own
excluded) and checks them against the bound: the lanes' pool (``db.pool_size``) + 3 (registry/LISTEN, lane guard,
the database watchdog's probe). Per configuration: failed lanes, wall time against the slowest lane, CPU ms per
request, RSS per lane, threads and connections.

    python benchmarks/bench_lanes_per_process.py [--lanes 1,2,4,8] [--days 7] [--gap 0.02] [--tasks A,B]
        [--pool-size 16] [--workers 2] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

ANCHOR = datetime(2024, 3, 4)
REAL_GAP = (5.0 + 20.0) / 2  # s, the default random gap's mean
FIRST_SITE = 8640015201004601


def _serve(conn, days: int, lanes: int) -> None:
    from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

    sites = tuple(FIRST_SITE + i for i in range(lanes))
    tokens = {f"fq_bench_{i}": (site,) for i, site in enumerate(sites)}
    cfg = SimulatorConfig(seed=5, scale="small", days=days, anchor=ANCHOR, site_ids=sites, tokens=tokens,
                          token="fq_admin", risk=RiskControlConfig(gap_standard=0.001, gap_groupbuy=0.001))
    with Simulator(cfg) as sim:
        conn.send(sim.base_url)
        conn.recv()  # until the parent says stop


def _prepare(dsn: str) -> None:
    import psycopg

    from feiqiu_etl.connector.model import load_connector
    from feiqiu_etl.runner.flow_runner import prepare_database

    with psycopg.connect(dsn) as conn:
        prepare_database(conn, load_connector())
        conn.commit()


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def child(lanes: int, days: int, gap: float, dsn: str, base: str, tasks: list[str] | None = None,
          pool_size: int = 16, workers: int = 2) -> dict:
    """One configuration, in this (fresh) process: run the fleet, sample RSS, threads and connections every 50 ms."""
    from feiqiu_etl.connector.windows import fmt
    from feiqiu_etl.app.run import RunRequest, run
    from feiqiu_etl.pipeline import CancellationToken
    from feiqiu_etl.plan import RunOptions

    folder = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    fleet = folder / "fleet.yaml"
    lines = ["lanes:"]
    env = {}
    for i in range(lanes):
        lines += [f"  - {{name: l{i}, token_env: FQ_BENCH_{i}, stores: [{{site_id: {FIRST_SITE + i}}}]}}"]
        env[f"FQ_BENCH_{i}"] = f"fq_bench_{i}"
    fleet.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = {"pipeline.rate_min": gap, "pipeline.rate_max": gap * 1.2, "pipeline.ods_group_package.rate_min": gap,
                 "pipeline.ods_group_package.rate_max": gap * 1.2, "pipeline.batch_timeout": 0.2, "api.timeout": 30,
                 "db.pool_size": pool_size, "pipeline.workers": workers}
    options = RunOptions(api_base=base, fleet_path=str(fleet), overrides=overrides, unsafe_gaps=True, environ=env,
                         window_start=fmt(ANCHOR - timedelta(days=days)), window_end=fmt(ANCHOR), load_dwd=False,
                         task_codes=tasks)
    import feiqiu_etl.runner  # noqa: F401 - import everything before the baseline
    import feiqiu_etl.tasks.ods  # noqa: F401

    import psycopg

    base_rss, peak = _rss_kib(), {"rss": 0, "threads": 0, "connections": 0}
    stop = threading.Event()
    watch = psycopg.connect(dsn, autocommit=True)
    mine = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'")

    def sample() -> None:
        while not stop.wait(0.05):
            peak["rss"] = max(peak["rss"], _rss_kib())
            peak["threads"] = max(peak["threads"], threading.active_count())
            peak["connections"] = max(peak["connections"], watch.execute(mine).fetchone()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0, wall0 = os.times(), time.monotonic()
    result = run(RunRequest(options, dsn=dsn, cancellation=CancellationToken()))
    wall, cpu1 = time.monotonic() - wall0, os.times()
    stop.set()
    sampler.join()
    watch.close()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    totals = result.totals()
    seconds = [lane.statistics.seconds for lane in result.lanes if lane.statistics is not None]
    return {"lanes": lanes, "gap": gap, "status": result.status, "requests": totals["requests"],
            "rows": totals["rows_written"], "failed_lanes": sum(1 for lane in result.lanes if lane.status == "FAILED"),
            "wall_s": wall, "slowest_lane_s": max(seconds, default=0.0), "cpu_s": cpu, "base_rss_mib": base_rss / 1024,
            "peak_rss_mib": max(peak["rss"], base_rss) / 1024, "threads": peak["threads"] - 1,
            "connections": peak["connections"], "pool_size": pool_size, "workers": workers,
            "error": result.error}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="1,2,4,8")
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--tasks", help="task codes (default: every task)")
    ap.add_argument("--pool-size", type=int, default=16, help="db.pool_size of the run")
    ap.add_argument("--workers", type=int, default=2, help="pipeline.workers (processing threads per task)")
    ap.add_argument("--append", action="store_true", help="append to --output instead of replacing it")
    ap.add_argument("--output")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dsn", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",") if args.tasks else None
    if args.child:
        print(json.dumps(child(args.child, args.days, args.gap, args.dsn, args.base, tasks, args.pool_size,
                               args.workers)))
        return 0
    counts = [int(x) for x in args.lanes.split(",")]
    lines = [f"$ python benchmarks/bench_lanes_per_process.py {' '.join(argv if argv is not None else sys.argv[1:])}"]
    load = os.getloadavg()
    from feiqiu_etl.db.embedded import create_database, temporary_server

    here, there = multiprocessing.Pipe()
    sim = multiprocessing.get_context("fork").Process(target=_serve, args=(there, args.days, max(counts)), daemon=True)
    sim.start()
    base = here.recv()
    rows = []
    try:
        with temporary_server(prefix="bench-lanes-pg-") as server:
            for n in counts:
                name = f"bench_{n}_{int(time.time())}"
                create_database(server.dsn("postgres"), name)
                _prepare(server.dsn(name))  # the tables exist, as on every night but the first
                out = subprocess.run([sys.executable, __file__, "--child", str(n), "--days", str(args.days), "--gap",
                                      str(args.gap), "--dsn", server.dsn(name), "--base", base, "--pool-size",
                                      str(args.pool_size), "--workers", str(args.workers),
                                      *(["--tasks", args.tasks] if args.tasks else [])],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"the run of {n} lanes failed:\n{out.stderr[-3000:]}")
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        here.send("stop")
        sim.join(10)
    one = rows[0]
    lines.append(f"{os.cpu_count()} CPUs, load average at start {load[0]:.1f}; one small store per lane, "
                 f"{'tasks ' + args.tasks if args.tasks else 'every task'}, {args.days} days, gap {args.gap}-"
                 f"{args.gap * 1.2:g} s (--unsafe-gaps; simulator and PostgreSQL in other processes, not counted); "
                 f"db.pool_size {args.pool_size}, pipeline.workers {args.workers}")
    lines.append(f"{'lanes':>5} {'status':>8} {'failed':>6} {'requests':>8} {'rows':>7} {'wall s':>7} {'slowest':>7} "
                 f"{'wall/slow':>9} {'CPU s':>6} {'CPU ms/req':>10} {'peak RSS MiB':>12} {'MiB/lane':>8} "
                 f"{'threads':>7} {'PG conns':>8} {'bound':>5}")
    for r in rows:
        per_req = 1000 * r["cpu_s"] / max(r["requests"], 1)
        per_lane = (r["peak_rss_mib"] - r["base_rss_mib"]) / r["lanes"]
        ratio = r["wall_s"] / r["slowest_lane_s"] if r["slowest_lane_s"] else float("nan")
        bound = r["pool_size"] + 3
        lines.append(f"{r['lanes']:>5} {r['status']:>8} {r['failed_lanes']:>6} {r['requests']:>8} {r['rows']:>7} "
                     f"{r['wall_s']:>7.2f} {r['slowest_lane_s']:>7.2f} {ratio:>8.3f}x {r['cpu_s']:>6.2f} "
                     f"{per_req:>10.2f} {r['peak_rss_mib']:>12.1f} {per_lane:>8.2f} {r['threads']:>7} "
                     f"{r['connections']:>8} {('<=' if r['connections'] <= bound else '> ') + str(bound):>5}")
        if r.get("error"):
            lines.append(f"      error: {r['error']}")
    per_req = max(1000 * r["cpu_s"] / max(r["requests"], 1) for r in rows)
    rate = 1 / (REAL_GAP + 0.3)
    lines.append(f"at the real gaps (mean {REAL_GAP:g} s + ~0.3 s per response) a lane sends {rate:.3f} requests/s: "
                 f"{per_req * rate / 1000 * 100:.2f} % of one core per lane at the highest CPU/request above; "
                 f"a store's {one['requests'] // one['lanes']} requests take "
                 f"{one['requests'] / one['lanes'] / rate / 60:.0f} min of lane time")
    text = "\n".join(lines)
    print(text)
    if args.output:
        with open(args.output, "a" if args.append else "w", encoding="utf-8") as f:
            f.write(("\n" if args.append else "") + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
