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
    INPUT_ERROR_FUNCTION, Fragment, cast_error_sql, cast_input, cast_sql, json_text, names, param, same_key,
    source_ident, sql_type, target_ident,
)
from feiqiu_etl.connector.dwd_mapping import DwdTable

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


def _select_source(table: DwdTable, ods_keys: list[str], since: datetime | None, *, bad: bool = False) -> Fragment:
    """SELECT of the deduplicated, typed source rows, with the stage's column names.

    With ``bad``, the rows of ``pg_temp.dwd_bad`` (:func:`_find_bad_rows`) are not cast; those with a valid
    business key still take part in the deduplication (with NULL in their other columns), so a bad row that
    would win its key is never replaced by an older one. Two more columns, ``_bad`` and ``_source_key``, mark
    such winners."""
    casts = Fragment.join(", ", (Fragment.of("{} AS {}", cast_sql(c, sql.Identifier("o", "payload")),
                                             sql.Identifier(c.name)) for c in table.columns))
    key_aliases = [sql.Identifier(f"_k{i}") for i in range(len(ods_keys))]
    ods_key_sel = sql.SQL("").join(
        sql.SQL(", o.{} AS {}").format(sql.Identifier(k), a) for k, a in zip(ods_keys, key_aliases))
    where = Fragment.of(" WHERE {} >= {}", MARK, param(since)) if since is not None else Fragment(sql.SQL(""))
    source: sql.Composable = source_ident(table)
    marks, bad_rows = sql.SQL(""), Fragment(sql.SQL(""))
    if bad:
        # OFFSET 0 keeps the bad rows out before any cast is evaluated (no flattening, no qual push-down).
        source = sql.SQL("(SELECT * FROM {} o WHERE NOT EXISTS (SELECT 1 FROM {} b WHERE {}) OFFSET 0)").format(
            source_ident(table), _BAD, sql.SQL(" AND ").join(
                sql.SQL("b.{} = o.{}").format(a, sql.Identifier(k))
                for a, k in zip([sql.Identifier("site_id"), *key_aliases], ["site_id", *ods_keys])))
        marks = sql.SQL(", false AS _bad, NULL::jsonb AS _source_key")
        placeholders = sql.SQL(", ").join(
            sql.SQL("b.{}").format(sql.Identifier(c.name)) if c.name in table.business_key
            else sql.SQL("NULL::{}").format(sql_type(c.sql_type)) for c in table.columns)
        bad_rows = Fragment(sql.SQL(
            " UNION ALL SELECT b.site_id, {}, b.is_deleted, b.content_hash, b.fetched_at, b._mark{}, true, b._source_key"
            " FROM {} b WHERE b._bk_ok").format(
            placeholders, sql.SQL("").join(sql.SQL(", b.{}").format(a) for a in key_aliases), _BAD))
    inner = Fragment.of(
        "SELECT o.site_id, {}, o.is_deleted, o.content_hash, o.fetched_at, {} AS _mark{}{} FROM {} o{}{}",
        casts, MARK, ods_key_sel, marks, source, where, bad_rows,
    )
    bk = [sql.Identifier("c", k) for k in table.key]
    if table.is_dimension:
        # mark and the ODS key: the dimension's change watermark and key alignment (tasks/dwd/watermark.py)
        extra = sql.SQL("{} AS change_hash, c._mark AS mark{}").format(
            change_hash_sql(table), sql.SQL("").join(sql.SQL(", c.{}").format(a) for a in key_aliases))
    else:
        extra = sql.SQL("c.content_hash AS src_content_hash, c.fetched_at AS src_fetched_at, c._mark AS mark")
    if bad:
        extra = sql.SQL("{}, c._bad, c._source_key").format(extra)
    order = sql.SQL(", ").join([*bk, sql.SQL("c.is_deleted"), sql.SQL("c.fetched_at DESC"),
                                *(sql.SQL("c.{} DESC").format(a) for a in key_aliases)])
    return Fragment.of(
        "SELECT DISTINCT ON ({}) c.site_id, {}, c.is_deleted, {} FROM ({}) c ORDER BY {}",
        sql.SQL(", ").join(bk), names(table.column_names, "c"), extra, inner, order,
    )


