"""A fleet: several tokens (lanes) at once, each strictly serial across its stores, sharing each lane fairly;
a forbidden store and a bad token fail alone. Real simulator over HTTP, real PostgreSQL."""

from __future__ import annotations

import time

import psycopg
import pytest

from feiqiu_etl.simulator import Simulator
from flowkit import dwd_exact, fleet_file, lane_violations, options, run_opts, sim_config, store_exact

NORTH = (8640015201004417, 8640015201004418, 8640015201004419)
SOUTH = (8640015201004421, 8640015201004422)
EAST = (8640015201004431, 8640015201004432)
FORBIDDEN = 8640015201004499  # listed in the north lane, but the north token may not read it
TASKS = ["ODS_MEMBER", "ODS_SETTLEMENT", "ODS_PAYMENT", "ODS_GOODS"]


def test_a_fleet_runs_its_lanes_at_once_and_failures_stay_in_their_lane_or_store(pg_dsn, tmp_path):
    tokens = {"fq_north": NORTH, "fq_south": SOUTH, "fq_east": EAST}
    cfg = sim_config(seed=61, site_ids=NORTH + SOUTH + EAST + (FORBIDDEN,), tokens=tokens, token="fq_admin")
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH + (FORBIDDEN,)), "south": ("FQ_SOUTH", SOUTH),
                                             "east": ("FQ_EAST", EAST), "west": ("FQ_WEST", (8640015201004441,))})
    with Simulator(cfg) as sim:
        opts = options(sim, tasks=TASKS, load_dwd=True, token=None, site_ids=[], fleet_path=fleet,
                       environ={"FQ_NORTH": "fq_north", "FQ_SOUTH": "fq_south", "FQ_EAST": "fq_east",
                                "FQ_WEST": "fq_revoked"})
        started = time.monotonic()
        result = run_opts(opts, pg_dsn)
        wall = time.monotonic() - started
        log = sim.request_log()
        lanes = {lane.name: lane for lane in result.lanes}
        assert lanes["west"].status == "FAILED" and "40101" in lanes["west"].reason  # bad token: its lane alone
        north = {s.site_id: s for s in lanes["north"].stores}
        assert north[FORBIDDEN].status == "FAILED" and "40103" in north[FORBIDDEN].reason  # that store alone
        assert all(north[s].status == "SUCCESS" for s in NORTH)
        assert lanes["north"].status == "PARTIAL"
        assert lanes["south"].status == lanes["east"].status == "SUCCESS"
        assert result.status == "PARTIAL" and result.dwd["status"] == "SUCCESS"
        for site in NORTH + SOUTH + EAST:
            store_exact(pg_dsn, sim, site, TASKS)
            dwd_exact(pg_dsn, site, TASKS)
    for lane_sites in (NORTH + (FORBIDDEN,), SOUTH, EAST):  # per token: strictly serial, never rejected
        mine = [e for e in log if e.site_id in lane_sites]
        assert lane_violations(mine, 0.01) == []
    seconds = {name: lane.statistics.seconds for name, lane in lanes.items() if name != "west"}
    assert wall < 0.75 * sum(seconds.values()), (wall, seconds)  # concurrent, not one after the other
    data = result.to_dict()
    assert {s["site_id"]: s["status"] for lane in data["lanes"] for s in lane["stores"]}[FORBIDDEN] == "FAILED"


def test_stores_of_one_lane_share_it_fairly(pg_dsn):
    big, small = 8640015201004451, (8640015201004452, 8640015201004453)
    cfg = sim_config(seed=62, site_ids=(big, *small), site_factors={big: 10}, days=2)
    with Simulator(cfg) as sim:
        result = run_opts(options(sim, tasks=["ODS_SETTLEMENT"], site_ids=[big, *small]), pg_dsn)
        log = sorted(sim.request_log(), key=lambda e: e.started)
    assert result.status == "SUCCESS"
    begin, end = log[0].started, log[-1].ended
    share = {site: (max(e.ended for e in log if e.site_id == site) - begin) / (end - begin) for site in small}
    requests = {site: sum(1 for e in log if e.site_id == site) for site in (big, *small)}
    assert requests[big] > 8 * requests[small[0]]
    assert all(s < 0.5 for s in share.values()), (share, requests)  # the small stores finish in the first half


