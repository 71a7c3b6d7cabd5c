"""Fleet figures: do lanes really run at once, and do the small stores of a lane get their turn?

1. Concurrency: 3 tokens × 2–3 stores (7 small stores, all 21 tasks and 3 details each) against one simulator
   (risk control on, per token) and one embedded PostgreSQL, in one process. Prints each lane's own time, the
   run's wall time, the sum of the lanes, and per token the simulator's overlaps and rejections.
2. Fairness: one lane with a store 10× bigger than its two neighbours; prints when each store's last request
   ended, as a share of the lane's time.

Usage: python benchmarks/bench_fleet.py   (needs the dev extras; starts its own PostgreSQL)
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.db.embedded import EmbeddedPostgres, create_database
from feiqiu_etl.app.run import RunRequest, run
from feiqiu_etl.plan import RunOptions
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

ANCHOR = datetime(2024, 3, 4)
GAPS = {"pipeline.rate_min": 0.05, "pipeline.rate_max": 0.07, "pipeline.ods_group_package.rate_min": 0.09,
        "pipeline.ods_group_package.rate_max": 0.11, "pipeline.batch_timeout": 0.2}
RISK = RiskControlConfig(gap_standard=0.04, gap_groupbuy=0.08)
LANES = {"north": (8640015201004417, 8640015201004418, 8640015201004419),
         "south": (8640015201004421, 8640015201004422),
         "east": (8640015201004431, 8640015201004432)}


def _fleet(path: Path, lanes: dict) -> str:
    lines = ["lanes:"]
    for name, stores in lanes.items():
        lines += [f"  - name: {name}", f"    token_env: FQ_{name.upper()}", "    stores:"]
        lines += [f"      - {{site_id: {s}}}" for s in stores]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _options(sim: Simulator, fleet: str, days: int, tasks=None) -> RunOptions:
    env = {f"FQ_{name.upper()}": f"fq_{name}" for name in LANES}
    return RunOptions(api_base=sim.base_url, fleet_path=fleet, overrides=dict(GAPS), unsafe_gaps=True,
                      window_start=fmt(ANCHOR - timedelta(days=days)), window_end=fmt(ANCHOR), load_dwd=False,
                      environ=env, task_codes=tasks or [])


def concurrency(server: EmbeddedPostgres, home: Path) -> None:
    sites = tuple(s for stores in LANES.values() for s in stores)
    cfg = SimulatorConfig(seed=7, scale="small", days=2, anchor=ANCHOR, risk=RISK, site_ids=sites,
                          tokens={f"fq_{name}": stores for name, stores in LANES.items()})
    create_database(server.dsn("postgres"), "bench_fleet", drop_first=True)
    with Simulator(cfg) as sim:
        started = time.monotonic()
        result = run(RunRequest(_options(sim, _fleet(home / "fleet.yaml", LANES), 2), dsn=server.dsn("bench_fleet")))
        wall = time.monotonic() - started
        log = sim.request_log()
    seconds = {lane.name: lane.statistics.seconds for lane in result.lanes}
    print(f"concurrency: status {result.status}, {len(log)} requests, {len(sites)} stores in {len(LANES)} lanes")
    for lane in result.lanes:
        mine = sorted((e for e in log if e.site_id in LANES[lane.name]), key=lambda e: e.started)
        overlaps = sum(1 for a, b in zip(mine, mine[1:]) if b.started < a.ended)
        rejected = sum(1 for e in mine if e.outcome == "rejected")
        print(f"  lane {lane.name}: {len(lane.stores)} stores, {lane.statistics.requests_sent} requests, "
              f"{seconds[lane.name]:.1f} s, overlaps {overlaps}, rejections {rejected}")
    slowest, total = max(seconds.values()), sum(seconds.values())
    print(f"  wall {wall:.1f} s; slowest lane {slowest:.1f} s; sum of lanes {total:.1f} s; "
          f"wall/slowest {wall / slowest:.2f}; wall/sum {wall / total:.2f}")


def fairness(server: EmbeddedPostgres) -> None:
    big, small = 8640015201004451, (8640015201004452, 8640015201004453)
    cfg = SimulatorConfig(seed=9, scale="small", days=3, anchor=ANCHOR, risk=RISK, site_ids=(big, *small),
                          site_factors={big: 10})
    create_database(server.dsn("postgres"), "bench_fair", drop_first=True)
    with Simulator(cfg) as sim:
        opts = RunOptions(api_base=sim.base_url, token=cfg.token, site_ids=[big, *small], overrides=dict(GAPS),
                          unsafe_gaps=True, window_start=fmt(ANCHOR - timedelta(days=3)), window_end=fmt(ANCHOR),
                          load_dwd=False, environ={})
        result = run(RunRequest(opts, dsn=server.dsn("bench_fair")))
        log = sorted(sim.request_log(), key=lambda e: e.started)
    begin, end = log[0].started, log[-1].ended
    print(f"fairness: status {result.status}, one lane, {len(log)} requests in {end - begin:.1f} s")
    for site in (big, *small):
        mine = [e for e in log if e.site_id == site]
        done = (max(e.ended for e in mine) - begin) / (end - begin)
        print(f"  store {site}{' (10x)' if site == big else ''}: {len(mine)} requests, last one at {100 * done:.0f} % "
              "of the lane's time")


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="fq-bench-fleet-"))
    server = EmbeddedPostgres(home / "pgdata").start()
    try:
        print("command: python benchmarks/bench_fleet.py")
        concurrency(server, home)
        fairness(server)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
