"""Operating runs from other processes (issue: operable runs), with real processes, real PostgreSQL and the
simulator over HTTP: one lane per token across processes, cancel RUN_ID, status, runs/show, INTERRUPTED."""

from __future__ import annotations

import json
import re
import signal
import time

import psycopg
import pytest

from clikit import (cli, cli_json, env_for, finish, held_upstream, run_args, running_run, start, wait_for,
                    waiting_for_a_lane)
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.statistics import RunStatistics
from flowkit import lane_violations, sim_config

SETTLEMENT = ["--tasks", "ODS_SETTLEMENT"]


def _overlaps(log) -> list:
    entries = sorted(log, key=lambda e: e.started)
    return [(a.path, b.path) for a, b in zip(entries, entries[1:]) if b.started < a.ended]


def test_a_second_run_on_the_same_token_is_refused_and_names_the_holder(pg_dsn):
    with Simulator(sim_config(seed=21)) as sim, held_upstream(sim, after=3) as release:
        env = env_for(sim.config.token)
        # the first run is held (a slow upstream) until the second has been refused: however long a CLI process
        # takes to start on a loaded machine (seen: 8 s at load 5; a first run of ~15 s had ended before it)
        first = start(run_args(sim, pg_dsn, *SETTLEMENT, gaps=(0.3, 0.4)), env)
        wait_for(lambda: len(sim.request_log()) >= 3, what="the first run's requests")
        holder = running_run(pg_dsn)["run_id"]
        second = cli(*run_args(sim, pg_dsn, *SETTLEMENT, dwd=True)[3:], env=env)  # DWD must not hide the refusal
        release.set()
        code, data, err = finish(first)
        log = sim.request_log()
    assert second.returncode == 6, second.stderr
    lines = [line for line in second.stderr.splitlines() if "ERROR" in line or "in use" in line]
    assert any(holder in line and "pid" in line and "host" in line for line in lines), second.stderr
    refused = json.loads(second.stdout)
    # issue 18: a refused run is BUSY (its own status, still exit 6), not FAILED
    assert refused["status"] == "BUSY" and refused["exit_code"] == 6 and refused["requests"] == 0
    assert refused["dwd"] is None  # skipped: the holder's own DWD load follows it
    assert code == 0 and data["status"] == "SUCCESS", err
    assert lane_violations(log, 0.01) == [] and _overlaps(log) == []
    assert sim.config.token not in second.stderr + second.stdout
    # the message once, without a doubled prefix ("lane default: lane default (…)")
    assert second.stderr.count(holder) == 1 and "lane default: lane default" not in second.stderr, second.stderr
    assert refused["error"].startswith("lane default (") and refused["error"].count(holder) == 1
    assert cli_json("runs", "--dsn", pg_dsn, "--status", "FAILED") == []
    assert [r["run_id"] for r in cli_json("runs", "--dsn", pg_dsn, "--status", "BUSY")] == [refused["run_id"]]
    from starlette.testclient import TestClient

    from feiqiu_etl.web import WebSettings, create_app

    with TestClient(create_app(WebSettings(dsn=pg_dsn, connector="feiqiu")), base_url="http://127.0.0.1:8080") as c:
        page = c.get("/?status=BUSY").text
    assert refused["run_id"] in page and re.search(r'class="badge[^"]*\bbusy\b[^"]*"[^>]*>\s*BUSY', page), page[-3000:]


