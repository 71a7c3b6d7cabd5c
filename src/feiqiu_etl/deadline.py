"""A lane's deadline: the moment its run must stop sending requests (issue 20, "the night has an end").

Written by a person in one of two forms, on the command line (``run --deadline``), in the settings
(``run.deadline``) or per fleet lane (``deadline:``):

* a **time of day** in the display zone, ``06:00`` or ``05:30:15``: the next such moment after the run starts
  (a run started at 23:10 with ``06:00`` has until 06:00 the next morning; one started at 06:00 exactly, 24 h);
* a **duration** from the start, ``45m``, ``90s``, ``2h``, ``1h30m`` or ``0.5h``.

:class:`Deadline` is the parsed value (it knows the text it came from); :meth:`Deadline.at` turns it into an
instant once the start is known. The display zone — the zone in which a person's time of day is read and shown —
is :func:`display_zone`: ``display.timezone`` (default the machine's local zone), through
:func:`feiqiu_etl.formats.display_tz`, the one function that decides it; every deadline message names its UTC
offset (issue 28 item 2: ``06:00`` on a UTC host with ``display.timezone`` Asia/Shanghai is 06:00 +08:00). Pure: no I/O; the clock only where a caller asks for "now".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone, tzinfo

MAX_SECONDS = 30 * 86400.0
"""The longest duration a deadline may give (s): the longest ``--timeout`` a run accepts."""

_TIME_OF_DAY = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$", re.ASCII)  # ASCII digits only (issue 28 item 7)
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$", re.ASCII)
_FORMS = "a time of day (06:00) or a duration from the start (45m, 90s, 2h, 1h30m)"


def display_zone(name: str | None = None) -> tzinfo:
    """The zone in which times of day are read from people and shown to them: ``name`` (a ``display.timezone``
    value: ``local`` or an IANA name), else the process's display zone (``display.timezone`` of its settings,
    default the machine's local zone)."""
    from feiqiu_etl.formats import display_tz

    return display_tz(name)


@dataclass(frozen=True)
class Deadline:
    """A parsed deadline: ``time_of_day`` (a ``datetime.time`` in the display zone) or ``seconds`` (a duration
    from the start, > 0); ``text`` is what the person wrote. Build it with :meth:`parse`."""

    text: str
    time_of_day: time | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Deadline":
        """The deadline ``text`` means. Raises ``ValueError`` (one line naming the forms) for anything else:
        an empty text, a time such as ``25:00``, a number without a unit (``45``), a duration of 0 or above
        :data:`MAX_SECONDS`."""
        if not isinstance(text, str):
            raise ValueError(f"expected {_FORMS} as text, got {text!r}")
        value = text.strip().lower()
        clock = _TIME_OF_DAY.match(value)
        if clock:
            hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
            if hour > 23 or minute > 59 or second > 59:
                raise ValueError(f"{text.strip()!r} is no time of day (00:00 to 23:59:59)")
            return cls(text.strip(), time_of_day=time(hour, minute, second))
        duration = _DURATION.match(value)
        if value and duration:
            seconds = sum(float(part or 0) * unit for part, unit in zip(duration.groups(), (3600, 60, 1)))
            if not 0 < seconds <= MAX_SECONDS:
                raise ValueError(f"a deadline must lie after the start and at most {MAX_SECONDS / 86400:g} days "
                                 f"after it, got {text.strip()!r}")
            return cls(text.strip(), seconds=seconds)
        raise ValueError(f"expected {_FORMS}, got {text.strip()!r}")

    def at(self, start: datetime, zone: tzinfo | None = None) -> datetime:
        """The instant (aware, UTC) this deadline means for a run that started at ``start`` (aware): the start
        plus the duration, or the next ``time_of_day`` in ``zone`` (default :func:`display_zone`) after it."""
        if start.tzinfo is None:
            raise ValueError("the start of a run must be an aware datetime")
        if self.seconds is not None:
            return (start + timedelta(seconds=self.seconds)).astimezone(timezone.utc)
        zone = zone or display_zone()
        local = start.astimezone(zone)
        candidate = datetime.combine(local.date(), self.time_of_day, tzinfo=zone)
        if candidate <= local:
            candidate = datetime.combine(local.date() + timedelta(days=1), self.time_of_day, tzinfo=zone)
        return candidate.astimezone(timezone.utc)

    def __str__(self) -> str:
        return self.text


def shown(instant: datetime | str, zone: tzinfo | None = None) -> str:
    """An instant (or its ISO 8601 text) as a person reads it: ``06:00:00 +08:00`` in ``zone`` (default the display
    zone), with the date when it is not today's there. Always with the UTC offset (issue 28 item 2)."""
    from feiqiu_etl.formats import utc_offset

    if isinstance(instant, str):
        instant = datetime.fromisoformat(instant)
    zone = zone or display_zone()
    local = instant.astimezone(zone)
    today = datetime.now(zone).date()
    text = local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")
    return f"{text} {utc_offset(local)}"


def named(text: object, at: datetime | str | None) -> str:
    """A deadline in a message: ``06:00 (06:00:00 +08:00)`` — what the person wrote and the instant it means,
    with its offset (``text`` alone when the instant is unknown)."""
    return f"{text} ({shown(at)})" if at else str(text)
