"""What an ODS task is given (spec §3.5): its plan (:class:`PlannedTask`), the connector's request conventions
(:class:`ApiConventions`), what every task of one run shares (:class:`TaskContext`: database, run id,
cancellation, integrity rules) and how it reaches the upstream (:class:`LaneAccess`). Plain values, no I/O;
:class:`~feiqiu_etl.tasks.ods.task.BaseOdsTask` and the modules it runs through read them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Hashable, Protocol

import psycopg

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import Window
from feiqiu_etl.db.health import DatabaseHealth
from feiqiu_etl.estimates import Estimate
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.pipeline.unified_pipeline import Transport
from feiqiu_etl.tasks.ods.reconcile import IntegrityRules


class PlannedTask(Protocol):
    """What an ODS task reads of its plan: the spec, the store, the effective pipeline settings, the window
    segments, the incremental horizon, the estimate, whether it is a first load, how many details to re-check (and
    the fraction of one carried over), its ``phase`` (``all``, ``recent``, ``owed``, ``history``) and whether it
    only records its new parents' details as owed (``defers_details``).
    The plan's :class:`~feiqiu_etl.plan.model.TaskPlan` is one; the task package names what it needs instead of
    importing the plan (the plan is built above the tasks)."""

    @property
    def spec(self) -> OdsTaskSpec: ...
    @property
    def site_id(self) -> int: ...
    @property
    def config(self) -> PipelineConfig: ...
    @property
    def windows(self) -> tuple[Window, ...]: ...
    @property
    def horizon(self) -> datetime | None: ...
    @property
    def estimate(self) -> Estimate: ...
    @property
    def first_load(self) -> bool: ...
    @property
    def recheck_budget(self) -> int: ...
    @property
    def recheck_credit(self) -> float: ...
    @property
    def phase(self) -> str: ...
    @property
    def defers_details(self) -> bool: ...


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

    @classmethod
    def of(cls, connector) -> "ApiConventions":
        """The conventions of a :class:`~feiqiu_etl.connector.model.Connector`."""
        api = connector.api
        return cls(connector=connector.name, site_param=api.site_param, page_param=api.pagination.page_param,
                   limit_param=api.pagination.limit_param, start_param=api.window.start_param,
                   end_param=api.window.end_param, max_pages=api.pagination.max_pages,
                   first_page=api.pagination.first_page)


@dataclass(frozen=True)
class TaskContext:
    """What every ODS task of one run shares: the database (``dsn``; ``connect`` opens a connection, default
    :func:`feiqiu_etl.db.connection.connect`; with ``health`` every database step survives a lost connection),
    the run id written to every row, the run's cancellation, the connector's request conventions, how many
    failed attempts give an owed detail up, whether a cancel may abort the request in flight, and the
    ``integrity`` rules every listing is reconciled by (issue 25, tasks/ods/reconcile.py)."""

    dsn: str
    run_id: str
    cancellation: CancellationToken
    conventions: ApiConventions = ApiConventions()
    detail_max_attempts: int = 5
    abortable: bool = False
    connect: Callable[[str], psycopg.Connection] | None = None
    health: DatabaseHealth | None = None
    integrity: IntegrityRules = IntegrityRules()


@dataclass(frozen=True)
class LaneAccess:
    """How one task reaches the upstream: the lane's :class:`RequestScheduler` (shared by every store of the
    token), the ``transport`` that performs a request through it, the lane's name (for the result) and the
    task's ``tenant`` (its store's share of the lane: the lane takes turns between tenants)."""

    scheduler: RequestScheduler
    transport: Transport
    name: str | None = None
    tenant: Hashable | None = None