def test_with_wait_for_lane_the_second_run_waits_then_runs_without_overlap(pg_dsn):
    with Simulator(sim_config(seed=22)) as sim, held_upstream(sim, after=3) as release:
        env = env_for(sim.config.token)
        first = start(run_args(sim, pg_dsn, *SETTLEMENT, gaps=(0.2, 0.25)), env)   # held until the second waits
        wait_for(lambda: len(sim.request_log()) >= 3, what="the first run's requests")
        second = start(run_args(sim, pg_dsn, *SETTLEMENT, "--wait-for-lane", "120"), env)
        wait_for(lambda: waiting_for_a_lane(pg_dsn) or first.poll() is not None, timeout=120, every=0.1,
                 what="the second run waiting for the lane")
        release.set()
        results = [finish(first), finish(second)]
        log = sim.request_log()
    assert [r[0] for r in results] == [0, 0], [r[2][-500:] for r in results]
    assert "got the lane after waiting" in results[1][2]
    assert lane_violations(log, 0.01) == [] and _overlaps(log) == []
    first_sent, second_sent = (sum(t["attempts"] for t in r[1]["tasks"]) for r in results)
    assert first_sent > 10 and second_sent >= 1 and len(log) == first_sent + second_sent


def test_runs_on_different_tokens_proceed_at_the_same_time(pg_dsn):
    a_site, b_site = 8640015201004417, 8640015201004418
    cfg = sim_config(seed=23, site_ids=(a_site, b_site), tokens={"fq_tok_a": (a_site,), "fq_tok_b": (b_site,)})
    with Simulator(cfg) as sim:
        procs = [start(run_args(sim, pg_dsn, *SETTLEMENT, site=site, gaps=(0.04, 0.05)), env_for(token))
                 for token, site in (("fq_tok_a", a_site), ("fq_tok_b", b_site))]
        results = [finish(p) for p in procs]
        log = sim.request_log()
    assert [r[0] for r in results] == [0, 0], [r[2][-500:] for r in results]
    spans = {}
    for site in (a_site, b_site):
        mine = [e for e in log if e.site_id == site]
        assert lane_violations(mine, 0.01) == [] and _overlaps(mine) == []
        spans[site] = (min(e.started for e in mine), max(e.ended for e in mine))
    (a0, a1), (b0, b1) = spans[a_site], spans[b_site]
    assert a0 < b1 and b0 < a1  # the two lanes were busy at the same time
    assert all(e.outcome != "rejected" for e in log)


def test_cancel_from_another_process_ends_the_run_within_a_second_and_keeps_what_was_fetched(pg_dsn):
    with Simulator(sim_config(seed=24)) as sim:
        env = env_for(sim.config.token)
        proc = start(run_args(sim, pg_dsn, gaps=(0.08, 0.1)), env)
        run = running_run(pg_dsn)
        wait_for(lambda: len(sim.request_log()) >= 8, what="some requests")
        cancel = cli_json("cancel", run["run_id"], "--dsn", pg_dsn)
        code, data, err = finish(proc)
        log = sim.request_log()
    assert cancel["status"] == "CANCELLED" and cancel["seconds"] < 1.0, cancel
    assert code == 5 and data["status"] == "CANCELLED", err
    fetched = sum(e.record_count for e in log if e.outcome == "accepted")
    with psycopg.connect(pg_dsn) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'ods'").fetchall()
        stored = sum(conn.execute(f"SELECT count(*) FROM ods.{t}").fetchone()[0] for (t,) in tables)
    assert stored == fetched  # every record the upstream sent is in ODS; nothing is lost
    shown = cli_json("show", run["run_id"], "--dsn", pg_dsn)
    assert shown["status"] == "CANCELLED" and shown["exit_code"] == 5 and "cancel" in (shown["error"] or "")


def test_status_shows_the_current_request_wait_reason_rows_per_second_and_eta(pg_dsn):
    with Simulator(sim_config(seed=25)) as sim:
        proc = start(run_args(sim, pg_dsn, gaps=(0.3, 0.4)), env_for(sim.config.token))
        try:
            wait_for(lambda: len(sim.request_log()) >= 12, what="requests")

            def naming_a_request():  # a heartbeat published while the lane held a request, not in a gap between
                live = running_run(pg_dsn)["live"]
                return live if (live["lanes"][0].get("current") or {}).get("request") else None

            live = wait_for(naming_a_request, timeout=60, what="a heartbeat naming the current request")
        finally:
            proc.send_signal(signal.SIGINT)
            finish(proc)
    lane = live["lanes"][0]
    assert lane["current"]["task"] and lane["current"]["request"].startswith("/api/")
    assert lane["wait_reason"] in ("gap", "floor", "retry-after", "banned", "timeout-hold", "lane", None)
    assert lane["requests_sent"] >= 10 and lane["rows_written"] > 0 and lane["rows_per_s"] >= 0
    assert lane["eta_s"] > 0 and lane["requests_remaining"] > 0 and live["tasks"] == 21
    assert RunStatistics.from_dict(live).to_dict() == live  # what the heartbeat published is exactly the type
    assert lane["running"][0]["task"] == lane["current"]["task"] and lane["running"][0]["state"] == "running"
    text = cli("status", "--dsn", pg_dsn)
    assert text.returncode == 0


