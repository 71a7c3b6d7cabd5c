"""Human-readable output with rich: the per-task summary table and the task list (stdout)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text


def _console() -> Console:
    """stdout console; when piped, wide enough that nothing is cut."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=200)


def _compact() -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))


def render_summary(data: dict, console: Console | None = None) -> None:
    """Per-task counts (fits 80 columns: new = inserted, chg = updated, same = skipped, del = deleted;
    details = ok/failed/skipped), then skipped tasks, the first errors, and the DWD table."""
    console = console or _console()
    sites = {t["site_id"] for t in data["tasks"]}
    console.print(f"run {data['run_id']}: [bold]{data['status']}[/bold]")
    table = _compact()
    table.add_column("task", no_wrap=True)
    if len(sites) > 1:
        table.add_column("site", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("req", "fetched", "new", "chg", "same", "del", "details", "err", "s"):
        table.add_column(col, justify="right", no_wrap=True)
    for t in data["tasks"]:
        row = [t["task"]] + ([str(t["site_id"])] if len(sites) > 1 else []) + [
            t["status"], str(t["total_requests"]), str(t["total_fetched"]), str(t["total_inserted"]),
            str(t["total_updated"]), str(t["total_skipped"]), str(t["total_deleted"]),
            f"{t['detail_success']}/{t['detail_failure']}/{t['detail_skipped']}", str(len(t["errors"])),
            f"{t['timing'].get('total', 0):.1f}",
        ]
        table.add_row(*row)
    if data["tasks"]:
        console.print(table)
        console.print("new = inserted, chg = updated, same = unchanged (skipped), del = soft-deleted; "
                      "details = fetched/failed/skipped (unchanged parent or not sent)", style="dim")
    for s in data.get("skipped_tasks", []):
        console.print(f"[yellow]not run: {s['task']} (site {s['site_id']}): {s['reason']}[/yellow]")
    for t in data["tasks"]:
        for e in t["errors"][:3]:
            console.print(f"[red]{t['task']}: {e.get('stage')}: {e.get('error')}[/red]", overflow="fold")
        if t.get("snapshot_note", "") and t["snapshot_note"].startswith("soft delete skipped"):
            console.print(f"[yellow]{t['task']}: {t['snapshot_note']}[/yellow]")
        for d in t.get("schema_drift", []):  # tasks/ods/drift.py
            parts = [f"new field(s) {', '.join(d['new_fields'])}" if d["new_fields"] else "",
                     f"lost field(s) {', '.join(d['lost_fields'])}" if d["lost_fields"] else ""]
            console.print(f"[yellow]{t['task']}: schema drift in {d['table']}: {'; '.join(p for p in parts if p)} "
                          f"(first seen in run {d['first_seen_run']})[/yellow]", overflow="fold")
    dwd = data.get("dwd")
    if dwd:
        console.print(f"DWD: [bold]{dwd.get('status')}[/bold]")
        d = _compact()
        d.add_column("table", no_wrap=True)
        for col in ("kind", "inserted", "updated", "closed", "s"):
            d.add_column(col, justify="right", no_wrap=True)
        d.add_column("error", overflow="fold")
        for t in dwd.get("tables", []):
            d.add_row(t["table"], t.get("kind", ""), str(t.get("inserted", 0)), str(t.get("updated", 0)),
                      str(t.get("closed", 0)), f"{t.get('seconds', 0):.2f}", str(t.get("error") or ""))
        console.print(d)


def render_rows(columns: list[str], rows: list[tuple], console: Console | None = None) -> None:
    console = console or _console()
    table = _compact()
    for col in columns:
        table.add_column(col, overflow="fold")
    console.print(f"{len(rows)} row(s)")
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    console.print(table)


def render_tasks(connector: str, rows: list[dict], console: Console | None = None) -> None:
    console = console or _console()
    console.print(f"connector {connector}: {len(rows)} tasks")
    table = _compact()
    table.add_column("task", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for col in ("endpoint", "table", "detail table"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["task"], r["kind"], r["endpoint"], r["table"], r["detail_table"] or "")
    console.print(table)


def progress_line(progress: dict) -> Text:
    """One line: tasks done, the running task, requests, outstanding work, queues, next request due."""
    text = f"[{progress['done']}/{progress['total']}]"
    stats = progress.get("stats")
    if stats and stats.get("running"):
        lane = stats["lane"]
        text += (f" {progress['task']}: {lane.requests_sent} sent, {stats['outstanding']} in flight, "
                 f"next in {lane.next_due_in:.1f} s")
    return Text(text, no_wrap=True, overflow="ellipsis")


def task_line(index: int, total: int, run) -> str:
    """One plain line per finished task, for logs (cron, pipes)."""
    r = run.result
    return (f"[{index}/{total}] {run.task_code} site {run.site_id}: {r.status}, {r.total_requests} requests, "
            f"{r.total_inserted} new, {r.total_updated} changed, {r.total_skipped} unchanged, "
            f"{r.total_deleted} deleted, {len(r.errors)} errors, {r.timing.get('total', 0):.1f} s")


@contextmanager
def _every(seconds: float, fn: Callable[[], None]) -> Iterator[None]:
    """Call ``fn`` every ``seconds`` on a helper thread while the body runs, and once more at the end."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            fn()

    thread = threading.Thread(target=loop, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(1)
        fn()


@contextmanager
def live_progress(source: Callable[[], dict], enabled: bool) -> Iterator[None]:
    """While the body runs: on a terminal, refresh one progress line on stderr; otherwise print one line
    per finished task to stderr (so that logs of long unattended runs show progress)."""
    console = Console(stderr=True)
    if not enabled:
        yield
        return
    if console.is_terminal:
        with Live(progress_line(source()), console=console, transient=True, refresh_per_second=4) as live:
            with _every(0.25, lambda: live.update(progress_line(source()))):
                yield
        return
    printed = 0

    def report() -> None:
        nonlocal printed
        snapshot = source()
        for run in snapshot["finished"][printed:]:
            printed += 1
            console.print(task_line(printed, snapshot["total"], run), soft_wrap=True, highlight=False)

    with _every(0.5, report):
        yield
