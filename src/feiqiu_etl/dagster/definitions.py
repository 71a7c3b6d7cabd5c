"""Dagster ``Definitions`` built from a fleet file: one ODS asset per lane (token), partitioned by its stores,
in a concurrency pool of its own; the DWD load downstream; one daily schedule per lane.

What Dagster adds to one ``feiqiu-etl run --fleet`` process (docs/scale-out.md): runs on several machines,
queued and retried by Dagster, while the **pool** keeps each token's lane serial *across* runs and machines —
the pool is named after the lane key (connector name + token fingerprint, never the token), so with a limit of 1
only one step of that token runs at a time, wherever it runs. The PostgreSQL lane guard of the runner stays
underneath as the safety net (per token per database): if a pool has no limit, the second run waits for the
lane there (``wait_for_lane``) instead of failing.

What it must never do: change how a run works. Every materialization is one
:func:`feiqiu_etl.flowcli.execute_in_process` call (recorded in ``etl_meta.run`` like the CLI, resumable,
cancellable with ``feiqiu-etl cancel``); tokens are read from the environment variables the fleet file names,
in the process that runs the step, and never appear in a definition, a log line or metadata.
"""

# no `from __future__ import annotations`: Dagster reads the `context` annotation at definition time
import dataclasses
import logging
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import dagster as dg

from feiqiu_etl.connector.model import ConnectorError, load_connector
from feiqiu_etl.dagster.outcome import Verdict, judge_dwd, judge_ods
from feiqiu_etl.plan.fleet import FleetError, LaneModel, load_fleet
from feiqiu_etl.plan.inputs import RunOptions
from feiqiu_etl.plan.model import Secret

DEFAULT_CRON = "0 3 * * *"
DEFAULT_TIMEZONE = "Asia/Shanghai"
DEFAULT_WAIT_FOR_LANE = 6 * 3600.0
"""Seconds a step waits for the PostgreSQL lane guard when the token's lane is held elsewhere (another
Dagster step whose pool had no limit, or a ``feiqiu-etl run`` outside Dagster) before that lane FAILS busy."""
ODS_GROUP = "feiqiu_ods"
DWD_GROUP = "feiqiu_dwd"
DWD_KEY = dg.AssetKey(["feiqiu", "dwd"])
LANE_TAG = "feiqiu/lane"
_RUN_OPTION_FIELDS = {f.name for f in dataclasses.fields(RunOptions)}
_OWNED_OPTIONS = {"fleet_path", "lanes", "stores", "load_dwd", "dwd_only", "token", "site_ids", "environ",
                  "api_base", "overrides", "unsafe_gaps", "wait_for_lane", "connector_path", "dsn", "dotenv"}


class FleetDefinitionsError(ValueError):
    """The fleet cannot become Dagster definitions (bad fleet or connector file, clashing names, bad
    options); ``str()`` is one line."""


@dataclass(frozen=True)
class FleetSettings:
    """How every materialization of the fleet file at ``fleet_path`` runs.

    ``dsn`` (else ``$ETL_DB_DSN`` when a step runs) is the warehouse; ``api_base``/``connector_path``/
    ``overrides`` (``--set`` keys)/``unsafe_gaps`` are the CLI's; ``wait_for_lane`` (s) is how long a step
    waits for the PostgreSQL lane guard (None: fail at once); ``fail_on_partial`` makes a PARTIAL store fail
    its step; ``run_options`` sets further :class:`~feiqiu_etl.plan.RunOptions` fields (e.g. ``task_codes``,
    ``window_start``/``window_end``, ``timeout``); ``environ`` replaces ``os.environ`` (tokens, settings).
    """

    fleet_path: str
    dsn: str | None = None
    api_base: str | None = None
    connector_path: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    unsafe_gaps: bool = False
    wait_for_lane: float | None = DEFAULT_WAIT_FOR_LANE
    fail_on_partial: bool = False
    run_options: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] | None = None

    def env(self) -> Mapping[str, str]:
        return os.environ if self.environ is None else self.environ

    def options(self, **kw: Any) -> RunOptions:
        """The :class:`RunOptions` of one materialization (``kw``: lanes/stores/load_dwd/dwd_only). Its settings
        are built as the CLI builds them (:func:`feiqiu_etl.config.load_settings`): ``dsn``, ``api_base`` and
        ``overrides`` take the places of ``--dsn``, ``--api-base`` and ``--set``; the step's environment
        (``ETL_DB_DSN``, ``FEIQIU_API_BASE``, ``PIPELINE_*`` …) is read in the same order as the CLI's."""
        return RunOptions(fleet_path=self.fleet_path, api_base=self.api_base, dsn=self.dsn,
                          connector_path=self.connector_path, overrides=dict(self.overrides),
                          unsafe_gaps=self.unsafe_gaps, wait_for_lane=self.wait_for_lane, environ=dict(self.env()),
                          **dict(self.run_options), **kw)


