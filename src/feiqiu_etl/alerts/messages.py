"""Alert texts in English or Chinese (``alerts.language``): one title and one plain-text body per message.

A message names the run id, its lanes and stores, why it is sent (every finding, most severe first), the
first errors, the stale stores/tasks and, when ``alerts.web_url`` is set, a link to the run's page (or to
``/freshness``). Text that came from outside (upstream messages in errors) has its control characters
escaped and is cut to one line, so a message cannot be forged line by line. Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from feiqiu_etl.alerts.rules import (BANNED, CONSECUTIVE_FAILURES, DEADLINE, DELETIONS_HELD, FAILED, INTERRUPTED, PARTIAL, RECONCILE,
                                     STALE,
                                     STATUS_REASONS, STORE_REFUSED, TEST, TIMEOUT, TOKEN_REFUSED, Finding, ordered,
                                     severity)
from feiqiu_etl.formats import when
from feiqiu_etl.textsafe import escape

ERRORS_SHOWN = 5
STALE_SHOWN = 20
LINE_MAX = 300


@dataclass(frozen=True)
class Message:
    """What one target receives: ``title``, ``body`` (plain text) and ``severity`` (Apprise's type:
    failure, warning or info)."""

    title: str
    body: str
    severity: str
    reasons: tuple[str, ...]


TEXTS: dict[str, dict[str, str]] = {
    "en": {
        "title_run": "[feiqiu-etl] run {run_id} {what}",
        "title_stale": "[feiqiu-etl] stale data: {n} store/task(s) older than {hours:g} h",
        "title_test": "[feiqiu-etl] test alert",
        "run_line": "Run {run_id} ended {status}{exit} on host {host}, at {finished}.",
        "why": "Why:",
        FAILED: "the run FAILED: {error}",
        PARTIAL: "the run is PARTIAL: some items failed ({error})",
        INTERRUPTED: "the run was INTERRUPTED: {error}",
        DEADLINE: "the run stopped at its DEADLINE, the rest is left for the next run ({error})",
        TIMEOUT: "the run was cancelled by its --timeout",
        TOKEN_REFUSED: "token refused (40101) on lane {lanes}",
        STORE_REFUSED: "store refused (40103): {stores}",
        BANNED: "banned by the upstream (42902) on lane {lanes}",
        RECONCILE: "listings not exact against their total: {listings}",
        DELETIONS_HELD: "soft deletions held back, nothing deleted until confirmed (a later complete snapshot, or "
                        "`state accept-deletions`): {held}",
        CONSECUTIVE_FAILURES: "store {site_id} failed in {runs} runs in a row",
        "lanes": "Lanes: {lanes}",
        "stores": "Stores: {stores}",
        "errors": "First errors ({shown} of {total}):",
        "stale": "Stale data (older than {hours:g} h or never loaded):",
        "stale_row": "{site_id} {task}: loaded up to {until} ({age} ago)",
        "minutes": "{n} min",
        "hours": "{n:.1f} h",
        "stale_never": "{site_id} {task}: never loaded",
        "more": "… and {n} more",
        "link": "Details: {url}",
        "test": "A test message from feiqiu-etl on host {host} to target {target}. If you read this, alerts "
                "reach you.",
        "unknown": "unknown",
    },
    "zh": {
        "title_run": "[feiqiu-etl] 运行 {run_id} {what}",
        "title_stale": "[feiqiu-etl] 数据过期：{n} 个门店/任务超过 {hours:g} 小时未更新",
        "title_test": "[feiqiu-etl] 测试告警",
        "run_line": "运行 {run_id} 结束，状态 {status}{exit}，主机 {host}，时间 {finished}。",
        "why": "原因：",
        FAILED: "运行失败（FAILED）：{error}",
        PARTIAL: "运行部分成功（PARTIAL）：部分数据失败（{error}）",
        INTERRUPTED: "运行被中断（INTERRUPTED）：{error}",
        DEADLINE: "运行到达截止时间（DEADLINE）而停止，其余留给下次运行（{error}）",
        TIMEOUT: "运行超过 --timeout 被取消",
        TOKEN_REFUSED: "令牌被拒绝（40101），通道 {lanes}",
        STORE_REFUSED: "门店被拒绝（40103）：{stores}",
        BANNED: "被上游封禁（42902），通道 {lanes}",
        RECONCILE: "列表与其 total 不符：{listings}",
        DELETIONS_HELD: "软删除已暂缓，确认前不删除（之后的完整快照，或 `state accept-deletions`）：{held}",
        CONSECUTIVE_FAILURES: "门店 {site_id} 连续 {runs} 次运行失败",
        "lanes": "通道：{lanes}",
        "stores": "门店：{stores}",
        "errors": "最早的错误（{total} 个中的 {shown} 个）：",
        "stale": "过期数据（超过 {hours:g} 小时或从未加载）：",
        "stale_row": "{site_id} {task}：数据截至 {until}（{age}前）",
        "minutes": "{n} 分钟",
        "hours": "{n:.1f} 小时",
        "stale_never": "{site_id} {task}：从未加载",
        "more": "…… 另有 {n} 项",
        "link": "详情：{url}",
        "test": "这是 feiqiu-etl（主机 {host}）发往目标 {target} 的测试消息。收到即表示告警可以送达。",
        "unknown": "未知",
    },
}


def clean(value: Any, limit: int = LINE_MAX) -> str:
    """``value`` as one line: control characters escaped (:func:`feiqiu_etl.textsafe.escape`: ``\\x1b`` …), cut
    to ``limit`` characters."""
    text = escape(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def run_message(findings: Iterable[Finding], run: dict[str, Any] | None, *, language: str = "en",
                web_url: str | None = None, host: str = "") -> Message:
    """The message about ``findings``. ``run`` is the run's summary (``RunResult.to_dict``) or its record
    (INTERRUPTED), or None for a freshness check alone (then only ``STALE`` findings)."""
    t = TEXTS.get(language, TEXTS["en"])
    found = ordered(findings)
    reasons = tuple(dict.fromkeys(f.reason for f in found))
    stale = [f for f in found if f.reason == STALE]
    others = [f for f in found if f.reason != STALE]
    lines: list[str] = []
    if run is not None:
        status = run.get("status") or "?"
        code = run.get("exit_code")
        lines.append(t["run_line"].format(run_id=run["run_id"], status=status, host=clean(run.get("host") or host),
                                          exit=f" (exit {code})" if code is not None else "",
                                          finished=when(run.get("finished_at")) if run.get("finished_at") else "?"))
    if others:
        first = sorted(others, key=lambda f: f.reason not in STATUS_REASONS.values())  # the run's status first
        what = " · ".join(dict.fromkeys(_short(f, t) for f in first))
        title = t["title_run"].format(run_id=run["run_id"] if run else "?", what=what)
    else:  # only stale data (at the end of a run that went well, or from the freshness command)
        title = t["title_stale"].format(n=len(stale), hours=stale[0].facts["hours"] if stale else 0)
    if others:
        lines.append(t["why"])
        lines += [f"- {_why(f, t)}" for f in others]
    if run is not None:
        lanes = _lanes(run)
        if lanes:
            lines.append(t["lanes"].format(lanes=lanes))
        stores = _stores(run)
        if stores:
            lines.append(t["stores"].format(stores=stores))
        errors = first_errors(run)
        if errors:
            lines.append(t["errors"].format(shown=min(len(errors), ERRORS_SHOWN), total=len(errors)))
            lines += [f"- {e}" for e in errors[:ERRORS_SHOWN]]
    if stale:
        lines.append(t["stale"].format(hours=stale[0].facts["hours"]))
        for f in stale[:STALE_SHOWN]:
            x = f.facts
            if x.get("fresh_until"):
                lines.append("- " + t["stale_row"].format(site_id=x["site_id"], task=x["task"],
                                                           until=when(x["fresh_until"]),
                                                           age=_age(x.get("age_seconds"), t)))
            else:
                lines.append("- " + t["stale_never"].format(site_id=x["site_id"], task=x["task"]))
        if len(stale) > STALE_SHOWN:
            lines.append(t["more"].format(n=len(stale) - STALE_SHOWN))
    if web_url:
        url = f"{web_url}/runs/{run['run_id']}" if run is not None else f"{web_url}/freshness"
        lines.append(t["link"].format(url=url))
    return Message(clean(title, 200), "\n".join(lines), severity(reasons), reasons)


def _age(seconds: float | None, t: dict[str, str]) -> str:
    """``12 min`` under an hour, ``26.5 h`` from then on (in the message's language)."""
    seconds = max(0.0, float(seconds or 0))
    return t["minutes"].format(n=int(seconds // 60)) if seconds < 3600 else t["hours"].format(n=seconds / 3600)


def test_message(target: str, *, language: str = "en", host: str = "") -> Message:
    """The sample of ``feiqiu-etl alerts test``."""
    t = TEXTS.get(language, TEXTS["en"])
    return Message(t["title_test"], t["test"].format(host=clean(host), target=clean(target)), "info", (TEST,))


def first_errors(run: dict[str, Any]) -> list[str]:
    """Every error of a run in order, one line each: lane and store reasons first, then each task's
    errors (``TASK site: stage: error``), then the DWD load's."""
    out: list[str] = []
    for lane in run.get("lanes") or []:
        if not isinstance(lane, dict):
            continue
        if lane.get("reason"):
            out.append(clean(f"lane {lane['name']}: {lane['reason']}"))
        for s in lane.get("stores") or []:
            if s.get("reason") and not lane.get("reason"):
                out.append(clean(f"store {s['site_id']}: {s['reason']}"))
    for task in run.get("tasks") or []:
        for e in task.get("errors") or []:
            text = e.get("error") if isinstance(e, dict) else e
            stage = f"{e.get('stage')}: " if isinstance(e, dict) and e.get("stage") else ""
            out.append(clean(f"{task.get('task')} {task.get('site_id')}: {stage}{text}"))
    for e in (run.get("dwd") or {}).get("errors") or []:
        out.append(clean(f"DWD {e.get('table')}: {e.get('error')}"))
    if not out and run.get("error"):
        out.append(clean(run["error"]))
    return out


def _short(f: Finding, t: dict[str, str]) -> str:
    return f.reason if f.reason != CONSECUTIVE_FAILURES else f"{f.reason} ({f.facts.get('site_id')})"


def _why(f: Finding, t: dict[str, str]) -> str:
    x = f.facts
    error = clean(x.get("error") or t["unknown"])
    if f.reason in (TOKEN_REFUSED, BANNED):
        lanes = ", ".join(f"{lane['lane']}" + (f" ({lane['bans']}×, {lane['seconds']} s)" if "bans" in lane else "")
                          for lane in x.get("lanes", []))
        return t[f.reason].format(lanes=lanes)
    if f.reason == STORE_REFUSED:
        return t[f.reason].format(stores=", ".join(f"{s['site_id']} ({s['lane']})" for s in x.get("stores", [])))
    if f.reason == CONSECUTIVE_FAILURES:
        return t[f.reason].format(site_id=x["site_id"], runs=x["runs"])
    if f.reason == DELETIONS_HELD:
        held = "; ".join(f"{h['task']} {h['site_id']} {h['held']} of {h['live']} live rows "
                         f"({float(h.get('share') or 0):.0%}{', empty snapshot' if h.get('empty') else ''})"
                         for h in x.get("held", [])[:ERRORS_SHOWN])
        more = len(x.get("held", [])) - ERRORS_SHOWN
        return clean(t[f.reason].format(held=held + (f"; +{more}" if more > 0 else "")))
    if f.reason == RECONCILE:
        shown = x.get("listings", [])[:ERRORS_SHOWN]
        listed = "; ".join(f"{i['task']} {i['site_id']} {i['where']} {i['verdict']} ({i.get('reason')})" for i in shown)
        more = len(x.get("listings", [])) - len(shown)
        return clean(t[f.reason].format(listings=listed + (f"; +{more}" if more > 0 else "")))
    return clean(t.get(f.reason, f.reason).format(error=error))


def _lanes(run: dict[str, Any]) -> str:
    lanes = run.get("lanes") or []
    parts = []
    for lane in lanes:
        if isinstance(lane, dict):
            why = f": {lane['reason']}" if lane.get("reason") else ""
            parts.append(clean(f"{lane['name']} {lane.get('status', '?')}{why}", 120))
        else:
            parts.append(clean(lane, 80))
    return ", ".join(parts)


def _stores(run: dict[str, Any]) -> str:
    parts = []
    for lane in run.get("lanes") or []:
        if isinstance(lane, dict):
            parts += [f"{s['site_id']} {s.get('status', '?')}" for s in lane.get("stores") or []]
    if not parts:
        parts = [str(s) for s in run.get("stores") or []]
    shown = parts[:20]
    return ", ".join(shown) + (f", … (+{len(parts) - 20})" if len(parts) > 20 else "")
