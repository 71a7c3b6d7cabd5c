"""``plan``: per lane its stores and tasks, with windows and estimates."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from feiqiu_etl.cli.views.console import compact_table, short_sites, stdout_console
from feiqiu_etl.formats import UPSTREAM_ZONE, duration
from feiqiu_etl.textsafe import escape_tree


def render_plan(plan: dict, console: Console | None = None) -> None:
    """The plan: per lane its stores and tasks with windows and estimates."""
    console = console or stdout_console()
    plan = escape_tree(plan)
    e = plan["estimate"]
    console.print(f"plan: connector {plan['connector']}, {'incremental' if plan['incremental'] else 'explicit window'}"
                  f" as of {plan['now']} ({UPSTREAM_ZONE}, the upstream's time); {len(plan['lanes'])} lane(s), ~{e['requests']} requests, "
                  f"slowest lane ~{duration(e['lane_seconds_max'])}")
    if plan.get("estimate_note"):
        console.print(Text(plan["estimate_note"], style="yellow"), overflow="fold")
    for lane in plan["lanes"]:
        console.print(Text(f"lane {lane['name']} ({lane['key']}, token from ${lane['token_env']}): "
                           f"{len(lane['stores'])} store(s), ~{lane['estimate']['requests']} requests, "
                           f"~{duration(lane['estimate']['seconds'])} at its gaps", style="bold"))
        sites = short_sites({task["site_id"] for task in lane["tasks"]})
        names = {st.get("site_id"): st.get("name") for st in lane["stores"] if isinstance(st, dict)}
        if any(names.values()):
            # every store of the lane, named or not (a fresh-user trial missed the unnamed one here)
            console.print("  stores: " + ", ".join(f"{sites.get(k, k)} {v}" if v else f"{sites.get(k, k)} (no name)"
                                                   for k, v in names.items()), overflow="fold")
        t = compact_table()
        for col in ("store", "task", "kind", "windows", "gap s", "req", "basis"):
            t.add_column(col, no_wrap=col != "windows", overflow="fold")
        for task in lane["tasks"]:
            windows = task["windows"]
            w = "-" if not windows else (f"{min(a for a, _ in windows)[:16]} … {max(b for _, b in windows)[:16]} "
                                         f"({len(windows)} seg)")
            est = task["estimate"]
            req = f"{est['list_requests']}+{est['detail_requests']}" if task["detail_endpoint"] else str(est["requests"])
            t.add_row(sites[task["site_id"]], task["task"], task["kind"][:4], w,
                      f"{task['rate_min']:g}-{task['rate_max']:g}", req, est["basis"])
        console.print(t)
        deadline = lane.get("deadline")
        for line in (deadline or {}).get("summary") or []:
            console.print(Text(line, style="yellow" if deadline["fit"] and not deadline["fit"]["fits"] else ""),
                          overflow="fold")
    if plan.get("dwd"):
        d = plan["dwd"]
        console.print(f"then DWD: tables {d['tables']}, {d['parallel_workers']} in parallel"
                      f"{', full compare' if d['full'] else ''}")
