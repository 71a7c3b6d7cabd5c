"""Template filters: timestamps in the display zone (one time zone rule), durations, ages, numbers (pure functions)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from jinja2 import Undefined

from feiqiu_etl.formats import age as _age
from feiqiu_etl.formats import duration as _duration
from feiqiu_etl.common.status import Status
from feiqiu_etl.formats import when



def _missing(value: Any) -> bool:
    """None, or a key the summary of an older version did not have (Jinja's Undefined)."""
    return value is None or isinstance(value, Undefined)


def ts(value: Any, seconds: bool = True) -> str:
    """``2024-03-04 12:00:05 +08:00`` in the display zone (``display.timezone``: one time zone rule for every
    command and this page, :mod:`feiqiu_etl.formats`); ``-`` for None."""
    return "-" if _missing(value) else when(value, seconds=seconds)


def dur(seconds: Any) -> str:
    """``42 s``, ``3m05s``, ``2h04m`` (the CLI's format); ``-`` for None."""
    return _duration(None if _missing(seconds) else float(seconds))


def age(seconds: Any) -> str:
    """A coarse age (:func:`feiqiu_etl.formats.age`: ``45 s``, ``3 d 4 h``); ``never`` for None."""
    return _age(None if _missing(seconds) else seconds)


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
    """The CSS class of a status (``"success"``: :attr:`Status.css`), ``"unknown"`` for anything else."""
    try:
        return Status((status or "").upper()).css
    except ValueError:
        return "unknown"


FILTERS = {"ts": ts, "dur": dur, "age": age, "num": num, "status_class": status_class,
           "shortwin": shortwin}
