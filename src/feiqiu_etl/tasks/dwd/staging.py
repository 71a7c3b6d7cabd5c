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

from feiqiu_etl.tasks.dwd import quarantine
from feiqiu_etl.tasks.dwd.casts import (
    INPUT_ERROR_FUNCTION, Fragment, cast_error_sql, cast_sql, json_text, names, param, same_key, source_ident,
    target_ident,
)
from feiqiu_etl.tasks.dwd.mapping import DwdTable

STAGE = sql.Identifier("pg_temp", "dwd_stage")
_STAGE_NAME = sql.Identifier("dwd_stage")

#: Servers from this version on check casts with ``pg_input_error_info``; older ones with a PL/pgSQL helper.
NATIVE_INPUT_CHECK = 160000

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


def _select_source(table: DwdTable, ods_keys: list[str], since: datetime | None) -> Fragment:
    """SELECT of the deduplicated, typed source rows, with the stage's column names."""
    casts = Fragment.join(", ", (Fragment.of("{} AS {}", cast_sql(c, sql.Identifier("o", "payload")),
                                             sql.Identifier(c.name)) for c in table.columns))
    key_aliases = [sql.Identifier(f"_k{i}") for i in range(len(ods_keys))]
    ods_key_sel = sql.SQL("").join(
        sql.SQL(", o.{} AS {}").format(sql.Identifier(k), a) for k, a in zip(ods_keys, key_aliases))
    where = Fragment.of(" WHERE {} >= {}", MARK, param(since)) if since is not None else Fragment(sql.SQL(""))
    inner = Fragment.of(
        "SELECT o.site_id, {}, o.is_deleted, o.content_hash, o.fetched_at, {} AS _mark{} FROM {} o{}",
        casts, MARK, ods_key_sel, source_ident(table), where,
    )
    bk = [sql.Identifier("c", k) for k in table.key]
    if table.is_dimension:
        extra = sql.SQL("{} AS change_hash").format(change_hash_sql(table))
    else:
        extra = sql.SQL("c.content_hash AS src_content_hash, c.fetched_at AS src_fetched_at, c._mark AS mark")
    order = sql.SQL(", ").join([*bk, sql.SQL("c.is_deleted"), sql.SQL("c.fetched_at DESC"),
                                *(sql.SQL("c.{} DESC").format(a) for a in key_aliases)])
    return Fragment.of(
        "SELECT DISTINCT ON ({}) c.site_id, {}, c.is_deleted, {} FROM ({}) c ORDER BY {}",
        sql.SQL(", ").join(bk), names(table.column_names, "c"), extra, inner, order,
    )


def stage_source(conn: psycopg.Connection, table: DwdTable, *, since: datetime | None = None) -> int:
    """Fill ``pg_temp.dwd_stage`` with the source of ``table``; return the number of source rows staged.

    ``since`` (facts only) keeps the ODS rows whose ``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))``
    is ``>= since`` (warehouse-model §5.1); dimensions always read the whole source (§4.2).

    A row that cannot be loaded — a payload that does not cast (``"abc"`` or ``"1e40"`` for money) or an
    empty business key — is left out and quarantined (:mod:`~feiqiu_etl.tasks.dwd.quarantine`) instead of
    failing the table: the fast statement runs first, in a savepoint; only if it fails with a
    ``psycopg.errors.DataError`` (or stages an empty key) is the source staged again row by row checked
    (:func:`_stage_checked`). For a dimension, a quarantined key keeps its current version: the stage gets a
    copy of it, so the merge sees that key unchanged.
    """
    ods_keys = ods_key_columns(conn, table)
    select = _select_source(table, ods_keys, since)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(STAGE))
    try:
        with conn.transaction():  # a savepoint: a failed cast leaves the transaction usable
            # CREATE TABLE AS (not INSERT … SELECT) lets PostgreSQL scan and cast the source with parallel workers.
            cur = conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS ").format(_STAGE_NAME) + select.sql,
                               select.params)
            count = cur.rowcount
            if _has_empty_key(conn, table):
                raise _EmptyKey
    except (psycopg.errors.DataError, _EmptyKey):
        count = _stage_checked(conn, table, ods_keys, since)
    else:
        quarantine.settle(conn, table, ods_keys, since, MARK)
    conn.execute(sql.SQL("ANALYZE {}").format(STAGE))
    return count


