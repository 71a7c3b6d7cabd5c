"""Human-readable output with rich: the per-task summary table and the task list (stdout)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text


def render_summary(data: dict, console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 160)
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


def render_rows(columns: list[str], rows: list[tuple], console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 160)
    table = Table(*columns, title=f"{len(rows)} row(s)")
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    console.print(table)


def render_tasks(connector: str, rows: list[dict], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"connector {connector}: {len(rows)} tasks")
    for col in ("task", "kind", "endpoint", "table", "detail table"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["task"], r["kind"], r["endpoint"], r["table"], r["detail_table"] or "")
    console.print(table)


def progress_line(progress: dict) -> Text:
    """One line: tasks done, the running task, requests, outstanding work, queues, next request due."""
    text = f"tasks {progress['done']}/{progress['total']}"
    stats = progress.get("stats")
    if stats and stats.get("running"):
        lane = stats["lane"]
        text += (f" | {progress['task']} @ {progress['site_id']}: {lane.requests_sent} requests sent, "
                 f"{stats['outstanding']} items in flight, queues {stats['processing_queue']}/{stats['write_queue']}, "
                 f"next request in {lane.next_due_in:.1f} s")
    return Text(text)


@contextmanager
def live_progress(source: Callable[[], dict], enabled: bool) -> Iterator[None]:
    """Refresh a one-line progress display on stderr (only on a terminal) while the body runs."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield
        return
    stop = threading.Event()
    with Live(progress_line(source()), console=console, transient=True, refresh_per_second=4) as live:
        def refresh() -> None:
            while not stop.wait(0.25):
                live.update(progress_line(source()))

        thread = threading.Thread(target=refresh, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(1)
