"""Idempotent DDL of the DWD layer: SCD2 dimensions (warehouse-model §4.1), facts (§5.1), fact watermarks.

``ensure_dwd_tables`` creates what is missing and checks that existing tables carry every mapped column; it
never drops, alters or rewrites a table, so it is safe to call at the start of every run. Names come from
the mapping and always go through ``sql.Identifier``; type names only from the mapping's closed list.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
from psycopg import sql

from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl.tasks.dwd.casts import names, sql_type, target_ident
from feiqiu_etl.connector.dwd_mapping import DwdMapping, DwdTable
from feiqiu_etl.tasks.dwd.quarantine import ensure_quarantine_table
from feiqiu_etl.tasks.dwd.watermark import ensure_change_tracking

DDL_LOCK = "feiqiu_etl.ddl"  # the same advisory lock as db.schema, so DDL of both layers never interleaves

#: ``valid_to`` of a current version: '9999-12-31 00:00:00+08' (warehouse-model §4.2).
OPEN_END = datetime(9999, 12, 31, tzinfo=timezone(timedelta(hours=8)))

WATERMARK_TABLE = ("etl_meta", "dwd_watermark")

_WATERMARK_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} ("
    " table_name text PRIMARY KEY,"
    " watermark timestamptz NOT NULL,"
    " run_id text,"
    " updated_at timestamptz NOT NULL DEFAULT now())"
).format(sql.Identifier(*WATERMARK_TABLE))


class DwdSchemaError(RuntimeError):
    """An existing DWD table does not match the mapping (e.g. a mapped column is missing)."""


def ensure_dwd_tables(conn: psycopg.Connection, mapping: DwdMapping) -> None:
    """Create the schemas, every DWD table of ``mapping``, ``etl_meta.dwd_watermark`` and
    ``etl_meta.dwd_quarantine`` if missing. Commits.

    Dimensions get the §4.1 columns and constraints (identity ``<dim>_sk``, ``UNIQUE (site_id, bk…, valid_from)``,
    the partial unique index ``(site_id, bk…) WHERE is_current``, ``CHECK (valid_from < valid_to)``); facts get
    ``PRIMARY KEY (site_id, bk…)`` and the §5.1 bookkeeping columns. Raises :class:`DwdSchemaError` when an
    existing table lacks a mapped column (the DDL never alters existing tables).
    """
    ensure_schemas(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (DDL_LOCK,))
        for table in mapping.tables:
            for stmt in table_ddl(table):
                conn.execute(stmt)
            _check_columns(conn, table)
        conn.execute(_WATERMARK_DDL)
        ensure_change_tracking(conn, mapping)  # dimension watermarks + change indexes on their ODS sources
        ensure_quarantine_table(conn)


def table_ddl(table: DwdTable) -> list[sql.Composed]:
    """The ``CREATE … IF NOT EXISTS`` statements of one DWD table (dimension or fact)."""
    return _dimension_ddl(table) if table.is_dimension else [_fact_ddl(table)]


def _mapped_columns(table: DwdTable) -> list[sql.Composed]:
    cols = [sql.SQL("site_id bigint NOT NULL")]
    for c in table.columns:
        not_null = sql.SQL(" NOT NULL") if c.name in table.business_key else sql.SQL("")
        cols.append(sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql_type(c.sql_type), not_null))
    return cols


def _dimension_ddl(table: DwdTable) -> list[sql.Composed]:
    name = table.name
    keys = names(table.key)
    cols = [sql.SQL("{} bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY").format(sql.Identifier(table.surrogate_key))]
    cols += _mapped_columns(table)
    cols += [
        sql.SQL("change_hash text NOT NULL"),
        sql.SQL("version_no integer NOT NULL"),
        sql.SQL("valid_from timestamptz NOT NULL"),
        sql.SQL("valid_to timestamptz NOT NULL"),
        sql.SQL("is_current boolean NOT NULL"),
        sql.SQL("run_id text"),
        sql.SQL("loaded_at timestamptz"),
        sql.SQL("CONSTRAINT {} UNIQUE ({}, valid_from)").format(
            sql.Identifier(f"{name}_bk_valid_from_uq"), keys),
        sql.SQL("CONSTRAINT {} UNIQUE ({}, version_no)").format(
            sql.Identifier(f"{name}_bk_version_uq"), keys),
        sql.SQL("CONSTRAINT {} CHECK (valid_from < valid_to)").format(sql.Identifier(f"{name}_valid_range_ck")),
        # §4.3 rule 1: is_current exactly when valid_to is the open end. DDL cannot take bind parameters, so
        # this code constant (not mapping data) is quoted by psycopg as a literal.
        sql.SQL("CONSTRAINT {} CHECK (is_current = (valid_to = {}))").format(
            sql.Identifier(f"{name}_current_ck"), sql.Literal(OPEN_END)),
    ]
    return [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(target_ident(table), sql.SQL(", ").join(cols)),
        sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({}) WHERE is_current").format(
            sql.Identifier(f"{name}_current_uq"), target_ident(table), keys),
    ]


def _fact_ddl(table: DwdTable) -> sql.Composed:
    cols = _mapped_columns(table) + [
        sql.SQL("is_deleted boolean NOT NULL"),
        sql.SQL("src_content_hash text NOT NULL"),
        sql.SQL("src_fetched_at timestamptz"),
        sql.SQL("run_id text"),
        sql.SQL("loaded_at timestamptz"),
        sql.SQL("PRIMARY KEY ({})").format(names(table.key)),
    ]
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(target_ident(table), sql.SQL(", ").join(cols))


def _check_columns(conn: psycopg.Connection, table: DwdTable) -> None:
    present = {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (table.schema, table.name),
    )}
    missing = [c for c in ("site_id", *table.column_names) if c not in present]
    if missing:
        raise DwdSchemaError(
            f"{table.target} exists but lacks mapped column(s) {', '.join(missing)}; "
            "migrate it (ensure_dwd_tables never alters existing tables)"
        )
