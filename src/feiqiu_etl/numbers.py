"""Numbers written by people or sent from outside, read one way everywhere (issue 28 items 3 and 7).

A number in a flag, a ``.env`` line, the environment, a YAML file or a web query string is written in ASCII
digits only (``１２`` or ``٣`` are not numbers here, although Python's ``int()`` and ``float()`` take them) and
is finite: ``nan``, ``inf``, ``-inf``, ``Infinity`` and a literal that overflows (``1e400``) are refused, since a
NaN threshold compares false with everything and switches a monitor off without a word (``freshness --hours
nan`` once exited 0 with 12 of 21 tasks 11 days old). :func:`parse_float` and :func:`parse_int` are the readers;
:mod:`feiqiu_etl.cli.numeric` gives the same rule as click types, and the settings model refuses the same
values (``allow_inf_nan=False`` and these readers). Pure; raises ``ValueError`` with one line.
"""

from __future__ import annotations

import math
import re

_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INT = re.compile(r"[+-]?[0-9]+")


def ascii_digits(text: str) -> bool:
    """True when every digit of ``text`` is an ASCII digit (0-9): no full-width, Arabic-Indic or other digits."""
    return not any(ch.isdigit() and not "0" <= ch <= "9" for ch in text) and not any(
        ch.isnumeric() and not "0" <= ch <= "9" for ch in text)


def parse_float(text: object, what: str = "value") -> float:
    """``text`` as a finite float (a float or int is checked as it is). Raises ``ValueError``: ``what must be a
    finite number written in ASCII digits, got 'nan'``."""
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a number, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = str(text).strip()
        if not _FLOAT.fullmatch(raw):
            raise ValueError(f"{what} must be a finite number written in ASCII digits, got {_shown(text)}")
        value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {_shown(text)}")
    return value


def parse_int(text: object, what: str = "value") -> int:
    """``text`` as an int written in ASCII digits (an int is taken as it is). Raises ``ValueError``."""
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a whole number, got {text!r}")
    if isinstance(text, int):
        return text
    raw = str(text).strip()
    if not _INT.fullmatch(raw):
        raise ValueError(f"{what} must be a whole number written in ASCII digits, got {_shown(text)}")
    return int(raw)


def _shown(text: object) -> str:
    return repr(str(text)[:40])
