"""``feiqiu-etl check`` (issue 27) as a real process against the real simulator (real HTTP, risk control on, every
gap scaled ×0.01 — the simulator's G, its ban and the connector's documented minimum alike, so no --unsafe-gaps)
and a real PostgreSQL: a good token's report, a wrong token, a store not granted, an unreachable base URL."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from datetime import timedelta

import psycopg
import pytest

from clikit import PY, env_for
from flowkit import ANCHOR, scaled_connector
from feiqiu_etl.connector import load_connector
from feiqiu_etl.connector.windows import fmt, parse_local
from feiqiu_etl.common import exitcodes
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig

F = 0.01
"""Every gap of upstream-api.md §2.2 and of the configuration × F (3 s → 30 ms)."""
OTHER_SITE = 8640015201009999
CONNECTOR = load_connector()
NOW = ANCHOR - timedelta(hours=1)


def scaled_gaps() -> list[str]:
    """``--set`` of every configured gap × F (defaults and the connector's per-task ones)."""
    base = PipelineConfig()
    values = {"pipeline.rate_min": base.rate_min * F, "pipeline.rate_max": base.rate_max * F,
              "api.retry_backoff": 1.0 * F}
    for spec in CONNECTOR.tasks:
        for key in ("rate_min", "rate_max"):
            if key in (spec.pipeline or {}):
                values[f"pipeline.{spec.code.lower()}.{key}"] = spec.pipeline[key] * F
    return [f"--set={k}={v:g}" for k, v in values.items()]


@pytest.fixture(scope="module")
def sim():
    cfg = SimulatorConfig(seed=5, scale="small", days=3, anchor=ANCHOR,
                          tokens={"fq_other_token": (OTHER_SITE,)},
                          risk=RiskControlConfig(gap_standard=3.0 * F, gap_groupbuy=8.0 * F, ban_seconds=300 * F,
                                                 violation_window=60 * F))
    with Simulator(cfg) as s:
        yield s


@pytest.fixture(scope="module")
def connector_file(tmp_path_factory):
    return scaled_connector(tmp_path_factory.mktemp("check") / "feiqiu.yaml", 3.0 * F, 8.0 * F)


def check(sim, dsn: str, connector: str, *extra: str, token: str | None = None, base: str | None = None,
          timeout: float = 120) -> tuple[int, dict | None, str, float]:
    args = [*PY, "check", "--api-base", base or sim.base_url, "--dsn", dsn, "--connector", connector,
            "--now", fmt(NOW), "--json", *scaled_gaps(), *extra]
    if "--site-id" not in extra:
        args += ["--site-id", str(sim.config.site_ids[0])]
    t0 = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env=env_for(token or sim.config.token))
    took = time.monotonic() - t0
    data = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, data, proc.stderr, took


def expected_total(sim, spec, site: int, window) -> int:
    records = sim.dataset.records(spec.code, site)
    if spec.kind != "windowed":
        return len(records)
    start, end = (parse_local(w) for w in window)
    return sum(1 for r in records if start <= parse_local(r[spec.window_field]) < end)


def test_good_token_reports_every_store_and_task_paced_without_a_42901(sim, pg_dsn, connector_file):
    sim.add_field("loyaltyTier", "gold", "ODS_MEMBER")  # a field the connector does not declare
    sim.clear_log()
    try:
        code, data, err, took = check(sim, pg_dsn, connector_file)
    finally:
        sim.remove_field("loyaltyTier", "ODS_MEMBER")
    assert code == 0, err
    n = len(CONNECTOR.tasks)
    assert f"check: {n} request(s)" in err.splitlines()[0]  # said before it starts: N requests x the gap
    assert data["planned_requests"] == n and data["error"] is None
    (lane,) = data["lanes"]
    assert lane["authenticated"] is True and lane["reachable"] is True
    assert lane["requests_sent"] == n and lane["throttled"] == 0
    log = sim.request_log()
    assert len(log) == n
    assert [e for e in log if e.code in (42901, 42902) or e.outcome == "rejected"] == []  # 0 x 42901
    (store,) = lane["stores"]
    assert store["granted"] is True
    site = sim.config.site_ids[0]
    tasks = {t["task"]: t for t in store["tasks"]}
    assert set(tasks) == {s.code for s in CONNECTOR.tasks}
    for spec in CONNECTOR.tasks:
        t = tasks[spec.code]
        assert t["outcome"] == "ok", t
        assert t["total"] == expected_total(sim, spec, site, t["window"]), spec.code
        assert t["latency_s"] is not None and t["latency_s"] >= 0
        assert t["gap_class"] == spec.gap_class
        if spec.code != "ODS_MEMBER":
            assert t["fields"] == {"missing": {}, "new": {}, "other_type": {}}, spec.code
    member = tasks["ODS_MEMBER"]
    assert member["fields"]["new"] == {"loyaltyTier": member["records"]} and member["records"] > 0
    # every gap the lane waited is at least the scaled floor of its class
    floors = {"standard": 3.0 * F, "groupbuy": 8.0 * F}
    assert all(t["gap_s"] is None or t["gap_s"] >= floors[t["gap_class"]] for t in tasks.values())
    assert sum(t["gap_s"] is None for t in tasks.values()) == 1  # only the lane's first request
    with psycopg.connect(pg_dsn) as conn:
        sizes = dict(conn.execute("SELECT task_code, total FROM etl_meta.store_size WHERE site_id = %s",
                                  (site,)).fetchall())
    assert sizes == {code: t["total"] for code, t in tasks.items()}
    assert data["sizes_recorded"] == n
    # one progress line per endpoint as it is answered (minutes at the real gaps are not minutes of silence)
    lines = [x for x in err.splitlines() if x.startswith("check [")]
    assert [x.split("]")[0] for x in lines] == [f"check [{i}/{n}" for i in range(1, n + 1)], err
    member_line = next(x for x in lines if ", ODS_MEMBER: " in x)
    assert f"store {site}, ODS_MEMBER: ok, total {member['total']}, " in member_line and member_line.endswith(" ms")