@dataclass(frozen=True)
class DailySchedule:
    """Each lane's daily schedule: ``cron`` in ``timezone``; ``running`` starts the schedules and the DWD
    sensor RUNNING (default STOPPED: switch them on in the Dagster UI)."""

    cron: str = DEFAULT_CRON
    timezone: str = DEFAULT_TIMEZONE
    running: bool = False


def lane_key(connector: str, lane: LaneModel, environ: Mapping[str, str]) -> str | None:
    """The lane key ``<connector>:<token fingerprint>`` (what the PostgreSQL lane guard locks), or None when
    the lane's token is not in ``environ``."""
    token = (environ.get(lane.token_env) or "").strip()
    return f"{connector}:{Secret(token).fingerprint()}" if token else None


def pool_name(connector: str, lane: LaneModel, environ: Mapping[str, str]) -> str:
    """The Dagster concurrency pool of a lane: its lane key with ``_`` for anything but letters and digits
    (Dagster ≤ 1.11 accepts only ``[A-Za-z0-9_]``), e.g. ``feiqiu_99e701939941``. Two lanes (or fleet files, or
    code locations) on the same token share one pool. Without the token in this process's environment the
    pool falls back to ``<connector>_env_<TOKEN_ENV>`` (such a step fails anyway: it has no token)."""
    key = lane_key(connector, lane, environ) or f"{connector}:env:{lane.token_env}"
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def _ident(name: str) -> str:
    return name.replace("-", "_")


def build_definitions(fleet: str | os.PathLike | FleetSettings, *,
                      schedule: DailySchedule = DailySchedule()) -> dg.Definitions:
    """Dagster definitions for a fleet file: ``fleet`` is its path (every other setting at its default) or the
    :class:`FleetSettings` of every materialization; ``schedule`` the lanes' :class:`DailySchedule`.

    * one asset ``feiqiu/ods/<lane>`` per lane, partitioned by its stores (partition key = site id), in the
      pool :func:`pool_name` (named after the lane key); a run of several partitions runs them in one lane,
      fairly interleaved (backfill policy: single run);
    * ``feiqiu/dwd``: the DWD load (``--dwd-only``) downstream of every lane, requested by the automation
      sensor ``feiqiu_dwd_after_ods`` once ODS was updated and no ODS run is in progress;
    * jobs ``feiqiu_ods_<lane>`` and ``feiqiu_dwd``; schedules ``feiqiu_ods_<lane>_daily`` (``schedule.cron`` in
      ``schedule.timezone``, STOPPED unless ``schedule.running``) requesting one run per store.

    Raises :class:`FleetDefinitionsError` (one line) for a bad fleet or connector file, lane names that clash
    once made identifiers, or unknown ``run_options``.
    """
    given = fleet if isinstance(fleet, FleetSettings) else FleetSettings(str(fleet))
    settings = dataclasses.replace(given, fleet_path=str(given.fleet_path), overrides=dict(given.overrides),
                                   run_options=dict(given.run_options))
    fleet_path = settings.fleet_path
    bad = sorted(set(settings.run_options) - _RUN_OPTION_FIELDS) + sorted(set(settings.run_options) & _OWNED_OPTIONS)
    if bad:
        raise FleetDefinitionsError(f"run_options: {bad[0]!r} is not a RunOptions field this module lets you set")
    try:
        fleet = load_fleet(fleet_path)
        connector = load_connector(settings.connector_path)
    except (FleetError, ConnectorError) as exc:
        raise FleetDefinitionsError(str(exc)) from None
    idents = [_ident(lane.name) for lane in fleet.lanes]
    if len(set(idents)) != len(idents):
        raise FleetDefinitionsError(f"{fleet_path}: lane names {', '.join(lane.name for lane in fleet.lanes)} clash "
                                    "once '-' becomes '_' (Dagster names)")
    env = settings.env()
    assets, jobs, schedules = [], [], []
    status = dg.DefaultScheduleStatus.RUNNING if schedule.running else dg.DefaultScheduleStatus.STOPPED
    for lane in fleet.lanes:
        asset = _ods_asset(lane, settings, pool_name(connector.name, lane, env))
        job = dg.define_asset_job(f"feiqiu_ods_{_ident(lane.name)}", selection=[asset],
                                  tags={LANE_TAG: lane.name},
                                  description=f"ODS of lane {lane.name}: one store per partition")
        assets.append(asset)
        jobs.append(job)
        schedules.append(_daily(lane, job, schedule.cron, schedule.timezone, status))
    dwd = _dwd_asset(settings, [a.key for a in assets])
    assets.append(dwd)
    jobs.append(dg.define_asset_job("feiqiu_dwd", selection=[dwd], description="DWD load from what ODS holds"))
    sensor = dg.AutomationConditionSensorDefinition(
        "feiqiu_dwd_after_ods", target=dg.AssetSelection.assets(DWD_KEY),
        default_status=dg.DefaultSensorStatus.RUNNING if schedule.running else dg.DefaultSensorStatus.STOPPED,
        description="Loads DWD once ODS was updated and no ODS run is in progress")
    # one step per run: running it in the run worker itself saves a process per run (and its imports)
    return dg.Definitions(assets=assets, jobs=jobs, schedules=schedules, sensors=[sensor],
                          executor=dg.in_process_executor)


