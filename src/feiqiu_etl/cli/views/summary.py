"""The summary a run prints when it ends (``run``, ``demo``; ``show`` prints it too): per-task counts fitted to
the terminal, the lanes and stores that stopped, the first errors of each task, the DWD table. Reads the dict of
``RunResult.to_dict()``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from feiqiu_etl.cli.views.console import compact_table, fitted, short_sites, status_text, stdout_console
from feiqiu_etl.common.status import Status
from feiqiu_etl.deadline import named
from feiqiu_etl.formats import duration
from feiqiu_etl.textsafe import escape_tree

ERRORS_SHOWN = 3

_LEGEND = {"rows": "rows = list/detail records fetched", "new": "new/chg/same/del = inserted/updated/unchanged/"
           "soft-deleted", "fail": "fail = records fetched but not written",
           "details": "details = detail requests answered/failed/skipped", "rl": "rl = rate-limited answers"}


def _not_written(t: dict) -> int:
    """Records of a task fetched but not written: bad, in a failed batch, or still queued when it ended
    (``PipelineResult``: fetched = new + chg + same + this)."""
    return int(t.get("rows_failed", 0)) + int(t.get("rows_not_written", 0))


def _task_table(tasks: list[dict], lanes: list[dict], width: int) -> tuple[Table, str]:
    """The per-task table, fitted to ``width`` columns: columns that are zero for every task (del, fail, rl,
    details failed/skipped: the details fetched are in ``rows``) or do not apply (lane, site) are left out;
    if it is still too wide, ``rl``, ``details``, ``lane``, ``del`` and ``same`` go in that order (``feiqiu-etl
    show`` prints them all; ``fail`` is never dropped). Task names are never shortened: people copy them into ``--tasks``."""
    sites = short_sites({t["site_id"] for t in tasks})
    lane_of = {store["site_id"]: lane["name"] for lane in lanes for store in lane.get("stores", [])}
    wanted = ["task", *(["lane"] if len({lane_of.get(t["site_id"]) for t in tasks}) > 1 else []),
              *(["site"] if len(sites) > 1 else []), "status", "req", "rows", "new", "chg", "same",
              *(["del"] if any(t["total_deleted"] for t in tasks) else []),
              *(["fail"] if any(_not_written(t) for t in tasks) else []),
              *(["details"] if any(t.get("detail_failure") or t.get("detail_skipped") for t in tasks) else []),
              *(["rl"] if any(t.get("rate_limited") for t in tasks) else []), "err", "s"]

    def cells(t: dict) -> dict[str, Any]:
        listed = t["total_fetched"] - t.get("detail_fetched", 0)
        return {"task": t["task"], "lane": lane_of.get(t["site_id"], "-"), "site": sites[t["site_id"]],
                "status": status_text(t["status"]), "req": str(t["total_requests"]),
                "rows": f"{listed}/{t.get('detail_fetched', 0)}" if t.get("detail_table") else str(listed),
                "new": str(t["total_inserted"]), "chg": str(t["total_updated"]), "same": str(t["total_skipped"]),
                "del": str(t["total_deleted"]), "fail": str(_not_written(t)),
                "details": f"{t['detail_success']}/{t['detail_failure']}/{t['detail_skipped']}",
                "rl": str(t.get("rate_limited", 0)), "err": str(len(t["errors"])),
                "s": duration(t["timing"].get("total", 0))}

    # least missed first; `show` has them all; task names stay whole: people copy them into --tasks
    table, columns = fitted([cells(t) for t in tasks], wanted, ("rl", "details", "lane", "del", "same"), width,
                             left=("task", "lane", "site", "status"))
    shown = set(columns)
    legend = "; ".join(text for key, text in _LEGEND.items() if key in shown)
    if "same" not in shown:
        legend = legend.replace("new/chg/same/del", "new/chg/del").replace("unchanged/", "")
    if "del" not in shown:
        legend = legend.replace("/del", "").replace("/soft-deleted", "")
    if "lane" in wanted and "lane" not in shown:
        by_lane: dict[str, list[str]] = {}
        for site, name in lane_of.items():
            if site in sites:
                by_lane.setdefault(name, []).append(sites[site])
        legend += "; lanes: " + ", ".join(f"{n} = {' '.join(v)}" for n, v in by_lane.items())
    return table, legend


def render_summary(data: dict, console: Console | None = None, *, more_hint: bool = True) -> None:
    """Per-task counts (80 columns: rows = list/detail records fetched; new/chg/same/del = inserted/updated/
    unchanged/soft-deleted; rl = rate-limited answers), stores and lanes that stopped, the first errors of
    each task with "(N more)", and the DWD table."""
    console = console or stdout_console()
    data = escape_tree(data)
    tasks = data.get("tasks", [])
    error = _print_header(console, data)
    if tasks:
        table, legend = _task_table(tasks, data.get("lanes", []), console.width)
        console.print(table)
        console.print(legend, style="dim")
    _print_lanes(console, data.get("lanes", []), error)
    _print_skipped(console, data.get("skipped_tasks", []))
    for t in tasks:
        _print_task_notes(console, t, data["run_id"], more_hint)
    _print_rechecks(console, tasks)
    if data.get("dwd"):
        _print_dwd(console, data["dwd"])


def _print_header(console: Console, data: dict) -> str:
    """``run <id>: STATUS (error)``; returns the error text as shown (``""`` when there is none)."""
    line = Text.assemble(f"run {data['run_id']}: ", status_text(data["status"]))
    error = data.get("error") or ""
    if data["status"] == Status.CANCELLED and error.startswith("cancelled (") and error.endswith(")"):
        error = error[len("cancelled ("):-1]  # "CANCELLED (signal)", not "CANCELLED (cancelled (signal))"
    if error:
        line.append(f" ({error})")
    console.print(line)
    return error


def _print_lanes(console: Console, lanes: list[dict], error: str) -> None:
    """The lanes that stopped (unless the header said why already), their deadlines, and the stores that stopped."""
    for lane in lanes:
        if lane.get("reason") and lane["reason"] not in error:  # the header said it already (a busy lane)
            console.print(Text(f"lane {lane['name']}: {lane['status']}: {lane['reason']}", style="red"), soft_wrap=True)
        if lane.get("deadline"):
            console.print(Text(deadline_line(lane["name"], lane["deadline"]),
                               style="blue" if lane["deadline"].get("reached") else "dim"), overflow="fold")
        for store in lane.get("stores", []):
            if store.get("reason") and not lane.get("reason"):
                console.print(Text(f"store {store['site_id']}: {store['status']}: {store['reason']}", style="red"),
                              soft_wrap=True)


def _print_skipped(console: Console, skipped: list[dict]) -> None:
    """``not run: N task(s): <reason>``, one line per reason, in the order first seen."""
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    for reason, n in reasons.items():
        console.print(Text(f"not run: {n} task(s): {reason}", style="yellow"), overflow="fold")


def _print_task_notes(console: Console, t: dict, run_id: str, more_hint: bool) -> None:
    """One task's first ``ERRORS_SHOWN`` errors (and "(N more; …)" when ``more_hint``), a skipped soft delete,
    its schema drift and the owed details given up."""
    errors = t["errors"]
    for e in errors[:ERRORS_SHOWN]:
        console.print(Text(f"{t['task']}: {e.get('stage')}: {e.get('error')}{error_params(e)}", style="red"), soft_wrap=True)
    if len(errors) > ERRORS_SHOWN and more_hint:  # `show` prints the others itself
        console.print(Text(f"{t['task']}: ({len(errors) - ERRORS_SHOWN} more; feiqiu-etl show {run_id})",
                           style="red"))
    if (t.get("snapshot_note") or "").startswith("soft delete skipped"):
        console.print(Text(f"{t['task']}: {t['snapshot_note']}", style="yellow"))
    for d in t.get("schema_drift", []):  # tasks/ods/drift.py
        parts = [f"new field(s) {', '.join(d['new_fields'])}" if d["new_fields"] else "",
                 f"lost field(s) {', '.join(d['lost_fields'])}" if d["lost_fields"] else ""]
        console.print(Text(f"{t['task']}: schema drift in {d['table']}: {'; '.join(p for p in parts if p)} "
                           f"(first seen in run {d['first_seen_run']})", style="yellow"), overflow="fold")
    if t.get("details_given_up"):
        console.print(Text(f"{t['task']}: {len(t['details_given_up'])} owed detail(s) given up", style="yellow"))


def _print_rechecks(console: Console, tasks: list[dict]) -> None:
    """The details re-checked against their budget (``detail.recheck_share``), when any task had a budget."""
    rechecks = [t["recheck"] for t in tasks if t.get("recheck")]
    if any(r["budget"] for r in rechecks):
        console.print(f"details re-checked (oldest first): {sum(r['used'] for r in rechecks)} of a budget of "
                      f"{sum(r['budget'] for r in rechecks)} (detail.recheck_share)", style="dim")


def _print_dwd(console: Console, dwd: dict) -> None:
    """``DWD: STATUS``, the per-table counts and the errors that concern every table (``table == "*"``)."""
    console.print(Text.assemble("DWD: ", status_text(dwd.get("status"))))
    d = compact_table()
    d.add_column("table", no_wrap=True)
    for col in ("kind", "inserted", "updated", "closed", "s"):
        d.add_column(col, justify="right", no_wrap=True)
    d.add_column("error", overflow="fold")
    for t in dwd.get("tables", []):
        d.add_row(t["table"], t.get("kind", ""), str(t.get("inserted", 0)), str(t.get("updated", 0)),
                  str(t.get("closed", 0)), f"{t.get('seconds', 0):.2f}", str(t.get("error") or ""))
    console.print(d)
    for e in dwd.get("errors", []):
        if e.get("table") == "*":
            console.print(Text(f"DWD: {e['error']}", style="red"), soft_wrap=True)


def deadline_line(lane: str, deadline: dict) -> str:
    """``lane north: deadline 06:00 (06:00:00 +08:00) reached, ~120 requests left for the next run (gaps narrowed,
    pace 0.00)``."""
    pace = deadline.get("pace", 1.0)
    narrowed = f" (gaps narrowed, pace {pace:.2f})" if pace is not None and pace < 1 else ""
    if deadline.get("reached"):
        left = deadline.get("left_requests")
        what = f"~{left:,} requests left" if isinstance(left, int) else "the rest left"
        return f"lane {lane}: deadline {named(deadline.get('text'), deadline.get('at'))} reached, {what} for the next " \
               f"run{narrowed}"
    return f"lane {lane}: finished before its deadline {named(deadline.get('text'), deadline.get('at'))}{narrowed}"


def error_params(error: dict) -> str:
    """`` [memberId=…]``: the request parameters of an error (which parent a detail failure was about)."""
    params = error.get("params")
    return (" [" + ", ".join(f"{k}={v}" for k, v in params.items()) + "]") if params else ""
