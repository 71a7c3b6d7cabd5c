"""Idempotent DDL: schemas ``ods``, ``dwd``, ``etl_meta`` and the ODS tables of a connector.

ODS tables follow warehouse-model.md §2.2/§2.4 exactly; their names and key columns come from the
connector's task specs and are always composed with ``psycopg.sql.Identifier`` (never pasted).
``etl_meta`` holds run bookkeeping: runs, completed window segments and the earliest start ever planned
incrementally (together: resume from the gaps) and detail requests still owed (retried on the next run).
"""

from __future__ import annotations

from typing import Iterable

import psycopg
from psycopg import sql

from feiqiu_etl.connector.spec import KeyColumn, OdsTaskSpec, split_table

SCHEMAS = ("ods", "dwd", "etl_meta")

_META_DDL = """
CREATE TABLE IF NOT EXISTS etl_meta.run (
    run_id      text PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    status      text NOT NULL,
    summary     jsonb
);
CREATE TABLE IF NOT EXISTS etl_meta.window_progress (
    connector    text NOT NULL,
    task_code    text NOT NULL,
    site_id      bigint NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    run_id       text NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, task_code, site_id, window_start, window_end),
    CHECK (window_start < window_end)
);
CREATE TABLE IF NOT EXISTS etl_meta.window_horizon (
    connector     text NOT NULL,
    task_code     text NOT NULL,
    site_id       bigint NOT NULL,
    horizon_start timestamptz NOT NULL,
    PRIMARY KEY (connector, task_code, site_id)
);
CREATE TABLE IF NOT EXISTS etl_meta.detail_pending (
    connector   text NOT NULL,
    task_code   text NOT NULL,
    site_id     bigint NOT NULL,
    parent_key  text NOT NULL,
    record      jsonb NOT NULL,
    last_error  text,
    attempts    integer NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, task_code, site_id, parent_key)
);
"""


def ensure_schemas(conn: psycopg.Connection) -> None:
    """CREATE SCHEMA IF NOT EXISTS for ods, dwd, etl_meta plus the etl_meta tables. Commits."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('feiqiu_etl.ddl'))")
        for schema in SCHEMAS:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(_META_DDL)


def ensure_ods_tables(conn: psycopg.Connection, specs: Iterable[OdsTaskSpec]) -> None:
    """Create every ODS table (list and detail) of ``specs`` if missing (warehouse-model §2.2). Commits."""
    ensure_schemas(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('feiqiu_etl.ddl'))")
        for spec in specs:
            window = (spec.window_column,) if spec.window_column else ()
            conn.execute(ods_table_ddl(spec.table, spec.keys, window_columns=window))
            if spec.detail:
                d = spec.detail
                extra = () if d.parent_is_key else (d.parent,)
                conn.execute(ods_table_ddl(d.target_table, d.keys, extra_columns=extra))
                if not d.parent_is_key:
                    schema, name = split_table(d.target_table)
                    conn.execute(
                        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (site_id, {})").format(
                            sql.Identifier(f"{name}_parent_idx"),
                            sql.Identifier(schema, name),
                            sql.Identifier(d.parent.column),
                        )
                    )


def ods_table_ddl(
    table: str,
    keys: Iterable[KeyColumn],
    *,
    window_columns: Iterable[str] = (),
    extra_columns: Iterable[KeyColumn] = (),
) -> sql.Composed:
    """``CREATE TABLE IF NOT EXISTS`` for one ODS table with the §2.2 column set."""
    keys = tuple(keys)
    schema, name = split_table(table)
    cols: list[sql.Composable] = [sql.SQL("site_id bigint NOT NULL")]
    for k in keys:
        cols.append(sql.SQL("{} {} NOT NULL").format(sql.Identifier(k.column), sql.SQL(k.sql_type)))
    for k in extra_columns:
        cols.append(sql.SQL("{} {} NOT NULL").format(sql.Identifier(k.column), sql.SQL(k.sql_type)))
    for w in window_columns:
        cols.append(sql.SQL("{} timestamptz").format(sql.Identifier(w)))
    cols += [
        sql.SQL("payload jsonb NOT NULL"),
        sql.SQL("content_hash text NOT NULL"),
        sql.SQL("fetched_at timestamptz NOT NULL"),
        sql.SQL("run_id text NOT NULL"),
        sql.SQL("is_deleted boolean NOT NULL DEFAULT false"),
        sql.SQL("deleted_at timestamptz"),
    ]
    pk = sql.SQL(", ").join([sql.Identifier("site_id")] + [sql.Identifier(k.column) for k in keys])
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
        sql.Identifier(schema, name), sql.SQL(", ").join(cols), pk
    )
