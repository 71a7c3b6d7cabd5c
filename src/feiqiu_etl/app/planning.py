"""Planning a run: the options validated into inputs (:func:`prepare_inputs`: every configuration error before
the database starts or any request is sent), the database prepared (DDL, vanished runs → INTERRUPTED), the
history read and the plan built (:func:`plan_run`), bounded by the run's database limits (:func:`plan_bounded`).
Raises :mod:`feiqiu_etl.app.errors` only."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import psycopg

from feiqiu_etl.alerts.choice import FROM_ENVIRONMENT
from feiqiu_etl.alerts.config import AlertChoice
from feiqiu_etl.app.database import db_error
from feiqiu_etl.app.errors import CancelledEarly, UsageFailure
from feiqiu_etl.common.lanes import lane_key
from feiqiu_etl.config import ConfigError
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.db.health import DatabaseUnavailable
from feiqiu_etl.formats import iso, use_display_zone
from feiqiu_etl.pipeline.cancellation import CancellationToken

log = logging.getLogger("feiqiu_etl.run")


def prepare_inputs(options):
    """:func:`feiqiu_etl.plan.prepare` with its errors as :class:`UsageFailure`."""
    from feiqiu_etl.plan import prepare

    try:
        inputs = prepare(options)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    use_display_zone(inputs.settings.display.timezone)  # the busy message, the summary: one time zone rule
    return inputs


def plan_run(inputs, conn: psycopg.Connection, *, now=None, alerts: AlertChoice = FROM_ENVIRONMENT):
    """Prepare the database (DDL, vanished runs → INTERRUPTED and alerted to ``alerts``: the run's alert
    configuration, default the environment's), read history and build the plan."""
    from feiqiu_etl.plan import build_plan, read_history
    from feiqiu_etl.runner.flow_runner import prepare_database

    stale = inputs.settings.run.stale_after
    prepare_database(conn, inputs.connector, stale_after=stale, alerts=alerts)
    keys = [(s.code, store.site_id) for lane in inputs.lanes for store in lane.stores for s in lane.specs]
    lanes = [lane_key(inputs.connector.name, lane.token.value) for lane in inputs.lanes]
    history = read_history(conn, inputs.connector.name, keys, lanes)
    return build_plan(inputs, history, now=now)


@dataclass
class Planned:
    """The plan and the warehouse's identity (:func:`feiqiu_etl.registry.late.database_identity`) — or, when the
    database stopped answering while planning, the FAILED ``result`` (exit 7) of a run that never started."""

    plan: Any = None
    database: str | None = None
    result: Any = None


def plan_bounded(inputs, dsn: str, connect: Callable[[str], psycopg.Connection],
                 cancellation: CancellationToken | None, invocation, *, now=None,
                 alerts: AlertChoice = FROM_ENVIRONMENT) -> Planned:
    """:func:`plan_run` with the run's database bounds: on a connection of its own that the database watchdog
    watches, retried after a lost connection (DDL and reads: idempotent), given up after ``db.unavailable_limit``.
    A database that stops answering here ends the run FAILED (exit 7) with its record kept for later
    (:mod:`feiqiu_etl.registry.late`); a cancel meanwhile is :class:`CancelledEarly`; any other database error a
    :class:`UsageFailure` (exit 2), as before."""
    from feiqiu_etl.db.health import DatabaseHealth
    from feiqiu_etl.runner.results import RunResult
    from feiqiu_etl.runner.flow_runner import keep_late_record
    from feiqiu_etl.registry.late import database_identity

    limits = DbLimits.of(inputs.settings.db)
    health = DatabaseHealth(dsn, connect, limits=DbLimits(limits.connect_timeout, limits.unavailable_limit, 1,
                                                          limits.statement_timeout),
                            cancel_event=cancellation.event if cancellation is not None else None)
    out = Planned()
    started = datetime.now(timezone.utc)

    def planning(conn: psycopg.Connection):
        out.database = database_identity(conn)
        return plan_run(inputs, conn, now=now, alerts=alerts)

    try:
        out.plan = health.slot().run(planning)
    except DatabaseUnavailable as exc:
        if cancellation is not None and cancellation.is_cancelled:
            raise CancelledEarly("cancelled while preparing the database; nothing was run") from None
        result = RunResult(invocation.run_id, inputs.connector.name, database_lost=True,
                           error=f"database unavailable while preparing the run: {db_error(exc, dsn)}")
        result.finish(False)
        result.started_at, result.finished_at = iso(started), iso(datetime.now(timezone.utc))
        log.error("%s", result.error)
        keep_late_record(result, invocation, out.database, started_at=started)
        out.result = result
    except psycopg.Error as exc:
        raise UsageFailure(f"cannot prepare the database: {db_error(exc, dsn)}") from None
    finally:
        health.close()
    return out