def test_wrong_token_is_one_line_exit_10_after_one_request(sim, pg_dsn, connector_file):
    sim.clear_log()
    code, data, err, took = check(sim, pg_dsn, connector_file, token="fq_wrong_token")
    assert code == exitcodes.CHECK_TOKEN, err
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "token" in errors[0] and "refused" in errors[0] and "40101" in errors[0]
    assert "fq_wrong_token" not in err + json.dumps(data)
    assert len(sim.request_log()) == 1  # the lane stops at the first 40101
    assert data["lanes"][0]["authenticated"] is False
    assert took < 30


def test_store_not_granted_is_exit_11_and_names_the_store(sim, pg_dsn, connector_file):
    sim.clear_log()
    site = sim.config.site_ids[0]
    code, data, err, took = check(sim, pg_dsn, connector_file, "--site-id", f"{site},{OTHER_SITE}")
    assert code == exitcodes.CHECK_STORE, err
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(OTHER_SITE) in errors[0] and "not granted" in errors[0]
    granted = {s["site_id"]: s["granted"] for s in data["lanes"][0]["stores"]}
    assert granted == {site: True, OTHER_SITE: False}
    n = len(CONNECTOR.tasks)
    assert len(sim.request_log()) == n + 1  # the refused store stops at its first 40103
    lines = [x for x in err.splitlines() if x.startswith("check [")]
    assert len(lines) == 2 * n and lines[-1].startswith(f"check [{2 * n}/{2 * n}]"), err  # the unsent ones too
    assert sum(f"store {OTHER_SITE}," in x and "not granted (40103)" in x for x in lines) == n - 1
    assert took < 60


def test_unreachable_base_url_is_exit_12_within_its_bound(sim, pg_dsn, connector_file):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, data, err, took = check(sim, pg_dsn, connector_file, base=f"http://127.0.0.1:{port}")
    assert code == exitcodes.CHECK_UNREACHABLE, err
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "cannot reach" in errors[0] and f"127.0.0.1:{port}" in errors[0]
    assert data["lanes"][0]["reachable"] is False
    assert data["lanes"][0]["requests_sent"] <= 2  # the lane stops at once (one retry at most)
    assert took < 30


def plan_json(sim, dsn: str, connector: str) -> dict:
    proc = subprocess.run([*PY, "plan", "--api-base", sim.base_url, "--dsn", dsn, "--connector", connector,
                           "--now", fmt(NOW), "--site-id", str(sim.config.site_ids[0]), "--no-dwd", "--json",
                           *scaled_gaps()], capture_output=True, text=True, timeout=60,
                          env=env_for(sim.config.token))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_new_stores_plan_says_contract_until_check_measured_it_then_uses_the_sizes(sim, pg_dsn, connector_file):
    before = plan_json(sim, pg_dsn, connector_file)
    site = sim.config.site_ids[0]
    assert before["estimate_note"] is not None
    assert f"store(s) {site}" in before["estimate_note"] and "feiqiu-etl check" in before["estimate_note"]
    assert "lower bound" in before["estimate_note"]
    assert {t["estimate"]["basis"] for t in before["lanes"][0]["tasks"]} == {"contract"}
    code, _, err, _ = check(sim, pg_dsn, connector_file)
    assert code == 0, err
    after = plan_json(sim, pg_dsn, connector_file)
    assert after["estimate_note"] is None
    tasks = after["lanes"][0]["tasks"]
    assert {t["estimate"]["basis"] for t in tasks} == {"check"}
    member = next(t for t in tasks if t["task"] == "ODS_MEMBER")
    members = len(sim.dataset.records("ODS_MEMBER", site))
    assert member["estimate"]["requests"] == members // 200 + 1 + members  # its pages and one detail per member
    assert after["estimate"]["requests"] < before["estimate"]["requests"] / 5  # a small store, not the contract's
