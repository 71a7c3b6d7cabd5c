"""Issue 20.4: a plan that knows. On the first run of a new 3-token fleet (no history) the plan estimates from the
contract's documented volumes per task and is within ±30 % of the requests sent; while a task runs, page 1's
``total`` gives its pages exactly and its rows the details to expect. Real simulator over HTTP, real PostgreSQL.

The simulator's ``small`` stores are far below the contract's volumes (upstream-api.md §4.1: 2k–20k members), so
the fleet runs with a connector file that documents the small store's volumes — the plan is judged against the
volumes it is told. (``benchmarks/bench_plan.py`` measures the real connector on ``medium`` stores, which are
the contract's lower bounds.)"""

from __future__ import annotations

from pathlib import Path

import psycopg
import yaml

from feiqiu_etl.connector.model import default_connector_path
from feiqiu_etl.simulator import SCALE_PROFILES, Simulator
from flowkit import fleet_file, options, run_opts, sim_config

LANES = {"north": ("FQ_NORTH", (8640015201004417, 8640015201004418)),
         "south": ("FQ_SOUTH", (8640015201004421, 8640015201004422)),
         "east": ("FQ_EAST", (8640015201004431, 8640015201004432))}
SMALL = SCALE_PROFILES["small"]
VOLUMES = {  # the small store as a contract would document it: [low, high]
    "ODS_MEMBER": SMALL.members, "ODS_MEMBER_CARD": SMALL.cards, "ODS_BILLIARD_TABLE": SMALL.tables,
    "ODS_TABLE_AREA": SMALL.areas, "ODS_GOODS": SMALL.goods, "ODS_GOODS_CATEGORY": SMALL.categories,
    "ODS_ASSISTANT": SMALL.assistants, "ODS_GROUP_PACKAGE": SMALL.packages, "ODS_COUPON": SMALL.coupons,
    "ODS_MEMBER_BALANCE_CHANGE": SMALL.balance_changes_per_day, "ODS_RECHARGE_ORDER": SMALL.recharges_per_day,
    "ODS_SETTLEMENT": SMALL.settlements_per_day, "ODS_TABLE_USE": SMALL.table_uses_per_day,
    "ODS_GOODS_SALE": SMALL.goods_sales_per_day, "ODS_INVENTORY_CHANGE": SMALL.inventory_changes_per_day,
    "ODS_ASSISTANT_SERVICE": SMALL.assistant_services_per_day,
    "ODS_GROUP_VERIFICATION": SMALL.verifications_per_day, "ODS_PAYMENT": SMALL.settlements_per_day,
    "ODS_REFUND": 0, "ODS_COUPON_USAGE": SMALL.coupon_usages_per_day, "ODS_SHIFT_HANDOVER": SMALL.handovers_per_day,
}


def _small_connector(tmp_path: Path) -> str:
    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    data.pop("dwd_mapping", None)
    for task in data["tasks"]:
        key = "expected_rows" if task["kind"] == "snapshot" else "expected_daily_rows"
        task[key] = [VOLUMES[task["code"]], 4 * VOLUMES[task["code"]]]
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_the_plan_of_a_new_fleet_is_within_30_percent_of_the_requests_sent(pg_dsn, tmp_path, monkeypatch):
    from feiqiu_etl.app.planning import plan_run, prepare_inputs
    from feiqiu_etl.runner import executor

    sites = tuple(s for _, stores in LANES.values() for s in stores)
    tokens = {f"fq_{name}": stores for name, (_, stores) in LANES.items()}
    cfg = sim_config(seed=64, days=2, site_ids=sites, tokens=tokens, token="fq_admin")
    fleet = fleet_file(tmp_path / "fleet.yaml", LANES)
    env = {env: f"fq_{name}" for name, (env, _) in LANES.items()}
    tasks: list = []  # (BaseOdsTask, TaskRun) of the run, to ask each task for its live estimate at the end
    base = executor.BaseOdsTask

    class Recorded(base):
        def execute(self):
            run = base.execute(self)
            tasks.append((self, run))
            return run

    monkeypatch.setattr(executor, "BaseOdsTask", Recorded)
    with Simulator(cfg) as sim:
        opts = options(sim, token=None, site_ids=[], fleet_path=fleet, environ=env, window=False,
                       connector_path=_small_connector(tmp_path), overrides={"window.initial_days": 2},
                       now=cfg.resolved_anchor())
        with psycopg.connect(pg_dsn) as conn:
            plan = plan_run(prepare_inputs(opts), conn, now=opts.now)
        estimated = sum(lane.estimate_requests for lane in plan.lanes)
        result = run_opts(opts, pg_dsn)
        sent = len(sim.request_log())
    assert result.status == "SUCCESS"
    assert {t.estimate.basis for lane in plan.lanes for t in lane.tasks} == {"contract"}
    assert abs(estimated - sent) <= 0.3 * sent, (estimated, sent)
    # at its end, every task's live estimate is what it sent: pages from page 1's total, details from its rows
    assert len(tasks) == len(plan.lanes) * len(plan.lanes[0].stores) * 21
    for task, run in tasks:
        live, r = task.live_estimate(), run.result
        assert (live.basis, live.list_requests) == ("live", r.total_requests - r.detail_success), run.task_code
        assert live.detail_requests == r.detail_success, run.task_code
