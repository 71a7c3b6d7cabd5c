"""``FlowRunner``: one ETL run — every selected ODS task for every store through ONE shared request
lane, then (optionally) the DWD load. ``TaskRegistry`` maps task codes to specs; ``TaskExecutor`` runs
one task with its own ``PipelineConfig`` and buffered log.

The flow owns the lane and the API client (no global state). An invalid token (40101) stops the whole
run; a store the token may not access (40103) stops that store; a cancel stops starting new tasks.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

import psycopg
from psycopg.types.json import Jsonb

from feiqiu_etl.api.client import APIClient, EnvelopeRules, RetryPolicy
from feiqiu_etl.api.errors import AuthError, SiteForbiddenError
from feiqiu_etl.config.app_config import AppConfig
from feiqiu_etl.connector.model import Connector
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_ods_tables
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.log_buffer import TaskLogBuffer
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.tasks.ods.task import ApiConventions, BaseOdsTask, TaskRun, WindowSettings

STATUS_ORDER = {"SUCCESS": 0, "PARTIAL": 1, "CANCELLED": 2, "FAILED": 3}


def worst(statuses: Iterable[str]) -> str:
    return max(statuses, key=STATUS_ORDER.__getitem__, default="SUCCESS")


class TaskRegistry:
    """Task codes → :class:`OdsTaskSpec` (from a connector, or registered in Python)."""

    def __init__(self, specs: Iterable[OdsTaskSpec] = ()):
        self._specs: dict[str, OdsTaskSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: OdsTaskSpec) -> None:
        if spec.code in self._specs:
            raise ValueError(f"task {spec.code} is already registered")
        self._specs[spec.code] = spec

    def get(self, code: str) -> OdsTaskSpec:
        try:
            return self._specs[code.upper()]
        except KeyError:
            raise KeyError(f"unknown task {code!r}; known: {', '.join(self._specs)}") from None

    def select(self, codes: Iterable[str] | None) -> list[OdsTaskSpec]:
        codes = [c.strip() for c in codes or [] if c.strip()]
        return [self.get(c) for c in codes] if codes else list(self._specs.values())

    def __iter__(self):
        return iter(self._specs.values())


@dataclass
class FlowResult:
    run_id: str
    status: str
    tasks: list[TaskRun] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    dwd: dict | None = None
    started_at: str = ""
    finished_at: str = ""

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id, "status": self.status, "started_at": self.started_at,
            "finished_at": self.finished_at, "tasks": [t.to_dict() for t in self.tasks],
            "skipped_tasks": self.skipped, "dwd": self.dwd,
        }


@dataclass
class _FlowState:
    abort_run: str | None = None
    abort_sites: set = field(default_factory=set)


class TaskExecutor:
    """Runs one task for one store with its own config; logs are buffered and flushed per task."""

    def __init__(self, flow: "FlowRunner"):
        self.flow = flow

    def run_task(self, spec: OdsTaskSpec, site_id: int) -> TaskRun:
        f = self.flow
        logger = logging.getLogger(f"feiqiu_etl.task.{spec.code}.{site_id}")
        buffer = TaskLogBuffer(spec.code, f.logger)
        handler = buffer.handler()
        logger.addHandler(handler)
        logger.propagate = False
        try:
            task = BaseOdsTask(
                spec, transport=f.transport_for(site_id), lane=f.lane, dsn=f.dsn, config=f.pipeline_configs[spec.code],
                run_id=f.run_id, cancel_token=f.cancel_token, logger=logger, windows=f.windows,
                conventions=f.conventions, observer=lambda p: f.observe(spec.code, site_id, p),
            )
            run = task.execute(site_id)
            logger.info("done: %s requests=%d fetched=%d inserted=%d updated=%d skipped=%d deleted=%d",
                        run.result.status, run.result.total_requests, run.result.total_fetched,
                        run.result.total_inserted, run.result.total_updated, run.result.total_skipped,
                        run.result.total_deleted)
            return run
        finally:
            logger.removeHandler(handler)
            logger.propagate = True
            buffer.flush()


class FlowRunner:
    """One run of the flow. Build with validated settings; ``run()`` returns a :class:`FlowResult`."""

    def __init__(
        self,
        *,
        connector: Connector,
        app_config: AppConfig,
        dsn: str,
        api_base: str,
        token: str,
        site_ids: list[int],
        task_codes: list[str] | None = None,
        windows: WindowSettings = WindowSettings(),
        cancel_token: CancellationToken | None = None,
        logger: logging.Logger | None = None,
        run_id: str | None = None,
        load_dwd: bool = False,
        load_ods: bool = True,
        dwd_tables: list[str] | None = None,
        client_factory: Callable[..., APIClient] | None = None,
        dwd_full: bool = False,
    ):
        self.connector = connector
        self.config = app_config
        self.dsn = dsn
        self.site_ids = site_ids
        self.registry = TaskRegistry(connector.tasks)
        self.specs = self.registry.select(task_codes)
        self.windows = windows
        self.cancel_token = cancel_token or CancellationToken()
        self.logger = logger or logging.getLogger("feiqiu_etl.flow")
        self.run_id = run_id or new_run_id()
        self.load_dwd = load_dwd
        self.load_ods = load_ods
        self.dwd_tables = dwd_tables
        self.dwd_full = dwd_full
        api = connector.api
        self.conventions = ApiConventions(
            connector=connector.name, site_param=api.site_param, page_param=api.pagination.page_param,
            limit_param=api.pagination.limit_param, start_param=api.window.start_param,
            end_param=api.window.end_param, max_pages=api.pagination.max_pages,
            first_page=api.pagination.first_page, max_window=timedelta(days=api.window.max_days),
        )
        # Validate every task's configuration before any request is sent.
        self.pipeline_configs: dict[str, PipelineConfig] = {
            s.code: app_config.pipeline_config(s.code, s.pipeline) for s in self.specs
        }
        app_config.number("dwd.parallel_workers", int, minimum=1, maximum=64)  # checked even if unused
        self.dwd_mapping = self._dwd_mapping() if load_dwd else None
        self.lane = RequestScheduler()
        factory = client_factory or APIClient
        retry = RetryPolicy(attempts=app_config.number("api.retry_attempts", int, minimum=1, maximum=20),
                            base=app_config.number("api.retry_backoff", float, minimum=0.0, maximum=600.0))
        timeout = app_config.number("api.timeout", float, minimum=0.1, maximum=600.0, default=api.timeout_seconds)
        self.client = factory(api_base, token, timeout=timeout, retry=retry, rules=envelope_rules(connector))
        self._state = _FlowState()
        self._current: tuple[str, int, object] | None = None
        self.result: FlowResult | None = None
        self.completed_tasks = 0

    def observe(self, task_code: str, site_id: int, pipeline) -> None:
        """Called by a task when its pipeline starts (``pipeline``) and ends (``None``)."""
        if pipeline is None:
            self._current = None
            self.completed_tasks += 1
        else:
            self._current = (task_code, site_id, pipeline)

    def progress(self) -> dict:
        """Live snapshot for progress displays: tasks done/total and the running pipeline's statistics."""
        current = self._current
        out = {"done": self.completed_tasks, "total": len(self.specs) * len(self.site_ids) if self.load_ods else 0,
               "finished": list(self.result.tasks) if self.result else []}
        if current is not None:
            code, site, pipeline = current
            out |= {"task": code, "site_id": site, "stats": pipeline.statistics()}
        return out

    def transport_for(self, site_id: int):
        state = self._state

        def transport(request: PipelineRequest, send):
            try:
                return self.client.fetch(request, send)
            except AuthError:
                state.abort_run = "invalid or expired token (40101)"
                raise
            except SiteForbiddenError:
                state.abort_sites.add(site_id)
                raise

        return transport

    def run(self) -> FlowResult:
        started = datetime.now(timezone.utc)
        result = FlowResult(self.run_id, "SUCCESS", started_at=started.isoformat())
        self.result = result
        with connect(self.dsn) as conn:
            ensure_ods_tables(conn, self.registry)
            _record_run(conn, self.run_id, started, "RUNNING", None)
        executor = TaskExecutor(self)
        try:
            for site_id in self.site_ids if self.load_ods else []:
                for spec in self.specs:
                    why = self._skip_reason(site_id)
                    if why:
                        result.skipped.append({"task": spec.code, "site_id": site_id, "reason": why})
                        continue
                    result.tasks.append(executor.run_task(spec, site_id))
            if self.load_dwd and not self.cancel_token.is_cancelled and self._state.abort_run is None:
                result.dwd = self._run_dwd()
        finally:
            self.client.close()
        statuses = [t.result.status for t in result.tasks]
        if result.skipped:
            statuses.append("CANCELLED" if self.cancel_token.is_cancelled else "FAILED")
        if result.dwd is not None:
            statuses.append(result.dwd.get("status", "SUCCESS"))
        if self.cancel_token.is_cancelled:
            statuses.append("CANCELLED")  # e.g. a signal during DWD: what started finished, the rest did not
        if result.tasks and not any(t.result.completed_requests for t in result.tasks) \
                and any(t.result.request_failures for t in result.tasks):
            statuses.append("FAILED")  # not one request succeeded (wrong URL, upstream down): nothing loaded
        result.status = worst(statuses)
        result.finished_at = datetime.now(timezone.utc).isoformat()
        with connect(self.dsn) as conn:
            _record_run(conn, self.run_id, started, result.status, result.to_dict())
        return result

    def _skip_reason(self, site_id: int) -> str | None:
        if self.cancel_token.is_cancelled:
            return "cancelled before start"
        if self._state.abort_run:
            return self._state.abort_run
        if site_id in self._state.abort_sites:
            return "store not authorised for this token (40103)"
        return None

    def _dwd_mapping(self):
        """Load and check the DWD mapping and ``dwd_tables`` up front (raises ``ValueError``)."""
        from feiqiu_etl.tasks.dwd import load_dwd_mapping

        path = self.connector.dwd_mapping_path()
        if path is None:
            raise ValueError(f"connector {self.connector.name} has no dwd_mapping; use --no-dwd")
        mapping = load_dwd_mapping(path)
        mapping.select(self.dwd_tables)
        self.config.number("dwd.parallel_workers", int, minimum=1, maximum=64)
        return mapping

    def _run_dwd(self) -> dict:
        from feiqiu_etl.tasks.dwd import DwdLoadTask, ensure_dwd_tables

        mapping = self.dwd_mapping
        with connect(self.dsn) as conn:
            ensure_dwd_tables(conn, mapping)
        workers = self.config.number("dwd.parallel_workers", int, minimum=1, maximum=64)
        task = DwdLoadTask(self.dsn, mapping, parallel_workers=workers, run_id=self.run_id,
                           logger=logging.getLogger("feiqiu_etl.dwd"), cancel_event=self.cancel_token.event,
                           full=self.dwd_full)
        summary = task.load(only_tables=self.dwd_tables)
        out = summary.to_dict()
        out["status"] = summary.status
        return out


def envelope_rules(connector: Connector) -> EnvelopeRules:
    """The connector's envelope and error-code table as the client's :class:`EnvelopeRules`."""
    api = connector.api
    e, err = api.envelope, api.errors
    return EnvelopeRules(
        code_field=e.code_field, ok_code=e.ok_code, message_field=e.message_field, data_field=e.data_field,
        retry=frozenset(err.retry), rate_limited=frozenset(err.rate_limited), retry_after_field=err.retry_after_field,
        abort_run=frozenset(err.abort_run), abort_site=frozenset(err.abort_site), not_found=frozenset(err.not_found),
    )


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _record_run(conn: psycopg.Connection, run_id: str, started: datetime, status: str, summary: dict | None) -> None:
    with conn.transaction():
        conn.execute(
            "INSERT INTO etl_meta.run (run_id, started_at, status, summary) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status, summary = EXCLUDED.summary, "
            "finished_at = CASE WHEN EXCLUDED.status <> 'RUNNING' THEN now() END",
            (run_id, started, status, Jsonb(summary) if summary is not None else None),
        )