class _EmptyKey(Exception):
    """The fast stage holds a row with an empty business key (it would fail the load on NOT NULL)."""


def _has_empty_key(conn: psycopg.Connection, table: DwdTable) -> bool:
    empty = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in table.business_key)
    return conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {})").format(STAGE, empty)).fetchone()[0]


_ROWS = sql.Identifier("pg_temp", "dwd_rows")
_WINNERS = sql.Identifier("pg_temp", "dwd_winners")


def _checked_rows(table: DwdTable, ods_keys: list[str], since: datetime | None, native: bool) -> Fragment:
    """Per ODS row: the typed columns, or NULL where they do not cast, and the first failing column
    (``_err_col``), its payload text (``_err_val``) and PostgreSQL's message (``_err``). Business-key columns
    are checked first, so when a non-key column is the first failure the key columns are all valid."""
    payload = sql.Identifier("o", "payload")
    ordered = sorted(table.columns, key=lambda c: c.name not in table.business_key)
    checks = [(c, cast_error_sql(c, payload, native=native)) for c in ordered]
    checks = [(c, err) for c, err in checks if err is not None]
    bk_names = [c.name for c in ordered if c.name in table.business_key]
    if checks:
        values = Fragment.join(", ", (Fragment.of("({}::int, {}::text, {}, {})", param(i), param(c.name),
                                                  json_text(c.path, payload), err)
                                      for i, (c, err) in enumerate(checks)))
        first_error = Fragment.of(
            "LEFT JOIN LATERAL (SELECT e.c AS _err_col, e.v AS _err_val, e.m AS _err FROM (VALUES {}) e(n, c, v, m)"
            " WHERE e.m IS NOT NULL ORDER BY e.n LIMIT 1) x ON true", values)
    else:
        first_error = Fragment(sql.SQL("LEFT JOIN LATERAL (SELECT NULL::text AS _err_col, NULL::text AS _err_val,"
                                       " NULL::text AS _err) x ON true"))
    failing = {c.name for c, _ in checks}

    def guarded(c) -> Fragment:
        expr = cast_sql(c, payload)
        if c.name not in failing:
            return expr
        if c.name in table.business_key:  # valid unless a key column is the first failure
            return Fragment.of("CASE WHEN x._err_col IS NULL OR NOT x._err_col = ANY({}) THEN {} END",
                               param(bk_names), expr)
        return Fragment.of("CASE WHEN x._err_col IS NULL THEN {} END", expr)

    casts = Fragment.join(", ", (Fragment.of("{} AS {}", guarded(c), sql.Identifier(c.name)) for c in table.columns))
    keys = sql.SQL("").join(sql.SQL(", o.{} AS {}").format(sql.Identifier(k), sql.Identifier(f"_k{i}"))
                            for i, k in enumerate(ods_keys))
    where = Fragment.of(" WHERE {} >= {}", MARK, param(since)) if since is not None else Fragment(sql.SQL(""))
    return Fragment.of(
        "SELECT o.site_id, {}, o.is_deleted, o.content_hash, o.fetched_at, {} AS _mark{}, {} AS _source_key,"
        " x._err_col, x._err_val, x._err FROM {} o {}{}",
        casts, MARK, keys, quarantine.source_key_json(ods_keys), source_ident(table), first_error, where)


