"""Alert rules: which facts about a finished run (or the warehouse's freshness) deserve a message.

A rule turns facts into :class:`Finding` values; it never sends anything. A finding has a *reason* (one of
:data:`REASONS`) and a *subject* — what it is about — which together are the key that stops a storm: the
same reason about the same subject is sent once per target (:mod:`.record`). The subjects are:

* the run id for the run's own reasons (``FAILED``, ``PARTIAL``, ``INTERRUPTED``, ``DEADLINE``, ``TIMEOUT``,
  ``TOKEN_REFUSED``, ``STORE_REFUSED``, ``BANNED``, ``RECONCILE``: a listing whose verdict is not ``ok`` or
  ``refetched``, issue 25, tasks/ods/reconcile.py; ``DELETIONS_HELD``: a snapshot's soft delete held back by the
  deletion guard, issue 25, tasks/ods/deletions.py);
* ``site/run`` for ``CONSECUTIVE_FAILURES``, raised exactly when a store's streak of failed runs reaches N
  (not again at N + 1: the streak is already known);
* ``connector/site/task@fresh_until`` for ``STALE``: a store/task is reported once per age; after a fresh
  load, it can be reported again when it falls behind again.

A run's status maps to its reason through :data:`STATUS_REASONS` (``DEADLINE``, a lane that reached its deadline
and left work for the next run, is one entry there, one flag in :class:`~feiqiu_etl.alerts.config.RulesModel` and
two message lines).
The input is the run's summary as ``run --json`` prints it (``RunResult.to_dict``) or, for a run found
INTERRUPTED, its record; only plain dicts, so a rule is a pure function and is tested without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from feiqiu_etl.common import exitcodes
from feiqiu_etl.common.status import Status

FAILED, PARTIAL, INTERRUPTED, DEADLINE = (s.value for s in (Status.FAILED, Status.PARTIAL, Status.INTERRUPTED,
                                                           Status.DEADLINE))
"""The reasons a run's status raises are named after the status."""
TIMEOUT, TOKEN_REFUSED, STORE_REFUSED, BANNED = "TIMEOUT", "TOKEN_REFUSED", "STORE_REFUSED", "BANNED"
CONSECUTIVE_FAILURES, STALE, TEST = "CONSECUTIVE_FAILURES", "STALE", "TEST"
RECONCILE = "RECONCILE"
DELETIONS_HELD = "DELETIONS_HELD"
RECONCILE_ALERTED = ("short", "over", "unexpected_zero")
"""Listing verdicts that raise ``RECONCILE`` (``tasks.ods.reconcile.ALERTED``; here as data: rules import no task)."""

STATUS_REASONS = {Status.FAILED: FAILED, Status.PARTIAL: PARTIAL, Status.INTERRUPTED: INTERRUPTED,
                  Status.DEADLINE: DEADLINE}
"""Run status → reason. A status not listed (SUCCESS, CANCELLED) raises nothing by itself."""

REASONS = (FAILED, INTERRUPTED, TIMEOUT, TOKEN_REFUSED, CONSECUTIVE_FAILURES, BANNED, STORE_REFUSED, PARTIAL,
           DELETIONS_HELD, RECONCILE, DEADLINE, STALE, TEST)
"""Every reason, most severe first (a message's title names its first)."""

RULE_NAMES = tuple(r.lower() for r in REASONS if r != TEST)
"""The reasons as the alerts file names them (``rules:`` keys, a target's ``reasons:``)."""

FAILURE_REASONS = frozenset({FAILED, INTERRUPTED, TIMEOUT, TOKEN_REFUSED, CONSECUTIVE_FAILURES})
"""Sent as Apprise's ``failure`` type; the others as ``warning`` (``TEST`` as ``info``)."""



@dataclass(frozen=True)
class Finding:
    """One reason to alert: ``reason`` (see :data:`REASONS`), ``subject`` (the key against storms) and the
    facts a message shows (``facts``: plain values, e.g. the lane and its reason)."""

    reason: str
    subject: str
    facts: dict[str, Any] = field(default_factory=dict, compare=False)


def run_findings(summary: dict[str, Any], rules: Any) -> list[Finding]:
    """The findings about one finished run. ``summary`` is ``RunResult.to_dict()`` (or an INTERRUPTED run's
    record: ``run_id``, ``status``, ``error``); ``rules`` a :class:`~feiqiu_etl.alerts.config.RulesModel`.
    A run whose every lane was busy (exit 6: another run holds the token) raises nothing: nothing failed."""
    run_id, status = summary["run_id"], summary.get("status")
    if summary.get("exit_code") == exitcodes.LANE_BUSY:
        return []
    out: list[Finding] = []
    reason = STATUS_REASONS.get(status or "")
    if reason and getattr(rules, reason.lower(), False):
        out.append(Finding(reason, run_id, {"status": status, "error": summary.get("error")}))
    if status == Status.CANCELLED and rules.timeout and "timeout" in (summary.get("error") or ""):
        out.append(Finding(TIMEOUT, run_id, {"error": summary.get("error")}))
    lanes = [lane for lane in summary.get("lanes") or [] if isinstance(lane, dict)]
    if rules.token_refused:
        refused = [{"lane": lane["name"], "reason": lane.get("reason")} for lane in lanes
                   if "40101" in (lane.get("reason") or "")]
        if refused:
            out.append(Finding(TOKEN_REFUSED, run_id, {"lanes": refused}))
    if rules.store_refused:
        stores = [{"lane": lane["name"], "site_id": s["site_id"], "reason": s.get("reason")} for lane in lanes
                  for s in lane.get("stores") or [] if "40103" in (s.get("reason") or "")]
        if stores:
            out.append(Finding(STORE_REFUSED, run_id, {"stores": stores}))
    if rules.banned:
        banned = [{"lane": lane["name"], "bans": lane.get("banned", 0), "seconds": lane.get("banned_seconds", 0)}
                  for lane in lanes if (lane.get("banned") or 0) > 0]
        if banned:
            out.append(Finding(BANNED, run_id, {"lanes": banned}))
    if getattr(rules, "deletions_held", False):
        held = held_findings(summary.get("tasks") or [])
        if held:
            out.append(Finding(DELETIONS_HELD, run_id, {"held": held}))
    if getattr(rules, "reconcile", False):
        listings = reconcile_findings(summary.get("tasks") or [])
        if listings:
            out.append(Finding(RECONCILE, run_id, {"listings": listings}))
    return out


