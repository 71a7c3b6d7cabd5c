"""From CLI options to a finished run: validate → database → history → plan → :class:`FlowRunner`.

Everything that can be wrong with the configuration (connector, fleet and mapping files, task codes,
pipeline values, gaps below the upstream's minimum, windows) is checked by :func:`feiqiu_etl.plan.prepare`
*before* the database starts or any request is sent; errors become :class:`UsageFailure` (exit 2) with
one line. Signals are honoured at every stage — starting and connecting to the database included — and a
second signal aborts at once (exit 130) after stopping an embedded server this process started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import click
import psycopg

from feiqiu_etl.config import ConfigError
from feiqiu_etl.config.settings import reveal
from feiqiu_etl.db.connection import DEFAULT_CONNECT_TIMEOUT, DbLimits
from feiqiu_etl.db.embedded import DEFAULT_DATABASE
from feiqiu_etl.db.health import DatabaseUnavailable
from feiqiu_etl.errortext import one_line
from feiqiu_etl.formats import iso, use_display_zone
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.common import exitcodes
from feiqiu_etl.common.lanes import lane_key


log = logging.getLogger("feiqiu_etl.run")


class UsageFailure(click.ClickException):
    """One-line configuration error; exit code 2."""

    exit_code = exitcodes.USAGE


class DatabaseLost(click.ClickException):
    """The database went away and did not come back in time (one line; exit code 7)."""

    exit_code = exitcodes.DATABASE_LOST


class CancelledEarly(click.ClickException):
    """Cancelled before the run started (e.g. Ctrl-C while connecting); exit code 5."""

    exit_code = exitcodes.CANCELLED


_HARD_ABORT: list[Callable[[], None]] = []
"""Cleanups a second signal runs before exiting (e.g. stop the embedded server this process started)."""


@contextlib.contextmanager
def _listed(items: list, item: Any) -> Iterator[None]:
    """``item`` is in ``items`` while the body runs."""
    items.append(item)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            items.remove(item)


def on_hard_abort(fn: Callable[[], None]):
    """While the body runs, a second signal runs ``fn`` before exiting."""
    return _listed(_HARD_ABORT, fn)


@contextlib.contextmanager
def signals_cancel(cancellation: CancellationToken) -> Iterator[None]:
    """First SIGINT/SIGTERM → ``cancellation.cancel()`` (graceful); a second one aborts at once (exit 130), after
    running the hard-abort cleanups (the embedded server is stopped; nothing is left running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if cancellation.is_cancelled:
            os.write(2, b"\nsecond signal: aborting now\n")
            logging.disable(logging.CRITICAL)  # no "database not answering" from threads as our server stops
            for cleanup in list(_HARD_ABORT):
                with contextlib.suppress(Exception):
                    cleanup()
            os._exit(exitcodes.HARD_ABORT)
        # Through logging, not a raw write: on a terminal the line prints above the live display (a raw write
        # moved the cursor behind it and left two stale display lines), and --log-format json stays JSON.
        logging.getLogger("feiqiu_etl").warning("cancelling: no new requests; writing what was fetched "
                                                "(signal again to abort)")
        cancellation.cancel("signal")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def database(dsn: str | None, name: str = DEFAULT_DATABASE, *, reader: bool = False,
             prepare: Callable[[str], None] | None = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
             cancellation: CancellationToken | None = None) -> Iterator[str]:
    """``--dsn`` / ``ETL_DB_DSN`` if given, else database ``name`` on an embedded server started here and
    stopped at exit (also on a hard abort): as its superuser, or with ``reader`` as its read-only role
    ``feiqiu_reader``; ``prepare(superuser_dsn)`` runs first on the embedded server only. A server that
    cannot be prepared or started is a ``UsageFailure`` (one line, exit 2) — also one that is running but does
    not answer (frozen): its preparation is given ``connect_timeout`` + :data:`PREPARE_GRACE` s in all; a cancel
    of ``cancellation`` meanwhile ends it at once (:class:`CancelledEarly`, exit 5)."""
    if dsn:
        yield dsn
        return
    from feiqiu_etl.db.embedded import EmbeddedServerError, default_embedded

    try:
        server = default_embedded().start()
    except EmbeddedServerError as exc:
        raise UsageFailure(str(exc)) from None
    try:
        with on_hard_abort(server.abandon), _reviving(server):
            def prepared() -> str:
                real_dsn = server.ensure_database(name, connect_timeout=connect_timeout)
                if prepare is not None:
                    prepare(real_dsn)
                return server.reader_dsn(name, connect_timeout=connect_timeout) if reader else real_dsn

            try:
                real_dsn = bounded(prepared, connect_timeout + PREPARE_GRACE, cancellation,
                                   "cancelled while starting PostgreSQL; nothing was run")
            except TimeoutError:
                raise UsageFailure(f"embedded PostgreSQL is running but does not answer "
                                   f"(not within {connect_timeout + PREPARE_GRACE:g} s): is it stopped "
                                   f"(SIGSTOP) or overloaded?") from None
            except EmbeddedServerError as exc:
                raise UsageFailure(str(exc)) from None
            except psycopg.Error as exc:
                raise UsageFailure(f"embedded PostgreSQL: {one_line(exc, None, with_type=False)}") from None
            yield real_dsn
    finally:
        server.stop()


PREPARE_GRACE = 3.0
"""Seconds the embedded database's preparation (create the database, the reader role) may take beyond one
connect timeout before the server counts as not answering."""


def bounded(work: Callable[[], Any], limit: float, cancellation: CancellationToken | None, cancelled: str) -> Any:
    """``work()`` in a daemon thread, waited for at most ``limit`` s: its result, or its exception re-raised;
    ``TimeoutError`` when it is still busy then (a server that stopped answering: the thread is left behind,
    bounded by its own connect timeout), :class:`CancelledEarly` (``cancelled``) as soon as ``cancellation``
    is cancelled. The waiting thread (the main one) stays free for signals."""
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the waiting thread
            outcome["error"] = exc

    worker = threading.Thread(target=attempt, name="db-bounded", daemon=True)
    worker.start()
    end = time.monotonic() + limit
    while worker.is_alive():
        worker.join(0.1)
        if cancellation is not None and cancellation.is_cancelled and worker.is_alive():
            raise CancelledEarly(cancelled)
        if worker.is_alive() and time.monotonic() >= end:
            raise TimeoutError(f"not done within {limit:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


_REVIVE: list[Any] = []  # embedded servers this process started, while their commands run


def _reviving(server: Any):
    return _listed(_REVIVE, server)


def connector_for(timeout: float, limits=None) -> Callable[[str], psycopg.Connection]:
    """A ``connect(dsn)`` with the configured connect timeout (s) and Asia/Shanghai sessions (with ``limits``, a
    :class:`~feiqiu_etl.db.connection.DbLimits`: the run's session limits and TCP keepalives too). When a
    connection fails and an embedded server this process started has died (kill -9), that server is started
    again first, so ``DatabaseHealth``'s reconnect finds it (the run goes on instead of waiting out
    ``db.unavailable_limit``)."""
    from feiqiu_etl.db.connection import connect

    def open_connection(dsn: str) -> psycopg.Connection:
        try:
            return connect(dsn, connect_timeout=timeout, limits=limits)
        except psycopg.OperationalError:
            revived = False
            for server in list(_REVIVE):
                with contextlib.suppress(Exception):  # a failed restart is one more failed attempt
                    revived = server.revive() or revived
            if not revived:
                raise
            return connect(dsn, connect_timeout=timeout, limits=limits)

    return open_connection


def check_database(dsn: str, cancellation: CancellationToken | None = None, timeout: float = 10.0) -> None:
    """Connect once before any request, within ``timeout`` seconds and cancellable: an unreachable or silent
    database is a one-line error (exit 2); a cancel while connecting ends the command (exit 5)."""
    from feiqiu_etl.db.connection import connect, redact_dsn, scrub

    def attempt() -> int:
        with connect(dsn, connect_timeout=timeout) as conn:
            return conn.info.server_version

    try:
        version = bounded(attempt, timeout + PREPARE_GRACE, cancellation,
                          "cancelled while connecting to PostgreSQL; nothing was run")
    except TimeoutError as exc:
        raise UsageFailure(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {exc}") from None
    except CancelledEarly:
        raise
    except BaseException as error:  # noqa: BLE001 - one line, whatever it is
        reason = scrub(one_line(error, None, with_type=False), dsn)
        raise UsageFailure(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {reason}") from None
    if version < 130000:
        raise UsageFailure(f"PostgreSQL >= 13 is required, the server is {version // 10000}")


def prepare_inputs(options):
    """:func:`feiqiu_etl.plan.prepare` with its errors as :class:`UsageFailure`."""
    from feiqiu_etl.plan import prepare

    try:
        inputs = prepare(options)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    use_display_zone(inputs.settings.display.timezone)  # the busy message, the summary: one time zone rule
    return inputs


def plan_run(inputs, conn: psycopg.Connection, *, now=None):
    """Prepare the database (DDL, vanished runs → INTERRUPTED), read history and build the plan."""
    from feiqiu_etl.plan import build_plan, read_history
    from feiqiu_etl.runner.flow_runner import prepare_database

    stale = inputs.settings.run.stale_after
    prepare_database(conn, inputs.connector, stale_after=stale)
    keys = [(s.code, store.site_id) for lane in inputs.lanes for store in lane.stores for s in lane.specs]
    lanes = [lane_key(inputs.connector.name, lane.token.value) for lane in inputs.lanes]
    history = read_history(conn, inputs.connector.name, keys, lanes)
    return build_plan(inputs, history, now=now)


@dataclass
class _Planned:
    """The plan and the warehouse's identity (:func:`feiqiu_etl.registry.late.database_identity`) — or, when the
    database stopped answering while planning, the FAILED ``result`` (exit 7) of a run that never started."""

    plan: Any = None
    database: str | None = None
    result: Any = None


def plan_bounded(inputs, dsn: str, connect: Callable[[str], psycopg.Connection],
                 cancellation: CancellationToken | None, invocation, *, now=None) -> _Planned:
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
    out = _Planned()
    started = datetime.now(timezone.utc)

    def planning(conn: psycopg.Connection):
        out.database = database_identity(conn)
        return plan_run(inputs, conn, now=now)

    try:
        out.plan = health.slot().run(planning)
    except DatabaseUnavailable as exc:
        if cancellation is not None and cancellation.is_cancelled:
            raise CancelledEarly("cancelled while preparing the database; nothing was run") from None
        result = RunResult(invocation.run_id, inputs.connector.name, database_lost=True,
                           error=f"database unavailable while preparing the run: {_db_error(exc, dsn)}")
        result.finish(False)
        result.started_at, result.finished_at = iso(started), iso(datetime.now(timezone.utc))
        log.error("%s", result.error)
        keep_late_record(result, invocation, out.database, started_at=started)
        out.result = result
    except psycopg.Error as exc:
        raise UsageFailure(f"cannot prepare the database: {_db_error(exc, dsn)}") from None
    finally:
        health.close()
    return out


def execute_flow(options, database_name: str = DEFAULT_DATABASE, *, command: str = "run", args: dict | None = None,
                 progress: bool = True, abortable: bool = True):
    """Validate, start the database if needed (the settings' ``db_dsn``: ``--dsn``, ``$ETL_DB_DSN``, else
    ``database_name`` on the embedded server), plan, and run with signal handling and ``--timeout``.
    Returns the :class:`~feiqiu_etl.runner.results.RunResult` (also of a run that ended because the database
    stopped answering while it was planned: FAILED, exit 7). Raises :class:`UsageFailure`/:class:`CancelledEarly`."""
    from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring
    from feiqiu_etl.registry import Invocation

    inputs = prepare_inputs(options)
    db_timeout = inputs.settings.db.connect_timeout
    connect = connector_for(db_timeout, DbLimits.of(inputs.settings.db))
    cancellation = CancellationToken(timeout=options.timeout)
    invocation = Invocation(command=command, args=args or {})
    try:
        with signals_cancel(cancellation), database(reveal(inputs.settings.db_dsn), database_name,
                                                        connect_timeout=db_timeout, cancellation=cancellation) as real_dsn:  # signals covered until the server stopped
            if cancellation.is_cancelled:
                raise CancelledEarly("cancelled while starting PostgreSQL; nothing was run")
            check_database(real_dsn, cancellation, db_timeout)
            planned = plan_bounded(inputs, real_dsn, connect, cancellation, invocation, now=options.now)
            if planned.result is not None:
                return planned.result
            wiring = RunnerWiring(connect, heartbeat=inputs.settings.run.heartbeat_seconds, abortable=abortable,
                                  database=planned.database)
            runner = FlowRunner(planned.plan, real_dsn, invocation=invocation, cancellation=cancellation,
                                wiring=wiring)
            from feiqiu_etl.report import live_progress

            heartbeat = inputs.settings.progress.heartbeat_seconds
            try:
                with live_progress(runner, enabled=progress, heartbeat=heartbeat):
                    return runner.run()
            except (psycopg.Error, DatabaseUnavailable) as exc:
                raise DatabaseLost(f"database unavailable: {_db_error(exc, real_dsn)}") from None
    finally:
        cancellation.dispose()


def _db_error(exc: BaseException, dsn: str) -> str:
    """The database error on one line, the DSN's password scrubbed."""
    from feiqiu_etl.db.connection import scrub

    return scrub(one_line(exc, with_type=False), dsn)


def execute_in_process(options, dsn: str | None = None, cancellation: CancellationToken | None = None, *,
                       invocation=None, abortable: bool = True, client_factory=None, heartbeat: float | None = None,
                       progress: Callable[[str], None] | None = None):
    """Run in this process against an existing database — ``dsn``, else the settings' ``db_dsn`` (``options.dsn``,
    ``$ETL_DB_DSN``) — with no signal handling, no progress display and no embedded server: what tests and
    orchestrators (Dagster) call. ``invocation`` (:class:`~feiqiu_etl.registry.Invocation`, default: the
    command ``run`` without arguments) is what the run's record says started it. ``progress`` receives the lines
    the CLI prints without a terminal, as they happen (:func:`feiqiu_etl.report.progress_lines`: one per
    finished task, one per ``progress.heartbeat_seconds``). Raises :class:`UsageFailure` for a bad configuration,
    no database or an unreachable one; returns the :class:`~feiqiu_etl.runner.results.RunResult`."""
    from feiqiu_etl.runner.flow_runner import FlowRunner, RunnerWiring
    from feiqiu_etl.registry import Invocation

    inputs = prepare_inputs(options)
    dsn = dsn or reveal(inputs.settings.db_dsn)
    if not dsn:
        raise UsageFailure("no database: set ETL_DB_DSN (or pass a DSN); a run in this process never starts an "
                           "embedded server")
    db_timeout = inputs.settings.db.connect_timeout
    connect = connector_for(db_timeout, DbLimits.of(inputs.settings.db))
    check_database(dsn, cancellation, db_timeout)
    invocation = invocation or Invocation()
    planned = plan_bounded(inputs, dsn, connect, cancellation, invocation, now=options.now)
    if planned.result is not None:
        return planned.result
    kw = {"client_factory": client_factory} if client_factory is not None else {}
    wiring = RunnerWiring(connect, heartbeat=heartbeat or inputs.settings.run.heartbeat_seconds, abortable=abortable,
                          database=planned.database, **kw)
    runner = FlowRunner(planned.plan, dsn, invocation=invocation, cancellation=cancellation, wiring=wiring)
    if progress is None:
        return runner.run()
    from feiqiu_etl.report import progress_lines

    with progress_lines(runner, progress, inputs.settings.progress.heartbeat_seconds):
        return runner.run()