def _stage_checked(conn: psycopg.Connection, table: DwdTable, ods_keys: list[str], since: datetime | None) -> int:
    """Stage ``table`` without the rows that cannot be loaded, and quarantine those (the slow path).

    Rows whose business key does not cast or is empty cannot be matched to a key and are quarantined as they
    are; the others are deduplicated per key exactly as :func:`_select_source` does, and a winner that does
    not cast is quarantined (an older row of that key is never loaded in its place)."""
    native = conn.info.server_version >= NATIVE_INPUT_CHECK
    if not native:
        conn.execute(INPUT_ERROR_FUNCTION)
    for temp in (_ROWS, _WINNERS, STAGE):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(temp))
    rows = _checked_rows(table, ods_keys, since, native)
    conn.execute(sql.SQL("CREATE TEMP TABLE dwd_rows ON COMMIT DROP AS ") + rows.sql, rows.params)
    bk = [sql.Identifier("c", k) for k in table.key]
    bad_key = sql.SQL("(c._err_col = ANY(%s) OR {})").format(
        sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier("c", k)) for k in table.business_key))
    order = sql.SQL(", ").join([*bk, sql.SQL("c.is_deleted"), sql.SQL("c.fetched_at DESC"),
                                *(sql.SQL("c.{} DESC").format(sql.Identifier(f"_k{i}")) for i in range(len(ods_keys)))])
    conn.execute(sql.SQL("CREATE TEMP TABLE dwd_winners ON COMMIT DROP AS SELECT DISTINCT ON ({}) * FROM {} c"
                         " WHERE NOT COALESCE({}, false) ORDER BY {}").format(sql.SQL(", ").join(bk), _ROWS, bad_key,
                                                                              order),
                 (list(table.business_key),))
    extra = (sql.SQL("{} AS change_hash").format(change_hash_sql(table)) if table.is_dimension else
             sql.SQL("c.content_hash AS src_content_hash, c.fetched_at AS src_fetched_at, c._mark AS mark"))
    cur = conn.execute(sql.SQL("CREATE TEMP TABLE dwd_stage ON COMMIT DROP AS SELECT c.site_id, {}, c.is_deleted, {}"
                               " FROM {} c WHERE c._err_col IS NULL").format(
        names(table.column_names, "c"), extra, _WINNERS))
    count = cur.rowcount
    if table.is_dimension:
        _keep_current_versions(conn, table)
    empty_key = sql.SQL("CASE {} END").format(sql.SQL(" ").join(
        sql.SQL("WHEN c.{} IS NULL THEN {}").format(sql.Identifier(k), sql.Literal(k)) for k in table.business_key))
    found = Fragment(sql.SQL(
        "SELECT c._source_key AS source_key, COALESCE(c._err_col, {e}) AS column_name, c._err_val AS value,"
        " COALESCE(c._err, 'business key ' || {e} || ' is empty') AS reason, c.fetched_at AS source_fetched_at"
        " FROM {rows} c WHERE COALESCE({bad}, false)"
        " UNION ALL SELECT c._source_key, c._err_col, c._err_val, c._err, c.fetched_at FROM {winners} c"
        " WHERE c._err_col IS NOT NULL").format(e=empty_key, rows=_ROWS, bad=bad_key, winners=_WINNERS),
        (list(table.business_key),))
    quarantine.settle(conn, table, ods_keys, since, MARK, found)
    return count


def _keep_current_versions(conn: psycopg.Connection, table: DwdTable) -> None:
    """Stage a copy of the current version of every key whose winning source row is quarantined."""
    cols = ("site_id", *table.column_names)
    conn.execute(sql.SQL(
        "INSERT INTO {stage} ({cols}, is_deleted, change_hash) SELECT {dcols}, false, d.change_hash"
        " FROM {target} d JOIN {winners} c ON {key} WHERE d.is_current AND c._err_col IS NOT NULL"
    ).format(stage=STAGE, cols=names(cols), dcols=names(cols, "d"), target=target_ident(table), winners=_WINNERS,
             key=same_key(table, "d", "c")))
