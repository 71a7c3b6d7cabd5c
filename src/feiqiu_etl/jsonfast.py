"""Exact JSON at orjson's speed: orjson wherever it gives exactly what the standard library gives, the
standard library everywhere else (so results, and errors, are the standard library's).

* :func:`loads` parses with orjson and falls back to :func:`json.loads` for a document that may hold an
  integer beyond 64 bits (orjson would make it a float; ids stay exact, upstream-api.md Q2) and whenever
  orjson refuses the input: ``NaN``/``Infinity``, lone surrogates, a BOM or UTF-16/32 text, nesting deeper
  than 1024. Otherwise orjson yields the same values as :func:`json.loads` (same ints, correctly rounded
  floats, the last of repeated keys).
* :func:`canonical_bytes` is the canonical form of warehouse-model §2.2 (keys sorted, compact, UTF-8
  unescaped, exact integers) as UTF-8 bytes, byte-identical to
  ``json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``. orjson
  writes floats below 1e-4 differently (``0.00001`` vs ``1e-05``) and non-finite floats as ``null``; those
  outputs (and anything orjson refuses, e.g. integers beyond 64 bits) go to the standard library.

Values are what JSON parsing produces (dict with str keys, list, str, int, float, bool, None; tuples are
lists). This module never changes a value and never swallows an error of the standard library.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
            | orjson.OPT_PASSTHROUGH_SUBCLASS)


# Digits -> "0", "-" stays, everything else -> " ": a long digit run shows as a long run of "0".
_DIGIT_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else (0x2D if b == 0x2D else 0x20) for b in range(256))
_TWENTY_DIGITS = b"0" * 20
_MINUS_NINETEEN = b"-" + b"0" * 19


def _may_overflow_64_bits(data: bytes) -> bool:
    """True when ``data`` holds a digit run orjson may turn into a float: 20+ digits (above 2^64 - 1) or a
    minus and 19 digits (below -2^63). Runs inside strings or fractions give false alarms, never misses."""
    mapped = data.translate(_DIGIT_MAP)
    return _TWENTY_DIGITS in mapped or _MINUS_NINETEEN in mapped


def loads(data: bytes | str) -> Any:
    """Parse one JSON document. Raises ``ValueError`` (``json.JSONDecodeError``) or ``RecursionError`` exactly
    as :func:`json.loads` does. orjson silently reads integers beyond 64 bits as floats: a document that may
    hold one goes to the standard library."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if _may_overflow_64_bits(raw):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def canonical_text(value: Any) -> str:
    """The standard library's canonical JSON text of ``value`` (the reference form)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    """Canonical JSON of ``value`` as UTF-8 bytes. Raises ``ValueError`` for non-finite floats and strings
    that are not valid Unicode (lone surrogates), ``TypeError`` for non-JSON values, ``RecursionError`` for
    very deep nesting: the standard library's errors."""
    try:
        out = orjson.dumps(value, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: > 64-bit ints, surrogates, deep nesting, foreign types
        return canonical_text(value).encode("utf-8")
    if b"0.0000" in out or b"e-" in out or (b"null" in out and not _all_finite(value)):
        return canonical_text(value).encode("utf-8")
    return bytes(memoryview(out))  # an exact-size copy: orjson's own buffer keeps ~4 KiB per object


def _all_finite(value: Any) -> bool:
    """False if a float in ``value`` is NaN or infinite (orjson would write it as ``null``)."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
        elif t is float and v - v != 0.0:  # inf - inf and nan - nan are nan
            return False
    return True
