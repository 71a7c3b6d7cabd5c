"""Human-readable output with rich: the per-task summary table and the task list (stdout)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def render_summary(data: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"run {data['run_id']} — {data['status']}")
    for col in ("task", "site", "status", "requests", "fetched", "inserted", "updated", "skipped", "deleted",
                "details ok/fail/skip", "errors", "seconds"):
        table.add_column(col, justify="left" if col in ("task", "status") else "right")
    for t in data["tasks"]:
        table.add_row(
            t["task"], str(t["site_id"]), t["status"], str(t["total_requests"]), str(t["total_fetched"]),
            str(t["total_inserted"]), str(t["total_updated"]), str(t["total_skipped"]), str(t["total_deleted"]),
            f"{t['detail_success']}/{t['detail_failure']}/{t['detail_skipped']}", str(len(t["errors"])),
            f"{t['timing'].get('total', 0):.1f}",
        )
    console.print(table)
    for s in data.get("skipped_tasks", []):
        console.print(f"[yellow]skipped {s['task']} (site {s['site_id']}): {s['reason']}[/yellow]")
    for t in data["tasks"]:
        for e in t["errors"][:3]:
            console.print(f"[red]{t['task']}: {e.get('stage')}: {e.get('error')}[/red]")
    dwd = data.get("dwd")
    if dwd:
        d = Table(title=f"DWD — {dwd.get('status')}")
        for col in ("table", "kind", "inserted", "updated", "closed", "seconds", "error"):
            d.add_column(col)
        for t in dwd.get("tables", []):
            d.add_row(t["table"], t.get("kind", ""), str(t.get("inserted", 0)), str(t.get("updated", 0)),
                      str(t.get("closed", 0)), f"{t.get('seconds', 0):.2f}", str(t.get("error") or ""))
        console.print(d)


def render_tasks(connector: str, rows: list[dict], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"connector {connector}: {len(rows)} tasks")
    for col in ("task", "kind", "endpoint", "table", "detail table"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["task"], r["kind"], r["endpoint"], r["table"], r["detail_table"] or "")
    console.print(table)
