"""Values written for people, the same in the terminal (:mod:`feiqiu_etl.report`) and on the web page
(:mod:`feiqiu_etl.web.format`): durations (seconds in, text out)."""

from __future__ import annotations


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
