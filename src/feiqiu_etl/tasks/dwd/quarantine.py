"""Quarantine of DWD source rows that cannot be loaded: ``etl_meta.dwd_quarantine`` (issue 11, finding 4).

An ODS row whose payload does not cast to its DWD columns (``"123456789012345678901234567890.99"`` for a
``numeric(12,2)``, ``"八块"`` for money) or whose business key is empty would fail the whole table's load on every
run. Instead, staging (:mod:`~feiqiu_etl.tasks.dwd.staging`) leaves it out and records it here, one row per
(DWD table, ODS row): the ODS primary key as JSON (``{"site_id": …, "settle_id": …}``), the first column that
fails, the payload text and PostgreSQL's reason. The rest of the table loads. Each load of a table re-reads
some ODS rows (all of them for a full load, those with ``mark >= since`` for an incremental one): the rows it
finds bad again stay (``last_seen_at`` moves), the others leave, so a row that was corrected upstream loads
normally and leaves the quarantine. The DWD rows of a quarantined key are left as they were.

This module writes only ``etl_meta.dwd_quarantine``, inside the caller's transaction (under the table's
advisory lock), so a load that rolls back leaves the quarantine as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from feiqiu_etl.tasks.dwd.casts import Fragment, param, source_ident
from feiqiu_etl.connector.dwd_mapping import DwdTable

QUARANTINE_TABLE = ("etl_meta", "dwd_quarantine")
_Q = sql.Identifier(*QUARANTINE_TABLE)
#: Longest payload text kept for a quarantined value, characters.
MAX_VALUE = 1000
#: Rows listed per table in a run's summary (the count is always complete).
REPORT_LIMIT = 20

DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} ("
    " table_name text NOT NULL,"          # the DWD table, e.g. dwd.dwd_settlement
    " source_table text NOT NULL,"        # its ODS source, e.g. ods.settlement
    " source_key jsonb NOT NULL,"         # the ODS row's primary key, {"site_id": …, "settle_id": …}
    " column_name text NOT NULL,"         # the first DWD column that could not be filled
    " value text,"                        # the payload text given to it (NULL: absent)
    " reason text NOT NULL,"              # PostgreSQL's message, or 'business key … is empty'
    " source_fetched_at timestamptz,"     # fetched_at of the ODS row
    " first_seen_at timestamptz NOT NULL DEFAULT now(),"
    " last_seen_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (table_name, source_key))"
).format(_Q)

_FOUND = sql.Identifier("pg_temp", "dwd_found")
_FOUND_NAME = sql.Identifier("dwd_found")


@dataclass(frozen=True)
class QuarantinedRow:
    """One quarantined ODS row of one DWD table (see the module docstring for the fields)."""

    table: str
    source: str
    key: dict[str, Any]
    column: str
    value: str | None
    reason: str
    first_seen_at: datetime
    last_seen_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "source": self.source, "key": self.key, "column": self.column,
                "value": self.value, "reason": self.reason, "first_seen_at": self.first_seen_at.isoformat(),
                "last_seen_at": self.last_seen_at.isoformat()}

    def describe(self, width: int = 80) -> str:
        """One line, e.g. ``ods.settlement {"site_id": 1, "settle_id": 7} paid_amount='1e40': numeric …``."""
        value = "NULL" if self.value is None else repr(self.value if len(self.value) <= width
                                                          else self.value[:width] + "…")
        key = json.dumps(self.key, ensure_ascii=False, separators=(", ", ": "))
        return f"{self.source} {key} {self.column}={value}: {self.reason}"


def ensure_quarantine_table(conn: psycopg.Connection) -> None:
    """``CREATE TABLE IF NOT EXISTS etl_meta.dwd_quarantine`` (the caller holds the DDL lock)."""
    conn.execute(DDL)


def source_key_json(ods_keys: list[str], alias: str = "o") -> Fragment:
    """``jsonb_build_object('site_id', o.site_id, 'k', o.k, …)``: an ODS row's primary key as JSON."""
    pairs = [Fragment.of("{}::text, {}", param(k), sql.Identifier(alias, k)) for k in ("site_id", *ods_keys)]
    return Fragment.of("jsonb_build_object({})", Fragment.join(", ", pairs))