def test_fleet_file_errors_name_the_file_the_lane_and_the_field(tmp_path):
    from feiqiu_etl.config import ConfigError
    from feiqiu_etl.plan import RunOptions, prepare

    bad = tmp_path / "f.yaml"
    cases = [
        ("lanes:\n  - name: north\n    token_env: FQ_N\n    stores: [{site_id: abc}]\n", "lanes[0] (north).stores[0].site_id"),
        ("lanes:\n  - name: north\n    token_env: fq_live_8Hs2abcdefgh123\n    stores: [{site_id: 1}]\n", "NAME of an environment variable"),
        ("lanes:\n  - {name: a, token_env: A, stores: [{site_id: 1}]}\n  - {name: b, token_env: B, stores: [{site_id: 1}]}\n",
         "a store belongs to one token's lane"),
        ("lanes:\n  - {name: a, token_env: FQ_A, stores: [{site_id: 1}], pipeline: {rate_minn: 9}}\n", "rate_minn"),
        ("lanes:\n  - {name: a, token_env: FQ_A, stores: [{site_id: 1}], pipeline: {rate_min: -1}}\n",
         "lanes[0] (a).pipeline: "),
        ("lanes:\n  - {name: a, token_env: FQ_A, stores: [{site_id: 1}], pipeline: {ODS_NOPE.rate_min: 4}}\n",
         "lanes[0] (a).pipeline: "),
        ("lanes:\n  - {name: a, token_env: FQ_UNSET, stores: [{site_id: 1}]}\n", "FQ_UNSET is not set"),
        # one token under two variable names would drive two lanes at once: the upstream bans the token
        ("lanes:\n  - {name: a, token_env: FQ_A, stores: [{site_id: 1}]}\n  - {name: b, token_env: FQ_A2, stores: [{site_id: 2}]}\n",
         "lanes a ($FQ_A) and b ($FQ_A2) hold the same token"),
    ]
    for text, message in cases:
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as info:
            prepare(RunOptions(api_base="http://127.0.0.1:9", fleet_path=str(bad), environ={"FQ_A": "x", "FQ_A2": "x"}))
        assert str(bad) in str(info.value) and message in str(info.value), str(info.value)
        assert "fq_live_8Hs2abcdefgh123" not in str(info.value)


def test_lane_settings_apply_to_their_lane_only(tmp_path):
    from feiqiu_etl.plan import RunOptions, prepare

    path = tmp_path / "f.yaml"
    path.write_text("lanes:\n  - {name: slow, token_env: A, stores: [{site_id: 1}], pipeline: {rate_min: 9, rate_max: 30}}\n"
                    "  - {name: fast, token_env: B, stores: [{site_id: 2}]}\n", encoding="utf-8")
    inputs = prepare(RunOptions(api_base="http://127.0.0.1:9", fleet_path=str(path), environ={"A": "tok-slow-secret", "B": "tok-fast"},
                                task_codes=["ODS_MEMBER", "ODS_GROUP_PACKAGE"]))
    slow, fast = inputs.lanes
    assert (slow.configs["ODS_MEMBER"].rate_min, fast.configs["ODS_MEMBER"].rate_min) == (9.0, 5.0)
    assert slow.configs["ODS_GROUP_PACKAGE"].rate_min == 8.5  # the connector's group-buy default still wins
    assert slow.token.fingerprint() != fast.token.fingerprint() and "tok-slow" not in repr(slow.token) + str(slow.token)


def test_the_plan_of_a_second_run_estimates_its_requests_within_20_percent(pg_dsn, tmp_path):
    from feiqiu_etl.app.planning import plan_run, prepare_inputs

    tokens = {"fq_north": NORTH[:2], "fq_south": SOUTH}
    cfg = sim_config(seed=63, site_ids=NORTH[:2] + SOUTH, tokens=tokens, token="fq_admin")
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH[:2]), "south": ("FQ_SOUTH", SOUTH)})
    env = {"FQ_NORTH": "fq_north", "FQ_SOUTH": "fq_south"}
    with Simulator(cfg) as sim:
        opts = options(sim, token=None, site_ids=[], fleet_path=fleet, environ=env)
        first = run_opts(opts, pg_dsn)
        assert first.status == "SUCCESS"
        with psycopg.connect(pg_dsn) as conn:
            plan = plan_run(prepare_inputs(opts), conn)
        estimated = sum(lane.estimate_requests for lane in plan.lanes)
        sim.clear_log()
        second = run_opts(opts, pg_dsn)
        sent = len(sim.request_log())
    assert second.status == "SUCCESS"
    assert abs(estimated - sent) <= 0.2 * sent, (estimated, sent)
    assert all(t.estimate.basis == "history" for lane in plan.lanes for t in lane.tasks)


def test_a_fleet_with_a_site_id_is_refused_with_or_without_a_single_token(tmp_path):
    from feiqiu_etl.config import ConfigError
    from feiqiu_etl.plan import RunOptions, prepare

    path = tmp_path / "f.yaml"
    path.write_text("lanes:\n  - {name: a, token_env: A, stores: [{site_id: 1}]}\n", encoding="utf-8")
    for token in (None, "tok"):
        with pytest.raises(ConfigError, match="--fleet and --site-id exclude each other"):
            prepare(RunOptions(api_base="http://127.0.0.1:9", fleet_path=str(path), site_ids=[2], token=token,
                               environ={"A": "x"}))
