"""The next night (issue 20): ``feiqiu-etl run`` as a process, the simulator trades for 24 h, the next run: the
warehouse equals the simulator's data, and what the runs sent is measured against the ground-truth minimum (a
first load sends exactly it; nothing sends less)."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import pytest

from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.simulator.catalog import DETAIL_BY_PARENT
from feiqiu_etl.simulator.minimum import classify
from clikit import env_for, run_args
from flowkit import ANCHOR, CONNECTOR, expected_detail_rows, expected_rows, ods_rows, sim_config

pytestmark = pytest.mark.integration

DAY = timedelta(days=1)
DAYS = 2


def _run(sim: Simulator, dsn: str, now) -> dict:
    args = run_args(sim, dsn, "--now", fmt(now), window=False, settings={"window.initial_days": DAYS})
    done = subprocess.run(args, env=env_for(sim.config.token), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _accepted(sim: Simulator) -> list:
    return [e for e in sim.request_log() if e.outcome == "accepted"]


def _parent_of(spec, row) -> str:
    return str(row[spec.detail.parent.field])


def test_a_night_later_the_warehouse_equals_the_simulator(pg_dsn):
    with Simulator(sim_config(seed=43, days=DAYS)) as sim:
        site = sim.config.site_ids[0]
        first_window = (fmt(ANCHOR - timedelta(days=DAYS)), fmt(ANCHOR))
        first = _run(sim, pg_dsn, ANCHOR)
        assert first["status"] == "SUCCESS"
        assert len(_accepted(sim)) == sim.minimum_requests(site, ANCHOR - timedelta(days=DAYS), ANCHOR).requests
        detailed = [spec for spec in CONNECTOR.tasks if spec.detail]
        details_before = {spec.code: expected_detail_rows(sim, spec, site, first_window) for spec in detailed}
        lists_before = {spec.code: expected_rows(sim, spec, site, first_window) for spec in detailed}

        sim.clear_log()
        summary = sim.advance(hours=24)
        assert summary.changes[site]["ODS_SETTLEMENT"]["inserted"] > 0
        second = _run(sim, pg_dsn, ANCHOR + DAY)
        assert second["status"] == "SUCCESS"
        sent = _accepted(sim)
        assert len(sent) >= sim.minimum_requests(site, ANCHOR, ANCHOR + DAY).requests > 0

        window = (fmt(ANCHOR - timedelta(days=DAYS)), fmt(ANCHOR + DAY))
        for spec in CONNECTOR.tasks:  # every list table holds exactly the simulator's records, the night's included
            got = {k: v for k, v in ods_rows(pg_dsn, spec.table).items() if k[0] == site}
            assert got == expected_rows(sim, spec, site, window), spec.code
        for spec in detailed:
            # a detail is as fresh as the last fetch of its parent: every new or changed parent was fetched this
            # night and holds the simulator's rows now; the others keep what the first night fetched
            api = DETAIL_BY_PARENT[spec.code]
            fetched = {str(e.body[api.id_param]) for e in sent if e.path == api.path}
            after = expected_rows(sim, spec, site, window)
            needed = classify(spec.code, lists_before[spec.code], after, after)
            assert {str(after[k][spec.detail.id_column]) for k in needed.inserted + needed.updated} <= fetched
            now = expected_detail_rows(sim, spec, site, window)
            expected = {k: v for k, v in now.items() if _parent_of(spec, v) in fetched}
            expected.update({k: v for k, v in details_before[spec.code].items() if _parent_of(spec, v) not in fetched})
            got = {k: v for k, v in ods_rows(pg_dsn, spec.detail.target_table).items() if k[0] == site}
            assert got == expected, spec.detail.target_table


def test_now_is_checked_before_anything_starts(pg_dsn):
    with Simulator(sim_config()) as sim:
        for bad, message in (("2024-13-01 00:00:00", "--now: month 13 is not 01..12"), ("2999-01-01 00:00:00", "the current time")):
            done = subprocess.run(run_args(sim, pg_dsn, "--now", bad, window=False), env=env_for(sim.config.token),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert sim.request_log() == []
