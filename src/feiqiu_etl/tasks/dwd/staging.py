"""Stage one DWD table's source: cast the ODS payloads and keep one row per business key, in a temp table.

Both loaders start here (and share ``table_lock`` and ``LoadCounts`` from here). ``stage_source`` fills
``pg_temp.dwd_stage`` (dropped at commit) with the typed columns of the mapping (warehouse-model §3), the ODS
``is_deleted`` flag, and either the SCD2 ``change_hash`` (dimensions, §4.1) or the fact bookkeeping
(``src_content_hash``, ``src_fetched_at``, ``mark``; §5.1).
Several ODS rows mapping to the same business key are resolved deterministically: a live row beats a deleted
one (a key is deleted only when every row for it is), then the latest ``fetched_at``, then the greatest ODS
primary key. The merge steps after this only read the temp table, so the casts run once per load.

This module never writes to ``dwd`` or ``ods``; it must run inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.casts import Fragment, cast_sql, names, param, source_ident
from feiqiu_etl.tasks.dwd.mapping import DwdTable

STAGE = sql.Identifier("pg_temp", "dwd_stage")
_STAGE_NAME = sql.Identifier("dwd_stage")

#: ``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))``: when an ODS row last changed (§5.1).
MARK = sql.SQL("GREATEST(o.fetched_at, COALESCE(o.deleted_at, o.fetched_at))")


@dataclass(frozen=True)
class LoadCounts:
    """Rows written by one table load: new rows/versions, rows updated in place, versions closed."""

    inserted: int = 0
    updated: int = 0
    closed: int = 0


class SourceTableError(RuntimeError):
    """The ODS source table is missing or has no primary key."""


def table_lock(conn: psycopg.Connection, table: DwdTable) -> None:
    """Take the per-table advisory lock for this transaction: loads of one DWD table never overlap."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"feiqiu_etl.dwd:{table.target}",))


def ods_key_columns(conn: psycopg.Connection, table: DwdTable) -> list[str]:
    """Primary-key columns of the ODS source table, without ``site_id``, in key order.

    Raises :class:`SourceTableError` when the table is missing or has no primary key.
    """
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indisprimary AND n.nspname = %s AND c.relname = %s"
        " ORDER BY array_position(i.indkey::int2[], a.attnum)",
        (table.source_schema, table.source_name),
    ).fetchall()
    if not rows:
        raise SourceTableError(f"{table.target}: source table {table.source} does not exist or has no primary key")
    return [r[0] for r in rows if r[0] != "site_id"]


def change_hash_sql(table: DwdTable, alias: str = "c") -> sql.Composed:
    """``md5(jsonb_build_array(<tracked columns in listed order>)::text)`` (warehouse-model §4.1)."""
    return sql.SQL("md5(jsonb_build_array({})::text)").format(names(table.tracked, alias))


def _select_source(table: DwdTable, ods_keys: list[str], since: datetime | None,
                   changed: Fragment | None = None) -> Fragment:
    """SELECT of the deduplicated, typed source rows, with the stage's column names."""
    casts = Fragment.join(", ", (Fragment.of("{} AS {}", cast_sql(c, sql.Identifier("o", "payload")),
                                             sql.Identifier(c.name)) for c in table.columns))
    key_aliases = [sql.Identifier(f"_k{i}") for i in range(len(ods_keys))]
    ods_key_sel = sql.SQL("").join(
        sql.SQL(", o.{} AS {}").format(sql.Identifier(k), a) for k, a in zip(ods_keys, key_aliases))
    where = Fragment.of(" WHERE {} >= {}", MARK, param(since)) if since is not None else Fragment(sql.SQL(""))
    if changed is not None:
        where = Fragment.of(" WHERE {}", changed)
    inner = Fragment.of(
        "SELECT o.site_id, {}, o.is_deleted, o.content_hash, o.fetched_at, {} AS _mark{} FROM {} o{}",
        casts, MARK, ods_key_sel, source_ident(table), where,
    )
    bk = [sql.Identifier("c", k) for k in table.key]
    if table.is_dimension:
        # mark and the ODS key: the dimension's change watermark and key alignment (tasks/dwd/watermark.py)
        extra = sql.SQL("{} AS change_hash, c._mark AS mark{}").format(
            change_hash_sql(table), sql.SQL("").join(sql.SQL(", c.{}").format(a) for a in key_aliases))
    else:
        extra = sql.SQL("c.content_hash AS src_content_hash, c.fetched_at AS src_fetched_at, c._mark AS mark")
    order = sql.SQL(", ").join([*bk, sql.SQL("c.is_deleted"), sql.SQL("c.fetched_at DESC"),
                                *(sql.SQL("c.{} DESC").format(a) for a in key_aliases)])
    return Fragment.of(
        "SELECT DISTINCT ON ({}) c.site_id, {}, c.is_deleted, {} FROM ({}) c ORDER BY {}",
        sql.SQL(", ").join(bk), names(table.column_names, "c"), extra, inner, order,
    )


def stage_source(conn: psycopg.Connection, table: DwdTable, *, since: datetime | None = None,
                 changed: Fragment | None = None) -> int:
    """Fill ``pg_temp.dwd_stage`` with the source of ``table``; return its row count.

    ``since`` (facts) keeps the ODS rows whose ``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))``
    is ``>= since`` (warehouse-model §5.1); ``changed`` (dimensions, an incremental merge) is a filter on the
    ODS rows (alias ``o``, see ``watermark.changed_after``); without either the whole source is read (§4.2).
    A dimension's stage also holds ``mark`` and the ODS key columns ``_k0…`` (watermark and key alignment). A payload that does
    not cast (e.g. ``"abc"`` for a money field) raises ``psycopg.errors.DataError`` (or a subclass such as
    ``InvalidTextRepresentation``) and leaves the transaction to be rolled back by the caller.
    """
    select = _select_source(table, ods_key_columns(conn, table), since, changed)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(STAGE))
    # CREATE TABLE AS (not INSERT … SELECT) lets PostgreSQL scan and cast the source with parallel workers.
    cur = conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS ").format(_STAGE_NAME) + select.sql,
                       select.params)
    conn.execute(sql.SQL("ANALYZE {}").format(STAGE))
    return cur.rowcount
