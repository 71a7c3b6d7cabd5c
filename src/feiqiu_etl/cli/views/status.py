"""``status``: what each running run is doing now (its recorded live snapshot)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from feiqiu_etl.app.progress import recorded_live
from feiqiu_etl.cli.views.console import status_text, stdout_console
from feiqiu_etl.cli.views.progress import progress_view
from feiqiu_etl.common.status import Status
from feiqiu_etl.formats import duration
from feiqiu_etl.textsafe import escape_tree


def render_status(runs: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    runs = escape_tree(runs)
    if not runs:
        console.print("no run is in progress")
        return
    for r in runs:
        live = recorded_live(r.get("live"))
        console.print(Text.assemble(f"run {r['run_id']} ", status_text(Status.RUNNING),
                                    f" for {duration(r.get('duration'))} on {r.get('host')} pid {r.get('pid')}, "
                                    f"heartbeat {r.get('heartbeat_age') or 0:.0f} s ago"))
        if live is not None:
            console.print(progress_view(live))
