"""Time windows: half-open ``[start, end)`` segments in the source's local time (upstream-api.md §1.2).

Pure functions, no I/O. Times are naive ``datetime`` values in Asia/Shanghai at second precision;
:func:`fmt` renders them as the API wants (``"YYYY-MM-DD HH:MM:SS"``).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

SHANGHAI = timezone(timedelta(hours=8), "Asia/Shanghai")
API_FORMAT = "%Y-%m-%d %H:%M:%S"
EARLIEST_WINDOW = datetime(2000, 1, 1)  # explicit windows start after this (guards against typos like 0024)
LATEST_DAY = datetime(2099, 12, 31)  # and --from/--to days end by this one (typos like 9024; 9999-12-31 + 1 day)


@dataclass(frozen=True, order=True)
class Window:
    """Half-open interval ``[start, end)`` of naive Shanghai-local datetimes."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start >= self.end:
            raise ValueError(f"window start {fmt(self.start)} must be before end {fmt(self.end)}")

    @property
    def length(self) -> timedelta:
        return self.end - self.start


def fmt(value: datetime) -> str:
    return value.strftime(API_FORMAT)


_SHAPE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?: (\d{2}):(\d{2}):(\d{2}))?$")


def field_problem(text: str) -> str | None:
    """Which field of a well-shaped ``YYYY-MM-DD[ HH:MM:SS]`` is out of range (``month 13 is not 01..12``,
    ``day 31 is not in 2026-11 (01..30)``), None when none is or the text has another shape (issue 27)."""
    import calendar

    m = _SHAPE.match(text.strip())
    if not m:
        return None
    year, month, day = (int(g) for g in m.groups()[:3])
    if not 1 <= year:
        return f"year {m.group(1)} is not a year"
    if not 1 <= month <= 12:
        return f"month {m.group(2)} is not 01..12"
    last = calendar.monthrange(year, month)[1]
    if not 1 <= day <= last:
        return f"day {m.group(3)} is not in {year:04d}-{month:02d} (01..{last:02d})"
    if m.group(4) is not None:
        for name, value, top in (("hour", m.group(4), 23), ("minute", m.group(5), 59), ("second", m.group(6), 59)):
            if int(value) > top:
                return f"{name} {value} is not 00..{top:02d}"
    return None


def parse_local(text: str) -> datetime:
    """Parse ``"YYYY-MM-DD HH:MM:SS"`` (or ``"YYYY-MM-DD"``). Raises ``ValueError`` with the bad text: the field
    out of range when the shape is right (:func:`field_problem`), else the expected format."""
    text = text.strip()
    if not text.isascii():  # strptime reads "２０２６" as 2026: digits are ASCII only (issue 28 item 7)
        raise ValueError(f"expected 'YYYY-MM-DD HH:MM:SS' in ASCII digits, got {text!r}")
    for pattern in (API_FORMAT, "%Y-%m-%d"):
        try:
            return datetime.strptime(text, pattern)
        except ValueError:
            continue
    problem = field_problem(text)
    if problem:
        raise ValueError(f"{problem}, in {text!r}")
    raise ValueError(f"expected 'YYYY-MM-DD HH:MM:SS', got {text!r}")


def local_now() -> datetime:
    """Current Asia/Shanghai local time, naive, truncated to the second."""
    return datetime.now(SHANGHAI).replace(tzinfo=None, microsecond=0)


def to_aware(value: datetime) -> datetime:
    """Attach +08:00 (warehouse-model §1: stored as timestamptz)."""
    return value.replace(tzinfo=SHANGHAI)


def from_aware(value: datetime) -> datetime:
    return value.astimezone(SHANGHAI).replace(tzinfo=None)


def split(window: Window, max_length: timedelta) -> list[Window]:
    """Contiguous half-open segments of at most ``max_length`` covering ``window`` exactly."""
    if max_length <= timedelta(0):
        raise ValueError("segment length must be positive")
    out: list[Window] = []
    cursor = window.start
    while cursor < window.end:
        nxt = min(cursor + max_length, window.end)
        out.append(Window(cursor, nxt))
        cursor = nxt
    return out


def merge(windows: list[Window]) -> list[Window]:
    """Union of windows as sorted, non-overlapping, non-touching intervals."""
    out: list[Window] = []
    for w in sorted(windows):
        if out and w.start <= out[-1].end:
            if w.end > out[-1].end:
                out[-1] = Window(out[-1].start, w.end)
        else:
            out.append(w)
    return out


def subtract(target: Window, done: list[Window]) -> list[Window]:
    """Parts of ``target`` not covered by ``done`` (the holes to fetch: docs/glossary.md)."""
    holes: list[Window] = []
    cursor = target.start
    for w in merge(done):
        if w.end <= cursor or w.start >= target.end:
            continue
        if w.start > cursor:
            holes.append(Window(cursor, min(w.start, target.end)))
        cursor = max(cursor, w.end)
        if cursor >= target.end:
            break
    if cursor < target.end:
        holes.append(Window(cursor, target.end))
    return holes


