"""``BaseOdsTask``: runs one ODS task for one store through a ``UnifiedPipeline`` (spec §3.5).

``execute()`` plans the windows (explicit, or incremental from ``etl_meta.window_progress`` minus a
look-back), splits them into half-open segments of at most ``segment`` (≤ 31 days, upstream-api §1.2),
seeds page 1 of every segment (or of the snapshot) plus details still owed from earlier runs, and runs
the pipeline with :class:`OdsProcessor` as ``process_fn`` and :class:`OdsWriter` as ``write_fn``.
Scope completions checkpoint a segment (all its pages and details committed) or apply the snapshot
soft delete (only after a provably complete snapshot, never when cancelled).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import psycopg

from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.models import PipelineRequest, PipelineResult, WriteResult
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.pipeline.unified_pipeline import Transport, UnifiedPipeline
from feiqiu_etl.tasks.ods.drift import FieldTracker, record_drift
from feiqiu_etl.tasks.ods.processing import OdsProcessor, SnapshotState
from feiqiu_etl.tasks.ods.rows import layouts_for
from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.connector.windows import Window, fmt, from_aware, local_now, plan_incremental, split, to_aware
from feiqiu_etl.tasks.ods.writer import OdsWriter, detail_request


@dataclass(frozen=True)
class WindowSettings:
    """How windowed tasks choose their windows. ``explicit`` overrides the incremental plan."""

    explicit: Window | None = None
    segment: timedelta = timedelta(days=7)
    lookback: timedelta = timedelta(hours=48)
    initial: timedelta = timedelta(days=7)
    now: datetime | None = None  # naive Shanghai local; None = current time


@dataclass(frozen=True)
class ApiConventions:
    """The connector's request conventions that the task needs (names of body keys, limits)."""

    connector: str = "feiqiu"
    site_param: str = "siteId"
    page_param: str = "page"
    limit_param: str = "limit"
    start_param: str = "startTime"
    end_param: str = "endTime"
    max_pages: int = 5000
    first_page: int = 1
    max_window: timedelta = timedelta(days=31)


@dataclass
class TaskRun:
    """Outcome of one task for one store."""

    task_code: str
    site_id: int
    table: str
    detail_table: str | None
    result: PipelineResult
    windows: list[tuple[str, str]] = field(default_factory=list)
    snapshot_note: str | None = None
    schema_drift: list[dict] = field(default_factory=list)  # tasks/ods/drift.py: new/lost fields, reported once

    def to_dict(self) -> dict:
        return {
            "task": self.task_code, "site_id": self.site_id, "table": self.table,
            "detail_table": self.detail_table, "windows": [list(w) for w in self.windows],
            "snapshot_note": self.snapshot_note, "schema_drift": self.schema_drift, **self.result.to_dict(),
        }