def stage_source(conn: psycopg.Connection, table: DwdTable, *, since: datetime | None = None) -> int:
    """Fill ``pg_temp.dwd_stage`` with the source of ``table``; return the number of source rows staged.

    ``since`` keeps the ODS rows whose ``GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))`` is
    ``>= since``: facts (warehouse-model §5.1) and incremental dimension merges (§4.2, ``watermark.py``);
    without it the whole source is read. A dimension's stage also holds ``mark`` and the ODS key columns
    ``_k0…`` (its watermark and key alignment).

    A row that cannot be loaded — a payload that does not cast (``"abc"`` or ``"1e40"`` for money) or an
    empty business key — is left out and quarantined (:mod:`~feiqiu_etl.tasks.dwd.quarantine`) instead of
    failing the table: the fast statement runs first, in a savepoint; only if it fails with a
    ``psycopg.errors.DataError`` (or stages an empty key) are the bad rows looked for and the source staged
    again without them (:func:`_stage_checked`). For a dimension, a quarantined key keeps its current version: the stage gets a
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


_BAD = sql.Identifier("pg_temp", "dwd_bad")


def _find_bad_rows(table: DwdTable, ods_keys: list[str], since: datetime | None, native: bool) -> Fragment:
    """SELECT of the source rows that cannot be loaded, for ``pg_temp.dwd_bad``: a column does not cast, or
    a business-key column comes out NULL.

    One cheap pass: each row's values are only tested (``pg_input_is_valid``, in a CASE so that a key is cast
    only once it is known to be valid); the rest — the ODS key, the key columns where valid (``_bk_ok`` when
    all are), the first failing column (``_err_col``, key columns first), its payload text (``_err_val``) and
    PostgreSQL's message (``_err``) — is computed for the bad rows only."""
    payload = sql.Identifier("o", "payload")
    ordered = sorted(table.columns, key=lambda c: c.name not in table.business_key)
    checks = [(c, cast_error_sql(c, payload, native=native)) for c in ordered]
    checks = [(c, err) for c, err in checks if err is not None]
    failing = {c.name for c, _ in checks}
    bk_names = list(table.business_key)

    tests: list[Fragment] = []
    for c in ordered:
        if c.name in failing:
            text = cast_input(c, payload)
            invalid = (Fragment.of("NOT pg_input_is_valid({}, {})", text, param(c.sql_type)) if native else
                       Fragment.of("pg_temp.feiqiu_input_error({}, {}) IS NOT NULL", text, param(c.sql_type)))
            if c.when is not None:
                invalid = Fragment.of("CASE WHEN {} = {} THEN {} END", json_text((c.when.field,), payload),
                                      param(c.when.equals), invalid)
            tests.append(invalid)
        if c.name in table.business_key:
            tests.append(Fragment.of("{} IS NULL", cast_sql(c, payload)))
    is_bad = Fragment.of("CASE {} ELSE false END", Fragment.join(" ", (Fragment.of("WHEN {} THEN true", t)
                                                                      for t in tests)))
    values = Fragment.join(", ", (Fragment.of("({}::int, {}::text, {}, {})", param(i), param(c.name),
                                              json_text(c.path, payload), err) for i, (c, err) in enumerate(checks)))
    first_error = Fragment.of(
        "LEFT JOIN LATERAL (SELECT e.c AS _err_col, e.v AS _err_val, e.m AS _err FROM (VALUES {}) e(n, c, v, m)"
        " WHERE e.m IS NOT NULL ORDER BY e.n LIMIT 1) x ON true", values) if checks else Fragment(sql.SQL(
            "LEFT JOIN LATERAL (SELECT NULL::text AS _err_col, NULL::text AS _err_val, NULL::text AS _err) x ON true"))
    key_valid = Fragment.of("(x._err_col IS NULL OR NOT x._err_col = ANY({}))", param(bk_names))
    bk_casts = [(c, Fragment.of("CASE WHEN {} THEN {} END", key_valid, cast_sql(c, payload)) if c.name in failing
                 else cast_sql(c, payload)) for c in ordered if c.name in table.business_key]
    bk_ok = Fragment.join(" AND ", (Fragment.of("{} IS NOT NULL", expr) for _, expr in bk_casts))
    keys = sql.SQL("").join(sql.SQL(", o.{} AS {}").format(sql.Identifier(k), sql.Identifier(f"_k{i}"))
                            for i, k in enumerate(ods_keys))
    since_test = Fragment.of("{} >= {} AND ", MARK, param(since)) if since is not None else Fragment(sql.SQL(""))
    return Fragment.of(
        "SELECT o.site_id{}, {}, o.is_deleted, o.content_hash, o.fetched_at, {} AS _mark, {} AS _source_key,"
        " x._err_col, x._err_val, x._err, {} AS _bk_ok FROM {} o {} WHERE {}{}",
        keys, Fragment.join(", ", (Fragment.of("{} AS {}", expr, sql.Identifier(c.name)) for c, expr in bk_casts)),
        MARK, quarantine.source_key_json(ods_keys), bk_ok, source_ident(table), first_error, since_test, is_bad)


