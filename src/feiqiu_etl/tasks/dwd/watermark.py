"""Change watermarks of the SCD2 dimensions (warehouse-model §4.2, incremental merge).

One row per dimension in ``etl_meta.dwd_dim_watermark``: every ODS row whose change mark
``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))`` is at or before ``watermark`` has been merged.
An incremental merge reads only the ODS rows changed after it (the mark ``>= w + 1 µs``, timestamptz's resolution;
served by an index on that expression of the source table) and writes the new watermark in the merge's own
transaction, so the watermark never moves unless the merge committed with it.

The row also says whether the source is *key-aligned*: every ODS row's business key equals its ODS key, so
each business key has exactly one ODS row and the changed rows alone decide every affected key. Only then is
an incremental merge exact; otherwise (or without a watermark, or when the dimension no longer holds the
surrogate keys the merge left, e.g. after a truncate) the merge compares everything.

The watermark never passes ``now() - SAFETY``: rows fetched in the last hour before a merge are read again by
the next one, so an ODS batch still in flight while a merge runs (fetched earlier, committed later) is never
missed. Re-reading a row is harmless (the merge compares it with its current version). The incremental merge
relies on the ODS contract (§2.3): rows are never physically deleted, and ``fetched_at``/``deleted_at`` are the
times a row last changed. ``--dwd-full`` compares everything and repairs anything that broke the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.casts import target_ident
from feiqiu_etl.connector.dwd_mapping import DwdMapping, DwdTable

DIM_WATERMARK_TABLE = ("etl_meta", "dwd_dim_watermark")
SAFETY = timedelta(hours=1)

DIM_WATERMARK_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} ("
    " table_name text PRIMARY KEY,"
    " watermark timestamptz NOT NULL,"
    " key_aligned boolean NOT NULL,"
    " max_sk bigint,"
    " run_id text,"
    " updated_at timestamptz NOT NULL DEFAULT now())"
).format(sql.Identifier(*DIM_WATERMARK_TABLE))
_TABLE = sql.Identifier(*DIM_WATERMARK_TABLE)


@dataclass(frozen=True)
class DimWatermark:
    """``watermark``: changes up to here are merged; ``key_aligned``: see the module doc; ``max_sk``: the
    largest surrogate key the dimension held after that merge (None when it was empty)."""

    watermark: datetime
    key_aligned: bool
    max_sk: int | None


def ensure_change_tracking(conn: psycopg.Connection, mapping: DwdMapping) -> None:
    """Create ``etl_meta.dwd_dim_watermark`` and, on every existing ODS source of the mapping, an index on the
    change mark (``staging.MARK``) that finds the rows changed since a watermark (dimensions) or since the
    facts' watermark. Runs in the caller's transaction."""
    conn.execute(DIM_WATERMARK_DDL)
    for source in sorted({(t.source_schema, t.source_name) for t in mapping.tables}):
        if conn.execute("SELECT to_regclass(%s)", (".".join(source),)).fetchone()[0] is None:
            continue  # created later by its ODS task; indexed by the next DWD run
        conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ((GREATEST(fetched_at, COALESCE(deleted_at, "
                             "fetched_at))))").format(sql.Identifier(f"{source[1]}_change_mark_idx"),
                                                      sql.Identifier(*source)))


def read_dim_watermark(conn: psycopg.Connection, table: DwdTable) -> DimWatermark | None:
    """The dimension's watermark, or None before its first merge (or when the table is missing)."""
    if conn.execute("SELECT to_regclass(%s)", (".".join(DIM_WATERMARK_TABLE),)).fetchone()[0] is None:
        return None
    row = conn.execute(sql.SQL("SELECT watermark, key_aligned, max_sk FROM {} WHERE table_name = %s").format(_TABLE),
                       (table.target,)).fetchone()
    return DimWatermark(*row) if row else None


def max_surrogate_key(conn: psycopg.Connection, table: DwdTable) -> int | None:
    return conn.execute(sql.SQL("SELECT max({}) FROM {}").format(
        sql.Identifier(table.surrogate_key), target_ident(table))).fetchone()[0]


def next_mark(watermark: datetime) -> datetime:
    """The first change mark after ``watermark`` (timestamptz counts microseconds): ``MARK >= next_mark(w)``
    reads exactly the rows changed after ``w``."""
    return watermark + timedelta(microseconds=1)


def write_dim_watermark(conn: psycopg.Connection, table: DwdTable, *, staged_max: datetime | None,
                        previous: datetime | None, key_aligned: bool, run_id: str) -> None:
    """Store the new watermark: the latest change mark staged (or ``previous`` when nothing was), capped at
    ``now() - SAFETY``, never below ``previous``. Nothing is stored while there is neither."""
    mark = staged_max if previous is None or (staged_max is not None and staged_max > previous) else previous
    if mark is None:
        return
    conn.execute(
        sql.SQL(
            "INSERT INTO {t} (table_name, watermark, key_aligned, max_sk, run_id, updated_at)"
            " SELECT %(name)s, GREATEST(LEAST(%(mark)s::timestamptz, now() - %(safety)s::interval),"
            " COALESCE(%(prev)s::timestamptz, '-infinity'::timestamptz)),"
            " %(aligned)s, (SELECT max({sk}) FROM {dim}), %(run)s, now()"
            " ON CONFLICT (table_name) DO UPDATE SET watermark = EXCLUDED.watermark,"
            " key_aligned = EXCLUDED.key_aligned, max_sk = EXCLUDED.max_sk, run_id = EXCLUDED.run_id,"
            " updated_at = EXCLUDED.updated_at"
        ).format(t=_TABLE, sk=sql.Identifier(table.surrogate_key), dim=target_ident(table)),
        {"name": table.target, "mark": mark, "safety": SAFETY, "prev": previous, "aligned": key_aligned,
         "run": run_id},
    )
