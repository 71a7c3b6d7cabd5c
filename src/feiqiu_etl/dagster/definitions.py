"""Dagster ``Definitions`` built from a fleet file: one ODS asset per lane (token), partitioned by its stores,
in a concurrency pool of its own; the DWD load downstream; one daily schedule per lane.

What Dagster adds to one ``feiqiu-etl run --fleet`` process (docs/scale-out.md): runs on several machines,
queued and retried by Dagster, while the **pool** keeps each token's lane serial *across* runs and machines —
the pool is named after the lane key (connector name + token fingerprint, never the token), so with a limit of 1
only one step of that token runs at a time, wherever it runs. The PostgreSQL lane guard of the runner stays
underneath as the safety net (per token per database): if a pool has no limit, the second run waits for the
lane there (``wait_for_lane``) instead of failing.

What it must never do: change how a run works. Every materialization is one
:func:`feiqiu_etl.app.run.run` call (recorded in ``etl_meta.run`` like the CLI, resumable,
cancellable with ``feiqiu-etl cancel``); tokens are read from the environment variables the fleet file names,
in the process that runs the step, and never appear in a definition, a log line or metadata.
"""

# no `from __future__ import annotations`: Dagster reads the `context` annotation at definition time
import dataclasses
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import dagster as dg

from feiqiu_etl.common import lanes
from feiqiu_etl.connector.model import Connector, ConnectorError, load_connector
from feiqiu_etl.dagster.checks import (COMPLETE, CheckVerdict, fresh_check_name, read_completeness,
                                       read_freshness)
from feiqiu_etl.dagster.outcome import judge_dwd, judge_ods
from feiqiu_etl.dagster.step import check_result, materialize_result, run_in_step, warehouse, warn_unlimited_pool
from feiqiu_etl.plan.fleet import FleetError, FleetModel, LaneModel, load_fleet
from feiqiu_etl.plan.inputs import RunOptions
from feiqiu_etl.plan.fleet import schedule_from_fleet
from feiqiu_etl.registry.freshness import DEFAULT_STALE_HOURS, Schedule

DEFAULT_CRON = "0 3 * * *"
DEFAULT_FRESHNESS_CRON = "15 * * * *"
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
    ``window_start``/``window_end``, ``timeout``); ``environ`` replaces ``os.environ`` (tokens, settings);
    ``stale_hours`` is the freshness checks' threshold (h; the ``freshness`` command's default).
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
    stale_hours: float = DEFAULT_STALE_HOURS

    def env(self) -> Mapping[str, str]:
        return os.environ if self.environ is None else self.environ

    def options(self, **kw: Any) -> RunOptions:
        """The :class:`RunOptions` of one materialization (``kw``: lanes/stores/load_dwd/dwd_only). Its settings
        are built as the CLI builds them (:func:`feiqiu_etl.config.load_settings`): ``dsn``, ``api_base`` and
        ``overrides`` take the places of ``--dsn``, ``--api-base`` and ``--set``; the step's environment
        (``ETL_DB_DSN``, ``FEIQIU_API_BASE``, ``PIPELINE_*`` …) and, without ``environ``, the ``./.env`` of the
        step's working directory (:func:`feiqiu_etl.config.read_dotenv`, as the CLI reads it at start: the
        environment wins, an unknown setting in it is an error) are read in the same order as the CLI's.
        Raises ``dagster.Failure`` (one line) for a ``.env`` the CLI would refuse."""
        from feiqiu_etl.config import ConfigError, DotEnv, read_dotenv
        from feiqiu_etl.textsafe import escape

        env = dict(self.env())
        dotenv = DotEnv()
        if self.environ is None:
            try:
                dotenv = read_dotenv(".env", env)
            except ConfigError as exc:
                raise dg.Failure(description=escape(str(exc)), allow_retries=False) from None
        return RunOptions(fleet_path=self.fleet_path, api_base=self.api_base, dsn=self.dsn,
                          connector_path=self.connector_path, overrides=dict(self.overrides),
                          unsafe_gaps=self.unsafe_gaps, wait_for_lane=self.wait_for_lane, environ=env,
                          dotenv=dotenv, **dict(self.run_options), **kw)


@dataclass(frozen=True)
class DailySchedule:
    """Each lane's daily schedule: ``cron`` in ``timezone``; ``freshness_cron`` when the freshness checks run
    on their own (default hourly, at :15); ``running`` starts the schedules and the DWD sensor RUNNING
    (default STOPPED: switch them on in the Dagster UI)."""

    cron: str = DEFAULT_CRON
    timezone: str = DEFAULT_TIMEZONE
    running: bool = False
    freshness_cron: str = DEFAULT_FRESHNESS_CRON


