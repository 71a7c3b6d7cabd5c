"""``freshness``: per store and task how far its data goes and how old it is."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from feiqiu_etl.cli.views.console import aware, fitted, header_zone, short_sites, stdout_console
from feiqiu_etl.formats import age, when
from feiqiu_etl.textsafe import escape_tree


def render_freshness(report: dict, console: Console | None = None) -> None:
    """``freshness``: per store and task how far its data goes and how old it is (``registry/freshness.py``
    rows), fitted to the terminal like :func:`render_runs`: task names and ages are never cut; stores show by
    their shortest distinct tail, times without seconds and with the zone in the header; ``kind`` goes if it is
    still too wide (``--json`` has it all)."""
    console = console or stdout_console()
    report = escape_tree(report)
    rows = report["rows"]
    if not rows:
        console.print(f"connector {report['connector']}: nothing scheduled has been loaded yet")
        return
    fresh = [aware(r.get("fresh_until")) for r in rows]
    zone = header_zone(fresh)
    until = f"fresh until ({zone})" if zone else "fresh until"
    sites = short_sites({r["site_id"] for r in rows})
    cells = [{"store": sites[r["site_id"]], "task": r["task"], "kind": r["kind"] or "never loaded",
              until: when(f, seconds=False, offset=zone is None),
              "age": Text(age(r["age_seconds"]), style="red" if r["stale"] else "green"),
              "owed": str(r["owed_details"] or 0)} for r, f in zip(rows, fresh)]
    table, _ = fitted(cells, ["store", "task", "kind", until, "age", "owed"], ("kind",), console.width,
                       left=("store", "task", "kind", until))
    console.print(table)
    line = f"{report['stale']} of {len(rows)} older than {report['stale_after_hours']:g} h or never loaded"
    console.print(Text(line, style="red" if report["stale"] else "green"))
