"""The reconcile section of ``show RUN`` (issue 25, tasks/ods/reconcile.py): the verdict of every listing."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from feiqiu_etl.formats import reconcile_lines
from feiqiu_etl.cli.views.console import stdout_console
from feiqiu_etl.textsafe import escape_tree


RECONCILE_STYLE = {"ok": "green", "refetched": "cyan", "short": "red", "over": "yellow", "unexpected_zero": "yellow",
                   "incomplete": "dim"}


def render_reconcile(tasks: list[dict], console: Console | None = None) -> None:
    """Print :func:`reconcile_lines` (escaped: the reasons quote upstream totals only, but stay safe)."""
    console = console or stdout_console()
    for text, verdict in reconcile_lines(escape_tree(tasks)):
        console.print(Text(text, style=RECONCILE_STYLE.get(verdict, "bold")), soft_wrap=True)
