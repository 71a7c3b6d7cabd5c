"""What one process can carry: CPU and memory per lane, for 1, 2, 4, … lanes of one small store each, side by side.

Each configuration runs in a fresh child process (so its RSS is its own): a fleet of N lanes (N tokens), one
small store per lane, every task, against the simulator (in another process, so its CPU is not counted) and
an embedded PostgreSQL (its own processes, not counted either). Gaps are tiny on purpose (``--gap``), so the
run is CPU-bound; the CPU per request measured here is then scaled to the real gaps of 5–20 s.

    python benchmarks/bench_lanes_per_process.py [--lanes 1,2,4,8] [--days 7] [--gap 0.02] [--output FILE]
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


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def child(lanes: int, days: int, gap: float, dsn: str, base: str) -> dict:
    """One configuration, in this (fresh) process: run the fleet, sample RSS and threads every 50 ms."""
    from feiqiu_etl.connector.windows import fmt
    from feiqiu_etl.runner.launch import execute_in_process
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
                 "pipeline.ods_group_package.rate_max": gap * 1.2, "pipeline.batch_timeout": 0.2, "api.timeout": 10}
    options = RunOptions(api_base=base, fleet_path=str(fleet), overrides=overrides, unsafe_gaps=True, environ=env,
                         window_start=fmt(ANCHOR - timedelta(days=days)), window_end=fmt(ANCHOR), load_dwd=False)
    import feiqiu_etl.runner  # noqa: F401 - import everything before the baseline
    import feiqiu_etl.tasks.ods  # noqa: F401

    import psycopg

    base_rss, peak = _rss_kib(), {"rss": 0, "threads": 0, "connections": 0}
    stop = threading.Event()
    watch = psycopg.connect(dsn, autocommit=True)
    mine = "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()"

    def sample() -> None:
        while not stop.wait(0.05):
            peak["rss"] = max(peak["rss"], _rss_kib())
            peak["threads"] = max(peak["threads"], threading.active_count())
            peak["connections"] = max(peak["connections"], watch.execute(mine).fetchone()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0, wall0 = os.times(), time.monotonic()
    result = execute_in_process(options, dsn, CancellationToken())
    wall, cpu1 = time.monotonic() - wall0, os.times()
    stop.set()
    sampler.join()
    watch.close()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    totals = result.totals()
    return {"lanes": lanes, "status": result.status, "requests": totals["requests"], "rows": totals["rows_written"],
            "wall_s": wall, "cpu_s": cpu, "base_rss_mib": base_rss / 1024,
            "peak_rss_mib": max(peak["rss"], base_rss) / 1024, "threads": peak["threads"] - 1,
            "connections": peak["connections"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="1,2,4,8")
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--output")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dsn", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.days, args.gap, args.dsn, args.base)))
        return 0
    counts = [int(x) for x in args.lanes.split(",")]
    lines = [f"$ python benchmarks/bench_lanes_per_process.py {' '.join(argv if argv is not None else sys.argv[1:])}"]
    from feiqiu_etl.db.embedded import EmbeddedPostgres, create_database

    home = Path(tempfile.mkdtemp(prefix="bench-lanes-pg-"))
    server = EmbeddedPostgres(home / "pgdata").start()
    here, there = multiprocessing.Pipe()
    sim = multiprocessing.get_context("fork").Process(target=_serve, args=(there, args.days, max(counts)), daemon=True)
    sim.start()
    base = here.recv()
    rows = []
    try:
        for n in counts:
            name = f"bench_{n}_{int(time.time())}"
            create_database(server.dsn("postgres"), name)
            out = subprocess.run([sys.executable, __file__, "--child", str(n), "--days", str(args.days), "--gap",
                                  str(args.gap), "--dsn", server.dsn(name), "--base", base],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        here.send("stop")
        sim.join(10)
        server.stop()
    one = rows[0]
    load = os.getloadavg()
    lines.append(f"{os.cpu_count()} CPUs, load average at start {load[0]:.1f}; one small store per lane, every task, "
                 f"{args.days} days, gap {args.gap} s (simulator and PostgreSQL in other processes, not counted)")
    lines.append(f"{'lanes':>5} {'status':>8} {'requests':>8} {'rows':>7} {'wall s':>7} {'CPU s':>6} "
                 f"{'CPU ms/req':>10} {'peak RSS MiB':>12} {'+MiB/lane':>9} {'threads':>7} {'PG conns':>8}  wall vs 1 lane")
    for r in rows:
        per_req = 1000 * r["cpu_s"] / max(r["requests"], 1)
        extra = (r["peak_rss_mib"] - one["peak_rss_mib"]) / (r["lanes"] - 1) if r["lanes"] > 1 else \
            r["peak_rss_mib"] - r["base_rss_mib"]
        lines.append(f"{r['lanes']:>5} {r['status']:>8} {r['requests']:>8} {r['rows']:>7} {r['wall_s']:>7.2f} "
                     f"{r['cpu_s']:>6.2f} {per_req:>10.2f} {r['peak_rss_mib']:>12.1f} {extra:>9.1f} {r['threads']:>7} "
                     f"{r['connections']:>8}  "
                     f"{r['wall_s'] / one['wall_s']:.2f}x")
    per_req = max(1000 * r["cpu_s"] / max(r["requests"], 1) for r in rows)
    rate = 1 / (REAL_GAP + 0.3)
    lines.append(f"at the real gaps (mean {REAL_GAP:g} s + ~0.3 s per response) a lane sends {rate:.3f} requests/s: "
                 f"{per_req * rate / 1000 * 100:.2f} % of one core per lane at the highest CPU/request above; "
                 f"a small store's {one['requests']} requests take {one['requests'] / rate / 60:.0f} min of lane time")
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
