"""The ODS write path (warehouse-model.md §2.3), used by the pipeline's single writer thread.

Per batch, ONE transaction, sent in ONE round trip (psycopg pipeline mode: ``BEGIN``, one statement per
table, ``COMMIT``, then a single sync). For each table, keys are de-duplicated (the last occurrence wins)
and the rows travel as column arrays (``unnest``) into one ``INSERT … SELECT … ON CONFLICT … DO UPDATE …
WHERE content_hash IS DISTINCT FROM … OR is_deleted``, which writes only new or changed rows and reports
how many were inserted and updated. Everything else is skipped (not rewritten). The statement is built by
:mod:`feiqiu_etl.tasks.ods.upsert_sql`; the soft deletes are :mod:`feiqiu_etl.tasks.ods.soft_delete`'s, a
snapshot's through the deletion guard (:mod:`feiqiu_etl.tasks.ods.deletions`).

For tasks with Detail_Mode, inserted/updated parents become detail requests (not-yet-requested ids
only; with ``defer_details`` none: they are only recorded, for a later part of the run) and are recorded in
``etl_meta.detail_pending`` in the same transaction, so a detail lost to a
failure, a cancel or a crash is retried by the next run. A detail that failed counts one attempt there
(``attempts``, ``last_error``); after ``detail_max_attempts`` it is given up; one the upstream does not
know (40401) leaves the list. A parent whose change consists only of fields that were not in its stored
payload (schema drift, e.g. the API added a field) or of the task's ``volatile_fields`` (upstream-api.md Q11:
``member.points`` changes without ``updateTime``), or of both, is updated but asks for no detail, unless the
task's ``detail.refetch_on_new_fields`` / ``detail.refetch_on_volatile`` is set: the stored detail rows stay
as they were until the parent's next other change (warehouse-model §2.3). Identifiers always go through
``sql.Identifier``; values are always parameters.

Owed means recorded: every parent that asks for a detail has its ``etl_meta.detail_pending`` row written in
the transaction that writes the parent, also when a request for it is already out (a periodic re-check, a
detail fetched earlier in this run), so whatever stops the run early, the detail stays owed until a
``DetailDone`` clears it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.pipeline.models import PipelineRequest, WriteResult
from feiqiu_etl.tasks.ods import soft_delete
from feiqiu_etl.tasks.ods.rows import DetailDone, DetailFailed, OdsRow, TableLayout
from feiqiu_etl.tasks.ods.upsert_sql import TextBytes, batch_arrays, upsert_sql


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


# A batch commits synchronously (the server's default). An asynchronous commit (``synchronous_commit = off``)
# was tried for speed and lost data: after the server crashed and came back mid-run (chaos matrix, "server
# stopped (immediate)"), the writer reconnected and went on, but the batches committed in the last ~200 ms
# before the crash were gone while the run believed them written, and their segment was checkpointed later.
# A commit that returned must be durable, because the run continues past a reconnect.


def parent_key(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass
class OdsWriter:
    """``write_fn`` for one task and site. Owns no connection: each operation :meth:`bind`-s the connection it
    checked out of the run's pool (``conn`` is used only by the writer thread)."""

    conn: psycopg.Connection | None
    spec: OdsTaskSpec
    layouts: dict[str, TableLayout]
    run_id: str
    connector: str
    detail_scope_follows_rows: bool = True
    detail_max_attempts: int = 5
    defer_details: bool = False
    requested_details: set = field(default_factory=set)
    """(site_id, parent_key) of every detail requested in this run (re-checks included): a re-check skips them."""
    in_flight: set = field(default_factory=set)
    """Keys whose detail request is out and not yet answered: a change seen meanwhile asks for no second one."""
    recorded: set = field(default_factory=set)
    """Keys known to have an ``etl_meta.detail_pending`` row."""
    given_up: list = field(default_factory=list)
    lost_details: set = field(default_factory=set)
    """(site_id, parent_key) of detail rows whose batch failed for good: their ``DetailDone`` clears nothing."""
    parents_seen: int = 0
    """List rows of a task with details written so far (the live estimate's base)."""
    details_queued: int = 0
    """Detail requests created for new or changed parents so far."""
    deferred: int = 0
    """With ``defer_details``: parents whose detail was only recorded as owed (for a later part of the run)."""
    scope_counts: dict = field(default_factory=dict)
    """scope -> [inserted, updated, unchanged] of the task's own table (a listing's ODS outcome, issue 25)."""
    _statements: dict = field(default_factory=dict, repr=False)
    _maybe_committed: bool = field(default=False, repr=False)   # the batch runs again after a lost connection

    def bind(self, conn: psycopg.Connection) -> "OdsWriter":
        """Write through ``conn`` from now on (after a reconnect)."""
        self.conn = conn
        return self

    def owe(self, keys: Iterable[tuple]) -> None:
        """``(site_id, parent_key)`` owed by earlier runs, whose requests this run sends (recorded, in flight)."""
        for key in keys:
            self.requested_details.add(key)
            self.in_flight.add(key)
            self.recorded.add(key)

    def batch_lost(self, rows: list) -> None:
        """A batch failed for good (after its retries): detail rows in it were not written, so their parents'
        details stay owed — a ``DetailDone`` that comes in a later batch must not clear them (issue 21)."""
        if self.spec.detail is None:
            return
        d = self.spec.detail
        for row in rows:
            if isinstance(row, OdsRow) and row.table == d.target_table:
                self.lost_details.add((row.site_id, parent_key(row.record.get(d.parent.field))))

    def save_state(self) -> tuple:
        """In-memory bookkeeping a batch may change, to restore when its transaction is lost and retried."""
        return (set(self.requested_details), set(self.in_flight), set(self.recorded), len(self.given_up),
                self.deferred, {k: list(v) for k, v in self.scope_counts.items()})

    def restore_state(self, saved: tuple) -> None:
        """Back to ``saved`` before the batch runs again after a lost connection. Its transaction may have been
        committed all the same (the connection was lost after the server committed, before the client heard it):
        then the rows come back unchanged and would ask for no detail, so the batch run again also asks for the
        details its parents still owe in ``etl_meta.detail_pending`` (:meth:`_queue_details`)."""
        requested, in_flight, recorded, given_up, self.deferred, counts = saved
        self.scope_counts.clear()
        self.scope_counts.update({k: list(v) for k, v in counts.items()})
        # the same set objects stay (a re-check source holds requested_details): update them in place
        for current, old in ((self.requested_details, requested), (self.in_flight, in_flight),
                             (self.recorded, recorded)):
            current.clear()
            current.update(old)
        del self.given_up[given_up:]
        self._maybe_committed = True

    def write(self, rows: list) -> WriteResult:
        """Write one batch in one transaction. Raises on database errors (the batch rolls back)."""
        result = WriteResult()
        tables: dict[tuple, list[OdsRow]] = {}
        markers: list[DetailDone] = []
        failures: list[DetailFailed] = []
        own = self.spec.table
        for row in rows:
            if isinstance(row, DetailDone):
                markers.append(row)
            elif isinstance(row, DetailFailed):
                failures.append(row)
            else:
                tables.setdefault((row.table, None), []).append(row)
        if (own, None) in tables:
            tables.update(self._by_listing(tables.pop((own, None)), result))
        given_up: list[str] = []
        with self.conn.pipeline() as pipeline:
            with self.conn.transaction():
                pending = [self._upsert(self.layouts[table], table_rows, result, scope if table == own else None)
                           for (table, scope), table_rows in tables.items()]
                for finish in pending:
                    finish()
                for marker in markers:
                    self._detail_done(marker, result)
                for failure in failures:
                    self._detail_failed(failure, given_up)
            pipeline.sync()
        self.given_up.extend(given_up)
        self._maybe_committed = False
        return result

    # ------------------------------------------------------------------ upsert
    def _by_listing(self, rows: list[OdsRow], result: WriteResult) -> dict[tuple, list[OdsRow]]:
        """The task's own rows per listing (scope), so each listing's ODS outcome is known (issue 25): one
        statement per listing, all in the batch's one round trip. Keys are de-duplicated over the whole batch
        first (the last occurrence wins, as before); a superseded row counts as unchanged for its listing."""
        latest: dict[tuple, OdsRow] = {}
        for row in rows:
            key = (row.site_id, row.keys)
            old = latest.pop(key, None)
            if old is not None:
                result.skipped += 1
                self.scope_counts.setdefault(old.scope, [0, 0, 0])[2] += 1
            latest[key] = row
        groups: dict[tuple, list[OdsRow]] = {}
        for row in latest.values():
            groups.setdefault((row.table, row.scope), []).append(row)
        return groups

    def _upsert(self, layout: TableLayout, rows: list[OdsRow], result: WriteResult, scope: Any = None):
        """Queue the upsert of ``rows``; return the step that reads its outcome (run inside the transaction);
        with ``scope`` the outcome also counts for that listing (``scope_counts``)."""
        latest: dict[tuple, OdsRow] = {}
        for row in rows:
            latest[(row.site_id, row.keys)] = row
        result.skipped += len(rows) - len(latest)  # superseded within the batch (last one wins)
        parents = self.spec.detail is not None and layout.table == self.spec.table
        statement = self._statement(layout, parents)
        arrays, payloads = batch_arrays(layout, list(latest.values()))
        params = [self.run_id, *arrays, payloads]  # in the order of the statement's placeholders
        if parents:  # the stored rows of these keys, read before the upsert (drift-only changes)
            params = arrays[:1 + len(layout.keys)] + params
        cur = self.conn.cursor()
        cur.adapters.register_dumper(bytes, TextBytes)  # this cursor only: the payload array is UTF-8 text
        cur.execute(statement, params)

        def tally(inserted: int, updated: int, unchanged: int) -> None:
            result.inserted += inserted
            result.updated += updated
            result.skipped += unchanged
            if scope is not None:
                counts = self.scope_counts.setdefault(scope, [0, 0, 0])
                counts[0] += inserted
                counts[1] += updated
                counts[2] += unchanged + len(rows) - len(latest)  # (none superseded here: _by_listing did it)

        def finish() -> None:
            if not parents:
                inserted, changed = cur.fetchone()
                cur.close()
                tally(inserted, changed - inserted, len(latest) - changed)
                return
            changed = cur.fetchall()
            cur.close()
            self.parents_seen += len(latest)
            inserted = sum(1 for r in changed if r[0])
            tally(inserted, len(changed) - inserted, len(latest) - len(changed))
            wanted = {(r[2], tuple(r[3:])) for r in changed if not r[1]}
            self._queue_details(latest.values(), wanted, result)

        return finish

    def _statement(self, layout: TableLayout, parents: bool) -> sql.Composed:
        key = (layout.table, parents)
        cached = self._statements.get(key)
        if cached is None:
            cached = self._statements[key] = upsert_sql(self.spec, self.connector, layout, parents)
        return cached

    def owe_for_deleted(self, site_id: int, deleted_at: datetime) -> None:
        """The parents' details that rows of this task soft-deleted at ``deleted_at`` make due (in the caller's
        transaction; :func:`~feiqiu_etl.tasks.ods.soft_delete.owe_for_deleted`)."""
        soft_delete.owe_for_deleted(self.conn, self.spec, self.connector, site_id, deleted_at)

    # ------------------------------------------------------------------ details
    def _queue_details(self, rows: Iterable[OdsRow], changed: set, result: WriteResult) -> None:
        """Detail requests for the parents in ``changed``, each recorded as owed in this transaction (even when
        a request for it is already out) — and, when the batch runs again after a lost connection, for its parents
        whose detail is owed and not requested (their first transaction may have committed); every other row
        counts as ``follow_ups_skipped``."""
        rows = list(rows)
        if self._maybe_committed:
            changed = changed | self._owed(rows, changed)
        pending: list[tuple] = []
        for row in rows:
            if (row.site_id, row.keys) not in changed:
                result.follow_ups_skipped += 1
                continue
            request = detail_request(self.spec, row.record, scope=row.scope if self.detail_scope_follows_rows else None)
            key = (row.site_id, request.context["parent_key"])
            if key in self.requested_details and key not in self.in_flight:
                continue  # its detail was fetched (or failed) earlier in this run: once per run (ENGINE-NOTES)
            if key not in self.recorded:
                self.recorded.add(key)
                pending.append((self.connector, self.spec.code, row.site_id, key[1], Jsonb(row.record)))
            if key in self.in_flight:
                continue
            self.requested_details.add(key)
            self.in_flight.add(key)  # deferred: no request here, and none a second time (a later part fetches it)
            if self.defer_details:  # owed for a later part of the run (a lane with a deadline: recent data first)
                self.deferred += 1
                continue
            self.details_queued += 1
            result.follow_ups.append(request)
        if pending:
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record, attempts) "
                    "VALUES (%s, %s, %s, %s, %s, 0) ON CONFLICT (connector, task_code, site_id, parent_key) "
                    "DO UPDATE SET record = EXCLUDED.record, updated_at = now()",
                    pending,
                )

    def _owed(self, rows: list[OdsRow], changed: set) -> set:
        """``(site_id, keys)`` of the rows not in ``changed`` whose parent has an owed detail with no request out."""
        keys = {}
        for row in rows:
            if (row.site_id, row.keys) in changed:
                continue
            key = (row.site_id, parent_key(row.record.get(self.spec.detail.id_column)))
            if key not in self.in_flight:
                keys[key] = (row.site_id, row.keys)
        if not keys:
            return set()
        owed = self.conn.execute(
            "SELECT site_id, parent_key FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
            "AND (site_id, parent_key) IN (SELECT * FROM unnest(%s::bigint[], %s::text[]))",
            (self.connector, self.spec.code, [k[0] for k in keys], [k[1] for k in keys])).fetchall()
        return {keys[(site, key)] for site, key in owed if (site, key) in keys}

    def _detail_done(self, marker: DetailDone, result: WriteResult) -> None:
        if (marker.site_id, marker.parent_key) in self.lost_details:  # some of its rows were not written
            self.in_flight.discard((marker.site_id, marker.parent_key))
            return
        layout = self.layouts[marker.table]
        assert layout.parent is not None
        result.deleted += soft_delete.soft_delete_missing(
            self.conn, layout, marker.site_id, marker.seen, marker.fetched_at, parent=(layout.parent.column, marker.parent_value))
        key = (self.connector, marker.task_code, marker.site_id, marker.parent_key)
        self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                          "AND site_id = %s AND parent_key = %s", key)
        self.recorded.discard(key[2:])
        self.in_flight.discard(key[2:])
        self.conn.execute(
            "INSERT INTO etl_meta.detail_checked (connector, task_code, site_id, parent_key, checked_at, run_id) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id, parent_key) DO UPDATE "
            "SET checked_at = EXCLUDED.checked_at, run_id = EXCLUDED.run_id", (*key, marker.fetched_at, self.run_id))

    def _detail_failed(self, failure: DetailFailed, given_up: list[str]) -> None:
        key = (self.connector, failure.task_code, failure.site_id, failure.parent_key)
        self.in_flight.discard(key[2:])
        if failure.gone:
            self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                              "AND site_id = %s AND parent_key = %s", key)
            self.recorded.discard(key[2:])
            return
        row = self.conn.execute(
            "UPDATE etl_meta.detail_pending SET attempts = attempts + 1, last_error = %s, updated_at = now() "
            "WHERE connector = %s AND task_code = %s AND site_id = %s AND parent_key = %s RETURNING attempts",
            (failure.error, *key)).fetchone()
        if row is not None and row[0] >= self.detail_max_attempts:
            self.conn.execute("DELETE FROM etl_meta.detail_pending WHERE connector = %s AND task_code = %s "
                              "AND site_id = %s AND parent_key = %s", key)
            self.recorded.discard(key[2:])
            given_up.append(failure.parent_key)

    # ------------------------------------------------------------------ snapshot soft delete
    def guarded_delete(self, site_id: int, seen_keys: Iterable[tuple], deleted_at: datetime, rules,
                       *, complete_at: datetime | None = None):
        """Soft-delete live rows of ``site_id`` whose key was not seen (warehouse-model §2.3) through the deletion
        guard (:mod:`feiqiu_etl.tasks.ods.deletions`, ``rules`` a ``GuardRules``): one transaction; returns its
        ``GuardOutcome`` (rows deleted, held back). Only call after a provably complete snapshot; ``complete_at``
        records that snapshot as the task's freshness (``etl_meta.snapshot_done``)."""
        from feiqiu_etl.tasks.ods.deletions import Snapshot, guard_snapshot

        snapshot = Snapshot(self.connector, self.spec.code, site_id, self.run_id, frozenset(seen_keys), deleted_at)
        with self.conn.transaction():
            outcome = guard_snapshot(self.conn, self.layouts[self.spec.table], snapshot, rules)
            if outcome.deleted and self.spec.owes_details:
                self.owe_for_deleted(site_id, deleted_at)
            if complete_at is not None:
                self._snapshot_done(site_id, complete_at)
            return outcome

    def _snapshot_done(self, site_id: int, complete_at: datetime) -> None:
        soft_delete.record_snapshot_done(self.conn, self.connector, self.spec.code, site_id, complete_at, self.run_id)

    def checkpoint_window(self, site_id: int, start: datetime, end: datetime) -> None:
        """Record ``[start, end)`` of this task and site as completely committed (resume from gaps)."""
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, window_end, run_id) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (self.connector, self.spec.code, site_id, start, end, self.run_id),
            )
