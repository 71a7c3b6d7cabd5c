"""Template filters: timestamps in the warehouse's time zone, durations, ages, numbers (pure functions)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from jinja2 import Undefined

from feiqiu_etl.db.connection import SESSION_TIME_ZONE
from feiqiu_etl.formats import duration as _duration

ZONE = ZoneInfo(SESSION_TIME_ZONE)
STATUS_CLASSES = {"RUNNING": "running", "SUCCESS": "success", "PARTIAL": "partial", "FAILED": "failed",
                  "CANCELLED": "cancelled", "INTERRUPTED": "interrupted"}


def _missing(value: Any) -> bool:
    """None, or a key the summary of an older version did not have (Jinja's Undefined)."""
    return value is None or isinstance(value, Undefined)


def ts(value: Any, seconds: bool = True) -> str:
    """``2024-03-04 12:00:05`` in Asia/Shanghai (the stores' zone, warehouse-model §1); ``-`` for None."""
    if _missing(value) or value == "":
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if value.tzinfo is not None:
        value = value.astimezone(ZONE)
    return value.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def dur(seconds: Any) -> str:
    """``42 s``, ``3m05s``, ``2h04m`` (the CLI's format); ``-`` for None."""
    return _duration(None if _missing(seconds) else float(seconds))


def age(seconds: Any) -> str:
    """A coarse age: ``45 s``, ``12 min``, ``5 h 20 min``, ``3 d 4 h``; ``never`` for None."""
    if _missing(seconds):
        return "never"
    s = max(0, int(float(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def num(value: Any) -> str:
    """``12,345``; ``-`` for None; floats with one decimal."""
    if _missing(value):
        return "-"
    if isinstance(value, (float, Decimal)) and not float(value).is_integer():
        return f"{float(value):,.1f}"
    return f"{int(value):,}"


def shortwin(value: Any) -> str:
    """A window bound without zero seconds: ``2024-03-02 00:00:00`` → ``2024-03-02 00:00``."""
    text = str(value or "")
    return text[:-3] if len(text) == 19 and text.endswith(":00") else text


def status_class(status: str | None) -> str:
    return STATUS_CLASSES.get((status or "").upper(), "unknown")


FILTERS = {"ts": ts, "dur": dur, "age": age, "num": num, "status_class": status_class,
           "shortwin": shortwin}