def test_runs_and_show_list_finished_failed_cancelled_and_killed_runs(pg_dsn):
    with Simulator(sim_config(seed=26)) as sim:
        env = env_for(sim.config.token)
        ok = cli(*run_args(sim, pg_dsn, "--tasks", "ODS_PAYMENT")[3:], env=env)
        bad = cli(*run_args(sim, pg_dsn, "--tasks", "ODS_PAYMENT")[3:], env=env_for("fq_wrong_token"))
        killed = start(run_args(sim, pg_dsn, gaps=(0.2, 0.3)), env)
        # a hang guard (the start-up took over 30 s at load 9 on 2 CPUs), not a promise of the product
        wait_for(lambda: len(sim.request_log()) >= 4, timeout=90, what="requests")
        killed.kill()
        killed.wait()
        cancelled = start(run_args(sim, pg_dsn, gaps=(0.2, 0.3)), env)
        wait_for(lambda: len(sim.request_log()) >= 8, what="requests")
        cancelled.send_signal(signal.SIGINT)
        finish(cancelled)
    assert (ok.returncode, bad.returncode) == (0, 4)
    runs = cli_json("runs", "--dsn", pg_dsn)
    statuses = sorted(r["status"] for r in runs)
    assert statuses == ["CANCELLED", "FAILED", "INTERRUPTED", "SUCCESS"], statuses
    interrupted = next(r for r in runs if r["status"] == "INTERRUPTED")
    assert "gone" in interrupted["error"]
    failed = cli_json("show", next(r["run_id"] for r in runs if r["status"] == "FAILED"), "--dsn", pg_dsn)
    assert "40101" in failed["summary"]["lanes"][0]["reason"] and failed["args"]["token"] in (None, "***")
    stored = [(line["task"], line["message"].split(":")[0]) for line in failed["log"]]
    assert ("ODS_PAYMENT", "start") in stored and ("ODS_PAYMENT", "request failure") in stored
    text = cli("runs", "--dsn", pg_dsn, "--status", "interrupted")
    assert text.returncode == 0 and interrupted["run_id"] in text.stdout


def test_logs_are_written_when_things_happen_with_their_own_timestamps(pg_dsn):
    with Simulator(sim_config(seed=27)) as sim:
        args = [a for a in run_args(sim, pg_dsn, "--tasks", "ODS_MEMBER", gaps=(0.05, 0.06)) if a != "--no-progress"]
        proc = start([*args, "-vv", "--log-format", "json"], env_for(sim.config.token))
        code, data, err = finish(proc)
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line is JSON, progress too
    assert any(line["logger"] == "feiqiu_etl.progress" and "ODS_MEMBER" in line["message"] for line in lines)
    debug = [line for line in lines if line["level"] == "DEBUG" and line["message"].startswith("request #")]
    assert len(debug) >= 40 and debug[0]["lane"] and debug[0]["site_id"]  # -vv: every attempt
    assert lines and all(set(line) >= {"ts", "level", "logger", "message", "run_id", "lane", "site_id", "task"}
                         for line in lines)
    start_line = next(line for line in lines if line["message"].startswith("start:"))
    done_line = next(line for line in lines if line["message"].startswith("done:"))
    assert start_line["task"] == "ODS_MEMBER" and start_line["run_id"] == data["run_id"]
    from datetime import datetime

    took = (datetime.fromisoformat(done_line["ts"]) - datetime.fromisoformat(start_line["ts"])).total_seconds()
    assert took > 1.0  # 41 requests at >= 50 ms: the start line was stamped when the task started, not at its end


