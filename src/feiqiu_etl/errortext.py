"""One line of text about an error: what a log line, a run record, a status cell or a CLI error shows.

The one helper every module uses for that (the engine, the loaders, the runner, the registry, the commands),
so that an error reads the same wherever it appears: white space (newlines included) folded, cut to a
length, the exception's class name first unless the caller's own words already say what failed. It never
adds anything that was not in the exception: secrets are the caller's business (``db.connection.scrub``).
"""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(exc: BaseException, limit: int | None = 300, *, with_type: bool = True) -> str:
    """``"OperationalError: connection refused …"``: ``str(exc)`` on one line (runs of white space become one
    space), at most ``limit`` characters of it (None: all), after the class name and ``": "`` — or without
    them when ``with_type`` is False. An exception without text gives its class name alone, either way."""
    text = " ".join(str(exc).split())
    if limit is not None:
        text = text[:limit]
    if not text:
        return exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if with_type else text
