"""Alert latency and payloads (issue 18): how long from a run's end to the alert at the receiver, what a
hanging receiver costs, and one payload of each target kind.

1. Latency: ``feiqiu-etl run`` as a process that ends FAILED (a wrong token: 40101) against the simulator,
   with ``FEIQIU_ALERT_URLS`` pointing at a local JSON webhook (``json://``) and a local SMTP server
   (``mailto://``, aiosmtpd). Latency = arrival at the receiver minus the run's ``finished_at``; also the
   time from ``finished_at`` to the process's exit, with and without alerts.
2. Bound: the same run with one receiver that never answers (``alerts.timeout_seconds: 2``).
3. Payloads: the JSON webhook body and the email of trial 1, and what Apprise sends for Feishu, Lark,
   DingTalk and WeCom bots. Apprise has no URL option for their host, so for this capture only (in this
   process) each plugin class's ``notify_url`` is pointed at the local receiver; nothing leaves the machine.

Usage: python benchmarks/bench_alerts.py [--trials 5] [--output benchmarks/results/alerts.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alertkit import SmtpReceiver, WebhookReceiver  # noqa: E402
from benchlib import emit  # noqa: E402
from clikit import wait_for  # noqa: E402

from feiqiu_etl.connector.windows import fmt  # noqa: E402
from feiqiu_etl.db.embedded import create_database, temporary_server  # noqa: E402
from feiqiu_etl.simulator import RiskControlConfig, Simulator, SimulatorConfig  # noqa: E402

ANCHOR = datetime(2024, 3, 4)
PY = [sys.executable, "-m", "feiqiu_etl"]


def _run(sim, dsn: str, env: dict, *extra: str) -> tuple[dict, float]:
    args = [*PY, "run", "--api-base", sim.base_url, "--site-id", str(sim.config.site_ids[0]), "--dsn", dsn,
            "--no-dwd", "--json", "--unsafe-gaps", "--no-progress", "--tasks", "ODS_PAYMENT",
            "--window-start", fmt(ANCHOR - timedelta(days=2)), "--window-end", fmt(ANCHOR),
            "--set=pipeline.rate_min=0.02", "--set=pipeline.rate_max=0.03", *extra]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    exited = time.time()
    data = json.loads(proc.stdout)
    return data, exited - datetime.fromisoformat(data["finished_at"]).timestamp()


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


def capture_platform_payloads(summary: dict) -> dict[str, dict]:
    """What Apprise sends for Feishu, Lark, DingTalk and WeCom bots, captured on a loopback receiver."""
    from apprise.plugins.dingtalk import NotifyDingTalk
    from apprise.plugins.feishu import NotifyFeishu
    from apprise.plugins.lark import NotifyLark
    from apprise.plugins.wecombot import NotifyWeComBot

    from feiqiu_etl.alerts import rules
    from feiqiu_etl.alerts.config import RulesModel, Target
    from feiqiu_etl.alerts.messages import run_message
    from feiqiu_etl.alerts.sending import deliver, redact

    message = run_message(rules.run_findings(summary, RulesModel()), summary, language="zh",
                          web_url="http://etl-host:8080", host="etl-host")
    out: dict[str, dict] = {}
    with WebhookReceiver() as hook:
        base = f"http://127.0.0.1:{hook.port}"
        patched = {NotifyFeishu: f"{base}/feishu/{{token}}/", NotifyLark: f"{base}/lark/",
                   NotifyDingTalk: f"{base}/dingtalk?access_token={{token}}",
                   NotifyWeComBot: f"{base}/wecombot?key={{key}}"}
        saved = {cls: cls.notify_url for cls in patched}
        try:
            for cls, url in patched.items():
                cls.notify_url = url
            urls = {"feishu": "feishu://FEISHU_BOT_TOKEN", "lark": "lark://lark-bot-token-0042",
                    "dingtalk": "dingtalk://dingtalktoken0042", "wecombot": "wecombot://WECOM_BOT_KEY"}
            for name, url in urls.items():
                before = len(hook.received)
                (d,) = deliver([(Target(name, url, redact(url)), message)], timeout=5, attempts=1)
                got = hook.received[before:]
                out[name] = {"ok": d.ok, "error": d.error, "path": got[0].path if got else None,
                             "content_type": got[0].headers.get("Content-Type") if got else None,
                             "body": got[0].json() if got else None}
        finally:
            for cls, url in saved.items():
                cls.notify_url = url
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--output", type=Path)
    a = parser.parse_args()
    lines = [f"command: python benchmarks/bench_alerts.py --trials {a.trials}"
             + (f" --output {a.output}" if a.output else ""),
             f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"]
    risk = RiskControlConfig(gap_standard=0.01, gap_groupbuy=0.02)
    with temporary_server(prefix="feiqiu-bench-alerts-") as server, \
            Simulator(SimulatorConfig(seed=5, scale="small", days=2, anchor=ANCHOR, risk=risk)) as sim:
        base = {**os.environ, "FEIQIU_API_TOKEN": "fq_wrong_token"}
        json_lat, smtp_lat, tail_alerts, tail_quiet = [], [], [], []
        first: tuple | None = None
        for i in range(a.trials):
            dsn = create_database(server.dsn("postgres"), f"alerts_{i}") or server.dsn(f"alerts_{i}")
            with WebhookReceiver() as hook, SmtpReceiver() as smtp:
                data, tail = _run(sim, dsn, {**base, "FEIQIU_ALERT_URLS": f"{hook.url},{smtp.url}"})
                wait_for(lambda: hook.received and smtp.mails, 5, what="both alerts")
                end = datetime.fromisoformat(data["finished_at"]).timestamp()
                json_lat.append(hook.received[0].at - end)
                smtp_lat.append(smtp.mails[0].at - end)
                tail_alerts.append(tail)
                if first is None:
                    first = (data, hook.received[0], smtp.mails[0])
            _, quiet = _run(sim, dsn, base)
            tail_quiet.append(quiet)
            lines.append(f"trial {i + 1}: status {data['status']}, json {json_lat[-1] * 1000:.0f} ms, smtp "
                         f"{smtp_lat[-1] * 1000:.0f} ms after the run's end; process exit {tail:.2f} s after it "
                         f"(without alerts {quiet:.2f} s); deliveries {[x['ok'] for x in data['alerts']]}")
        lines.append(f"latency run end → JSON webhook: {_ms(json_lat)}")
        lines.append(f"latency run end → SMTP server: {_ms(smtp_lat)}")
        lines.append(f"run end → process exit: with alerts {_ms(tail_alerts)}, without {_ms(tail_quiet)}")
        dsn = create_database(server.dsn("postgres"), "alerts_hang") or server.dsn("alerts_hang")
        with WebhookReceiver("hang") as hang:
            path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-alerts-{os.getpid()}.yaml"
            path.write_text("alerts:\n  timeout_seconds: 2\n  targets: [{name: hang, url_env: FQ_ALERT_HANG}]\n",
                            encoding="utf-8")
            data, tail = _run(sim, dsn, {**base, "FQ_ALERT_HANG": hang.url}, "--alerts", str(path))
            path.unlink()
        lines.append(f"a receiver that never answers (timeout_seconds 2): process exit {tail:.2f} s after the "
                     f"run's end; recorded {data['alerts']}")
    data, hook_msg, mail = first
    lines += ["", "payload, JSON webhook (json://), POST " + hook_msg.path + " Content-Type "
              + hook_msg.headers.get("Content-Type", "?") + ":", json.dumps(hook_msg.json(), ensure_ascii=False, indent=2)]
    lines += ["", "payload, SMTP (mailto://): From " + mail.sender + " To " + ", ".join(mail.recipients),
              "Subject: " + mail.subject, mail.text().rstrip()]
    for name, got in capture_platform_payloads(data).items():
        lines += ["", f"payload, {name}:// (Apprise plugin pointed at loopback), POST {got['path']} Content-Type "
                  f"{got['content_type']}, delivered {got['ok']} {got['error'] or ''}".rstrip(),
                  json.dumps(got["body"], ensure_ascii=False, indent=2)]
    emit("\n".join(lines) + "\n", a.output)


if __name__ == "__main__":
    main()
