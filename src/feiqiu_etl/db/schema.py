"""Idempotent DDL: schemas ``ods``, ``dwd``, ``etl_meta`` and the ODS tables of a connector.

ODS tables follow warehouse-model.md §2.2/§2.4 exactly; their names and key columns come from the
connector's task specs and are always composed with ``psycopg.sql.Identifier`` (never pasted).
``etl_meta`` holds run bookkeeping: runs (and the alerts sent about them; ``pruned_at`` is when retention
removed a run's stored log and request timeline, :mod:`feiqiu_etl.registry.retention`), completed window segments and the
earliest start ever planned incrementally (together: resume from the holes), detail requests still owed
(retried on the next run) and who reset which of that bookkeeping when (``state_reset``: ``feiqiu-etl state
reset``, :mod:`feiqiu_etl.registry.state`), every listing's reconciliation against its total
(``listing_reconcile``, issue 25: :mod:`feiqiu_etl.tasks.ods.reconcile`), the soft deletions a snapshot
held back until they are confirmed (``deletion_hold``, issue 25: :mod:`feiqiu_etl.tasks.ods.deletions`) and each
store's measured size (``store_size``: page 1's ``total`` per task, ``feiqiu-etl check``,
:mod:`feiqiu_etl.registry.sizes`).
"""

from __future__ import annotations

import hashlib
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

_RUN_DDL = """
ALTER TABLE etl_meta.run
    ADD COLUMN IF NOT EXISTS command text,
    ADD COLUMN IF NOT EXISTS args jsonb,
    ADD COLUMN IF NOT EXISTS config jsonb,
    ADD COLUMN IF NOT EXISTS host text,
    ADD COLUMN IF NOT EXISTS pid integer,
    ADD COLUMN IF NOT EXISTS process_started double precision,
    ADD COLUMN IF NOT EXISTS version text,
    ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz,
    ADD COLUMN IF NOT EXISTS exit_code integer,
    ADD COLUMN IF NOT EXISTS error text,
    ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz,
    ADD COLUMN IF NOT EXISTS cancel_requested_by text,
    ADD COLUMN IF NOT EXISTS live jsonb,
    ADD COLUMN IF NOT EXISTS lanes text[],
    ADD COLUMN IF NOT EXISTS stores bigint[],
    ADD COLUMN IF NOT EXISTS tasks text[],
    ADD COLUMN IF NOT EXISTS rows_written bigint,
    ADD COLUMN IF NOT EXISTS requests integer,
    ADD COLUMN IF NOT EXISTS rejections integer,
    ADD COLUMN IF NOT EXISTS errors integer,
    ADD COLUMN IF NOT EXISTS pruned_at timestamptz,
    ADD COLUMN IF NOT EXISTS recorded_late_at timestamptz;
"""
_RUN_TABLES = """
CREATE INDEX IF NOT EXISTS run_started_idx ON etl_meta.run (started_at DESC);
CREATE INDEX IF NOT EXISTS run_running_idx ON etl_meta.run (status) WHERE status = 'RUNNING';
CREATE TABLE IF NOT EXISTS etl_meta.run_log (
    run_id   text NOT NULL,
    seq      bigint GENERATED ALWAYS AS IDENTITY,
    ts       timestamptz NOT NULL,
    level    text NOT NULL,
    lane     text,
    site_id  bigint,
    task     text,
    message  text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS etl_meta.run_request (
    run_id     text NOT NULL,
    lane       text NOT NULL,
    seq        integer NOT NULL,
    site_id    bigint,
    task       text,
    request    text,
    gap_class  text,
    started_at timestamptz NOT NULL,
    seconds    double precision NOT NULL,
    gap        double precision,
    wait_reason text,
    outcome    text NOT NULL,
    detail     text,
    PRIMARY KEY (run_id, lane, seq)
);
CREATE TABLE IF NOT EXISTS etl_meta.detail_checked (
    connector   text NOT NULL,
    task_code   text NOT NULL,
    site_id     bigint NOT NULL,
    parent_key  text NOT NULL,
    checked_at  timestamptz NOT NULL,
    run_id      text NOT NULL,
    PRIMARY KEY (connector, task_code, site_id, parent_key)
);
CREATE INDEX IF NOT EXISTS detail_checked_oldest ON etl_meta.detail_checked (connector, task_code, site_id, checked_at);
CREATE TABLE IF NOT EXISTS etl_meta.snapshot_done (
    connector    text NOT NULL,
    task_code    text NOT NULL,
    site_id      bigint NOT NULL,
    completed_at timestamptz NOT NULL,
    run_id       text NOT NULL,
    PRIMARY KEY (connector, task_code, site_id)
);
CREATE TABLE IF NOT EXISTS etl_meta.alert (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reason     text NOT NULL,
    subject    text NOT NULL,
    target     text NOT NULL,
    run_id     text,
    message_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz,
    ok         boolean,
    error      text,
    latency_s  double precision,
    attempts   integer,
    UNIQUE (reason, subject, target)
);
CREATE INDEX IF NOT EXISTS alert_run_idx ON etl_meta.alert (run_id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS etl_meta.state_reset (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reset_at   timestamptz NOT NULL DEFAULT now(),
    os_user    text NOT NULL,
    host       text NOT NULL,
    connector  text NOT NULL,
    site_id    bigint NOT NULL,
    task_code  text NOT NULL,
    range_start timestamptz,
    range_end  timestamptz,
    dwd        boolean NOT NULL,
    forgot     jsonb NOT NULL
);
CREATE TABLE IF NOT EXISTS etl_meta.listing_reconcile (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           text NOT NULL,
    connector        text NOT NULL,
    site_id          bigint NOT NULL,
    task_code        text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('window', 'snapshot')),
    window_start     timestamptz,
    window_end       timestamptz,
    first_total      bigint,
    totals_moved     bigint[] NOT NULL DEFAULT '{}',
    pages            integer NOT NULL,
    rows_received    bigint NOT NULL,
    distinct_keys    bigint NOT NULL,
    listings         integer NOT NULL,
    expected_rows    double precision,
    ods_inserted     bigint NOT NULL,
    ods_updated      bigint NOT NULL,
    ods_unchanged    bigint NOT NULL,
    ods_soft_deleted bigint NOT NULL,
    verdict          text NOT NULL,
    reason           text,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS listing_reconcile_run_idx ON etl_meta.listing_reconcile (run_id);
CREATE INDEX IF NOT EXISTS listing_reconcile_not_ok_idx ON etl_meta.listing_reconcile
    (connector, site_id, task_code, window_start) WHERE verdict <> 'ok';
CREATE TABLE IF NOT EXISTS etl_meta.lane_lock (
    lane_key    text PRIMARY KEY,
    run_id      text NOT NULL,
    lane        text,
    host        text,
    pid         integer,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS etl_meta.deletion_hold (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    connector      text NOT NULL,
    site_id        bigint NOT NULL,
    task_code      text NOT NULL,
    keys           jsonb NOT NULL,
    live_rows      bigint NOT NULL,
    empty_snapshot boolean NOT NULL,
    held_at        timestamptz NOT NULL DEFAULT now(),
    run_id         text NOT NULL,
    status         text NOT NULL DEFAULT 'held' CHECK (status IN ('held', 'confirmed', 'accepted', 'withdrawn')),
    decided_at     timestamptz,
    decided_run    text,
    decided_by     text,
    applied        bigint
);
CREATE UNIQUE INDEX IF NOT EXISTS deletion_hold_one_held ON etl_meta.deletion_hold (connector, site_id, task_code)
    WHERE status = 'held';
CREATE TABLE IF NOT EXISTS etl_meta.store_size (
    connector    text NOT NULL,
    site_id      bigint NOT NULL,
    task_code    text NOT NULL,
    total        bigint NOT NULL CHECK (total >= 0),
    window_start timestamptz,
    window_end   timestamptz,
    measured_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, site_id, task_code),
    CHECK (window_start IS NULL OR window_start < window_end)
);
"""


