"""Turn CLI options into a validated :class:`FlowRunner` and run it (shared by ``run`` and ``demo``).

Everything that can be wrong with the configuration (connector file, task codes, pipeline values,
windows) is checked here *before* the database starts or any request is sent; errors become
``UsageFailure`` (exit 2) with one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import click

from feiqiu_etl.config.app_config import AppConfig, ConfigError
from feiqiu_etl.db.embedded import DEFAULT_DATABASE
from feiqiu_etl.pipeline.cancellation import CancellationToken


EXIT_USAGE = 2


class UsageFailure(click.ClickException):
    """One-line configuration error; exit code 2."""

    exit_code = EXIT_USAGE


@contextlib.contextmanager
def signals_cancel(token: CancellationToken) -> Iterator[None]:
    """First SIGINT/SIGTERM → ``token.cancel()`` (graceful); a second one aborts at once (exit 130)."""
    def handler(signum: int, frame: Any) -> None:
        if token.is_cancelled:
            os.write(2, b"\nsecond signal: aborting now\n")
            os._exit(130)
        os.write(2, b"\ncancelling: no new requests; writing what was fetched (signal again to abort)\n")
        token.cancel("signal")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def database(dsn: str | None, name: str = DEFAULT_DATABASE) -> Iterator[str]:
    """``--dsn`` / ``ETL_DB_DSN`` if given, else database ``name`` on an embedded server started here and
    stopped at exit."""
    if dsn:
        yield dsn
        return
    from feiqiu_etl.db.embedded import default_embedded

    server = default_embedded()
    try:
        server.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield server.ensure_database(name)
    finally:
        server.stop()


def window_settings(config: AppConfig, start: str | None, end: str | None, now=None):
    from feiqiu_etl.tasks.ods.task import WindowSettings
    from feiqiu_etl.connector.windows import EARLIEST_WINDOW, Window, fmt, local_now, parse_local

    segment = config.number("window.segment_days", float, minimum=1 / 24, maximum=31)
    lookback = config.number("window.lookback_hours", float, minimum=0, maximum=24 * 366)
    initial = config.number("window.initial_days", float, minimum=0, maximum=3660)
    explicit = None
    if start or end:
        if not (start and end):
            raise UsageFailure("--window-start and --window-end go together")
        try:
            explicit = Window(parse_local(start), parse_local(end))
        except ValueError as exc:
            raise UsageFailure(f"bad window: {exc}") from None
        latest = (now or local_now()) + timedelta(days=366)
        if explicit.start < EARLIEST_WINDOW or explicit.end > latest:
            raise UsageFailure(f"bad window: it must lie between {fmt(EARLIEST_WINDOW)} and a year from now")
    return WindowSettings(explicit=explicit, segment=timedelta(days=segment), lookback=timedelta(hours=lookback),
                          initial=timedelta(days=initial), now=now)



@dataclass
class FlowOptions:
    api_base: str
    token: str
    site_ids: list[int]
    task_codes: list[str] = field(default_factory=list)
    connector_path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    window_start: str | None = None
    window_end: str | None = None
    timeout: float | None = None
    load_dwd: bool = True
    dwd_only: bool = False
    dwd_tables: list[str] = field(default_factory=list)
    environ: dict[str, str] | None = None
    now: Any = None
    progress: bool = True
    strict_env_names: set[str] = field(default_factory=set)
    dwd_full: bool = False  # --dwd-full: merge dimensions by a full compare


def build_runner(options: FlowOptions, dsn: str, token: CancellationToken):
    """Validate ``options`` and return a ready :class:`FlowRunner`. Raises ``UsageFailure``."""
    from feiqiu_etl.connector import ConnectorError, load_connector
    from feiqiu_etl.tasks.flow import FlowRunner

    if not options.api_base.startswith(("http://", "https://")):
        raise UsageFailure(f"--api-base must be an http(s) URL, got {options.api_base!r}")
    try:
        connector = load_connector(options.connector_path)
        config = AppConfig.load(task_codes=[t.code for t in connector.tasks], overrides=options.overrides,
                                environ=options.environ, strict_names=options.strict_env_names)
        windows = window_settings(config, options.window_start, options.window_end, now=options.now)
        return FlowRunner(
            connector=connector, app_config=config, dsn=dsn, api_base=options.api_base, token=options.token,
            site_ids=options.site_ids, task_codes=options.task_codes, windows=windows, cancel_token=token,
            load_dwd=options.load_dwd or options.dwd_only, load_ods=not options.dwd_only,
            dwd_tables=options.dwd_tables or None, logger=logging.getLogger("feiqiu_etl.flow"),
            dwd_full=options.dwd_full,
        )
    except (ConnectorError, ConfigError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise UsageFailure(message) from None


def validate(options: FlowOptions) -> None:
    """Check the configuration without a database (so a bad config fails before anything starts)."""
    build_runner(options, "postgresql://validation-only/", CancellationToken()).client.close()


def check_database(dsn: str) -> None:
    """Connect once before any request; an unreachable database is a configuration error (exit 2)."""
    import psycopg

    from feiqiu_etl.db.connection import connect, redact_dsn, scrub

    try:
        with connect(dsn) as conn:
            version = conn.info.server_version
    except psycopg.Error as exc:
        reason = scrub(" ".join(str(exc).split()) or exc.__class__.__name__, dsn)
        raise UsageFailure(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {reason}") from None
    if version < 130000:
        raise UsageFailure(f"PostgreSQL >= 13 is required, the server is {version // 10000}")


def execute_flow(options: FlowOptions, dsn: str | None, database_name: str = DEFAULT_DATABASE):
    """Validate, start the database if needed, run with signal handling and ``--timeout``."""
    validate(options)
    token = CancellationToken(timeout=options.timeout)
    try:
        with signals_cancel(token), database(dsn, database_name) as real_dsn:  # signals covered until the server stopped
            check_database(real_dsn)
            runner = build_runner(options, real_dsn, token)
            from feiqiu_etl.report import live_progress

            with live_progress(runner.progress, enabled=options.progress):
                return runner.run()
    finally:
        token.dispose()
