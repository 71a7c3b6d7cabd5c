"""The ODS write path (warehouse-model.md §2.3), used by the pipeline's single writer thread.

Per batch, ONE transaction: for each table, keys are de-duplicated (the last occurrence wins), rows are
``COPY``-ed into a temporary staging table, then one ``INSERT … SELECT … ON CONFLICT … DO UPDATE …
WHERE content_hash IS DISTINCT FROM … OR is_deleted`` writes only new or changed rows and returns
which were inserted and which updated. Everything else is skipped (not rewritten).

For tasks with Detail_Mode, inserted/updated parents become detail requests (not-yet-requested ids
only) and are recorded in ``etl_meta.detail_pending`` in the same transaction, so a detail lost to a
failure, a cancel or a crash is retried by the next run. A detail that failed counts one attempt there
(``attempts``, ``last_error``); after ``detail_max_attempts`` it is given up; one the upstream does not
know (40401) leaves the list. Identifiers always go through ``sql.Identifier``; values are always
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from feiqiu_etl.pipeline.models import PipelineRequest, WriteResult
from feiqiu_etl.tasks.ods.rows import DetailDone, DetailFailed, OdsRow, TableLayout
from feiqiu_etl.connector.spec import OdsTaskSpec, split_table


def detail_request(spec: OdsTaskSpec, record: dict, *, scope: Any = None) -> PipelineRequest:
    """The detail request for a list record (spec §3.6; ids passed through unchanged, Q2)."""
    d = spec.detail
    assert d is not None
    parent_value = record.get(d.id_column)
    return PipelineRequest(
        endpoint=d.endpoint,
        params=d.param_builder(record),
        page_size=None,
        data_path=d.data_path,
        list_key=d.list_key,
        is_detail=True,
        detail_id=parent_value,
        scope=scope,
        gap_class=spec.gap_class,
        context={"parent_value": d.parent.convert(parent_value), "parent_key": parent_key(parent_value),
                 "record": record},
    )


def parent_key(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass
class OdsWriter:
    """``write_fn`` for one task and site. Owns no connection: ``conn`` is used only by the writer thread."""

    conn: psycopg.Connection
    spec: OdsTaskSpec
    layouts: dict[str, TableLayout]
    run_id: str
    connector: str
    detail_scope_follows_rows: bool = True
    detail_max_attempts: int = 5
    requested_details: set = field(default_factory=set)
    given_up: list = field(default_factory=list)
    _staged: set = field(default_factory=set)

    def bind(self, conn: psycopg.Connection) -> "OdsWriter":
        """Write through ``conn`` from now on (after a reconnect: staging tables are per session)."""
        if conn is not self.conn:
            self.conn = conn
            self._staged.clear()
        return self

    def save_state(self) -> tuple:
        """In-memory bookkeeping a batch may change, to restore when its transaction is lost and retried."""
        return set(self.requested_details), len(self.given_up)

    def restore_state(self, saved: tuple) -> None:
        requested, given_up = saved
        self.requested_details = set(requested)
        del self.given_up[given_up:]
        self._staged.clear()

    def write(self, rows: list) -> WriteResult:
        """Write one batch in one transaction. Raises on database errors (the batch rolls back)."""
        result = WriteResult()
        tables: dict[str, list[OdsRow]] = {}
        markers: list[DetailDone] = []
        failures: list[DetailFailed] = []
        for row in rows:
            if isinstance(row, DetailDone):
                markers.append(row)
            elif isinstance(row, DetailFailed):
                failures.append(row)
            else:
                tables.setdefault(row.table, []).append(row)
        given_up: list[str] = []
        try:
            with self.conn.transaction():
                for table, table_rows in tables.items():
                    self._upsert(self.layouts[table], table_rows, result)
                for marker in markers:
                    self._detail_done(marker, result)
                for failure in failures:
                    self._detail_failed(failure, given_up)
        except BaseException:
            self._staged.clear()  # staging tables created in the rolled-back transaction are gone
            raise
        self.given_up.extend(given_up)
        return result

    # ------------------------------------------------------------------ upsert
    def _upsert(self, layout: TableLayout, rows: list[OdsRow], result: WriteResult) -> None:
        latest: dict[tuple, OdsRow] = {}
        for row in rows:
            latest[(row.site_id, row.keys)] = row
        result.skipped += len(rows) - len(latest)  # superseded within the batch (last one wins)
        stage = self._stage(layout)
        columns = self._columns(layout)
        with self.conn.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                    sql.Identifier(stage), sql.SQL(", ").join(map(sql.Identifier, columns)))) as copy:
                for row in latest.values():
                    copy.write_row(self._values(layout, row))
            changed = cur.execute(self._upsert_sql(layout, stage, columns)).fetchall()
        inserted = sum(1 for r in changed if r[0])
        result.inserted += inserted
        result.updated += len(changed) - inserted
        result.skipped += len(latest) - len(changed)
        if self.spec.detail is not None and layout.table == self.spec.table:
            changed_keys = {(r[1], tuple(r[2:])) for r in changed}
            self._queue_details(latest.values(), changed_keys, result)

    def _columns(self, layout: TableLayout) -> list[str]:
        cols = ["site_id", *layout.key_columns, *(k.column for k in layout.extra)]
        if layout.window_column:
            cols.append(layout.window_column)
        return cols + ["payload", "content_hash", "fetched_at", "run_id"]

    def _values(self, layout: TableLayout, row: OdsRow) -> tuple:
        values: list[Any] = [row.site_id, *row.keys, *row.extra]
        if layout.window_column:
            values.append(row.window)
        return (*values, row.payload, row.content_hash, row.fetched_at, self.run_id)

    def _stage(self, layout: TableLayout) -> str:
        schema, name = split_table(layout.table)
        stage = f"stage_{schema}_{name}"
        if stage not in self._staged:
            self.conn.execute(sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
            ).format(sql.Identifier(stage), sql.Identifier(schema, name)))
            self._staged.add(stage)
        return stage

    def _upsert_sql(self, layout: TableLayout, stage: str, columns: list[str]) -> sql.Composed:
        schema, name = split_table(layout.table)
        target = sql.Identifier(schema, name)
        conflict = ["site_id", *layout.key_columns]
        updatable = [c for c in columns if c not in conflict]
        sets = [sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in updatable]
        sets += [sql.SQL("is_deleted = false"), sql.SQL("deleted_at = NULL")]
        cols = sql.SQL(", ").join(map(sql.Identifier, columns))
        return sql.SQL(
            "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {stage} "
            "ON CONFLICT ({conflict}) DO UPDATE SET {sets} "
            "WHERE t.content_hash IS DISTINCT FROM EXCLUDED.content_hash OR t.is_deleted "
            "RETURNING (xmax = 0), {keys}"
        ).format(
            target=target, cols=cols, stage=sql.Identifier(stage),
            conflict=sql.SQL(", ").join(map(sql.Identifier, conflict)),
            sets=sql.SQL(", ").join(sets),
            keys=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in conflict),
        )

    # ------------------------------------------------------------------ details
    def _queue_details(self, rows: Iterable[OdsRow], changed: set, result: WriteResult) -> None:
        pending: list[tuple] = []
        for row in rows:
            if (row.site_id, row.keys) not in changed:
                result.follow_ups_skipped += 1
                continue
            request = detail_request(self.spec, row.record, scope=row.scope if self.detail_scope_follows_rows else None)
            key = (row.site_id, request.context["parent_key"])
            if key in self.requested_details:
                continue
            self.requested_details.add(key)
            result.follow_ups.append(request)
            pending.append((self.connector, self.spec.code, row.site_id, key[1], Jsonb(row.record)))
        if pending:
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record, attempts) "
                    "VALUES (%s, %s, %s, %s, %s, 0) ON CONFLICT (connector, task_code, site_id, parent_key) "
                    "DO UPDATE SET record = EXCLUDED.record, updated_at = now()",
                    pending,
                )

    def _detail_done(self, marker: DetailDone, result: WriteResult) -> None:
        layout = self.layouts[marker.table]
        assert layout.parent is not None
        result.deleted += self._soft_delete_missing(
            layout, marker.site_id, marker.seen, marker.fetched_at, parent=(layout.parent.column, marker.parent_value))
        key = (self.connector, marker.task_code, marker.site_id, marker.parent_key)
        self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                          "AND site_id = %s AND parent_key = %s", key)
        self.conn.execute(
            "INSERT INTO etl_meta.detail_checked (connector, task_code, site_id, parent_key, checked_at, run_id) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id, parent_key) DO UPDATE "
            "SET checked_at = EXCLUDED.checked_at, run_id = EXCLUDED.run_id", (*key, marker.fetched_at, self.run_id))

    def _detail_failed(self, failure: DetailFailed, given_up: list[str]) -> None:
        key = (self.connector, failure.task_code, failure.site_id, failure.parent_key)
        if failure.gone:
            self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                              "AND site_id = %s AND parent_key = %s", key)
            return
        row = self.conn.execute(
            "UPDATE etl_meta.detail_pending SET attempts = attempts + 1, last_error = %s, updated_at = now() "
            "WHERE connector = %s AND task_code = %s AND site_id = %s AND parent_key = %s RETURNING attempts",
            (failure.error, *key)).fetchone()
        if row is not None and row[0] >= self.detail_max_attempts:
            self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                              "AND site_id = %s AND parent_key = %s", key)
            given_up.append(failure.parent_key)

    # ------------------------------------------------------------------ snapshot soft delete
    def mark_missing_as_deleted(self, site_id: int, seen_keys: Iterable[tuple], deleted_at: datetime,
                                *, complete_at: datetime | None = None) -> int:
        """Soft-delete live rows of ``site_id`` whose key was not seen (warehouse-model §2.3). One
        transaction; returns the number of rows marked. Only call after a provably complete snapshot;
        ``complete_at`` records that snapshot as the task's freshness (``etl_meta.snapshot_done``)."""
        with self.conn.transaction():
            deleted = self._soft_delete_missing(self.layouts[self.spec.table], site_id, list(seen_keys), deleted_at)
            if complete_at is not None:
                self.conn.execute(
                    "INSERT INTO etl_meta.snapshot_done (connector, task_code, site_id, completed_at, run_id) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id) DO UPDATE SET "
                    "completed_at = EXCLUDED.completed_at, run_id = EXCLUDED.run_id",
                    (self.connector, self.spec.code, site_id, complete_at, self.run_id))
            return deleted

    def _soft_delete_missing(self, layout: TableLayout, site_id: int, seen: list[tuple], deleted_at: datetime,
                             parent: tuple[str, Any] | None = None) -> int:
        """``is_deleted = true`` for live rows of the site (and parent) whose key is not in ``seen``.
        Composite keys are compared column by column (ENGINE-NOTES)."""
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
            "UPDATE {t} AS t SET is_deleted = true, deleted_at = %s "
            "WHERE t.site_id = %s{scope} AND NOT t.is_deleted "
            "AND NOT EXISTS (SELECT 1 FROM unnest({unnest}) AS s({alias}) WHERE {match})"
        ).format(t=sql.Identifier(schema, name), scope=scope, unnest=unnest, alias=alias, match=match)
        with self.conn.cursor() as cur:
            cur.execute(query, (*params, *arrays))
            return cur.rowcount

    def checkpoint_window(self, site_id: int, start: datetime, end: datetime) -> None:
        """Record ``[start, end)`` of this task and site as completely committed (resume from gaps)."""
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, window_end, run_id) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (self.connector, self.spec.code, site_id, start, end, self.run_id),
            )