# ------------------------------------------------------------------------------------------------- assets
def _ods_asset(lane: LaneModel, settings: FleetSettings, pool: str) -> dg.AssetsDefinition:
    partitions = dg.StaticPartitionsDefinition([str(s.site_id) for s in lane.stores])
    names = ", ".join(f"{s.site_id} ({s.name})" if s.name else str(s.site_id) for s in lane.stores)
    with warnings.catch_warnings():  # backfill_policy is marked beta; single_run is what a lane wants
        warnings.simplefilter("ignore")

        @dg.asset(key=dg.AssetKey(["feiqiu", "ods", lane.name]), partitions_def=partitions, pool=pool,
                  group_name=ODS_GROUP, backfill_policy=dg.BackfillPolicy.single_run(), kinds={"postgres"},
                  description=f"ODS tables of the stores of lane {lane.name} (token from ${lane.token_env}): "
                              f"{names}. One token = one serial lane: pool {pool} must have limit 1.",
                  metadata={"lane": lane.name, "token_env": lane.token_env, "pool": pool,
                            "stores": len(lane.stores)},
                  op_tags={LANE_TAG: lane.name})
        def _ods(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            sites = [int(k) for k in context.partition_keys]
            _warn_unlimited_pool(context, pool)
            result = _run(context, settings.options(lanes=[lane.name], stores=sites, load_dwd=False),
                          {"asset": f"feiqiu/ods/{lane.name}", "partitions": sites})
            verdict = judge_ods(result, sites, fail_on_partial=settings.fail_on_partial)
            return _report(context, verdict, partitioned=True)

    return _ods


def _dwd_asset(settings: FleetSettings, upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    condition = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())

    @dg.asset(key=DWD_KEY, deps=upstream, group_name=DWD_GROUP, kinds={"postgres"}, automation_condition=condition,
              description="DWD layer (SCD2 dimensions, then facts) loaded from everything ODS holds")
    def _dwd(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        result = _run(context, settings.options(dwd_only=True), {"asset": "feiqiu/dwd"})
        return _report(context, judge_dwd(result), partitioned=False)

    return _dwd


def _daily(lane: LaneModel, job, cron: str, timezone: str, status) -> dg.ScheduleDefinition:
    @dg.schedule(cron_schedule=cron, job=job, execution_timezone=timezone, default_status=status,
                 name=f"feiqiu_ods_{_ident(lane.name)}_daily",
                 description=f"Every store of lane {lane.name}, one run each; the lane's pool runs them one by one")
    def _tick(context: dg.ScheduleEvaluationContext):
        when = context.scheduled_execution_time
        stamp = when.strftime("%Y-%m-%dT%H:%M") if when else "now"
        for store in lane.stores:
            yield dg.RunRequest(run_key=f"{lane.name}:{store.site_id}:{stamp}", partition_key=str(store.site_id),
                                tags={LANE_TAG: lane.name})

    return _tick


# ------------------------------------------------------------------------------------------------ running
def _report(context: dg.AssetExecutionContext, verdict: Verdict, *, partitioned: bool) -> dg.MaterializeResult:
    for line in verdict.warnings:
        context.log.warning(line)
    if verdict.failure:
        raise dg.Failure(description=verdict.failure, metadata=_clean(verdict.totals), allow_retries=False)
    if not partitioned:
        return dg.MaterializeResult(metadata=_clean(verdict.metadata[""]))
    keys = list(context.partition_keys)
    if len(keys) == 1:
        return dg.MaterializeResult(metadata=_clean(verdict.metadata[keys[0]]))
    for key in keys:
        context.add_asset_metadata(_clean(verdict.metadata[key]), partition_key=key)
    return dg.MaterializeResult(metadata=_clean(verdict.totals))


def _clean(meta: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "first_errors":
            out[key] = dg.MetadataValue.md(f"```\n{value}\n```")
        elif key == "feiqiu_run_id":
            out[key] = dg.MetadataValue.text(str(value))
        else:
            out[key] = value
    return out


def _warn_unlimited_pool(context: dg.AssetExecutionContext, pool: str) -> None:
    """Say so when the pool has no limit: the PostgreSQL lane guard then keeps the lane serial."""
    try:
        info = context.instance.event_log_storage.get_concurrency_info(pool)
        limit = info.limit
    except Exception:  # noqa: BLE001 - storage without pool support: same advice
        limit = None
    if limit is None:
        context.log.warning(f"pool {pool} has no limit in this Dagster instance: set concurrency.pools.default_limit: 1 "
                            f"in dagster.yaml (or `dagster instance concurrency set '{pool}' 1`); until then runs of "
                            "this token wait for each other on the PostgreSQL lane guard")


class _ToDagsterLog(logging.Handler):
    """feiqiu_etl warnings and errors into the step's Dagster log (tokens are never logged by the runner)."""

    def __init__(self, context: dg.AssetExecutionContext):
        super().__init__(logging.WARNING)
        self._log = context.log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._log.log(record.levelno, f"{record.name}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - logging must never break the run
            pass


def _run(context: dg.AssetExecutionContext, options: RunOptions, args: dict):
    """One feiqiu-etl run in this process, in a worker thread, so that a Dagster termination (raised in this,
    the main, thread) becomes a graceful cancel: no new requests, what was fetched is written, the run is
    recorded CANCELLED, and then the interruption propagates. A configuration error (no database among them:
    a step never starts an embedded server) is a ``Failure``."""
    import click

    from feiqiu_etl.flowcli import execute_in_process
    from feiqiu_etl.pipeline.cancellation import CancellationToken

    token = CancellationToken(timeout=options.timeout)
    box: dict[str, Any] = {}
    # wait on an Event, not Thread.join(): when a signal handler raises inside join(), CPython before 3.13
    # marks the thread stopped although it still runs (bpo-45274), and the wait for the cancel would end early
    done = threading.Event()
    args = {**args, "dagster_run_id": context.run.run_id}

    def work() -> None:
        try:
            box["result"] = execute_in_process(options, None, token, command="dagster", args=args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the step's thread
            box["error"] = exc
        finally:
            done.set()

    handler = _ToDagsterLog(context)
    logging.getLogger("feiqiu_etl").addHandler(handler)
    threading.Thread(target=work, name="feiqiu-etl-run", daemon=True).start()
    try:
        try:
            while not done.wait(0.2):
                pass
        except BaseException:  # Dagster terminated the run (DagsterExecutionInterruptedError) or Ctrl-C
            token.cancel("dagster")
            context.log.warning("run terminated: cancelling the feiqiu-etl run (fetched data is written first)")
            while not done.wait(0.2):  # a second interruption ends this wait and the process
                pass
            if "result" in box:
                context.log.warning(f"feiqiu-etl run {box['result'].run_id}: {box['result'].status}")
            raise
    finally:
        token.dispose()
        logging.getLogger("feiqiu_etl").removeHandler(handler)
    error = box.get("error")
    if isinstance(error, click.ClickException):  # bad configuration, unreachable database
        raise dg.Failure(description=error.format_message(), allow_retries=False)
    if error is not None:
        raise error
    result = box["result"]
    context.log.info(f"feiqiu-etl run {result.run_id}: {result.status} ({result.totals()})")
    return result
