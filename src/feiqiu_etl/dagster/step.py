"""Inside a Dagster step: one feiqiu-etl run, its log streamed into Dagster's event log as it happens, and
its outcome turned into what Dagster shows (materialization metadata, ``Failure``, asset check results).

* :func:`run_in_step` runs :func:`feiqiu_etl.app.run.run` in a worker thread, so that a
  Dagster termination (raised in the step's thread) becomes a graceful cancel; its settings come from the
  step's environment exactly as the CLI's (``FleetSettings.options``);
* while it runs, the step's Dagster log gets what the CLI prints without a terminal: a line per finished
  task and a progress line every ``progress.heartbeat_seconds`` (:func:`feiqiu_etl.app.progress.progress_lines`),
  plus the run's warnings and errors — each line escaped (upstream text is data), one event each;
* :func:`materialize_result` builds the ``MaterializeResult`` (per partition metadata) or raises the
  ``Failure`` of a :class:`~feiqiu_etl.dagster.outcome.Verdict`.

What it must never do: log a token or a password (the runner never logs them; the DSN is never shown).
"""

# no `from __future__ import annotations`: Dagster reads annotations of what it decorates
import logging
import threading
from typing import Any, Callable, Mapping

import dagster as dg

from feiqiu_etl.dagster.checks import CheckVerdict
from feiqiu_etl.dagster.outcome import Verdict
from feiqiu_etl.plan.inputs import RunOptions
from feiqiu_etl.textsafe import escape

STATEMENT_TIMEOUT_MS = 30_000
"""Bound of each statement a check runs against the warehouse (ms)."""


class _ToDagsterLog(logging.Handler):
    """feiqiu_etl warnings and errors into the step's Dagster log, escaped (tokens are never logged by the
    runner)."""

    def __init__(self, log: Callable[[int, str], None]):
        super().__init__(logging.WARNING)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._log(record.levelno, escape(f"{record.name}: {record.getMessage()}"))
        except Exception:  # noqa: BLE001 - logging must never break the run
            pass


def run_in_step(context: dg.OpExecutionContext, options: RunOptions, args: dict):
    """One feiqiu-etl run in this process, in a worker thread, so that a Dagster termination (raised in this,
    the main, thread) becomes a graceful cancel: no new requests, what was fetched is written, the run is
    recorded CANCELLED, and then the interruption propagates. Its progress streams into ``context.log`` as it
    happens. A configuration error (no database among them: a step never starts an embedded server) is a
    ``Failure``. Returns the :class:`~feiqiu_etl.runner.results.RunResult`."""
    from feiqiu_etl.app.errors import AppError
    from feiqiu_etl.app.progress import progress_lines
    from feiqiu_etl.app.run import RunRequest, run
    from feiqiu_etl.pipeline.cancellation import CancellationToken
    from feiqiu_etl.registry import Invocation

    cancellation = CancellationToken(timeout=options.timeout)
    box: dict[str, Any] = {}
    # wait on an Event, not Thread.join(): when a signal handler raises inside join(), CPython before 3.13
    # marks the thread stopped although it still runs (bpo-45274), and the wait for the cancel would end early
    done = threading.Event()
    args = {**args, "dagster_run_id": context.run.run_id}

    def progress(line: str) -> None:
        context.log.info(escape(line))

    def watch(runner: Any, settings: Any):
        return progress_lines(runner, progress, settings.progress.heartbeat_seconds)

    def work() -> None:
        try:
            box["result"] = run(RunRequest(options, Invocation(command="dagster", args=args), cancellation=cancellation,
                                           watch=watch))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the step's thread
            box["error"] = exc
        finally:
            done.set()

    handler = _ToDagsterLog(context.log.log)
    logging.getLogger("feiqiu_etl").addHandler(handler)
    threading.Thread(target=work, name="feiqiu-etl-run", daemon=True).start()
    try:
        try:
            while not done.wait(0.2):
                pass
        except BaseException:  # Dagster terminated the run (DagsterExecutionInterruptedError) or Ctrl-C
            cancellation.cancel("dagster")
            context.log.warning("run terminated: cancelling the feiqiu-etl run (fetched data is written first)")
            while not done.wait(0.2):  # a second interruption ends this wait and the process
                pass
            if "result" in box:
                context.log.warning(f"feiqiu-etl run {box['result'].run_id}: {box['result'].status}")
            raise
    finally:
        cancellation.dispose()
        logging.getLogger("feiqiu_etl").removeHandler(handler)
    error = box.get("error")
    if isinstance(error, AppError):  # bad configuration, unreachable database
        raise dg.Failure(description=escape(error.message), allow_retries=False)
    if error is not None:
        raise error
    result = box["result"]
    context.log.info(f"feiqiu-etl run {result.run_id}: {result.status} ({result.totals()})")
    return result