def _stage_checked(conn: psycopg.Connection, table: DwdTable, ods_keys: list[str], since: datetime | None) -> int:
    """Stage ``table`` without the rows that cannot be loaded, and quarantine those (after a failed fast stage).

    1. ``pg_temp.dwd_bad`` gets the bad rows (:func:`_find_bad_rows`).
    2. The stage is built as in the fast path from the other rows; bad rows with a valid key take part in the
       deduplication, and those that win their key are quarantined with the rows whose key is not valid.
    3. For a dimension, each quarantined key gets a copy of its current version (see :func:`stage_source`).
    """
    native = conn.info.server_version >= NATIVE_INPUT_CHECK
    if not native:
        conn.execute(INPUT_ERROR_FUNCTION)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_BAD))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(STAGE))
    bad = _find_bad_rows(table, ods_keys, since, native)
    conn.execute(sql.SQL("CREATE TEMP TABLE dwd_bad ON COMMIT DROP AS ") + bad.sql, bad.params)
    conn.execute(sql.SQL("ANALYZE {}").format(_BAD))
    select = _select_source(table, ods_keys, since, bad=True)
    cur = conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS ").format(_STAGE_NAME) + select.sql,
                       select.params)
    staged = cur.rowcount
    empty_key = sql.SQL("CASE {} END").format(sql.SQL(" ").join(
        sql.SQL("WHEN b.{} IS NULL THEN {}").format(sql.Identifier(k), sql.Literal(k)) for k in table.business_key))
    found = Fragment(sql.SQL(
        "SELECT b._source_key AS source_key, COALESCE(b._err_col, {e}) AS column_name, b._err_val AS value,"
        " COALESCE(b._err, 'business key ' || {e} || ' is empty') AS reason, b.fetched_at AS source_fetched_at"
        " FROM {bad} b WHERE NOT b._bk_ok OR EXISTS (SELECT 1 FROM {stage} s WHERE s._bad AND"
        " s._source_key = b._source_key)").format(e=empty_key, bad=_BAD, stage=STAGE))
    quarantine.settle(conn, table, ods_keys, since, MARK, found)
    if table.is_dimension:
        _keep_current_versions(conn, table)
    removed = conn.execute(sql.SQL("DELETE FROM {} WHERE _bad").format(STAGE)).rowcount
    conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN _bad, DROP COLUMN _source_key").format(STAGE))
    return staged - removed


def _keep_current_versions(conn: psycopg.Connection, table: DwdTable) -> None:
    """Stage a copy of the current version of every key whose winning source row is quarantined (``_bad``)."""
    cols = ("site_id", *table.column_names)
    conn.execute(sql.SQL(
        "INSERT INTO {stage} ({cols}, is_deleted, change_hash, _bad) SELECT {dcols}, false, d.change_hash, false"
        " FROM {target} d JOIN {stage} c ON {key} WHERE d.is_current AND c._bad"
    ).format(stage=STAGE, cols=names(cols), dcols=names(cols, "d"), target=target_ident(table),
             key=same_key(table, "d", "c")))
