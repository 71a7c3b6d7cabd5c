"""SCD Type 2 merge of one dimension (warehouse-model §4.2), set-based, in one transaction.

The merge is a handful of set-based statements over the staged source (``staging.stage_source``): update
type-1 columns in place, close the current rows that changed, were deleted or disappeared, then insert the
new versions. It compares each key with its *current* row only, takes a per-table advisory lock so two
merges of one dimension never overlap, and refuses a ``now`` that is not after every existing ``valid_from``.

It must never loop over rows in Python, touch a closed row (§4.3 rule 7), or commit part of a merge: any
error rolls the whole dimension back.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.mapping import DwdTable
from feiqiu_etl.tasks.dwd.schema import OPEN_END
from feiqiu_etl.tasks.dwd.staging import STAGE, LoadCounts, stage_source, table_lock


class MergeTimeError(ValueError):
    """``now`` is not after the latest ``valid_from`` of the dimension (warehouse-model §4.2)."""


def _ident(table: DwdTable) -> sql.Identifier:
    return sql.Identifier(table.schema, table.name)


def _same_key(table: DwdTable, left: str, right: str) -> sql.Composed:
    """``l.site_id = r.site_id AND l.bk = r.bk …`` (composite keys compared column by column)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier(left, k), sql.Identifier(right, k))
        for k in ("site_id", *table.business_key)
    )


def check_now(conn: psycopg.Connection, table: DwdTable, now: datetime) -> None:
    """Raise :class:`MergeTimeError` unless ``now`` is after every ``valid_from`` in the dimension."""
    latest = conn.execute(sql.SQL("SELECT max(valid_from) FROM {}").format(_ident(table))).fetchone()[0]
    if latest is not None and now <= latest:
        shown_now, shown_latest = (t.astimezone(OPEN_END.tzinfo).isoformat() for t in (now, latest))
        raise MergeTimeError(
            f"{table.target}: now {shown_now} is not after the latest valid_from {shown_latest}; "
            "every DWD run needs a later now (warehouse-model §4.2)"
        )


def _update_type1(conn: psycopg.Connection, table: DwdTable, run_id: str) -> int:
    """Overwrite differing type-1 columns on current rows whose tracked hash is unchanged."""
    if not table.type1:
        return 0
    sets = sql.SQL(", ").join(sql.SQL("{} = s.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in table.type1)
    old = sql.SQL(", ").join(sql.Identifier("d", c) for c in table.type1)
    new = sql.SQL(", ").join(sql.Identifier("s", c) for c in table.type1)
    stmt = sql.SQL(
        "UPDATE {} d SET {}, run_id = %s, loaded_at = now() FROM {} s"
        " WHERE d.is_current AND {} AND NOT s.is_deleted AND d.change_hash = s.change_hash"
        " AND ROW({}) IS DISTINCT FROM ROW({})"
    ).format(_ident(table), sets, STAGE, _same_key(table, "d", "s"), old, new)
    return conn.execute(stmt, (run_id,)).rowcount


def _close(conn: psycopg.Connection, table: DwdTable, now: datetime) -> int:
    """Close every current row without a live source row of the same hash (changed, deleted or absent)."""
    stmt = sql.SQL(
        "UPDATE {} d SET valid_to = %s, is_current = false WHERE d.is_current AND NOT EXISTS"
        " (SELECT 1 FROM {} s WHERE {} AND NOT s.is_deleted AND s.change_hash = d.change_hash)"
    ).format(_ident(table), STAGE, _same_key(table, "s", "d"))
    return conn.execute(stmt, (now,)).rowcount


def _insert_versions(conn: psycopg.Connection, table: DwdTable, now: datetime, run_id: str) -> int:
    """Insert a version for every live source key without a current row; ``version_no`` = previous max + 1."""
    mapped = ["site_id", *table.column_names]
    target_cols = sql.SQL(", ").join(sql.Identifier(c) for c in (*mapped, "change_hash", "version_no",
                                                                  "valid_from", "valid_to", "is_current",
                                                                  "run_id", "loaded_at"))
    src_cols = sql.SQL(", ").join(sql.Identifier("s", c) for c in (*mapped, "change_hash"))
    order = sql.SQL(", ").join(sql.Identifier("s", k) for k in ("site_id", *table.business_key))
    stmt = sql.SQL(
        "INSERT INTO {t} ({cols}) SELECT {src},"
        " COALESCE((SELECT max(v.version_no) FROM {t} v WHERE {vkey}), 0) + 1, %s, %s, true, %s, now()"
        " FROM {stage} s WHERE NOT s.is_deleted"
        " AND NOT EXISTS (SELECT 1 FROM {t} d WHERE d.is_current AND {dkey})"
        " ORDER BY {order}"
    ).format(t=_ident(table), cols=target_cols, src=src_cols, vkey=_same_key(table, "v", "s"),
             stage=STAGE, dkey=_same_key(table, "d", "s"), order=order)
    return conn.execute(stmt, (now, OPEN_END, run_id)).rowcount


def merge_dim_scd2(conn: psycopg.Connection, table: DwdTable, *, now: datetime, run_id: str) -> LoadCounts:
    """Merge the whole ODS source of dimension ``table`` into ``dwd.<dim>`` (warehouse-model §4.2).

    ``now`` (timezone-aware) is the run's single timestamp and must be after every existing ``valid_from``,
    else :class:`MergeTimeError`. Runs in its own transaction (a savepoint if one is open) and holds the
    table's advisory lock. Returns :class:`LoadCounts`: ``inserted`` versions, ``updated`` current rows whose
    type-1 columns were overwritten, ``closed`` versions. Cast errors propagate as ``psycopg.Error``.
    """
    if not table.is_dimension:
        raise ValueError(f"{table.target} is a fact, not a dimension")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    with conn.transaction():
        table_lock(conn, table)
        check_now(conn, table, now)
        stage_source(conn, table)
        updated = _update_type1(conn, table, run_id)
        closed = _close(conn, table, now)
        inserted = _insert_versions(conn, table, now, run_id)
    return LoadCounts(inserted=inserted, updated=updated, closed=closed)


#: The name used by the design document (spec §3.7).
_merge_dim_scd2 = merge_dim_scd2
