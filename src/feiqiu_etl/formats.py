"""Values written for people, the same in the terminal (:mod:`feiqiu_etl.cli.views`) and on the web page
(:mod:`feiqiu_etl.web.format`): durations (seconds in, text out) and times.

**One time zone rule** (docs/guides/time-zones.md): every time a command or the web page shows is in the display
zone — ``display.timezone``, default the machine's local zone — and carries its UTC offset (``2026-12-01
21:56:23 +08:00``); JSON gives ISO 8601 with the offset. Window bounds are the upstream's wall-clock times and
stay in its zone, :data:`UPSTREAM_ZONE` (docs/upstream-api.md), and say so. The process's display zone is
set once from the settings (:func:`use_display_zone`)."""

from __future__ import annotations

from datetime import date, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UPSTREAM_ZONE = "Asia/Shanghai"
"""The zone of the upstream's times, so of every window bound (docs/upstream-api.md: ``Asia/Shanghai``)."""
LOCAL = "local"

_display: tzinfo | None = None  # None: the machine's local zone


def zone_problem(name: str) -> str | None:
    """Why ``name`` is no display zone (``local`` or an IANA name), or None."""
    if name == LOCAL:
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {name[:64]!r} (use an IANA name such as Asia/Shanghai or UTC, or local)"
    return None


def use_display_zone(name: str) -> None:
    """Show every time of this process in ``name`` (``local`` or an IANA name, checked by the settings)."""
    global _display
    _display = None if name == LOCAL else ZoneInfo(name)


def display_zone_label(at: datetime | None = None) -> str:
    """The display zone as a page names it: ``Asia/Shanghai (+08:00)``, ``UTC (+00:00)``; the machine's zone by
    its abbreviation (``CET (+01:00)``); the offset is the one at ``at`` (default: now)."""
    from datetime import timezone as _tz

    now = in_display_zone(at or datetime.now(_tz.utc))
    name = getattr(_display, "key", None) or now.tzname() or "local"
    return f"{name} ({utc_offset(now)})"
def display_tz(name: str | None = None) -> tzinfo:
    """The zone ``name`` names (``local`` or an IANA name), or the process's display zone when None: the local
    zone is the machine's, with its offset now. The one place that decides where people's times of day are read
    (``--deadline 06:00``, issue 28 item 2) and shown."""
    if name is None:
        if _display is not None:
            return _display
        name = LOCAL
    if name == LOCAL:
        from datetime import timezone

        return datetime.now().astimezone().tzinfo or timezone.utc
    return ZoneInfo(name)


def in_display_zone(value: datetime) -> datetime:
    """An aware ``value`` in the display zone; a naive one is an upstream (window) time: it stays as it is, in
    :data:`UPSTREAM_ZONE`."""
    if value.tzinfo is None:
        return value.replace(tzinfo=ZoneInfo(UPSTREAM_ZONE))
    return value.astimezone(_display)  # None: the local zone, with the offset of that date


def when(value: Any, *, seconds: bool = True, offset: bool = True, year: bool = True) -> str:
    """``2026-12-01 21:56:23 +08:00`` in the display zone (``-`` for None; an ISO 8601 string is read first;
    other text is returned as it is; a naive time is an upstream time, see :func:`in_display_zone`).
    ``offset=False`` when the offset is printed once elsewhere (a header)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return str(value)
    local = in_display_zone(value)
    text = local.strftime(("%Y-%m-%d " if year else "%m-%d ") + ("%H:%M:%S" if seconds else "%H:%M"))
    return f"{text} {utc_offset(local)}" if offset else text


def utc_offset(value: datetime) -> str:
    """``+08:00`` (``+00:00`` for UTC) of an aware datetime."""
    text = value.strftime("%z")
    return f"{text[:3]}:{text[3:]}" if text else "+00:00"


def iso(value: Any) -> Any:
    """A datetime as ISO 8601 with its offset, in the display zone (what every JSON prints); a date as
    ``YYYY-MM-DD``; anything else unchanged."""
    if isinstance(value, datetime):
        return in_display_zone(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


def duration(seconds: float | None) -> str:
    """``42 s``, ``3m05s``, ``2h04m`` (None → ``-``)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


_DURATION_PART = __import__("re").compile(r"([0-9]+(?:\.[0-9]+)?)([wdhms])", __import__("re").ASCII)
_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_seconds(text: str) -> float:
    """A duration of an option in one form everywhere (issue 27): ``45m``, ``90s``, ``2h``, ``1h30m``, ``2d``, or
    plain seconds (``90``, ``2.5``), as seconds. Raises ``ValueError`` with one line naming the forms."""
    value = str(text).strip().lower()
    forms = "45m, 90s, 2h, 1h30m or plain seconds"
    try:
        seconds = float(value) if value and value.replace(".", "", 1).isascii() and \
            value.replace(".", "", 1).isdigit() else None
    except ValueError:
        seconds = None
    if seconds is None:
        parts = _DURATION_PART.findall(value)
        if not value or "".join(n + u for n, u in parts) != value or len({u for _, u in parts}) != len(parts):
            raise ValueError(f"not a duration: {str(text)[:40]!r} ({forms})")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return seconds
def age(seconds: Any) -> str:
    """A coarse age: ``45 s``, ``12 min``, ``5 h 20 min``, ``3 d 4 h``; ``never`` for None (the terminal's
    ``freshness`` and the web page's, one rule)."""
    if seconds is None:
        return "never"
    s = max(0, int(float(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def reconcile_lines(tasks: list[dict]) -> list[tuple[str, str]]:
    """The reconcile section of ``show RUN`` (issue 25, tasks/ods/reconcile.py) as ``(text, verdict)`` lines:
    the verdict counts of every listing, then one line per listing that was not ``ok`` the first time. Empty for
    a run recorded before issue 25."""
    counts: dict[str, int] = {}
    used = budget = 0
    lines: list[tuple[str, str]] = []
    for t in tasks:
        r = t.get("reconcile")
        if not r:
            continue
        used += r.get("refetches", 0)
        budget += r.get("budget", 0)
        for verdict, n in r.get("verdicts", {}).items():
            counts[verdict] = counts.get(verdict, 0) + n
        for listing in r.get("listings", []):
            where = "snapshot" if listing["kind"] == "snapshot" else f"{listing['window'][0]} … {listing['window'][1]}"
            ods = listing["ods"]
            lines.append((f"  {t['task']} {t['site_id']} {where}: {listing['verdict']}: {listing.get('reason') or ''}; "
                          f"{listing['listings']} listing(s), {listing['pages']} pages, {listing['rows']} rows, "
                          f"{listing['distinct_keys']} keys of total {listing.get('first_total')}"
                          f"{' (moved: ' + ', '.join(map(str, listing['totals_moved'])) + ')' if listing.get('totals_moved') else ''}"
                          f"; ODS new {ods['inserted']} chg {ods['updated']} same {ods['unchanged']} "
                          f"del {ods['soft_deleted']}", listing["verdict"]))
    if not counts:
        return []
    order = ("ok", "refetched", "short", "over", "unexpected_zero", "incomplete")
    head = ", ".join(f"{counts[v]} {v}" for v in order if counts.get(v))
    return [(f"reconcile: {sum(counts.values())} listing(s): {head}; {used} refetched of a budget of {budget} "
             f"(integrity.refetch_listings per task)", "ok" if len(lines) == 0 else "head"), *lines]
