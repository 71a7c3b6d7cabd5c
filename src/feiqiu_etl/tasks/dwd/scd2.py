"""SCD Type 2 merge of one dimension (warehouse-model §4.2), set-based, in one transaction.

The merge is a handful of set-based statements over the staged source (``staging.stage_source``): one
pass classifies every key against its current row (``_classify``), then three statements apply the result:
update type-1 columns in place, close the current rows that changed, were deleted or disappeared, and insert
the new versions. It compares each key with its *current* row only, takes a per-table advisory lock so two
merges of one dimension never overlap, and refuses a ``now`` that is not after every existing ``valid_from``.

An *incremental* merge (``incremental=True``, what ``DwdLoadTask`` runs unless ``--dwd-full``) stages only
the ODS rows changed after the dimension's watermark (``tasks/dwd/watermark.py``) and compares only the keys
staged; keys it did not stage are left alone. It falls back to the full compare when there is no usable
watermark (first merge, a source whose business keys are not its ODS keys, a dimension emptied since) and
writes the new watermark in the same transaction. Both give the same table (tests/properties).

It must never loop over rows in Python, touch a closed row (§4.3 rule 7), or commit part of a merge: any
error rolls the whole dimension back.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.casts import names, same_key, source_ident, target_ident
from feiqiu_etl.connector.dwd_mapping import DwdTable
from feiqiu_etl.tasks.dwd.schema import OPEN_END
from feiqiu_etl.tasks.dwd.staging import MARK, STAGE, LoadCounts, ods_key_columns, stage_source, table_lock
from feiqiu_etl.tasks.dwd.watermark import (
    max_surrogate_key, next_mark, read_dim_watermark, write_dim_watermark,
)


_DIFF = sql.Identifier("pg_temp", "dwd_diff")


class MergeTimeError(ValueError):
    """``now`` is not after the latest ``valid_from`` of the dimension (warehouse-model §4.2)."""


def check_now(conn: psycopg.Connection, table: DwdTable, now: datetime) -> None:
    """Raise :class:`MergeTimeError` unless ``now`` is after every ``valid_from`` in the dimension.

    Every merge's ``now`` is after every earlier ``valid_from`` (this check), so ``valid_from`` grows with the
    surrogate key and the newest version (largest ``<dim>_sk``, one primary-key probe) holds the latest one."""
    row = conn.execute(sql.SQL("SELECT valid_from FROM {} ORDER BY {} DESC LIMIT 1").format(
        target_ident(table), sql.Identifier(table.surrogate_key))).fetchone()
    latest = row[0] if row else None
    if latest is not None and now <= latest:
        shown_now, shown_latest = (t.astimezone(OPEN_END.tzinfo).isoformat() for t in (now, latest))
        raise MergeTimeError(
            f"{table.target}: now {shown_now} is not after the latest valid_from {shown_latest}; "
            "every DWD run needs a later now (warehouse-model §4.2)"
        )


def _classify(conn: psycopg.Connection, table: DwdTable, *, staged_keys_only: bool = False) -> None:
    """One pass comparing every current row with its live source row (warehouse-model §4.2).

    Fills ``pg_temp.dwd_diff`` with the keys that need work, their ``action`` and the source row:
    ``close`` (deleted or absent from S), ``insert`` (no current row), ``replace`` (tracked hash changed:
    close and insert) or ``type1`` (same hash, type-1 columns differ). Unchanged keys are left out.
    ``staged_keys_only`` (incremental merge): only the current rows of keys in the stage are compared (a key
    the stage does not hold is unchanged, not absent).
    """
    sk = sql.Identifier(table.surrogate_key)
    type1_differs = sql.SQL("false")
    if table.type1:
        type1_differs = sql.SQL("ROW({}) IS DISTINCT FROM ROW({})").format(
            names(table.type1, "d"), names(table.type1, "s"))
    key = same_key(table, "d", "s")
    if staged_keys_only:
        # Driven by the (few) staged keys, each probing the current-row index. A staged key whose ODS rows are
        # all deleted closes its current row; the stage holds every key that needs work.
        gone, close = sql.SQL("s.is_deleted"), sql.SQL("CASE WHEN d.{} IS NOT NULL THEN 'close' END").format(sk)
        source = sql.SQL("{stage} s LEFT JOIN {t} d ON {key} AND d.is_current").format(
            stage=STAGE, t=target_ident(table), key=key)
    else:
        gone, close = sql.SQL("s.site_id IS NULL"), sql.SQL("'close'")
        source = sql.SQL("(SELECT * FROM {t} WHERE is_current) d FULL JOIN (SELECT * FROM {stage} WHERE NOT is_deleted) s"
                         " ON {key}").format(t=target_ident(table), stage=STAGE, key=key)
    stmt = sql.SQL(
        "CREATE TEMP TABLE dwd_diff ON COMMIT DROP AS SELECT * FROM ("
        " SELECT d.{sk} AS cur_sk, d.version_no AS cur_version,"
        " CASE WHEN {gone} THEN {close} WHEN d.{sk} IS NULL THEN 'insert'"
        " WHEN d.change_hash <> s.change_hash THEN 'replace' WHEN {t1} THEN 'type1' END AS action, s.*"
        " FROM {source}) x WHERE action IS NOT NULL"
    ).format(sk=sk, gone=gone, close=close, t1=type1_differs, source=source)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_DIFF))
    conn.execute(stmt)
    conn.execute(sql.SQL("ANALYZE {}").format(_DIFF))


def _update_type1(conn: psycopg.Connection, table: DwdTable, run_id: str) -> int:
    """Overwrite the type-1 columns of the current rows classified ``type1``."""
    if not table.type1:
        return 0
    sets = sql.SQL(", ").join(sql.SQL("{} = x.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in table.type1)
    stmt = sql.SQL(
        "UPDATE {} d SET {}, run_id = %s, loaded_at = now() FROM {} x WHERE d.{} = x.cur_sk AND x.action = 'type1'"
    ).format(target_ident(table), sets, _DIFF, sql.Identifier(table.surrogate_key))
    return conn.execute(stmt, (run_id,)).rowcount


def _close(conn: psycopg.Connection, table: DwdTable, now: datetime) -> int:
    """Close the current rows classified ``close`` or ``replace``: ``valid_to = now``, ``is_current = false``."""
    stmt = sql.SQL(
        "UPDATE {} d SET valid_to = %s, is_current = false FROM {} x"
        " WHERE d.{} = x.cur_sk AND x.action IN ('close', 'replace')"
    ).format(target_ident(table), _DIFF, sql.Identifier(table.surrogate_key))
    return conn.execute(stmt, (now,)).rowcount


def _insert_versions(conn: psycopg.Connection, table: DwdTable, now: datetime, run_id: str) -> int:
    """Insert the versions classified ``insert`` or ``replace``; ``version_no`` = previous max + 1 (or 1).

    A ``replace`` continues from the version it closes; an ``insert`` (new or revived key) looks the
    previous maximum up, so a revived key keeps counting (§4.3 rule 5).
    """
    mapped = ("site_id", *table.column_names, "change_hash")
    target_cols = names((*mapped, "version_no", "valid_from", "valid_to", "is_current", "run_id", "loaded_at"))
    stmt = sql.SQL(
        "INSERT INTO {t} ({cols}) SELECT {src},"
        " COALESCE(x.cur_version, (SELECT max(v.version_no) FROM {t} v WHERE {vkey}), 0) + 1,"
        " %s, %s, true, %s, now()"
        " FROM {diff} x WHERE x.action IN ('insert', 'replace') ORDER BY {order}"
    ).format(t=target_ident(table), cols=target_cols, src=names(mapped, "x"), vkey=same_key(table, "v", "x"),
             diff=_DIFF, order=names(table.key, "x"))
    return conn.execute(stmt, (now, OPEN_END, run_id)).rowcount


def merge_dim_scd2(conn: psycopg.Connection, table: DwdTable, *, now: datetime, run_id: str,
                   incremental: bool = False) -> LoadCounts:
    """Merge the ODS source of dimension ``table`` into ``dwd.<dim>`` (warehouse-model §4.2).

    ``now`` (timezone-aware) is the run's single timestamp and must be after every existing ``valid_from``,
    else :class:`MergeTimeError`. ``incremental`` reads only the ODS rows changed since the last merge when
    its watermark allows (see the module doc), else the whole source; either way the watermark is updated.
    Runs in its own transaction (a savepoint if one is open) and holds the table's advisory lock. Returns
    :class:`LoadCounts`: ``inserted`` versions, ``updated`` current rows whose type-1 columns were overwritten,
    ``closed`` versions. Cast errors propagate as ``psycopg.Error``.
    """
    if not table.is_dimension:
        raise ValueError(f"{table.target} is a fact, not a dimension")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    with conn.transaction():
        table_lock(conn, table)
        check_now(conn, table, now)
        # The temp tables' statistics only steer joins on keys: a small sample is enough (ANALYZE of a
        # 100k-row stage at the default target took longer than casting it).
        conn.execute("SET LOCAL default_statistics_target = 10")
        conn.execute("SET LOCAL work_mem = '64MB'")  # sorts and hashes of the changed rows stay in memory
        # A few changed keys in a big dimension: probe its indexes instead of scanning it (the default cost 4
        # of a random page made a 1 M-row seq scan look cheaper than 10k cached index probes; it took 10x).
        conn.execute("SET LOCAL random_page_cost = 1.1")
        ods_keys = ods_key_columns(conn, table)
        previous = read_dim_watermark(conn, table)
        partial = (incremental and previous is not None and previous.key_aligned
                   and previous.max_sk == max_surrogate_key(conn, table))
        if partial:
            since = next_mark(previous.watermark)
            staged = stage_source(conn, table, since=since)
            # Still exact only if every changed row is key-aligned and none shares its key with another.
            partial = _aligned(conn, table, ods_keys) and staged == _count_source(conn, table, since)
        if partial:
            aligned = True  # aligned before, and every changed row still is
        else:
            staged = stage_source(conn, table)
            aligned = _aligned(conn, table, ods_keys) and staged == _count_source(conn, table)
        if partial:  # the changed keys probe the dimension's indexes (its statistics may lag far behind: the
            # planner hashed all 1 M current rows to join 10k staged keys, 10x slower than probing)
            for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin", "enable_bitmapscan"):
                conn.execute(sql.SQL("SET LOCAL {} = off").format(sql.Identifier(setting)))
        _classify(conn, table, staged_keys_only=partial)
        updated = _update_type1(conn, table, run_id)
        closed = _close(conn, table, now)
        inserted = _insert_versions(conn, table, now, run_id)
        staged_max = conn.execute(sql.SQL("SELECT max(mark) FROM {}").format(STAGE)).fetchone()[0]
        write_dim_watermark(conn, table, staged_max=staged_max,
                            previous=previous.watermark if previous is not None and partial else None,
                            key_aligned=aligned, run_id=run_id)
    return LoadCounts(inserted=inserted, updated=updated, closed=closed)


def _aligned(conn: psycopg.Connection, table: DwdTable, ods_keys: list[str]) -> bool:
    """True when every staged row's business key equals its ODS key, column by column (as text)."""
    if len(ods_keys) != len(table.business_key):
        return False
    same = sql.SQL(" AND ").join(
        sql.SQL("c.{}::text IS NOT DISTINCT FROM c.{}::text").format(sql.Identifier(b), sql.Identifier(f"_k{i}"))
        for i, b in enumerate(table.business_key))
    row = conn.execute(sql.SQL("SELECT bool_and({}) FROM {} c").format(same, STAGE)).fetchone()
    return row[0] is not False


def _count_source(conn: psycopg.Connection, table: DwdTable, since: datetime | None = None) -> int:
    """ODS rows of the source, all or those changed at or after ``since`` (``staging.MARK``)."""
    query = sql.SQL("SELECT count(*) FROM {} o").format(source_ident(table))
    if since is None:
        return conn.execute(query).fetchone()[0]
    return conn.execute(query + sql.SQL(" WHERE {} >= %s").format(MARK), (since,)).fetchone()[0]


#: The name used by the design document (spec §3.7).
_merge_dim_scd2 = merge_dim_scd2