def lane_key(connector: str, lane: LaneModel, environ: Mapping[str, str]) -> str | None:
    """The lane key ``<connector>:<token fingerprint>`` (what the PostgreSQL lane guard locks), or None when
    the lane's token is not in ``environ``."""
    token = (environ.get(lane.token_env) or "").strip()
    return lanes.lane_key(connector, token) if token else None


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
      ``schedule.timezone``, STOPPED unless ``schedule.running``) requesting one run per store;
    * asset checks on each lane's asset (:mod:`feiqiu_etl.dagster.checks`): ``complete`` (the run's own
      completeness, reported by the step) and ``fresh_<site id>`` per store (run after each materialization
      and by the job ``feiqiu_freshness``, scheduled ``schedule.freshness_cron`` as ``feiqiu_freshness_hourly``).

    Raises :class:`FleetDefinitionsError` (one line) for a bad fleet or connector file, lane names that clash
    once made identifiers, or unknown ``run_options``.
    """
    settings = _settings(fleet)
    fleet, connector, scheduled = _load(settings)
    env = settings.env()
    assets, jobs, schedules, checks = [], [], [], []
    status = dg.DefaultScheduleStatus.RUNNING if schedule.running else dg.DefaultScheduleStatus.STOPPED
    for lane in fleet.lanes:
        asset = _ods_asset(lane, settings, connector, pool_name(connector.name, lane, env))
        fresh = _freshness_checks(lane, asset.key, settings, connector.name, scheduled)
        job = dg.define_asset_job(f"feiqiu_ods_{_ident(lane.name)}",
                                  selection=dg.AssetSelection.assets(asset) | dg.AssetSelection.checks(fresh),
                                  tags={LANE_TAG: lane.name},
                                  description=f"ODS of lane {lane.name}: one store per partition")
        assets.append(asset)
        checks.append(fresh)
        jobs.append(job)
        schedules.append(_daily(lane, job, schedule.cron, schedule.timezone, status))
    dwd = _dwd_asset(settings, [a.key for a in assets])
    assets.append(dwd)
    jobs.append(dg.define_asset_job("feiqiu_dwd", selection=[dwd], description="DWD load from what ODS holds"))
    freshness, hourly = _freshness_job(checks, schedule, status)
    jobs.append(freshness)
    schedules.append(hourly)
    sensor = dg.AutomationConditionSensorDefinition(
        "feiqiu_dwd_after_ods", target=dg.AssetSelection.assets(DWD_KEY),
        default_status=dg.DefaultSensorStatus.RUNNING if schedule.running else dg.DefaultSensorStatus.STOPPED,
        description="Loads DWD once ODS was updated and no ODS run is in progress")
    # one step per run: running it in the run worker itself saves a process per run (and its imports)
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs, schedules=schedules, sensors=[sensor],
                          executor=dg.in_process_executor)


def _settings(fleet: str | os.PathLike | FleetSettings) -> FleetSettings:
    """``fleet`` as :class:`FleetSettings` of plain values (a path string, dicts); raises
    :class:`FleetDefinitionsError` for ``run_options`` that are not RunOptions fields or are this module's own."""
    given = fleet if isinstance(fleet, FleetSettings) else FleetSettings(str(fleet))
    settings = dataclasses.replace(given, fleet_path=str(given.fleet_path), overrides=dict(given.overrides),
                                   run_options=dict(given.run_options))
    bad = sorted(set(settings.run_options) - _RUN_OPTION_FIELDS) + sorted(set(settings.run_options) & _OWNED_OPTIONS)
    if bad:
        raise FleetDefinitionsError(f"run_options: {bad[0]!r} is not a RunOptions field this module lets you set")
    return settings


def _load(settings: FleetSettings) -> tuple[FleetModel, Connector, Schedule]:
    """The fleet, the connector and the fleet's task schedule; raises :class:`FleetDefinitionsError` (one line)
    for a bad fleet or connector file, or lane names that clash once made Dagster identifiers."""
    fleet_path = settings.fleet_path
    try:
        fleet = load_fleet(fleet_path)
        connector = load_connector(settings.connector_path)
        scheduled = schedule_from_fleet(fleet_path, [t.code for t in connector.tasks])
    except (FleetError, ConnectorError) as exc:
        raise FleetDefinitionsError(str(exc)) from None
    idents = [_ident(lane.name) for lane in fleet.lanes]
    if len(set(idents)) != len(idents):
        raise FleetDefinitionsError(f"{fleet_path}: lane names {', '.join(lane.name for lane in fleet.lanes)} clash "
                                    "once '-' becomes '_' (Dagster names)")
    return fleet, connector, scheduled


def _freshness_job(checks: list[dg.AssetChecksDefinition], schedule: DailySchedule,
                   status: dg.DefaultScheduleStatus) -> tuple[Any, dg.ScheduleDefinition]:
    """The job ``feiqiu_freshness`` running every store's freshness ``checks`` on their own, and its schedule
    ``feiqiu_freshness_hourly`` (``schedule.freshness_cron`` in ``schedule.timezone``)."""
    freshness = dg.define_asset_job("feiqiu_freshness", selection=dg.AssetSelection.checks(*checks),
                                    description="The freshness checks of every store, on their own")
    return freshness, dg.ScheduleDefinition(name="feiqiu_freshness_hourly", job=freshness,
                                            cron_schedule=schedule.freshness_cron,
                                            execution_timezone=schedule.timezone, default_status=status,
                                            description="Every store's freshness checks (stale data shows even "
                                                        "when no run comes)")


