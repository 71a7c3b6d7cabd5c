"""The one entry of a run: :func:`run` takes a typed :class:`RunRequest` and returns the
:class:`~feiqiu_etl.runner.results.RunResult`. It validates (every configuration error before the database
starts or any request is sent), prepares the database (the DSN given, the settings' ``db_dsn``, else a database
on the embedded server when the request allows one), reads history, plans and runs, each step bounded, and
raises only :mod:`feiqiu_etl.app.errors`. The CLI (with its signals and live display), Dagster and the tests
all call it; what differs between them is data in the request, not another door."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import psycopg

from feiqiu_etl.alerts.choice import FROM_ENVIRONMENT
from feiqiu_etl.alerts.config import AlertChoice, resolve
from feiqiu_etl.app.database import check_database, connector_for, database, db_error
from feiqiu_etl.app.errors import CancelledEarly, DatabaseLost, UsageFailure
from feiqiu_etl.app.planning import plan_bounded, prepare_inputs
from feiqiu_etl.config.settings import reveal
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.db.embedded import DEFAULT_DATABASE
from feiqiu_etl.db.health import DatabaseUnavailable
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.registry.runs import Invocation

Watch = Callable[[Any, Any], ContextManager[Any]]
"""``watch(runner, settings)``: a context manager that observes the run while it runs (the CLI's live display,
the progress lines of a Dagster step: :mod:`feiqiu_etl.app.progress`); it reads ``runner.statistics()``."""


@dataclass(frozen=True)
class RunRequest:
    """What to run and how.

    ``options`` (:class:`~feiqiu_etl.plan.RunOptions`) say what; ``invocation`` is what the run's record says
    started it (command and redacted arguments). The warehouse is ``dsn``, else the settings' ``db_dsn``
    (``--dsn``, ``$ETL_DB_DSN``), else — only when ``embedded`` names a database — that database on the embedded
    server, started here and stopped at the end; without any, the request is a :class:`UsageFailure`.
    ``cancellation`` stops the run gracefully (the CLI's signals, a Dagster termination, ``--timeout``);
    ``watch`` observes it. ``abortable``, ``client_factory`` and ``heartbeat`` (s) go to the runner's wiring
    (:class:`~feiqiu_etl.runner.flow_runner.RunnerWiring`; None: the defaults and the settings). ``alerts`` is
    where the run's alerts go (the CLI's ``--alerts``, already validated; None: no alerts; default: the
    environment's ``FEIQIU_ALERTS``/``FEIQIU_ALERT_URLS``, read once when the run starts): the run's own, never
    shared with another run of the process."""

    options: Any
    invocation: Invocation = field(default_factory=Invocation)
    dsn: str | None = None
    embedded: str | None = None
    cancellation: CancellationToken | None = None
    watch: Watch | None = None
    abortable: bool = True
    client_factory: Callable[..., Any] | None = None
    heartbeat: float | None = None
    alerts: AlertChoice = FROM_ENVIRONMENT


def run(request: RunRequest):
    """Validate, prepare the database, plan, and run ``request``; the :class:`RunResult` (also of a run that
    ended because the database stopped answering while it was planned: FAILED, exit 7). Raises
    :class:`UsageFailure` (configuration, no or an unreachable database), :class:`CancelledEarly` (cancelled
    before the run started), :class:`DatabaseLost` (the database went away during the run)."""
    from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring

    inputs = prepare_inputs(request.options)
    dsn = request.dsn or reveal(inputs.settings.db_dsn)
    if not dsn and request.embedded is None:
        raise UsageFailure("no database: set ETL_DB_DSN (or pass a DSN); a run in this process never starts an "
                           "embedded server")
    alerts = resolve(request.alerts)
    db_timeout = inputs.settings.db.connect_timeout
    connect = connector_for(db_timeout, DbLimits.of(inputs.settings.db))
    cancellation = request.cancellation
    with database(dsn, request.embedded or DEFAULT_DATABASE, connect_timeout=db_timeout, cancellation=cancellation) as real_dsn:
        if cancellation is not None and cancellation.is_cancelled:
            raise CancelledEarly("cancelled while starting PostgreSQL; nothing was run")
        check_database(real_dsn, cancellation, db_timeout)
        planned = plan_bounded(inputs, real_dsn, connect, cancellation, request.invocation, now=request.options.now,
                               alerts=alerts)
        if planned.result is not None:
            return planned.result
        kw = {"client_factory": request.client_factory} if request.client_factory is not None else {}
        wiring = RunnerWiring(connect, heartbeat=request.heartbeat or inputs.settings.run.heartbeat_seconds,
                              abortable=request.abortable, database=planned.database, alerts=alerts, **kw)
        runner = FlowRunner(planned.plan, real_dsn, invocation=request.invocation, cancellation=cancellation,
                            wiring=wiring)
        watch = request.watch or (lambda _runner, _settings: contextlib.nullcontext())
        try:
            with watch(runner, inputs.settings):
                return runner.run()
        except (psycopg.Error, DatabaseUnavailable) as exc:
            raise DatabaseLost(f"database unavailable: {db_error(exc, real_dsn)}") from None
