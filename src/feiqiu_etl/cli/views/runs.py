"""``runs``: the runs newest first, fitted to the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from feiqiu_etl.cli.views.console import count_text, fitted, header_zone, short_sites, status_text, stdout_console
from feiqiu_etl.formats import duration, when
from feiqiu_etl.textsafe import escape_tree


def render_runs(rows: list[dict], console: Console | None = None) -> None:
    """Runs newest first, start times in the display zone (its offset in the header). Fitted to the terminal:
    run ids and statuses are never cut, and a non-zero rejection or error count is never hidden — an all-zero
    ``rej`` or ``err`` column goes first, then ``tasks``, ``stores``, the seconds of the start time and ``took``
    (``--json`` and a pipe have them all)."""
    console = console or stdout_console()
    rows = escape_tree(rows)
    sites = short_sites({s for r in rows for s in (r.get("stores") or [])})
    zone = header_zone(r.get("started_at") for r in rows)
    started = f"started ({zone})" if zone else "started"

    def cells(r: dict, seconds: bool) -> dict[str, Any]:
        stores = r.get("stores") or []
        status = status_text(r["status"])
        if r.get("recorded_late_at"):
            status.append("*")
        return {"run": r["run_id"], "status": status,
                started: when(r.get("started_at"), seconds=seconds, offset=zone is None, year=False),
                "took": duration(r.get("duration")),
                "stores": sites.get(stores[0], str(stores[0])) if len(stores) == 1 else str(len(stores)),
                "tasks": str(len(r.get("tasks") or [])), "rows": count_text(r.get("rows_written")),
                "req": count_text(r.get("requests")), "rej": count_text(r.get("rejections")), "err": count_text(r.get("errors"))}

    columns = ["run", "status", started, "took", "stores", "tasks", "rows", "req", "rej", "err"]
    empty = tuple(c for c, key in (("rej", "rejections"), ("err", "errors")) if not any(r.get(key) for r in rows))
    left = ("run", "status", started, "took", "stores", "tasks")
    for seconds in (True, False):  # the start's seconds go before `took` does
        drops = (*empty, "tasks", "stores", *(() if seconds else ("took",)))
        t, shown = fitted([cells(r, seconds) for r in rows], columns, drops, console.width, left=left)
        if "took" in shown:
            break
    console.print(t)
    if not rows:
        console.print("no runs recorded yet", style="dim")
    if any(r.get("recorded_late_at") for r in rows):
        console.print("* recorded late: the database did not answer when the run ended; a later command wrote its "
                      "record (feiqiu-etl show RUN_ID)", style="dim")