def warn_unlimited_pool(context: dg.OpExecutionContext, pool: str) -> None:
    """Say so when the pool has no limit: the PostgreSQL lane guard then keeps the lane serial."""
    try:
        limit = context.instance.event_log_storage.get_concurrency_info(pool).limit
    except Exception:  # noqa: BLE001 - storage without pool support: same advice
        limit = None
    if limit is None:
        context.log.warning(f"pool {pool} has no limit in this Dagster instance: set "
                            "concurrency.pools.default_limit: 1 in dagster.yaml"
                            f" (or `dagster instance concurrency set '{pool}' 1`); until then runs of "
                            "this token wait for each other on the PostgreSQL lane guard")


def materialize_result(context: dg.AssetExecutionContext, verdict: Verdict, *, partitioned: bool,
                       checks: list[dg.AssetCheckResult] | None = None) -> dg.MaterializeResult:
    """The step's ``MaterializeResult`` (metadata per partition, ``checks`` attached), or the ``Failure`` of a
    failed ``verdict`` (without retries: a rerun is the user's or the schedule's decision)."""
    for line in verdict.warnings:
        context.log.warning(escape(line))
    if verdict.failure:
        raise dg.Failure(description=escape(verdict.failure), metadata=metadata(verdict.totals), allow_retries=False)
    checks = checks or None
    if not partitioned:
        return dg.MaterializeResult(metadata=metadata(verdict.metadata[""]), check_results=checks)
    keys = list(context.partition_keys)
    if len(keys) == 1:
        return dg.MaterializeResult(metadata=metadata(verdict.metadata[keys[0]]), check_results=checks)
    for key in keys:
        context.add_asset_metadata(metadata(verdict.metadata[key]), partition_key=key)
    return dg.MaterializeResult(metadata=metadata(verdict.totals), check_results=checks)


def metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata values as Dagster shows them best (errors and problems as code blocks, the run id as text)."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key in ("first_errors", "problems", "stale_tasks") and isinstance(value, str):
            lines = "\n".join(escape(line).replace("`", "'") for line in value.split("\n"))  # one line each
            out[key] = dg.MetadataValue.md(f"```\n{lines}\n```")
        elif key == "feiqiu_run_id":
            out[key] = dg.MetadataValue.text(str(value))
        elif isinstance(value, str):
            out[key] = escape(value)
        else:
            out[key] = value
    return out


def check_result(asset_key: dg.AssetKey, name: str, verdict: CheckVerdict) -> dg.AssetCheckResult:
    """A :class:`~feiqiu_etl.dagster.checks.CheckVerdict` as Dagster's check result (ERROR when it failed)."""
    return dg.AssetCheckResult(asset_key=asset_key, check_name=name, passed=verdict.passed,
                               description=escape(verdict.description), metadata=metadata(verdict.metadata),
                               severity=dg.AssetCheckSeverity.ERROR)


def warehouse(options: RunOptions):
    """A connection to the warehouse the run of ``options`` writes to — its DSN resolved as the CLI resolves
    it (``dsn`` of the definitions, else ``$ETL_DB_DSN``, from the step's environment), within
    ``db.connect_timeout``, each statement bounded by :data:`STATEMENT_TIMEOUT_MS`. Raises ``dg.Failure``
    (one line) when there is no database or it cannot be reached."""
    import psycopg

    from feiqiu_etl.config import ConfigError
    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.db.connection import redact_dsn, scrub
    from feiqiu_etl.errortext import one_line
    from feiqiu_etl.app.database import connector_for

    try:
        settings = options.settings()
    except ConfigError as exc:
        raise dg.Failure(description=escape(str(exc)), allow_retries=False) from None
    dsn = reveal(settings.db_dsn)
    if not dsn:
        raise dg.Failure(description="no database: set ETL_DB_DSN", allow_retries=False)
    try:
        conn = connector_for(settings.db.connect_timeout)(dsn)
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.commit()
    except psycopg.Error as exc:
        from feiqiu_etl.db.connection import no_answer

        reason = no_answer(exc, settings.db.connect_timeout)
        raise dg.Failure(description=escape(f"{reason} ({redact_dsn(dsn)})" if reason else
                                            f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): "
                                            f"{scrub(one_line(exc, with_type=False), dsn)}"),
                         allow_retries=False) from None
    return conn