_REQUEST_DDL = """
ALTER TABLE etl_meta.run_request
    ADD COLUMN IF NOT EXISTS drawn double precision;
"""
"""Columns added to ``etl_meta.run_request`` (created by ``_RUN_TABLES``) since it was created."""

_DDL_HASH = hashlib.sha256((_META_DDL + _RUN_DDL + _RUN_TABLES + _REQUEST_DDL).encode()).hexdigest()[:16]
"""What the etl_meta DDL of this version is: recorded once applied, so that the next command skips it."""


def ensure_schemas(conn: psycopg.Connection) -> None:
    """CREATE SCHEMA IF NOT EXISTS for ods, dwd, etl_meta plus the etl_meta tables (migrating older ones in
    place: new columns are added, nothing is dropped). Commits. A database this DDL was applied to already
    (``etl_meta.schema_version`` holds its hash) costs one SELECT and no lock (issue 27: read-only commands)."""
    try:
        with conn.transaction():
            done = conn.execute("SELECT 1 FROM etl_meta.schema_version WHERE ddl_hash = %s", (_DDL_HASH,)).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        done = None
    if done:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('feiqiu_etl.ddl'))")
        for schema in SCHEMAS:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(_META_DDL)
        # ALTER TABLE locks the table: only when a column is missing (the newest column of each ALTER)
        if not _has_column(conn, "run", "recorded_late_at"):
            conn.execute(_RUN_DDL)
        conn.execute(_RUN_TABLES)
        if not _has_column(conn, "run_request", "drawn"):
            conn.execute(_REQUEST_DDL)
        conn.execute("CREATE TABLE IF NOT EXISTS etl_meta.schema_version (ddl_hash text PRIMARY KEY, "
                     "applied_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO etl_meta.schema_version (ddl_hash) VALUES (%s) ON CONFLICT DO NOTHING", (_DDL_HASH,))


def _has_column(conn: psycopg.Connection, table: str, column: str) -> bool:
    """Whether ``etl_meta.<table>`` has ``column``."""
    return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'etl_meta' AND table_name = %s "
                        "AND column_name = %s", (table, column)).fetchone() is not None


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
