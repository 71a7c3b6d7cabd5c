"""``details``: the detail requests still owed."""

from __future__ import annotations

from rich.console import Console

from feiqiu_etl.cli.views.console import compact_table, stdout_console, ts
from feiqiu_etl.textsafe import escape_tree


def render_details(rows: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    rows = escape_tree(rows)
    t = compact_table()
    for col in ("task", "site", "parent", "attempts", "last error", "since"):
        t.add_column(col, overflow="fold", no_wrap=col not in ("last error",))
    for r in rows:
        t.add_row(r["task_code"], str(r["site_id"]), r["parent_key"], str(r["attempts"]), r.get("last_error") or "",
                  ts(r.get("updated_at")))
    console.print(f"{len(rows)} owed detail(s)")
    if rows:
        console.print(t)