def reconcile_findings(tasks: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every listing of the run's tasks whose verdict raises ``RECONCILE``: ``{task, site_id, verdict, where,
    reason}`` (``where``: ``snapshot`` or the window)."""
    out = []
    for t in tasks:
        if not isinstance(t, dict):
            continue
        for listing in (t.get("reconcile") or {}).get("listings") or []:
            if listing.get("verdict") in RECONCILE_ALERTED:
                window = listing.get("window")
                out.append({"task": t.get("task"), "site_id": t.get("site_id"), "verdict": listing["verdict"],
                            "where": "snapshot" if not window else f"{window[0]} - {window[1]}",
                            "reason": listing.get("reason")})
    return out


def held_findings(tasks: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task of the run whose snapshot soft delete the deletion guard held back: ``{task, site_id, held,
    live, share, empty}``."""
    out = []
    for t in tasks:
        d = t.get("deletions") if isinstance(t, dict) else None
        if isinstance(d, dict) and d.get("held"):
            out.append({"task": t.get("task"), "site_id": t.get("site_id"), "held": d["held"], "live": d.get("live"),
                        "share": d.get("share"), "empty": bool(d.get("empty"))})
    return out


def store_outcome(run: dict[str, Any], site_id: int) -> str | None:
    """How store ``site_id`` did in ``run`` (a registry row with ``status``, ``exit_code`` and ``lanes`` = the
    summary's lanes): ``"failed"``, ``"ok"`` or None (does not count: lane busy, cancelled, still running)."""
    for lane in run.get("lanes") or []:
        for store in lane.get("stores") or []:
            if store.get("site_id") == site_id:
                if lane.get("busy"):
                    return None
                return "failed" if store.get("status") == Status.FAILED else (
                    None if store.get("status") == Status.CANCELLED else "ok")
    if run.get("exit_code") == exitcodes.LANE_BUSY or run.get("status") in (Status.CANCELLED, Status.RUNNING):
        return None
    return "failed" if run.get("status") in (Status.FAILED, Status.INTERRUPTED) else "ok"


def failure_streak(runs: Iterable[dict[str, Any]], site_id: int) -> int:
    """How many of the newest ``runs`` (newest first) failed store ``site_id`` in a row (runs that do not
    count, see :func:`store_outcome`, are passed over)."""
    streak = 0
    for run in runs:
        outcome = store_outcome(run, site_id)
        if outcome == "failed":
            streak += 1
        elif outcome == "ok":
            break
    return streak


def streak_findings(run_id: str, streaks: dict[int, int], rules: Any) -> list[Finding]:
    """``CONSECUTIVE_FAILURES`` for each store whose streak (including run ``run_id``) is exactly
    ``rules.consecutive_failures``."""
    n = rules.consecutive_failures
    if not n:
        return []
    return [Finding(CONSECUTIVE_FAILURES, f"{site}/{run_id}", {"site_id": site, "runs": streak})
            for site, streak in sorted(streaks.items()) if streak == n]


def stale_findings(connector: str, rows: Iterable[dict[str, Any]], hours: float) -> list[Finding]:
    """``STALE`` for each stale freshness row (:func:`feiqiu_etl.registry.freshness.judge`)."""
    out = []
    for r in rows:
        if not r.get("stale"):
            continue
        until = r.get("fresh_until")
        stamp = until.isoformat() if hasattr(until, "isoformat") else (str(until) if until else "never")
        out.append(Finding(STALE, f"{connector}/{r['site_id']}/{r['task']}@{stamp}",
                           {"site_id": r["site_id"], "task": r["task"], "fresh_until": stamp if until else None,
                            "age_seconds": r.get("age_seconds"), "hours": hours}))
    return out


def severity(reasons: Iterable[str]) -> str:
    """Apprise's notification type for a message with these reasons: failure, warning or info."""
    rs = set(reasons)
    if rs & FAILURE_REASONS:
        return "failure"
    return "info" if rs <= {TEST} else "warning"


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe reason first (:data:`REASONS`), stable otherwise."""
    return sorted(findings, key=lambda f: REASONS.index(f.reason) if f.reason in REASONS else len(REASONS))