def plan_incremental(
    now: datetime,
    done: list[Window],
    *,
    lookback: timedelta,
    initial: timedelta,
    horizon: datetime | None = None,
) -> list[Window]:
    """Windows to fetch for a (site, task) without an explicit window (resume from the holes).

    ``horizon`` is where incremental loading of this (site, task) began (recorded by its first
    incremental run); without one it begins now: ``now - initial``. From the horizon on, everything that is
    not in ``done`` is a hole — also a failed first segment — and ``[high_water - lookback, now)`` is
    fetched again (upstream-api.md Q13: a look-back catches late changes). Completed windows before the
    horizon (explicit backfills) neither widen nor narrow the plan. Returned merged and sorted; split them
    with :func:`split`.
    """
    start = horizon if horizon is not None else now - initial
    if start >= now:
        return []
    relevant = [w for w in merge(done) if w.end > start and w.start < now]
    high_water = min(max((w.end for w in relevant), default=start), now)
    parts = subtract(Window(start, high_water), relevant) if high_water > start else []
    tail_start = max(start, high_water - lookback)
    if tail_start < now:
        parts.append(Window(tail_start, now))
    return merge(parts)


def split_back(window: Window, max_length: timedelta) -> list[Window]:
    """Like :func:`split`, but aligned to the end and newest first: the oldest segment is the short one (history
    filled backwards, a segment at a time, keeps its segment boundaries from one night to the next)."""
    if max_length <= timedelta(0):
        raise ValueError("segment length must be positive")
    out: list[Window] = []
    cursor = window.end
    while cursor > window.start:
        prev = max(cursor - max_length, window.start)
        out.append(Window(prev, cursor))
        cursor = prev
    return out


def recent_and_history(
    now: datetime,
    done: list[Window],
    *,
    lookback: timedelta,
    initial: timedelta,
    horizon: datetime | None = None,
    recent_from: datetime,
) -> tuple[list[Window], list[Window]]:
    """:func:`plan_incremental`'s windows split for a run that must meet a deadline: ``(recent, history)``.

    Recent is what a nightly run fetches: the look-back tail after the high-water mark — or, on a first load
    (nothing finished since the horizon), only the part from ``recent_from`` on (e.g. yesterday 00:00), so that
    yesterday's data comes first. History is everything before it (gaps left by earlier runs, the older part of a
    first load), newest first. Both cover exactly what :func:`plan_incremental` plans."""
    planned = plan_incremental(now, done, lookback=lookback, initial=initial, horizon=horizon)
    if not planned:
        return [], []
    start = horizon if horizon is not None else now - initial
    relevant = [w for w in merge(done) if w.end > start and w.start < now]
    if relevant:
        cut = max(start, min(max(w.end for w in relevant), now) - lookback)
    else:
        cut = max(start, min(recent_from, now))
    recent = [Window(max(w.start, cut), w.end) for w in planned if w.end > cut]
    history = [Window(w.start, min(w.end, cut)) for w in reversed(planned) if w.start < cut]
    return recent, history


def day_range(first: str | None, last: str | None) -> tuple[datetime | None, datetime | None]:
    """``--from DATE`` / ``--to DATE`` (``YYYY-MM-DD``, whole days in the source's zone, ``last`` inclusive) as
    the half-open ``[first 00:00, last + 1 day 00:00)`` of naive Shanghai-local datetimes; an end not given is
    None (open). Raises ``ValueError`` with one line naming the flag: not a date, before
    :data:`EARLIEST_WINDOW` or after :data:`LATEST_DAY`, or ``first`` after ``last`` (state reset and ``run --backfill``, issue 18)."""
    days: list[datetime | None] = []
    for flag, text in (("--from", first), ("--to", last)):
        if text is None:
            days.append(None)
            continue
        try:
            if not text.isascii():  # strptime reads "２０２６" as 2026: digits are ASCII only (issue 28 item 7)
                raise ValueError(text)
            day = datetime.strptime(text.strip(), "%Y-%m-%d")
        except ValueError:
            problem = field_problem(text)
            if problem:
                raise ValueError(f"{flag}: {problem}, in {text.strip()!r}") from None
            raise ValueError(f"{flag}: expected a date YYYY-MM-DD, got {text!r}") from None
        if day < EARLIEST_WINDOW:
            raise ValueError(f"{flag}: {text.strip()} is before {EARLIEST_WINDOW:%Y-%m-%d}")
        if day > LATEST_DAY:
            raise ValueError(f"{flag}: {text.strip()} is after {LATEST_DAY:%Y-%m-%d}")
        days.append(day)
    start, end = days
    if start is not None and end is not None and start > end:
        raise ValueError(f"--from {start:%Y-%m-%d} is after --to {end:%Y-%m-%d}")
    return start, (end + timedelta(days=1) if end is not None else None)
