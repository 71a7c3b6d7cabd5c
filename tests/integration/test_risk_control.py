"""Risk control made visible and self-protecting: gaps below the documented minimum are refused unless asked
for on purpose; with them, the lane learns the upstream's floor after one rejection per endpoint class and
never walks into a ban; every rejection is counted and logged the moment it happens."""

from __future__ import annotations

import json
import os
from datetime import timedelta

from clikit import PY, cli, env_for, finish, start
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.simulator import RiskControlConfig, Simulator
from flowkit import ANCHOR, sim_config

# The simulator's default rules (3 violations in 60 s ban for 300 s), with gaps scaled down 10x.
SCALED = RiskControlConfig(gap_standard=0.3, gap_groupbuy=0.8)
TASKS = "ODS_GROUP_PACKAGE,ODS_PAYMENT,ODS_REFUND,ODS_COUPON,ODS_GOODS,ODS_TABLE_AREA,ODS_ASSISTANT"


def test_a_gap_below_the_upstream_minimum_is_refused_before_any_request():
    with Simulator(sim_config(seed=51)) as sim:
        proc = cli("run", "--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0]),
                   "--pipeline-rate-min", "0", "--pipeline-rate-max", "0", "--dsn", "postgresql://unused.invalid/x",
                   env=env_for(sim.config.token))
        assert sim.request_log() == []
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pipeline.rate_min = 0 s (flag)" in lines[0] and "minimum gap of 3 s" in lines[0]
    assert "--unsafe-gaps" in lines[0]


def test_with_unsafe_gaps_the_lane_learns_each_class_floor_after_one_rejection_and_is_never_banned(pg_dsn):
    with Simulator(sim_config(seed=52, risk=SCALED)) as sim:
        args = [*PY, "run", "--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0]), "--dsn", pg_dsn,
                "--tasks", TASKS, "--no-dwd", "--json", "--no-progress", "--unsafe-gaps",
                "--window-start", fmt(ANCHOR - timedelta(days=2)), "--window-end", fmt(ANCHOR),
                "--pipeline-rate-min", "0.05", "--pipeline-rate-max", "0.1",
                "--set", "pipeline.ods_group_package.rate_min=0.05", "--set", "pipeline.ods_group_package.rate_max=0.1",
                "--set", "api.retry_backoff=0.05"]
        code, data, err = finish(start(args, env_for(sim.config.token)))
        log = sim.request_log()
    assert code == 0 and data["status"] == "SUCCESS", err[-1500:]
    rejected = [e for e in log if e.outcome == "rejected"]
    assert all(e.code == 42901 for e in rejected), [e.code for e in rejected]  # never 42902: no ban
    by_class = {"groupbuy" if "groupbuy" in e.path else "standard" for e in rejected}
    per_class = {c: sum(1 for e in rejected if ("groupbuy" in e.path) == (c == "groupbuy")) for c in by_class}
    assert all(n <= 1 for n in per_class.values()), per_class
    assert sum(t["rate_limited"] for t in data["tasks"]) == len(rejected) >= 1  # counted in --json
    warnings = [line for line in err.splitlines() if "rate limited by upstream" in line]
    assert len(warnings) == len(rejected) and all("42901" in w for w in warnings)  # logged at once, each
    assert "every later standard request of this run waits at least" in err
    shown = json.loads(cli("show", data["run_id"], "--dsn", pg_dsn, "--json").stdout)
    assert shown["rejections"] == len(rejected)
    assert shown["summary"]["lanes"][0]["throttled"] == len(rejected)