def _reread(table: DwdTable, ods_keys: list[str], since: datetime | None, mark: sql.Composable) -> Fragment:
    """Condition on ``q`` (a quarantine row of ``table``): this load re-read its ODS row, or the row is gone.

    A full load (``since`` None) re-reads every row; an incremental one the rows with ``mark >= since``."""
    if since is None:
        return Fragment(sql.SQL("true"))
    same = sql.SQL(" AND ").join(sql.SQL("o.{0} = r.{0}").format(sql.Identifier(k)) for k in ("site_id", *ods_keys))
    return Fragment.of(
        "NOT EXISTS (SELECT 1 FROM jsonb_populate_record(NULL::{}, q.source_key) r JOIN {} o ON {}"
        " WHERE {} < {})", source_ident(table), source_ident(table), same, mark, param(since))


def settle(conn: psycopg.Connection, table: DwdTable, ods_keys: list[str], since: datetime | None,
           mark: sql.Composable, found: Fragment | None = None) -> int:
    """Bring the quarantine of ``table`` up to date after staging; return how many rows this load found bad.

    ``found`` selects this load's bad rows as ``(source_key jsonb, column_name, value, reason,
    source_fetched_at)`` (None: there were none). Entries of re-read ODS rows (:func:`_reread`) that are not
    found again are deleted; found rows are inserted or refreshed (``last_seen_at = now()``)."""
    scope = _reread(table, ods_keys, since, mark)
    if found is None:
        stmt = Fragment.of("DELETE FROM {} q WHERE q.table_name = {} AND {}", _Q, param(table.target), scope)
        conn.execute(stmt.sql, stmt.params)
        return 0
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_FOUND))
    create = Fragment.of("CREATE TEMP TABLE {} ON COMMIT DROP AS {}", _FOUND_NAME, found)
    conn.execute(create.sql, create.params)
    stale = Fragment.of("DELETE FROM {} q WHERE q.table_name = {} AND {} AND NOT EXISTS"
                        " (SELECT 1 FROM {} f WHERE f.source_key = q.source_key)", _Q, param(table.target), scope,
                        _FOUND)
    conn.execute(stale.sql, stale.params)
    cur = conn.execute(
        sql.SQL("INSERT INTO {q} AS q (table_name, source_table, source_key, column_name, value, reason,"
                " source_fetched_at) SELECT DISTINCT ON (f.source_key) %s, %s, f.source_key, f.column_name,"
                " left(f.value, %s), f.reason, f.source_fetched_at FROM {f} f"
                " ON CONFLICT (table_name, source_key) DO UPDATE SET column_name = EXCLUDED.column_name,"
                " value = EXCLUDED.value, reason = EXCLUDED.reason, source_fetched_at = EXCLUDED.source_fetched_at,"
                " last_seen_at = now()").format(q=_Q, f=_FOUND),
        (table.target, table.source, MAX_VALUE))
    return cur.rowcount


def held(conn: psycopg.Connection, table: DwdTable, limit: int = REPORT_LIMIT) -> tuple[int, list[QuarantinedRow]]:
    """(count, first ``limit`` rows ordered by key) of the rows of ``table`` in quarantine now."""
    count = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE table_name = %s").format(_Q),
                         (table.target,)).fetchone()[0]
    if not count:
        return 0, []
    rows = conn.execute(
        sql.SQL("SELECT table_name, source_table, source_key, column_name, value, reason, first_seen_at,"
                " last_seen_at FROM {} WHERE table_name = %s ORDER BY source_key LIMIT %s").format(_Q),
        (table.target, limit)).fetchall()
    return count, [QuarantinedRow(*r) for r in rows]
