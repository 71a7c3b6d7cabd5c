"""Template filters: timestamps in the display zone (one time zone rule), durations, ages, numbers, status and task
names in the page's language (pure functions; :func:`filters` binds them to a language)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from jinja2 import Undefined

from feiqiu_etl.formats import duration as _duration
from feiqiu_etl.common.status import Status
from feiqiu_etl.formats import when
from feiqiu_etl.web.i18n import N_, gettext



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


def age(seconds: Any, lang: str = "en") -> str:
    """A coarse age: ``45 s``, ``12 min``, ``5 h 20 min``, ``3 d 4 h`` (zh-CN: ``5 小时 20 分``); ``never`` (从未)
    for None."""
    if _missing(seconds):
        return gettext(lang, N_("never"))
    s = max(0, int(float(seconds)))
    if s < 60:
        return gettext(lang, N_("%(s)d s")) % {"s": s}
    if s < 3600:
        return gettext(lang, N_("%(m)d min")) % {"m": s // 60}
    if s < 86400:
        return gettext(lang, N_("%(h)d h %(m)02d min")) % {"h": s // 3600, "m": s % 3600 // 60}
    return gettext(lang, N_("%(d)d d %(h)d h")) % {"d": s // 86400, "h": s % 86400 // 3600}


def age_short(seconds: Any, lang: str = "en") -> str:
    """An age for a grid cell: ``45m``, ``7h``, ``3d`` (zh-CN: ``45分``, ``7时``, ``3天``); ``–`` for never."""
    if _missing(seconds):
        return "–"
    s = max(0, int(float(seconds)))
    if s < 3600:
        return gettext(lang, N_("%(m)dm")) % {"m": s // 60}
    if s < 48 * 3600:
        return gettext(lang, N_("%(h)dh")) % {"h": s // 3600}
    return gettext(lang, N_("%(d)dd")) % {"d": s // 86400}


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


STATUS_LABELS = {Status.RUNNING.value: N_("RUNNING"), Status.SUCCESS.value: N_("SUCCESS"),
                 Status.PARTIAL.value: N_("PARTIAL"), Status.FAILED.value: N_("FAILED"),
                 Status.CANCELLED.value: N_("CANCELLED"), Status.INTERRUPTED.value: N_("INTERRUPTED"),
                 Status.BUSY.value: N_("BUSY"), Status.DEADLINE.value: N_("DEADLINE"), "CANCELLING": N_("CANCELLING"),
                 "SKIPPED": N_("SKIPPED"), "REFUSED": N_("REFUSED")}
"""A run's, store's or task's status as the page shows it (the code stays in ``data-status``)."""


def status_label(status: str | None, lang: str = "en") -> str:
    """``SUCCESS`` → ``成功`` in zh-CN; an unknown status as it is."""
    code = (status or "").upper()
    return gettext(lang, STATUS_LABELS[code]) if code in STATUS_LABELS else (status or "-")


def task_name(code: str | None, lang: str = "en", names: Any = None) -> str:
    """A task's display name in ``lang`` from the connector's ``names`` (zh, en), else its code."""
    entry = (names or {}).get(code or "") or {}
    return entry.get("zh" if lang.startswith("zh") else "en") or (code or "")


FILTERS = {"ts": ts, "dur": dur, "age": age, "num": num, "status_class": status_class,
           "shortwin": shortwin, "status_label": status_label}


def filters(lang: str, task_names: Any = None) -> dict:
    """:data:`FILTERS` bound to ``lang`` (age, status_label, task_name) and the connector's task names."""
    return {**FILTERS, "age": lambda v: age(v, lang), "age_short": lambda v: age_short(v, lang),
            "status_label": lambda v: status_label(v, lang),
            "task_name": lambda v: task_name(v, lang, task_names),
            "t": lambda v: gettext(lang, v)}
