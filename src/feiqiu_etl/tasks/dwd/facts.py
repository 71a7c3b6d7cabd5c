"""Incremental load of one DWD fact by key (warehouse-model §5.1), with its watermark, in one transaction.

Candidates are the ODS rows with ``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at)) >= watermark``
(all rows when the table has no watermark yet). They are upserted on (``site_id``, BK); an existing row is
rewritten only when ``src_content_hash`` or ``is_deleted`` differ, so a re-run writes nothing. The
watermark (``etl_meta.dwd_watermark``) advances to the candidates' maximum in the same transaction.

Facts are never physically deleted here, and the watermark never moves unless the upsert committed with it.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.casts import names, target_ident
from feiqiu_etl.connector.dwd_mapping import DwdTable
from feiqiu_etl.tasks.dwd.schema import WATERMARK_TABLE
from feiqiu_etl.tasks.dwd.staging import STAGE, LoadCounts, stage_source, table_lock

_WATERMARK = sql.Identifier(*WATERMARK_TABLE)
_BOOKKEEPING = ("is_deleted", "src_content_hash", "src_fetched_at")


def read_watermark(conn: psycopg.Connection, table: DwdTable) -> datetime | None:
    """The fact's watermark, or None before its first successful load."""
    row = conn.execute(sql.SQL("SELECT watermark FROM {} WHERE table_name = %s").format(_WATERMARK),
                       (table.target,)).fetchone()
    return row[0] if row else None


def _write_watermark(conn: psycopg.Connection, table: DwdTable, run_id: str) -> None:
    """Advance the watermark to the staged candidates' maximum ``mark``; never backwards, no write if unmoved."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {w} AS w (table_name, watermark, run_id, updated_at)"
            " SELECT %s, max(mark), %s, now() FROM {stage} HAVING max(mark) IS NOT NULL"
            " ON CONFLICT (table_name) DO UPDATE SET watermark = EXCLUDED.watermark,"
            " run_id = EXCLUDED.run_id, updated_at = EXCLUDED.updated_at"
            " WHERE EXCLUDED.watermark > w.watermark"
        ).format(w=_WATERMARK, stage=STAGE),
        (table.target, run_id),
    )


def _upsert(conn: psycopg.Connection, table: DwdTable, run_id: str) -> tuple[int, int]:
    """Upsert the staged rows; return (inserted, updated)."""
    cols = ("site_id", *table.column_names, *_BOOKKEEPING)
    updates = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
        for c in (*table.column_names, *_BOOKKEEPING, "run_id", "loaded_at")
        if c not in table.business_key
    )
    stmt = sql.SQL(
        "WITH w AS (INSERT INTO {t} AS f ({names}) SELECT {src}, %s, now() FROM {stage} s ORDER BY {order}"
        " ON CONFLICT ({keys}) DO UPDATE SET {updates}"
        " WHERE f.src_content_hash IS DISTINCT FROM EXCLUDED.src_content_hash"
        " OR f.is_deleted IS DISTINCT FROM EXCLUDED.is_deleted"
        " RETURNING (xmax = 0) AS inserted)"
        " SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) FROM w"
    ).format(t=target_ident(table), names=names((*cols, "run_id", "loaded_at")), src=names(cols, "s"),
             stage=STAGE, order=names(table.key, "s"), keys=names(table.key), updates=updates)
    inserted, updated = conn.execute(stmt, (run_id,)).fetchone()
    return inserted, updated


def load_fact(conn: psycopg.Connection, table: DwdTable, *, run_id: str) -> LoadCounts:
    """Load the new and changed ODS rows of fact ``table`` and advance its watermark (warehouse-model §5.1).

    Runs in its own transaction (a savepoint if one is open) under the table's advisory lock. Returns
    :class:`LoadCounts` with ``inserted`` and ``updated`` rows (``closed`` is always 0 for facts). Cast errors
    propagate as ``psycopg.Error`` and leave the table and its watermark unchanged.
    """
    if table.is_dimension:
        raise ValueError(f"{table.target} is a dimension, not a fact")
    with conn.transaction():
        table_lock(conn, table)
        stage_source(conn, table, since=read_watermark(conn, table))
        inserted, updated = _upsert(conn, table, run_id)
        _write_watermark(conn, table, run_id)
    return LoadCounts(inserted=inserted, updated=updated)