class BaseOdsTask:
    """One ODS task (``spec``) for one store. The writer's connection is opened per ``execute``."""

    def __init__(
        self,
        spec: OdsTaskSpec,
        *,
        transport: Transport,
        lane: RequestScheduler,
        dsn: str,
        config: PipelineConfig,
        run_id: str,
        cancel_token: CancellationToken,
        logger: logging.Logger,
        windows: WindowSettings = WindowSettings(),
        conventions: ApiConventions = ApiConventions(),
        observer: Callable[[UnifiedPipeline | None], None] | None = None,
    ):
        self.spec = spec
        self.transport = transport
        self.lane = lane
        self.dsn = dsn
        self.config = config
        self.run_id = run_id
        self.cancel_token = cancel_token
        self.logger = logger
        self.window_settings = windows
        self.conv = conventions
        self.observer = observer

    def execute(self, site_id: int) -> TaskRun:
        from feiqiu_etl.db.connection import connect

        spec = self.spec
        layouts = layouts_for(spec)
        with connect(self.dsn) as conn:
            windows = self._plan_windows(conn, site_id) if spec.kind == "windowed" else []
            pending = self._pending_details(conn, site_id) if spec.detail else []
            snapshot = SnapshotState() if spec.is_snapshot else None
            writer = OdsWriter(conn, spec, layouts, self.run_id, self.conv.connector,
                               detail_scope_follows_rows=not spec.is_snapshot)
            writer.requested_details.update((site_id, r.context["parent_key"]) for r in pending)
            fields = FieldTracker()
            processor = OdsProcessor(spec, site_id, layouts, self.conv.max_pages + self.conv.first_page - 1,
                                     page_param=self.conv.page_param, site_field=self.conv.site_param,
                                     snapshot=snapshot, fields=fields)
            pipeline = UnifiedPipeline(self.transport, self.config, lane=self.lane,
                                       cancel_token=self.cancel_token, logger=self.logger)
            run_started = datetime.now(timezone.utc)
            note: dict[str, str] = {}

            def on_scope(scope: Any, ok: bool) -> WriteResult | None:
                return self._scope_done(writer, site_id, scope, ok, snapshot, run_started, note)

            seeds = self._seeds(site_id, windows, pending)
            self.logger.info("start: %s, %d window segment(s), %d pending detail(s)",
                             spec.kind, len(windows), len(pending))
            if self.observer:
                self.observer(pipeline)
            try:
                result = pipeline.run(seeds, processor, writer.write, on_scope_complete=on_scope)
            finally:
                if self.observer:
                    self.observer(None)
            drift = self._drift(conn, fields)
        detail_table = spec.detail.target_table if spec.detail else None
        return TaskRun(spec.code, site_id, spec.table, detail_table, result,
                       [(fmt(w.start), fmt(w.end)) for w in windows], note.get("snapshot"), drift)

    def _drift(self, conn: psycopg.Connection, fields: FieldTracker) -> list[dict]:
        """Schema drift report of this run (tasks/ods/drift.py); a failure to record it is logged, not fatal."""
        try:
            return record_drift(conn, connector=self.conv.connector, task_code=self.spec.code, run_id=self.run_id,
                                tracker=fields, logger=self.logger)
        except psycopg.Error as exc:
            self.logger.error("schema drift not recorded: %s", exc)
            return []

    # ----------------------------------------------------------------- planning
    def _plan_windows(self, conn: psycopg.Connection, site_id: int) -> list[Window]:
        """Explicit window, or the incremental plan; the incremental horizon is recorded before any
        request so that a segment that fails is still a gap for the next run."""
        ws = self.window_settings
        max_segment = min(ws.segment, self.conv.max_window)
        if ws.explicit is not None:
            return split(ws.explicit, max_segment)
        key = (self.conv.connector, self.spec.code, site_id)
        done = [
            Window(from_aware(a), from_aware(b))
            for a, b in conn.execute(
                "SELECT window_start, window_end FROM etl_meta.window_progress "
                "WHERE connector = %s AND task_code = %s AND site_id = %s", key).fetchall()
        ]
        row = conn.execute("SELECT horizon_start FROM etl_meta.window_horizon "
                           "WHERE connector = %s AND task_code = %s AND site_id = %s", key).fetchone()
        now = ws.now or local_now()
        planned = plan_incremental(now, done, lookback=ws.lookback, initial=ws.initial,
                                   horizon=from_aware(row[0]) if row else None)
        if planned:
            conn.execute(
                "INSERT INTO etl_meta.window_horizon (connector, task_code, site_id, horizon_start) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id) "
                "DO UPDATE SET horizon_start = LEAST(window_horizon.horizon_start, EXCLUDED.horizon_start)",
                (*key, to_aware(planned[0].start)))
        conn.commit()
        return [seg for w in planned for seg in split(w, max_segment)]

    def _pending_details(self, conn: psycopg.Connection, site_id: int) -> list[PipelineRequest]:
        """Details owed by earlier runs whose parent is still live (others are forgotten)."""
        from psycopg import sql

        spec = self.spec
        schema, name = split_table(spec.table)
        key = spec.keys[0]
        rows = conn.execute(
            sql.SQL(
                "SELECT p.record FROM etl_meta.detail_pending p JOIN {t} t ON t.site_id = p.site_id "
                "AND t.{k}::text = p.parent_key AND NOT t.is_deleted "
                "WHERE p.connector = %s AND p.task_code = %s AND p.site_id = %s ORDER BY p.updated_at"
            ).format(t=sql.Identifier(schema, name), k=sql.Identifier(key.column)),
            (self.conv.connector, spec.code, site_id),
        ).fetchall()
        conn.commit()
        return [detail_request(spec, record) for (record,) in rows]

    def _seeds(self, site_id: int, windows: list[Window], pending: list[PipelineRequest]) -> Iterator[PipelineRequest]:
        c = self.conv
        base = {c.site_param: site_id, c.page_param: c.first_page, c.limit_param: self.spec.page_size}
        if self.spec.is_snapshot:
            yield self._list_request(base, ("snapshot", self.spec.code, site_id))
        for w in windows:
            params = {**base, c.start_param: fmt(w.start), c.end_param: fmt(w.end)}
            yield self._list_request(params, ("segment", self.spec.code, site_id, w.start, w.end))
        yield from pending

    def _list_request(self, params: dict, scope: tuple) -> PipelineRequest:
        return PipelineRequest(
            endpoint=self.spec.endpoint, params=params, page_size=self.spec.page_size,
            data_path=self.spec.data_path, list_key=self.spec.list_key, scope=scope,
        )

    # ----------------------------------------------------------------- scope completions (writer thread)
    def _scope_done(self, writer: OdsWriter, site_id: int, scope: Any, ok: bool,
                    snapshot: SnapshotState | None, run_started: datetime, note: dict) -> WriteResult | None:
        if not isinstance(scope, tuple):
            return None
        if scope[0] == "segment" and ok:
            # Only the part before the task started is complete: later records may still come (a window
            # that reaches into the future must not hide them from the next incremental run).
            end = min(scope[4], from_aware(run_started).replace(microsecond=0))
            if scope[3] < end:
                writer.checkpoint_window(site_id, to_aware(scope[3]), to_aware(end))
            return None
        if scope[0] != "snapshot" or snapshot is None:
            return None
        if self.cancel_token.is_cancelled:
            reason = "the run was cancelled"
        else:
            reason = snapshot.incomplete_reason() or (None if ok else "a page or record failed")
        if reason:
            note["snapshot"] = f"soft delete skipped: {reason}"
            self.logger.warning("snapshot incomplete, soft delete skipped: %s", reason)
            return None
        deleted = writer.mark_missing_as_deleted(site_id, snapshot.keys, run_started)
        note["snapshot"] = f"complete; {deleted} row(s) soft-deleted"
        return WriteResult(deleted=deleted)
