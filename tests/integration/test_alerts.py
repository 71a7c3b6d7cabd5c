"""Alerts end to end (issue 18.1): real `feiqiu-etl` processes against the simulator over HTTP, real
PostgreSQL, and real local receivers — an HTTP webhook (json://) and an SMTP server (mailto://). A run that
ends FAILED, one that ends PARTIAL, a killed run found INTERRUPTED and stale data each produce exactly one
message per receiver, in the receiver's format; a receiver that hangs or answers 500 costs the run at most
the configured bound, and the run's record shows the failure."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from alertkit import SmtpReceiver, WebhookReceiver
from clikit import cli, cli_json, env_for, finish, run_args, start, wait_for
from feiqiu_etl.simulator import Simulator
from flowkit import sim_config

SECRET = "hook-s3cr3t-9f8e7d"
PAYMENT = ["--tasks", "ODS_PAYMENT"]


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _alerts_file(tmp_path: Path, *targets: str, **settings) -> str:
    """An alerts file with ``targets`` (names; their URLs in FQ_ALERT_<NAME>) and ``settings`` (YAML text)."""
    settings = {"language": "en", "web_url": "http://etl-host:8080", **settings}  # a key once (YAML refuses twice)
    lines = ["alerts:"] + [f"  {k}: {v}" for k, v in settings.items()]
    lines += ["  targets:"] + [f"    - {{name: {t}, url_env: FQ_ALERT_{t.upper()}}}" for t in targets]
    path = tmp_path / "alerts.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


def test_a_failed_run_sends_one_message_to_a_webhook_and_one_email(pg_dsn):
    with Simulator(sim_config(seed=41)) as sim, WebhookReceiver(path=f"/hook/{SECRET}") as hook, \
            SmtpReceiver() as smtp:
        env = env_for("fq_wrong_token", FEIQIU_ALERT_URLS=f"{hook.url},{smtp.url}")
        proc = cli(*run_args(sim, pg_dsn, *PAYMENT)[3:], "-v", env=env)
        ended = time.time()
    assert proc.returncode == 4, proc.stderr[-800:]
    data = json.loads(proc.stdout)
    assert data["status"] == "FAILED"
    (payload,) = hook.messages()                      # exactly one, in Apprise's JSON webhook format
    assert set(payload) == {"version", "title", "message", "attachments", "type"} and payload["type"] == "failure"
    assert payload["title"] == f"[feiqiu-etl] run {data['run_id']} FAILED · TOKEN_REFUSED"
    assert "token refused (40101) on lane default" in payload["message"]
    assert "Stores: 8640015201004417 FAILED" in payload["message"]
    (mail,) = smtp.mails                              # exactly one email
    assert mail.subject == payload["title"] and mail.recipients == ["ops@example.com"]
    assert f"Run {data['run_id']} ended FAILED (exit 4)" in mail.text()
    sent = {a["target"].split(" ")[0]: a for a in data["alerts"]}
    assert set(sent) == {"url1", "url2"} and all(a["ok"] and a["attempts"] == 1 for a in sent.values())
    assert sent["url1"]["reasons"] == ["FAILED", "TOKEN_REFUSED", "STALE"]  # ODS_PAYMENT never loaded, too
    assert "8640015201004417 ODS_PAYMENT: never loaded" in payload["message"]
    latency = {"json": hook.received[0].at - _epoch(data["finished_at"]),
               "smtp": mail.at - _epoch(data["finished_at"])}
    assert all(0 <= v < 2.0 for v in latency.values()), latency
    assert ended - _epoch(data["finished_at"]) < 5
    print(f"alert latency run end → receiver: {latency}")
    shown = cli_json("show", data["run_id"], "--dsn", pg_dsn)
    assert sorted(a["target"].split(" ")[0] for a in shown["alerts"]) == ["url1", "url2"]
    assert all(a["ok"] and a["reasons"] == ["FAILED", "TOKEN_REFUSED", "STALE"] for a in shown["alerts"])
    text = cli("show", data["run_id"], "--dsn", pg_dsn)
    assert "alert FAILED, TOKEN_REFUSED, STALE → url1 (json://127.0.0.1:" in text.stdout
    _no_secret(proc.stdout, proc.stderr, json.dumps(shown), text.stdout)


def test_a_partial_run_sends_one_message_naming_the_refused_store(pg_dsn, tmp_path):
    allowed, other = 8640015201004417, 8640015201009999
    cfg = sim_config(seed=42, site_ids=(allowed, other), tokens={"fq_one_store": (allowed,)})
    with Simulator(cfg) as sim, WebhookReceiver() as hook, SmtpReceiver() as smtp:
        env = env_for("fq_one_store", FQ_ALERT_HOOK=hook.url, FQ_ALERT_MAIL=smtp.url)
        path = _alerts_file(tmp_path, "hook", "mail", language="zh")
        proc = cli(*run_args(sim, pg_dsn, *PAYMENT, "--site-id", str(other), "--alerts", path)[3:], env=env)
    assert proc.returncode == 3, proc.stderr[-800:]
    data = json.loads(proc.stdout)
    (payload,) = hook.messages()
    (mail,) = smtp.mails
    assert payload["type"] == "warning" and mail.subject == payload["title"]
    assert payload["title"] == f"[feiqiu-etl] 运行 {data['run_id']} PARTIAL · STORE_REFUSED"
    assert f"门店被拒绝（40103）：{other} (default)" in payload["message"]
    assert f"详情：http://etl-host:8080/runs/{data['run_id']}" in payload["message"]
    assert [a["ok"] for a in data["alerts"]] == [True, True]


def test_a_killed_run_found_interrupted_alerts_once(pg_dsn):
    with Simulator(sim_config(seed=43)) as sim, WebhookReceiver() as hook:
        env = env_for(sim.config.token, FEIQIU_ALERT_URLS=hook.url)
        proc = start(run_args(sim, pg_dsn, gaps=(0.2, 0.3)), env)
        wait_for(lambda: len(sim.request_log()) >= 3, what="requests")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert hook.received == []
        first = cli("runs", "--dsn", pg_dsn, "--json", env=env)      # this command finds it INTERRUPTED
        again = [cli("runs", "--dsn", pg_dsn, env=env), cli("status", "--dsn", pg_dsn, env=env)]
        time.sleep(0.3)
    assert first.returncode == 0 and all(p.returncode == 0 for p in again)
    (run,) = json.loads(first.stdout)
    assert run["status"] == "INTERRUPTED"
    (payload,) = hook.messages()                        # once, whoever looks next
    assert payload["title"] == f"[feiqiu-etl] run {run['run_id']} INTERRUPTED" and payload["type"] == "failure"
    assert "the run was INTERRUPTED: process" in payload["message"] and "is gone" in payload["message"]
    shown = cli_json("show", run["run_id"], "--dsn", pg_dsn)
    assert [(a["reasons"], a["ok"]) for a in shown["alerts"]] == [(["INTERRUPTED"], True)]


def _fleet(tmp_path: Path, site: int, tasks: list[str], env: str = "FQ_TOKEN_SOUTH") -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"lanes:\n  - name: south\n    token_env: {env}\n    stores: [{{site_id: {site}}}]\n"
                    f"    tasks: [{', '.join(tasks)}]\n", encoding="utf-8")
    return str(path)


def test_stale_data_alerts_once_at_the_run_end_and_not_again(pg_dsn, tmp_path):
    site = 8640015201004417
    with Simulator(sim_config(seed=44)) as sim, WebhookReceiver() as hook, SmtpReceiver() as smtp:
        env = env_for(sim.config.token, FQ_ALERT_HOOK=hook.url, FQ_ALERT_MAIL=smtp.url, DISPLAY_TIMEZONE="Asia/Shanghai")
        path = _alerts_file(tmp_path, "hook", "mail")
        fleet = _fleet(tmp_path, site, ["ODS_PAYMENT"])
        # the window of the simulator's fixed history ends in March 2024: a successful run of stale data
        old = cli(*run_args(sim, pg_dsn, *PAYMENT, "--alerts", path)[3:], env=env)
        assert old.returncode == 0, old.stderr[-800:]
        check = cli("freshness", "--dsn", pg_dsn, "--fleet", fleet, "--fail-stale", "--json", "--alerts", path, env=env)
        again = cli(*run_args(sim, pg_dsn, *PAYMENT, "--alerts", path)[3:], env=env)   # same data: no repeat
        time.sleep(0.3)
    data = json.loads(old.stdout)
    (payload,) = hook.messages()
    (mail,) = smtp.mails
    assert payload["title"] == "[feiqiu-etl] stale data: 1 store/task(s) older than 26 h" == mail.subject
    assert payload["type"] == "warning"
    assert f"{site} ODS_PAYMENT: loaded up to 2024-03-04 00:00:00 +08:00 (" in payload["message"]  # formats.when
    assert [a["reasons"] for a in data["alerts"]] == [["STALE"], ["STALE"]]
    assert check.returncode == 8, check.stderr
    report = json.loads(check.stdout)
    assert report["stale"] == 1 and [r["task"] for r in report["rows"]] == ["ODS_PAYMENT"]
    assert report["alerts"] == []                   # already sent for this age: no storm
    assert again.returncode == 0 and json.loads(again.stdout)["alerts"] == []


def test_freshness_judges_only_scheduled_tasks_and_passes_after_a_fresh_run(pg_dsn, tmp_path):
    from starlette.testclient import TestClient

    from feiqiu_etl.connector import load_connector
    from feiqiu_etl.plan.fleet import schedule_from_fleet
    from feiqiu_etl.web import WebSettings, create_app

    site = 8640015201004417
    tasks = ["ODS_SETTLEMENT", "ODS_PAYMENT", "ODS_MEMBER"]
    fleet = _fleet(tmp_path, site, tasks)
    with Simulator(sim_config(seed=45, anchor=None)) as sim:   # history up to now: an incremental run is fresh
        env = env_for("unused", FQ_TOKEN_SOUTH=sim.config.token)
        before = cli("freshness", "--dsn", pg_dsn, "--fleet", fleet, "--fail-stale", "--json", env=env)
        sets = [a for a in run_args(sim, pg_dsn) if a.startswith("--set=")]
        ran = cli("run", "--fleet", fleet, "--api-base", sim.base_url, "--dsn", pg_dsn, "--no-dwd", "--json",
                  "--unsafe-gaps", "--no-progress", *sets, env=env, timeout=120)
    assert before.returncode == 8 and json.loads(before.stdout)["stale"] == 3, before.stderr
    assert ran.returncode == 0, ran.stderr[-800:]
    after = cli("freshness", "--dsn", pg_dsn, "--fleet", fleet, "--fail-stale", "--json", env=env)
    assert after.returncode == 0, after.stderr
    report = json.loads(after.stdout)
    assert report["stale"] == 0 and sorted(r["task"] for r in report["rows"]) == sorted(tasks)
    assert all(r["age_seconds"] < 600 for r in report["rows"])
    text = cli("freshness", "--dsn", pg_dsn, "--fleet", fleet, env=env)
    assert text.returncode == 0 and "0 of 3 older than 26 h or never loaded" in text.stdout
    every = cli("freshness", "--dsn", pg_dsn, "--fail-stale", "--json", env=env)  # no fleet: every task is judged
    assert every.returncode == 8 and json.loads(every.stdout)["stale"] == 18
    connector = load_connector()
    schedule = schedule_from_fleet(fleet, [t.code for t in connector.tasks])
    app = create_app(WebSettings(dsn=pg_dsn, connector="feiqiu", task_codes=tuple(t.code for t in connector.tasks),
                                 schedule=schedule))
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        api = c.get("/api/freshness").json()
        page = c.get("/freshness").text
    assert [(r["site_id"], r["task"], r["stale"]) for r in api["rows"]] == \
        [(r["site_id"], r["task"], r["stale"]) for r in report["rows"]]
    assert "0 of 3 older than 26 h" in page


@pytest.mark.parametrize("mode", ["hang", "trickle", "error"])
def test_a_receiver_that_hangs_or_answers_500_costs_at_most_the_bound_and_is_recorded(pg_dsn, tmp_path, mode):
    bound = 2.0
    with Simulator(sim_config(seed=46)) as sim, WebhookReceiver(mode, path=f"/hook/{SECRET}") as bad:
        env = env_for("fq_wrong_token", FQ_ALERT_BAD=bad.url)
        path = _alerts_file(tmp_path, "bad", timeout_seconds=bound, attempts=3)
        proc = start(run_args(sim, pg_dsn, *PAYMENT, "--alerts", path), env)
        code, data, err = finish(proc)
        exited = time.time()
        quiet = start(run_args(sim, pg_dsn, *PAYMENT), env)          # the same run without alerts
        q_code, q_data, _ = finish(quiet)
        q_exited = time.time()
    assert code == q_code == 4, err[-800:]
    tail, quiet_tail = exited - _epoch(data["finished_at"]), q_exited - _epoch(q_data["finished_at"])
    (alert,) = data["alerts"]
    print(f"{mode}: run end → exit {tail:.2f} s with alerts, {quiet_tail:.2f} s without; run end → alert done "
          f"{_epoch(alert['sent_at']) - _epoch(data['finished_at']):.2f} s (bound {bound} s)")
    # The promise (docs/guides/alerts.md: sending never holds the run up beyond timeout_seconds, plus a few
    # bounded statements), on the product's own clock: the sending itself within 0.25 s of the bound, and from
    # the run's end (finished_at) to the answer or the deadline (sent_at: reading the history, sending, retries)
    # within 1 s of it.
    assert alert["latency_s"] <= bound + 0.25, alert
    assert _epoch(alert["sent_at"]) - _epoch(data["finished_at"]) <= bound + 1.0, alert
    # Measured from outside against the same run without alerts, the whole process only guards against a hang
    # (a process that waited for the receiver would not end before it closes): two process ends on a shared
    # 2-core machine differ by seconds under load (seen: 1.8 s on top of the bound at load 5-8).
    assert tail - quiet_tail < bound + 8.0, (tail, quiet_tail)
    assert not alert["ok"] and alert["reasons"] == ["FAILED", "TOKEN_REFUSED", "STALE"]
    if mode in ("hang", "trickle"):
        assert alert["error"] == f"no answer within {bound:g} s" and len(bad.received) == 1
    else:
        assert "error=500" in alert["error"] and alert["attempts"] == 3 == len(bad.received)
    shown = cli_json("show", data["run_id"], "--dsn", pg_dsn)
    assert [(a["ok"], a["error"]) for a in shown["alerts"]] == [(False, alert["error"])]
    assert f"alert to bad (json://127.0.0.1:{bad.port}/…) failed" in err
    _no_secret(err, json.dumps(data), json.dumps(shown))


def test_a_bad_alerts_file_stops_the_run_before_anything_with_one_line(tmp_path):
    path = _alerts_file(tmp_path, "ops")             # FQ_ALERT_OPS is not set
    env = env_for("fq_x")
    env.pop("FQ_ALERT_OPS", None)
    proc = cli("run", "--site-id", "1", "--api-base", "http://127.0.0.1:9", "--dsn", "postgresql://127.0.0.1:9/x",
               "--alerts", path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"Error: {path}: alerts.targets[0] (ops).url_env: environment variable "
                                   "FQ_ALERT_OPS is not set")
    bad = cli("freshness", "--dsn", "postgresql://127.0.0.1:9/x", env={**env, "FEIQIU_ALERT_URLS": f"{SECRET}"})
    assert bad.returncode == 2 and "FEIQIU_ALERT_URLS: URL 1" in bad.stderr and SECRET not in bad.stderr


def test_alerts_test_sends_a_sample_to_each_target_or_the_one_named(tmp_path):
    with WebhookReceiver(path=f"/hook/{SECRET}") as hook, SmtpReceiver() as smtp, WebhookReceiver("hang") as hang:
        env = env_for("unused", FQ_ALERT_HOOK=hook.url, FQ_ALERT_MAIL=smtp.url, FQ_ALERT_HANG=hang.url)
        path = _alerts_file(tmp_path, "hook", "mail", language="zh")
        every = cli("alerts", "test", "--alerts", path, "--json", env=env)
        one = cli("alerts", "test", "hook", "--alerts", path, env=env)
        unknown = cli("alerts", "test", "nope", "--alerts", path, env=env)
        hung_path = str(tmp_path / "hung.yaml")
        Path(hung_path).write_text("alerts:\n  timeout_seconds: 1\n  targets: [{name: hang, url_env: FQ_ALERT_HANG}]\n",
                                   encoding="utf-8")
        t0 = time.monotonic()
        hung = cli("alerts", "test", "--alerts", hung_path, env=env)
        took = time.monotonic() - t0
        nothing = cli("alerts", "test", env={k: v for k, v in env.items() if not k.startswith("FEIQIU_ALERT")})
    assert every.returncode == 0, every.stderr
    assert [d["ok"] for d in json.loads(every.stdout)] == [True, True]
    assert one.returncode == 0 and one.stdout.startswith("hook (json://127.0.0.1:") and "sent" in one.stdout
    assert [m["title"] for m in hook.messages()] == ["[feiqiu-etl] 测试告警"] * 2 and len(smtp.mails) == 1
    assert hook.messages()[0]["type"] == "info" and "测试消息" in smtp.mails[0].text()
    assert unknown.returncode == 2 and "no target 'nope'; the targets are hook, mail" in unknown.stderr
    assert hung.returncode == 4 and "FAILED: no answer within 1 s" in hung.stdout, hung.stdout
    # the bound is the promise, on the product's clock (the sending within 0.25 s of it); the whole process,
    # measured from outside, only guards against a hang: a process waiting for the receiver would take its 60 s
    # (seen: 9.8 s in all at load 13-23, an interpreter's start and exit included)
    latency = float(re.search(r"no answer within 1 s \((\d+(?:\.\d+)?) s", hung.stdout).group(1))
    assert latency <= 1 + 0.25 and took < 30, (hung.stdout, took)
    assert nothing.returncode == 2 and "no alert target" in nothing.stderr
    _no_secret(every.stdout, one.stdout, hung.stdout)


def test_a_store_failing_n_runs_in_a_row_alerts_once_when_the_streak_reaches_n(pg_dsn):
    from feiqiu_etl.alerts import load_alerts
    from flowkit import options, run_opts

    with Simulator(sim_config(seed=47)) as sim, WebhookReceiver() as hook:
        path = Path("alerts-streak.yaml")  # (the test runs in its own empty folder)
        path.write_text("alerts:\n  rules: {consecutive_failures: 2, stale_hours: null}\n"
                        "  targets: [{name: hook, url_env: FQ_ALERT_HOOK}]\n", encoding="utf-8")
        alerts = load_alerts(path, {"FQ_ALERT_HOOK": hook.url})  # the runs' own configuration (RunRequest.alerts)
        results = []
        for token in ("fq_wrong", "fq_wrong", "fq_wrong", None):
            opts = options(sim, tasks=["ODS_PAYMENT"])
            opts.token = token or sim.config.token
            results.append(run_opts(opts, pg_dsn, alerts=alerts))
    assert [r.status for r in results] == ["FAILED", "FAILED", "FAILED", "SUCCESS"]
    assert [[a["reasons"] for a in r.alerts] for r in results] == [
        [["FAILED", "TOKEN_REFUSED"]], [["FAILED", "TOKEN_REFUSED", "CONSECUTIVE_FAILURES"]],
        [["FAILED", "TOKEN_REFUSED"]], []]
    titles = [m["title"] for m in hook.messages()]
    assert len(titles) == 3 and titles[1].endswith("CONSECUTIVE_FAILURES (8640015201004417)")
    assert "store 8640015201004417 failed in 2 runs in a row" in hook.messages()[1]["message"]
