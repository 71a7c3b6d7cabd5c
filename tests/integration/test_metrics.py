"""Issue 18 item 10: ``GET /metrics`` of ``feiqiu-etl web`` (a real uvicorn server over loopback) tells
Prometheus the registry: refused without the token, and with it the figures of runs made here — runs by status,
rows, requests, rejections, bans, the lane's busy share, freshness per store and task, alerts sent and failed —
parsed with prometheus_client's own parser. A scrape's reads are bounded."""

from __future__ import annotations

import json
import threading
import time

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from alertkit import WebhookReceiver, free_port
from clikit import cli, env_for, run_args
from feiqiu_etl.common.status import RECORDED
from feiqiu_etl.registry.freshness import Schedule
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.web.metrics import read_snapshot
from flowkit import sim_config
from webkit import WebServer

TOKEN = "metrics-token-7d1c9e2b4a"
TASKS = ["--tasks", "ODS_MEMBER,ODS_PAYMENT"]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted label pairs): value}`` of an exposition, by prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_are_behind_the_token_and_match_the_runs(pg_dsn):
    with Simulator(sim_config(seed=21)) as sim, WebhookReceiver() as hook:
        site = sim.config.site_ids[0]
        good = cli(*run_args(sim, pg_dsn, *TASKS)[3:], env=env_for(sim.config.token))
        assert good.returncode == 0, good.stderr[-800:]
        good = json.loads(good.stdout)
        dead = f"json://127.0.0.1:{free_port()}/hook"  # nobody listens: the delivery fails
        bad = cli(*run_args(sim, pg_dsn, *TASKS)[3:], env=env_for("fq_wrong_token",
                                                                   FEIQIU_ALERT_URLS=f"{hook.url},{dead}"))
        assert bad.returncode == 4, bad.stderr[-800:]
        bad = json.loads(bad.stdout)
    assert len(hook.messages()) == 1
    delivered = {a["ok"]: a for a in bad["alerts"]}
    assert set(delivered) == {True, False}

    with WebServer(pg_dsn, env={"FEIQIU_WEB_TOKEN": TOKEN}) as web:
        assert httpx.get(f"{web.url}/metrics", timeout=10).status_code == 401
        wrong = httpx.get(f"{web.url}/metrics", headers={"Authorization": "Bearer not-the-token-at-all"}, timeout=10)
        assert wrong.status_code == 401 and "feiqiu_etl_" not in wrong.text
        answer = httpx.get(f"{web.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        scraped_at = time.time()
        counted = httpx.get(f"{web.url}/api/statistics", headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=10).json()["metrics"]
    assert counted["scrapes"] == 1 and counted["failed"] == 0 and 0 < counted["last_read_s"] < 5
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"].startswith("text/plain; version=")
    got = samples(answer.text)

    def value(name: str, **labels) -> float:
        return got[(f"feiqiu_etl_{name}", tuple(sorted((k, str(v)) for k, v in labels.items())))]

    assert value("runs", status="SUCCESS") == 1 and value("runs", status="FAILED") == 1
    assert sum(value("runs", status=s) for s in RECORDED) == 2
    for name in ("rows_written", "requests", "rejections", "errors"):
        assert value(f"{name}_total") == good[name] + bad[name], name
    assert good["rows_written"] > 0 and good["requests"] > 0

    newest = bad["lanes"][0]  # the lane's busy share in its newest finished run
    assert value("lane_busy_share", lane="default") == pytest.approx(newest["busy_seconds"] / newest["seconds"])
    lanes = [good["lanes"][0], newest]
    assert value("lane_busy_seconds_total", lane="default") == pytest.approx(sum(x["busy_seconds"] for x in lanes))
    assert value("lane_seconds_total", lane="default") == pytest.approx(sum(x["seconds"] for x in lanes))
    assert value("lane_bans_total", lane="default") == sum(x["banned"] for x in lanes)
    assert value("lane_throttled_total", lane="default") == sum(x["throttled"] for x in lanes)
    assert value("lane_refused_busy_total", lane="default") == 0

    with psycopg.connect(pg_dsn) as conn:
        member_done = conn.execute("SELECT extract(epoch FROM completed_at)::float8 FROM etl_meta.snapshot_done "
                                   "WHERE task_code = 'ODS_MEMBER' AND site_id = %s", (site,)).fetchone()[0]
    assert value("freshness_stale", site_id=site, task="ODS_MEMBER") == 0
    age = value("freshness_age_seconds", site_id=site, task="ODS_MEMBER")
    assert 0 <= age <= scraped_at - member_done + 1
    assert value("freshness_stale", site_id=site, task="ODS_GOODS") == 1  # never loaded: stale, no age
    assert ("feiqiu_etl_freshness_age_seconds", (("site_id", str(site)), ("task", "ODS_GOODS"))) not in got
    assert value("last_success_timestamp_seconds") <= scraped_at

    assert value("alerts_total", result="sent") == len(delivered[True]["reasons"])
    assert value("alerts_total", result="failed") == len(delivered[False]["reasons"]) > 0
    assert value("alerts_total", result="sending") == 0


def test_a_scrape_reads_within_its_bound_when_the_registry_is_locked(pg_dsn):
    from feiqiu_etl.db.schema import ensure_schemas

    with psycopg.connect(pg_dsn) as setup:
        ensure_schemas(setup)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(pg_dsn) as conn:
            conn.execute("LOCK TABLE etl_meta.run IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        with psycopg.connect(pg_dsn) as conn:
            began = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled):
                read_snapshot(conn, connector="feiqiu", schedule=Schedule.everything(["ODS_MEMBER"]),
                              stale_hours=26, timeout_s=0.5)
            took = time.monotonic() - began
            assert conn.execute("SHOW statement_timeout").fetchone()[0] == "0"  # the pool's session is as before
    finally:
        release.set()
        holder.join(10)
    assert took < 2.0, took
