"""Soft deletes of the ODS write path (warehouse-model §2.3), in the caller's transaction: the live rows an
answer known to be complete did not show (:func:`soft_delete_missing`: a snapshot's rows of a store, or one
parent's detail rows), the parents' details that rows soft-deleted make due (:func:`owe_for_deleted`, a task's
``owes_details``), and a complete snapshot's record as the task's freshness (:func:`record_snapshot_done`).
Whether a snapshot may delete at all is the deletion guard's to decide (:mod:`feiqiu_etl.tasks.ods.deletions`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.tasks.ods.rows import TableLayout
from feiqiu_etl.tasks.ods.upsert_sql import owe_sql


def soft_delete_missing(conn: psycopg.Connection, layout: TableLayout, site_id: int, seen: list[tuple],
                        deleted_at: datetime, parent: tuple[str, Any] | None = None) -> int:
    """``is_deleted = true`` (stamped ``deleted_at``) for live rows of the site (and of ``parent``: ``(column,
    value)``) whose key is not in ``seen``; returns how many. Composite keys are compared column by column
    (ENGINE-NOTES)."""
    schema, name = split_table(layout.table)
    keys = layout.keys
    arrays = [[k[i] for k in seen] for i in range(len(keys))]
    unnest = sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(k.sql_type)) for k in keys)
    alias = sql.SQL(", ").join(map(sql.Identifier, (k.column for k in keys)))
    match = sql.SQL(" AND ").join(
        sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(k.column)) for k in keys)
    scope = sql.SQL("")
    params: list[Any] = [deleted_at, site_id]
    if parent is not None:
        scope = sql.SQL(" AND t.{} = %s").format(sql.Identifier(parent[0]))
        params.append(parent[1])
    query = sql.SQL(
        "WITH u AS (UPDATE {t} AS t SET is_deleted = true, deleted_at = %s "
        "WHERE t.site_id = %s{scope} AND NOT t.is_deleted "
        "AND NOT EXISTS (SELECT 1 FROM unnest({unnest}) AS s({alias}) WHERE {match}) RETURNING 1) "
        "SELECT count(*) FROM u"  # a count that also reads back in pipeline mode (rowcount does not)
    ).format(t=sql.Identifier(schema, name), scope=scope, unnest=unnest, alias=alias, match=match)
    with conn.cursor() as cur:
        cur.execute(query, (*params, *arrays))
        return cur.fetchone()[0]


def owe_for_deleted(conn: psycopg.Connection, spec: OdsTaskSpec, connector: str, site_id: int,
                    deleted_at: datetime) -> None:
    """The parents' details that rows of task ``spec`` soft-deleted at ``deleted_at`` make due
    (``etl_meta.detail_pending``, one INSERT per ``owes_details`` rule)."""
    schema, name = split_table(spec.table)
    for rule in spec.owes_details:
        conn.execute(owe_sql(connector, rule, sql.SQL(
            "SELECT DISTINCT d.site_id, d.payload ->> {f} AS k FROM {t} d WHERE d.site_id = %s AND d.is_deleted "
            "AND d.deleted_at = %s").format(f=sql.Literal(rule.parent_field), t=sql.Identifier(schema, name))),
            (site_id, deleted_at))


def record_snapshot_done(conn: psycopg.Connection, connector: str, task_code: str, site_id: int,
                         complete_at: datetime, run_id: str) -> None:
    """``etl_meta.snapshot_done``: the store's snapshot of the task was complete at ``complete_at`` (its
    freshness), in run ``run_id``."""
    conn.execute(
        "INSERT INTO etl_meta.snapshot_done (connector, task_code, site_id, completed_at, run_id) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id) DO UPDATE SET "
        "completed_at = EXCLUDED.completed_at, run_id = EXCLUDED.run_id",
        (connector, task_code, site_id, complete_at, run_id))
