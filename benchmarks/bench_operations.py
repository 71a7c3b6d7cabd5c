"""Operations figures: how good is the live ETA, and how fast does ``feiqiu-etl cancel`` stop a run.

1. ETA error: a full simulator run (21 tasks, 3 details, small store) in this process; the live snapshot is
   sampled every 0.25 s, and at 25/50/75 % of the run's real duration the estimated remaining time (``eta_s``)
   is compared with the time that really remained. Done for a first run (no history: the plan knows one page
   per segment and no details) and for a second run after 10 % of the upstream's records changed (history).
2. Cross-process cancel latency: ``feiqiu-etl run`` as a process, then ``feiqiu-etl cancel RUN_ID`` from another
   process; latency = from the cancel command's request to the run's record turning CANCELLED (what the cancel
   command reports), and to the run's process exiting.

Usage: python benchmarks/bench_operations.py [--trials 5]   (needs the dev extras; starts its own PostgreSQL)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from feiqiu_etl.connector.windows import fmt  # noqa: E402
from feiqiu_etl.db.embedded import EmbeddedPostgres, create_database, temporary_server  # noqa: E402
from feiqiu_etl.app.database import connector_for
from feiqiu_etl.app.planning import plan_run, prepare_inputs  # noqa: E402
from feiqiu_etl.plan import RunOptions  # noqa: E402
from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring  # noqa: E402
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig  # noqa: E402

ANCHOR = datetime(2024, 3, 4)
GAPS = {"pipeline.rate_min": 0.1, "pipeline.rate_max": 0.15, "pipeline.ods_group_package.rate_min": 0.12,
        "pipeline.ods_group_package.rate_max": 0.16, "pipeline.batch_timeout": 0.2, "api.retry_backoff": 0.05}


def _dsn(server: EmbeddedPostgres, name: str) -> str:
    create_database(server.dsn("postgres"), name, drop_first=True)
    return server.dsn(name)


def eta_errors(sim: Simulator, dsn: str) -> dict:
    opts = RunOptions(api_base=sim.base_url, token=sim.config.token, site_ids=list(sim.config.site_ids),
                      overrides=dict(GAPS), window_start=fmt(ANCHOR - timedelta(days=sim.config.days)),
                      window_end=fmt(ANCHOR), load_dwd=False, unsafe_gaps=True, environ={})
    inputs = prepare_inputs(opts)
    with connector_for(10)(dsn) as conn:
        plan = plan_run(inputs, conn)
    runner = FlowRunner(plan, dsn, wiring=RunnerWiring(heartbeat=0.5))
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            snap = runner.statistics()
            if snap.phase == "ods":
                samples.append((time.monotonic(), snap.eta_s))

    thread = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    thread.start()
    result = runner.run()
    ended = time.monotonic()
    done.set()
    thread.join()
    total = ended - started
    out = {"status": result.status, "seconds": round(total, 1), "requests": result.totals()["requests"]}
    for share in (0.25, 0.5, 0.75):
        at = started + share * total
        t, eta = min(samples, key=lambda s: abs(s[0] - at))
        actual = ended - t
        out[f"{int(share * 100)}%"] = {"estimated_s": round(eta, 1), "actual_s": round(actual, 1),
                                       "error_pct": round(100 * (eta - actual) / actual, 1)}
    return out


def cancel_latency(sim: Simulator, server: EmbeddedPostgres, trials: int) -> list[dict]:
    env = {**os.environ, "FEIQIU_API_TOKEN": sim.config.token}
    py = [sys.executable, "-m", "feiqiu_etl"]
    sets = [f"--set={k}={v}" for k, v in GAPS.items()]
    out = []
    for trial in range(trials):
        dsn = _dsn(server, f"bench_cancel_{trial}")  # a fresh warehouse: a full first run to cancel
        sim.clear_log()
        proc = subprocess.Popen([*py, "run", "--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0]),
                                 "--dsn", dsn, "--no-dwd", "--unsafe-gaps", "--no-progress", "--json",
                                 "--window-start", fmt(ANCHOR - timedelta(days=sim.config.days)), "--window-end",
                                 fmt(ANCHOR), *sets], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        while len(sim.request_log()) < 15:
            time.sleep(0.02)
        status = json.loads(subprocess.run([*py, "status", "--dsn", dsn, "--json"], capture_output=True, text=True,
                                           env=env).stdout)
        run_id = status[0]["run_id"]
        asked = time.monotonic()
        cancel = json.loads(subprocess.run([*py, "cancel", run_id, "--dsn", dsn, "--json"], capture_output=True,
                                           text=True, env=env).stdout)
        proc.communicate(timeout=60)
        out.append({"recorded_cancelled_s": cancel["seconds"], "process_exit_s": round(time.monotonic() - asked, 2),
                    "exit_code": proc.returncode, "status": cancel["status"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    with temporary_server(prefix="fq-bench-ops-") as server:
        cfg = SimulatorConfig(seed=7, scale="small", days=3, anchor=ANCHOR,
                              risk=RiskControlConfig(gap_standard=0.05, gap_groupbuy=0.1))
        with Simulator(cfg) as sim:
            dsn = _dsn(server, "bench_eta")
            first = eta_errors(sim, dsn)
            sim.dataset.mutate_random(0.1, 5)
            second = eta_errors(sim, dsn)
            latencies = cancel_latency(sim, server, args.trials)
    print("command: python benchmarks/bench_operations.py --trials", args.trials)
    print(f"ETA, first run (no history): {json.dumps(first)}")
    print(f"ETA, second run after 10 % of records changed: {json.dumps(second)}")
    for i, lat in enumerate(latencies, 1):
        print(f"cancel trial {i}: {json.dumps(lat)}")
    recorded = sorted(lat["recorded_cancelled_s"] for lat in latencies)
    exits = sorted(lat["process_exit_s"] for lat in latencies)
    print(f"cancel latency: recorded CANCELLED median {recorded[len(recorded) // 2]:.3f} s, max {recorded[-1]:.3f} s; "
          f"process exit median {exits[len(exits) // 2]:.2f} s, max {exits[-1]:.2f} s")


if __name__ == "__main__":
    main()
