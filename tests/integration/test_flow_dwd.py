"""Issue 4 acceptance through the real flow: ODS from the simulator, then DWD. Every dimension keeps the SCD2
invariants (warehouse-model §4.3) and every fact holds one row per ODS source key, across source changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import psycopg

from dwd_support import scd2_violations
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.tasks.dwd import load_dwd_mapping
from feiqiu_etl.connector.windows import fmt
from flowkit import ANCHOR, run_flow, sim_config

MAPPING = load_dwd_mapping()
WINDOW = dict(window_start=fmt(ANCHOR - timedelta(days=2)), window_end=fmt(ANCHOR + timedelta(days=1)))


def check_dwd(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        for t in MAPPING.dimensions:
            bk = list(t.business_key)
            assert scd2_violations(conn, t.target.split(".")[1], bk) == [], t.target
            current = conn.execute(f"SELECT count(*) FROM {t.target} WHERE is_current").fetchone()[0]
            live = conn.execute(f"SELECT count(*) FROM {t.source} WHERE NOT is_deleted").fetchone()[0]
            assert current == live, t.target
        for t in MAPPING.facts:
            facts = conn.execute(f"SELECT count(*) FROM {t.target}").fetchone()[0]
            source = conn.execute(f"SELECT count(*) FROM {t.source}").fetchone()[0]
            assert facts == source > 0, t.target


def test_flow_loads_dwd_after_ods_and_keeps_invariants_across_changes(pg_dsn):
    with Simulator(sim_config(seed=8)) as sim:
        site = sim.config.site_ids[0]
        sim.dataset.set_now(ANCHOR + timedelta(hours=1))
        first = run_flow(sim, pg_dsn, window=False, load_dwd=True, **WINDOW)
        assert first.status == "SUCCESS" and first.dwd["failed"] == 0
        assert first.dwd["succeeded"] == len(MAPPING.tables)
        check_dwd(pg_dsn)

        sim.dataset.set_now(ANCHOR + timedelta(hours=2))
        sim.dataset.mutate_random(0.15, rng_seed=2)
        member = sim.dataset.records("ODS_MEMBER", site)[0]["memberId"]
        sim.dataset.update("ODS_MEMBER", site, member, {"nickname": "改名了🎱"})
        sim.dataset.delete("ODS_GOODS", site, sim.dataset.records("ODS_GOODS", site)[0]["goodsId"])
        second = run_flow(sim, pg_dsn, window=False, load_dwd=True, **WINDOW)
        assert second.status == "SUCCESS"
        tables = {t["table"]: t for t in second.dwd["tables"]}
        assert tables["dim_member"]["closed"] >= 1 and tables["dim_goods"]["closed"] >= 1
        check_dwd(pg_dsn)
        with psycopg.connect(pg_dsn) as conn:
            versions = conn.execute("SELECT version_no, nickname, is_current FROM dwd.dim_member "
                                    "WHERE member_id = %s ORDER BY version_no", (member,)).fetchall()
        assert versions[-1] == (2, "改名了🎱", True) and versions[0][2] is False

        third = run_flow(sim, pg_dsn, window=False, load_dwd=True, **WINDOW)  # nothing changed: idempotent
        assert all((t["inserted"], t["updated"], t["closed"]) == (0, 0, 0) for t in third.dwd["tables"])


def test_cli_dwd_only_with_selected_tables_sends_no_request(pg_dsn):
    with Simulator(sim_config(seed=9)) as sim:
        assert run_flow(sim, pg_dsn, tasks=["ODS_MEMBER", "ODS_PAYMENT"]).status == "SUCCESS"
        sim.clear_log()
        env = {**os.environ, "FEIQIU_API_TOKEN": sim.config.token}
        base = [sys.executable, "-m", "feiqiu_etl", "run", "--api-base", sim.base_url, "--site-id",
                str(sim.config.site_ids[0]), "--dsn", pg_dsn, "--json", "--unsafe-gaps"]
        bare = [sys.executable, "-m", "feiqiu_etl", "run", "--dsn", pg_dsn, "--json"]  # no API settings needed
        proc = subprocess.run([*bare, "--dwd-only", "--dwd-tables", "dim_member,dwd_payment"],
                              capture_output=True, text=True, env=dict(os.environ), timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["tasks"] == [] and [t["table"] for t in out["dwd"]["tables"]] == ["dim_member", "dwd_payment"]
        assert all(t["inserted"] > 0 for t in out["dwd"]["tables"])
        assert sim.request_log() == []
        bad = subprocess.run([*base, "--dwd-tables", "dim_nope"], capture_output=True, text=True, env=env, timeout=60)
        assert bad.returncode == 2 and "dim_nope" in bad.stderr and sim.request_log() == []


def test_cancel_during_dwd_stops_starting_tables(pg_dsn):
    import threading

    from unittest import mock

    from feiqiu_etl.pipeline import CancellationToken
    from feiqiu_etl.runner.flow_runner import FlowRunner
    from flowkit import options, run_opts

    with Simulator(sim_config(seed=10)) as sim:
        token = CancellationToken()
        original = FlowRunner._run_dwd

        def cancel_then_load(self):
            threading.Timer(0, token.cancel).run()  # the signal arrives as DWD starts
            return original(self)

        with mock.patch.object(FlowRunner, "_run_dwd", cancel_then_load):
            result = run_opts(options(sim, tasks=["ODS_MEMBER"], load_dwd=True,
                                      overrides={"dwd.parallel_workers": 1}), pg_dsn, token)
    assert result.status == "CANCELLED"
    assert result.dwd["status"] == "CANCELLED"
    assert all(t["error"] == "cancelled before start" for t in result.dwd["tables"])
