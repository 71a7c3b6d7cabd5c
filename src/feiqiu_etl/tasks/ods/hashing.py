"""Canonical JSON and ``content_hash`` (warehouse-model.md §2.2).

Canonical form: keys sorted, no whitespace, non-ASCII unescaped (UTF-8), integers as exact digits.
``\\uXXXX`` versus raw UTF-8 on the wire therefore gives the same hash; ``"12.5"`` vs ``"12.50"`` does not.
``\\u0000`` is removed from strings before hashing and storing, because PostgreSQL ``jsonb``/``text``
reject it (ENGINE-NOTES).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def strip_nul(value: Any) -> Any:
    """Return ``value`` with ``\\u0000`` removed from every string (keys included)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_nul(v) for v in value]
    return value


def canonical_json(record: Any) -> str:
    """Canonical JSON text of ``record`` (sorted keys, compact, UTF-8 unescaped, exact integers)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(record: Any) -> str:
    """SHA-256 hex of :func:`canonical_json`."""
    return hash_text(canonical_json(record))


def hash_text(canonical: str) -> str:
    """SHA-256 hex of an already canonical JSON text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
