"""What every terminal view shares: the console that never interprets outside text (:class:`SafeConsole`),
plain messages (:func:`say`), status cells, tables fitted to the terminal's width, times in the display zone.
Rich only; no database, no run."""

from __future__ import annotations

import io
import os
from datetime import datetime, timezone
from typing import Any, Iterable

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from feiqiu_etl.common.status import STYLES
from feiqiu_etl.formats import in_display_zone, utc_offset, when
from feiqiu_etl.textsafe import escape


class SafeConsole(Console):
    """A rich console that never interprets text from outside: no markup (``[/x]`` in a store name would
    raise, ``[bold]`` restyle), and every string it renders, table cells included, has its control characters
    escaped (:func:`feiqiu_etl.textsafe.escape`). The renderers below also escape what they put in ``Text``."""

    def __init__(self, **kwargs: Any):
        super().__init__(**{"markup": False, **kwargs})

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(escape(text), **kwargs)


def stdout_console() -> Console:
    """stdout console (:class:`SafeConsole`); when piped, wide enough that nothing is cut, unless ``COLUMNS``
    says how wide (``COLUMNS=80 feiqiu-etl runs | less``)."""
    probe = SafeConsole()
    return probe if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit() else SafeConsole(width=200)


def message_console(*, stderr: bool = False) -> Console:
    """The console of plain messages (:func:`say`): on a terminal, or when ``COLUMNS`` says how wide, it wraps
    at word boundaries within that width (a terminal would otherwise break the line mid-word); piped without
    ``COLUMNS`` it never wraps (one message, one line)."""
    probe = SafeConsole(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return probe
    return SafeConsole(stderr=stderr, soft_wrap=True)


def say(text: str, *, err: bool = False, style: str | None = None) -> None:
    """Print a plain message (not a table, not a log record, not an error line) to stdout, or stderr with
    ``err``: escaped for the terminal, wrapped between words (:func:`message_console`), never inside one."""
    console = message_console(stderr=err)
    message = Text(escape(text), style=style or "")
    if console.soft_wrap:
        console.print(message, highlight=False)
        return
    for line in message.wrap(console, console.width, overflow="fold"):
        line.rstrip()  # no space left at the end of a wrapped line
        console.print(line, highlight=False, soft_wrap=True)


def compact_table() -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))


def status_text(status: str | None) -> Text:
    return Text(status or "-", style=STYLES.get(status or "", ""))


def short_sites(site_ids: set) -> dict:
    """``…4417``: the shortest tail (at least 4 digits) that tells the run's stores apart."""
    texts = {s: str(s) for s in site_ids}
    for n in range(4, max((len(t) for t in texts.values()), default=4) + 1):
        if len({t[-n:] for t in texts.values()}) == len(texts):
            return {s: ("…" + t[-n:]) if len(t) > n else t for s, t in texts.items()}
    return texts


def fitted(rows: list[dict[str, Any]], columns: list[str], drops: tuple[str, ...], width: int, *,
            left: tuple[str, ...]) -> tuple[Table, list[str]]:
    """A table of ``rows`` (cells by column name) within ``width`` columns: the ``columns`` that fit, leaving
    out those named in ``drops`` one by one, in that order, until it fits (or none is left to drop). Cells are
    never cut; columns named in ``left`` are left-justified, the others right."""
    for drop in (None, *drops):
        columns = [c for c in columns if c != drop]
        table = compact_table()
        for col in columns:
            table.add_column(col, no_wrap=True, justify="left" if col in left else "right")
        for row in rows:
            table.add_row(*(row[c] for c in columns))
        if fits(table, width):
            break
    return table, columns


def fits(table: Table, width: int) -> bool:
    """Whether ``table`` prints within ``width`` columns without wrapping or cutting a cell."""
    return SafeConsole(width=1000, file=io.StringIO()).measure(table).maximum <= width


def header_zone(values: Iterable[Any]) -> str | None:
    """The one UTC offset of these times in the display zone, for a column header (``UTC`` for +00:00), so the
    cells leave it out; None when they have several (each cell then carries its own). Other values are
    ignored; with no time at all, the display zone's offset now (not ``UTC`` whatever the zone)."""
    offsets = {utc_offset(in_display_zone(v)) for v in values if isinstance(v, datetime)}
    if not offsets:
        offsets = {utc_offset(in_display_zone(datetime.now(timezone.utc)))}
    return "UTC" if offsets <= {"+00:00"} else offsets.pop() if len(offsets) == 1 else None


def aware(value: Any) -> Any:
    """An ISO 8601 text read as a datetime (JSON-shaped rows); anything else as it is."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def count_text(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def ts(value: Any) -> str:
    """A time in the display zone with its offset (:func:`feiqiu_etl.formats.when`)."""
    return when(value)
