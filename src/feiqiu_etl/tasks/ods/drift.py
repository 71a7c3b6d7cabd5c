"""Schema drift of ODS tasks: the top-level fields a task's records carry, compared with what earlier runs saw.

Processing workers report, once per page, the union of the field names of the records of each ODS table
(:meth:`FieldTracker.page`, thread-safe). When the task ends, :func:`record_drift` compares that with
``etl_meta.ods_field`` (one row per connector, task, table and field ever seen) and reports once:

* ``new_fields``: fields no earlier run saw (or that had been lost and came back),
* ``lost_fields``: fields earlier runs saw that none of this run's records carried.

The first run of a table only records its fields (a baseline is no drift). The report is a list of
``{"table", "new_fields", "lost_fields", "first_seen_run"}`` (sorted field names); each one is logged as a
WARNING. Drift costs no lane time: a parent whose only change is new fields asks for no detail (see
``writer.py``). This module never sends requests; it writes only ``etl_meta.ods_field``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Iterable

import psycopg

FIELD_DDL = """
CREATE TABLE IF NOT EXISTS etl_meta.ods_field (
    connector      text NOT NULL,
    task_code      text NOT NULL,
    table_name     text NOT NULL,
    field          text NOT NULL,
    first_seen_run text NOT NULL,
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    lost_run       text,
    PRIMARY KEY (connector, task_code, table_name, field)
);
"""


@dataclass(frozen=True)
class FieldStatistics:
    """Snapshot of a :class:`FieldTracker`: ODS tables with records so far, distinct field names over them."""

    tables: int
    fields: int


class FieldTracker:
    """Union of the top-level field names seen per ODS table during one task run (thread-safe)."""

    def __init__(self) -> None:
        self._fields: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def page(self, table: str, records: Iterable) -> None:
        """Add the keys of every dict in ``records`` (one page) to ``table``'s fields, with ``\\u0000`` removed
        as in the stored payload (tasks/ods/hashing.py: PostgreSQL text cannot hold it; a field name with one
        once made recording the drift fail on every run)."""
        seen: set[str] = set()
        for record in records:
            if isinstance(record, dict):
                seen.update(str(k).replace("\x00", "") for k in record)
        if seen:
            with self._lock:
                self._fields.setdefault(table, set()).update(seen)

    def snapshot(self) -> dict[str, frozenset[str]]:
        with self._lock:
            return {table: frozenset(fields) for table, fields in self._fields.items()}

    def statistics(self) -> FieldStatistics:
        """Snapshot: tables seen so far and field names over all of them."""
        with self._lock:
            return FieldStatistics(tables=len(self._fields), fields=sum(len(f) for f in self._fields.values()))


def ensure_field_table(conn: psycopg.Connection) -> None:
    """CREATE TABLE IF NOT EXISTS ``etl_meta.ods_field`` under the DDL lock of ``db.schema`` (the schema
    exists: ``ensure_schemas``). Runs in the caller's transaction."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('feiqiu_etl.ddl'))")
    conn.execute(FIELD_DDL)


def record_drift(conn: psycopg.Connection, *, connector: str, task_code: str, run_id: str,
                 tracker: FieldTracker, logger: logging.Logger | None = None) -> list[dict]:
    """Compare this run's fields with the known ones, store the new state (one transaction) and return the
    drift report (empty when nothing changed or on a table's first run)."""
    log = logger or logging.getLogger(__name__)
    report: list[dict] = []
    with conn.transaction():
        ensure_field_table(conn)
        for table, fields in sorted(tracker.snapshot().items()):
            rows = conn.execute(
                "SELECT field, lost_run IS NULL FROM etl_meta.ods_field "
                "WHERE connector = %s AND task_code = %s AND table_name = %s",
                (connector, task_code, table)).fetchall()
            known = {f for f, live in rows if live}
            baseline = not rows
            new = sorted(fields - known)
            lost = sorted(known - fields)
            if new:
                conn.cursor().executemany(
                    "INSERT INTO etl_meta.ods_field (connector, task_code, table_name, field, first_seen_run) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connector, task_code, table_name, field) "
                    "DO UPDATE SET first_seen_run = EXCLUDED.first_seen_run, first_seen_at = now(), lost_run = NULL",
                    [(connector, task_code, table, f, run_id) for f in new])
            if lost:
                conn.execute(
                    "UPDATE etl_meta.ods_field SET lost_run = %s WHERE connector = %s AND task_code = %s "
                    "AND table_name = %s AND field = ANY(%s)", (run_id, connector, task_code, table, lost))
            if baseline or not (new or lost):
                continue
            entry = {"table": table, "new_fields": new, "lost_fields": lost, "first_seen_run": run_id}
            report.append(entry)
            log.warning("schema drift in %s (%s): %s%s%s (first seen in run %s)", task_code, table,
                        f"new field(s) {', '.join(new)}" if new else "", "; " if new and lost else "",
                        f"lost field(s) {', '.join(lost)}" if lost else "", run_id)
    return report
