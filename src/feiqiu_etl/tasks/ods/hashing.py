"""Canonical JSON and ``content_hash`` (warehouse-model.md §2.2).

Canonical form: keys sorted, no whitespace, non-ASCII unescaped (UTF-8), integers as exact digits.
``\\uXXXX`` versus raw UTF-8 on the wire therefore gives the same hash; ``"12.5"`` vs ``"12.50"`` does not.
``\\u0000`` is removed from strings before hashing and storing, because PostgreSQL ``jsonb``/``text``
reject it (ENGINE-NOTES). The text comes from :mod:`feiqiu_etl.jsonfast` (orjson where it is byte-identical
to the standard library's ``json.dumps``, the standard library otherwise).
"""

from __future__ import annotations

import hashlib
from typing import Any

from feiqiu_etl.jsonfast import canonical_bytes

NUL_ESCAPE = "\\u0000"
"""How a ``\\u0000`` in a string shows in canonical text: a record whose text lacks it has none to strip."""
NUL_ESCAPE_BYTES = NUL_ESCAPE.encode("ascii")


def strip_nul(value: Any) -> Any:
    """Return ``value`` with ``\\u0000`` removed from every string (keys included)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_nul(v) for v in value]
    return value


def count_nul(value: Any) -> int:
    """NUL characters in every string of ``value`` (keys included)."""
    if isinstance(value, str):
        return value.count("\x00")
    if isinstance(value, dict):
        return sum(count_nul(k) + count_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(count_nul(v) for v in value)
    return 0


def canonical_json(record: Any) -> str:
    """Canonical JSON text of ``record`` (sorted keys, compact, UTF-8 unescaped, exact integers)."""
    return canonical_bytes(record).decode("utf-8")


def canonical_row(record: Any) -> tuple[Any, bytes, str]:
    """``(record without \\u0000, canonical JSON as UTF-8 bytes, content_hash)`` in one pass over the record.

    The NUL scan (:func:`strip_nul`) only runs when the canonical text shows a ``\\u0000`` escape. Raises
    ``ValueError`` (non-finite float, lone surrogate), ``TypeError`` or ``RecursionError`` like
    :func:`canonical_json`."""
    return canonical_row_counted(record)[:3]


def canonical_row_counted(record: Any) -> tuple[Any, bytes, str, int]:
    """:func:`canonical_row` plus the number of NUL characters removed from the record's strings (keys
    included): text from outside changed, which the task counts and says once (issue 28 item 7)."""
    data = canonical_bytes(record)
    removed = 0
    if NUL_ESCAPE_BYTES in data:
        removed = count_nul(record)
        record = strip_nul(record)
        data = canonical_bytes(record)
    return record, data, hashlib.sha256(data).hexdigest(), removed


def content_hash(record: Any) -> str:
    """SHA-256 hex of :func:`canonical_json`."""
    return hash_text(canonical_json(record))


def hash_text(canonical: str) -> str:
    """SHA-256 hex of an already canonical JSON text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