@pytest.mark.parametrize("args,message", [
    (["--port", "70000"], "70000"),
    (["--days", "0"], "days"),
    (["--gap-standard", "-1"], "gap-standard"),
])
def test_simulate_rejects_bad_arguments_with_one_line(args, message):
    proc = cli("simulate", *args, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_simulate_reports_a_port_in_use_in_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = cli("simulate", "--port", str(port), timeout=30)
    assert proc.returncode == 2 and "cannot listen" in proc.stderr and "Traceback" not in proc.stderr


def test_env_file_is_accepted_after_the_command(tmp_path):
    env_file = tmp_path / "custom.env"
    env_file.write_text("PIPELINE_WORKERS=3\n", encoding="utf-8")
    out = cli_json("config", "show", "--env-file", str(env_file))
    workers = next(r for r in out if r["key"] == "pipeline.workers")
    assert workers["value"] == "3" and workers["source"] == ".env"
    missing = cli("config", "show", "--env-file", str(tmp_path / "nope.env"))
    assert missing.returncode == 2 and "no such env file" in missing.stderr


def test_sql_prints_jsonb_as_json_on_a_fresh_home(fresh_home):
    env = env_for("unused", FEIQIU_ETL_HOME=str(fresh_home))  # (as root, tmp_path is closed to the server)
    env.pop("ETL_DB_DSN", None)
    proc = cli("sql", "SELECT '{\"a\": [1, 2]}'::jsonb AS j, count(*) AS runs FROM etl_meta.run", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert '{"a": [1, 2]}' in proc.stdout and "'a'" not in proc.stdout


def test_a_bare_notification_does_not_cancel_a_run(pg_dsn):
    # any role that can connect can NOTIFY (the read-only `sql` role too); only a recorded request cancels
    from feiqiu_etl.registry import CANCEL_CHANNEL

    with Simulator(sim_config(seed=29)) as sim, held_upstream(sim, after=3) as release:
        proc = start(run_args(sim, pg_dsn, *SETTLEMENT, gaps=(0.1, 0.12)), env_for(sim.config.token))
        wait_for(lambda: len(sim.request_log()) >= 3, what="the run's requests")
        run_id = running_run(pg_dsn)["run_id"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, run_id))
        # the run is held (a slow upstream) until it has heard the notification: a ~5 s run had ended first
        wait_for(lambda: len(sim.request_log()) >= 5, timeout=60, what="requests after the notification")
        release.set()
        code, data, err = finish(proc)
    assert code == 0 and data["status"] == "SUCCESS", err
    assert "ignored a cancel notification" in err


def test_a_lane_held_by_a_session_that_is_no_run_is_named_as_such(pg_dsn):
    from feiqiu_etl.plan.model import Secret
    from feiqiu_etl.registry.lane_guard import lock_key

    with Simulator(sim_config(seed=31)) as sim:
        env = env_for(sim.config.token)
        done = cli(*run_args(sim, pg_dsn, "--tasks", "ODS_MEMBER_CARD")[3:], env=env)  # leaves its lane_lock row
        assert done.returncode == 0, done.stderr
        finished = json.loads(done.stdout)["run_id"]
        key = lock_key(f"feiqiu:{Secret(sim.config.token).fingerprint()}")
        with psycopg.connect(pg_dsn, autocommit=True) as squatter:  # e.g. someone in psql
            squatter.execute("SELECT pg_advisory_lock(%s)", (key,))
            refused = cli(*run_args(sim, pg_dsn, "--tasks", "ODS_MEMBER_CARD")[3:], env=env)
    assert refused.returncode == 6, refused.stderr
    assert "no feiqiu-etl run" in refused.stderr and finished not in refused.stderr, refused.stderr


def test_a_second_run_on_the_same_token_is_refused_whatever_its_connector_is_called(pg_dsn, tmp_path):
    from pathlib import Path

    import feiqiu_etl.connector as connector_pkg

    shipped = Path(connector_pkg.__file__).parent
    text = (shipped / "feiqiu.yaml").read_text(encoding="utf-8")
    assert "\nname: feiqiu\n" in "\n" + text
    (tmp_path / "other.yaml").write_text(("\n" + text).replace("\nname: feiqiu\n", "\nname: feiqiu2\n", 1)[1:],
                                         encoding="utf-8")
    (tmp_path / "feiqiu.dwd.yaml").write_text((shipped / "feiqiu.dwd.yaml").read_text(encoding="utf-8"),
                                              encoding="utf-8")
    with Simulator(sim_config(seed=33)) as sim, held_upstream(sim, after=3) as release:
        env = env_for(sim.config.token)
        first = start(run_args(sim, pg_dsn, *SETTLEMENT, gaps=(0.15, 0.2)), env)  # held until the second ended
        wait_for(lambda: len(sim.request_log()) >= 3, what="the first run's requests")
        second = cli(*run_args(sim, pg_dsn, *SETTLEMENT, "--connector", str(tmp_path / "other.yaml"))[3:], env=env)
        release.set()
        code, data, err = finish(first)
        log = sim.request_log()
    assert second.returncode == 6, second.stderr[-800:]
    assert code == 0 and data["status"] == "SUCCESS", err
    assert _overlaps(log) == []


def test_cancel_is_honoured_while_a_run_waits_for_its_lane(pg_dsn):
    """Issue 21 item 3: B waits for the lane A holds (``--wait-for-lane 300``); ``feiqiu-etl cancel B`` ends B
    CANCELLED within 2 s (measured by the cancel command, which waits for B's record), while A goes on."""
    with Simulator(sim_config(seed=25)) as sim, held_upstream(sim, after=2):
        env = env_for(sim.config.token)
        first = start(run_args(sim, pg_dsn, *SETTLEMENT, gaps=(0.6, 0.7)), env)  # held: it outlasts the test
        holder = running_run(pg_dsn)
        wait_for(lambda: len(sim.request_log()) >= 2, what="the first run's requests")
        second = start(run_args(sim, pg_dsn, *SETTLEMENT, "--wait-for-lane", "300"), env)

        def waiting_run():
            runs = [r for r in cli_json("status", "--dsn", pg_dsn) if r["run_id"] != holder["run_id"]]
            return runs[0] if runs else None

        waiting = wait_for(waiting_run, timeout=30, every=0.1, what="the second run")
        # it is waiting for the lane now: refused once, polling the lock every 0.25 s (was: a guessed 1 s)
        wait_for(lambda: waiting_for_a_lane(pg_dsn), timeout=120, every=0.1, what="the second run's lane wait")
        sent_before = len(sim.request_log())
        cancel = cli_json("cancel", waiting["run_id"], "--wait", "15", "--dsn", pg_dsn)
        code, data, err = finish(second, timeout=30)
        first_alive = first.poll() is None
        # the holder goes on (its next held request answers within a second and a gap)
        wait_for(lambda: len(sim.request_log()) > sent_before or first.poll() is not None, timeout=30,
                 what="the holder's next request")
        first.send_signal(signal.SIGTERM)
        finish(first, timeout=60)
    assert cancel["status"] == "CANCELLED" and cancel["seconds"] < 2.0, cancel
    assert code == 5 and data["status"] == "CANCELLED", err[-800:]
    assert "cancel" in (data["error"] or "") and data["tasks"] == []  # it never got the lane, nor sent anything
    assert "got the lane" not in err
    assert first_alive and len(sim.request_log()) > sent_before  # the holder went on meanwhile
    print(f"cancel while waiting for the lane: CANCELLED {cancel['seconds']:.2f} s after the cancel command")
