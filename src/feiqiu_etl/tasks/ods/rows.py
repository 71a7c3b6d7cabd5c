"""Row shapes that flow from processing to the ODS writer, and the per-table column layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Hashable

from feiqiu_etl.connector.spec import KeyColumn, OdsTaskSpec


@dataclass(frozen=True)
class TableLayout:
    """Columns of one ODS table besides the fixed §2.2 ones: keys, extra (detail parent), window."""

    table: str
    keys: tuple[KeyColumn, ...]
    extra: tuple[KeyColumn, ...] = ()
    window_column: str | None = None
    parent: KeyColumn | None = None  # detail tables: the per-parent soft-delete scope

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(k.column for k in self.keys)


def layouts_for(spec: OdsTaskSpec) -> dict[str, TableLayout]:
    """The list table and (if any) the detail table of ``spec``."""
    out = {spec.table: TableLayout(spec.table, spec.keys, window_column=spec.window_column)}
    if spec.detail:
        d = spec.detail
        extra = () if d.parent_is_key else (d.parent,)
        out[d.target_table] = TableLayout(d.target_table, d.keys, extra=extra, parent=d.parent)
    return out


@dataclass(slots=True)
class OdsRow:
    """One record bound for an ODS table. ``keys``/``extra`` follow the layout's column order; ``payload`` is
    the canonical JSON (UTF-8 bytes from processing; a str is accepted too)."""

    table: str
    site_id: int
    keys: tuple
    extra: tuple
    window: datetime | None
    payload: bytes | str
    content_hash: str
    fetched_at: datetime
    record: dict = field(repr=False)
    scope: Hashable | None = None
    wants_detail: bool = False


@dataclass
class DetailDone:
    """Marker after a ``code 0`` detail response: rows of ``parent`` missing from ``seen`` are
    soft-deleted (warehouse-model §2.3), and the parent's pending detail entry is cleared."""

    table: str
    task_code: str
    site_id: int
    parent_value: Any
    parent_key: str
    seen: list[tuple]
    fetched_at: datetime
    scope: Hashable | None = None
    is_record: ClassVar[bool] = False  # bookkeeping, not a fetched record (pipeline.models.is_record)


@dataclass
class DetailFailed:
    """Marker after a detail request failed for good: the parent's owed entry records the attempt and the
    error (and is given up after too many), or — ``gone``: the upstream said the record does not exist
    (40401) — leaves the owed list (upstream-api §2.1: skip, no retry)."""

    table: str
    task_code: str
    site_id: int
    parent_key: str
    error: str
    gone: bool
    scope: Hashable | None = None
    is_record: ClassVar[bool] = False  # bookkeeping, not a fetched record (pipeline.models.is_record)
