"""Plain tables: the rows of ``sql`` and the tasks of a connector (``tasks``)."""

from __future__ import annotations

from rich.console import Console

from feiqiu_etl.cli.views.console import compact_table, stdout_console
from feiqiu_etl.textsafe import escape_tree


def render_rows(columns: list[str], rows: list[tuple], console: Console | None = None) -> None:
    console = console or stdout_console()
    columns, rows = escape_tree(list(columns)), escape_tree(rows)
    table = compact_table()
    for col in columns:
        table.add_column(col, overflow="fold")
    console.print(f"{len(rows)} row(s)")
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    console.print(table)


def render_tasks(connector: str, rows: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    rows = escape_tree(rows)
    console.print(f"connector {connector}: {len(rows)} tasks")
    table = compact_table()
    table.add_column("task", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for col in ("endpoint", "table", "detail table"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["task"], r["kind"], r["endpoint"], r["table"], r["detail_table"] or "")
    console.print(table)