# ------------------------------------------------------------------------------------------------- assets
def _ods_asset(lane: LaneModel, settings: FleetSettings, connector: Connector, pool: str) -> dg.AssetsDefinition:
    key = dg.AssetKey(["feiqiu", "ods", lane.name])
    partitions = dg.StaticPartitionsDefinition([str(s.site_id) for s in lane.stores])
    names = ", ".join(f"{s.site_id} ({s.name})" if s.name else str(s.site_id) for s in lane.stores)
    snapshots = {t.code for t in connector.tasks if t.is_snapshot}
    complete = dg.AssetCheckSpec(COMPLETE, asset=key, description=(
        "The run's own completeness: every planned window segment finished (all pages and details committed), "
        "every snapshot completed, no planned task left unstarted, no owed detail given up"))
    with warnings.catch_warnings():  # backfill_policy is marked beta; single_run is what a lane wants
        warnings.simplefilter("ignore")

        @dg.asset(key=key, partitions_def=partitions, pool=pool, check_specs=[complete],
                  group_name=ODS_GROUP, backfill_policy=dg.BackfillPolicy.single_run(), kinds={"postgres"},
                  description=f"ODS tables of the stores of lane {lane.name} (token from ${lane.token_env}): "
                              f"{names}. One token = one serial lane: pool {pool} must have limit 1.",
                  metadata={"lane": lane.name, "token_env": lane.token_env, "pool": pool,
                            "stores": len(lane.stores)},
                  op_tags={LANE_TAG: lane.name})
        def _ods(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            sites = [int(k) for k in context.partition_keys]
            warn_unlimited_pool(context, pool)
            options = settings.options(lanes=[lane.name], stores=sites, load_dwd=False)
            result = run_in_step(context, options, {"asset": f"feiqiu/ods/{lane.name}", "partitions": sites})
            verdict = judge_ods(result, sites, fail_on_partial=settings.fail_on_partial)
            checks = []
            if not verdict.failure and dg.AssetCheckKey(key, COMPLETE) in context.selected_asset_check_keys:
                checks.append(check_result(key, COMPLETE, _read(
                    options, lambda conn: read_completeness(conn, connector.name, result, sites, snapshots))))
            return materialize_result(context, verdict, partitioned=True, checks=checks)

    return _ods


def _freshness_checks(lane: LaneModel, key: dg.AssetKey, settings: FleetSettings, connector: str,
                      scheduled: Schedule) -> dg.AssetChecksDefinition:
    """``fresh_<site id>`` for every store of ``lane`` (one op; a run may select some of them)."""
    sites = [s.site_id for s in lane.stores]
    specs = [dg.AssetCheckSpec(fresh_check_name(site), asset=key, description=(
        f"Store {site}: every task it is scheduled for has data newer than {settings.stale_hours:g} h "
        "(the rule of `feiqiu-etl freshness`)")) for site in sites]

    @dg.multi_asset_check(specs=specs, can_subset=True, name=f"feiqiu_freshness_{_ident(lane.name)}",
                          description=f"Freshness of the stores of lane {lane.name}")
    def _fresh(context: dg.AssetCheckExecutionContext):
        selected = {k.name for k in context.selected_asset_check_keys}
        options = settings.options(lanes=[lane.name], load_dwd=False)
        verdicts = _read(options, lambda conn: read_freshness(conn, connector, scheduled, sites,
                                                                settings.stale_hours))
        for site in sites:
            name = fresh_check_name(site)
            if name in selected:
                yield check_result(key, name, verdicts if isinstance(verdicts, CheckVerdict) else verdicts[site])

    return _fresh


def _read(options: RunOptions, read):
    """``read(conn)`` on the warehouse of ``options``; a database that cannot be read is a failed check with the
    reason, not a failed step (the data may be fine: the check could not tell)."""
    import psycopg

    try:
        with warehouse(options) as conn:
            return read(conn)
    except dg.Failure as exc:
        return CheckVerdict(False, f"could not check: {exc.description}")
    except psycopg.Error as exc:
        from feiqiu_etl.errortext import one_line

        return CheckVerdict(False, f"could not check: {one_line(exc, with_type=False)}")


def _dwd_asset(settings: FleetSettings, upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    condition = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())

    @dg.asset(key=DWD_KEY, deps=upstream, group_name=DWD_GROUP, kinds={"postgres"}, automation_condition=condition,
              description="DWD layer (SCD2 dimensions, then facts) loaded from everything ODS holds")
    def _dwd(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        result = run_in_step(context, settings.options(dwd_only=True), {"asset": "feiqiu/dwd"})
        return materialize_result(context, judge_dwd(result), partitioned=False)

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
