"""``show``: everything about one run — its record, per lane/store/task results, every error, its stored log."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from feiqiu_etl.app.progress import recorded_live
from feiqiu_etl.cli.views.console import status_text, stdout_console, ts
from feiqiu_etl.cli.views.progress import progress_view
from feiqiu_etl.cli.views.reconcile import render_reconcile
from feiqiu_etl.cli.views.summary import ERRORS_SHOWN, deadline_line, error_params, render_summary
from feiqiu_etl.formats import UPSTREAM_ZONE, duration
from feiqiu_etl.textsafe import escape_tree


def render_show(run: dict, console: Console | None = None) -> None:
    """Everything about one run: the record, per lane/store/task results, every error, and its stored log."""
    console = console or stdout_console()
    run = escape_tree(run)
    console.print(Text.assemble(f"run {run['run_id']}: ", status_text(run["status"]),
                                f"  exit {run['exit_code'] if run.get('exit_code') is not None else '-'}"))
    console.print(f"command: {run.get('command') or '-'}  host {run.get('host')} pid {run.get('pid')}  "
                  f"version {run.get('version') or '-'}")
    console.print(f"started {ts(run.get('started_at'))}, finished {ts(run.get('finished_at'))}, took "
                  f"{duration(run.get('duration'))}")
    if run.get("error"):
        console.print(Text(f"error: {run['error']}", style="red"), soft_wrap=True)
    if run.get("cancel_requested_at"):
        console.print(f"cancel requested {ts(run['cancel_requested_at'])} by {run.get('cancel_requested_by')}")
    if run.get("recorded_late_at"):
        console.print(f"recorded late, at {ts(run['recorded_late_at'])}: the database did not answer when the run "
                      "ended; the run kept its record and a later command wrote it", style="yellow")
    args = run.get("args") or {}
    if args:
        console.print("arguments: " + " ".join(f"{k}={v}" for k, v in args.items() if v not in (None, "", [], False)),
                      overflow="fold", style="dim")
    summary = run.get("summary")
    if summary:
        for lane in summary.get("lanes", []):
            console.print(Text.assemble(f"lane {lane['name']} ({lane['key']}): ", status_text(lane["status"]),
                                        f"  {lane.get('requests_sent', 0)} requests, {lane.get('throttled', 0)} "
                                        f"throttled, {lane.get('banned', 0)} banned ({lane.get('banned_seconds', 0)} s)"
                                        f", {duration(lane.get('seconds'))}"))
            if lane.get("deadline"):
                console.print("  " + deadline_line(lane["name"], lane["deadline"]), overflow="fold")
            for store in lane.get("stores", []):
                name = f" ({store['name']})" if store.get("name") else ""
                console.print(Text.assemble(f"  store {store['site_id']}{name}: ", status_text(store["status"]),
                                            f"  {store['tasks_done']}/{store['tasks']} tasks, {store['rows']} rows"
                                            + (f"  — {store['reason']}" if store.get("reason") else "")))
        render_summary(summary, console, more_hint=False)
        for t in summary.get("tasks", []):
            if t.get("windows"):
                w = t["windows"]
                console.print(f"{t['task']} {t['site_id']}: windows {w[0][0]} … {w[-1][1]} ({UPSTREAM_ZONE}, the "
                              f"upstream's time; {len(w)} segment(s))", style="dim")
            for e in t["errors"][ERRORS_SHOWN:]:
                console.print(Text(f"{t['task']}: {e.get('stage')}: {e.get('error')}{error_params(e)}", style="red"), soft_wrap=True)
        render_reconcile(summary.get("tasks", []), console)
    live = recorded_live(run.get("live"))
    if live is not None:
        console.print(progress_view(live))
    if run.get("pruned_at"):
        console.print(f"timeline pruned on {ts(run['pruned_at'])}: its stored log and request timeline were removed "
                      "(run.retention_days, feiqiu-etl runs prune)", style="yellow")
    log = run.get("log") or []
    if log:
        console.print(f"log ({len(log)} lines):", style="bold")
        for e in log:
            context = " ".join(str(e[k]) for k in ("lane", "site_id", "task") if e.get(k) is not None)
            console.print(Text(f"{ts(e['ts'])} {e['level']:<7} {('[' + context + '] ') if context else ''}"
                               f"{e['message']}", style="red" if e["level"] in ("ERROR", "CRITICAL") else
                               "yellow" if e["level"] == "WARNING" else ""), soft_wrap=True)
