"""Validate everything a run is given — once — before the database starts or any request is sent.

:class:`RunOptions` is what a caller (the CLI, Dagster, a test) asks for; :func:`prepare` turns it into
:class:`PlanInputs`: the connector, the typed :class:`~feiqiu_etl.config.Settings`, one :class:`LaneInput` per
token with its stores and per-task :class:`PipelineConfig`, window settings and the DWD selection. Every problem
is a :class:`~feiqiu_etl.config.ConfigError` with one line (the CLI exits 2). No I/O but reading the
connector, fleet and DWD mapping files.

The safety rule of upstream-api.md §2.2 lives here: a configured gap below the documented minimum of its
endpoint class is refused unless ``unsafe_gaps`` is set on purpose (tests and the demo against a simulator
started with tiny gaps).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

from feiqiu_etl.api.retry import RetryPolicy
from feiqiu_etl.api.tokens import token_problem
from feiqiu_etl.api.urls import base_url_problem
from feiqiu_etl.config import ConfigError, DotEnv, Settings, load_settings
from feiqiu_etl.config.settings import reveal
from feiqiu_etl.connector.model import Connector, ConnectorError, load_connector
from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import EARLIEST_WINDOW, Window, fmt, local_now, parse_local
from feiqiu_etl.pipeline.config import PipelineConfig
from feiqiu_etl.plan.fleet import FleetError, FleetModel, load_fleet, resolve_tokens
from feiqiu_etl.plan.model import DwdPlan, Secret, StorePlan, WindowSettings

DEFAULT_LANE = "default"
TOKEN_ENV = "FEIQIU_API_TOKEN"
MAX_TIMEOUT = 30 * 86400.0


@dataclass
class RunOptions:
    """What a run is asked to do (unvalidated). Single-token runs give ``site_ids`` (the token comes from
    ``token`` or ``$FEIQIU_API_TOKEN``); fleet runs give ``fleet_path`` (tokens come from the environment
    variables it names) and may filter it with ``lanes``/``stores``. ``api_base``, ``token``, ``dsn`` and
    ``flags`` (``{dotted key: value}``, e.g. ``{"pipeline.rate_min": "6"}``) are the dedicated flags' layer,
    ``overrides`` the ``--set`` layer; ``environ`` (default ``os.environ``) holds the environment layer and
    ``dotenv`` says which of its names a ``.env`` file set (:func:`feiqiu_etl.config.load_settings`).
    ``backfill`` with ``backfill_from``/``backfill_to`` (dates, both days included) re-fetches that range of the
    windowed tasks, finished or not, and nothing else (:func:`backfill_window`)."""

    api_base: str | None = None
    token: str | None = None
    site_ids: list[int] = field(default_factory=list)
    fleet_path: str | None = None
    lanes: list[str] = field(default_factory=list)
    stores: list[int] = field(default_factory=list)
    task_codes: list[str] = field(default_factory=list)
    connector_path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    dsn: str | None = None
    window_start: str | None = None
    window_end: str | None = None
    backfill: bool = False
    backfill_from: str | None = None
    backfill_to: str | None = None
    timeout: float | None = None
    load_dwd: bool = True
    dwd_only: bool = False
    dwd_tables: list[str] = field(default_factory=list)
    dwd_full: bool = False
    unsafe_gaps: bool = False
    wait_for_lane: float | None = None
    environ: Mapping[str, str] | None = None
    now: datetime | None = None
    dotenv: DotEnv = DotEnv()

    def settings(self, connector: Connector | None = None, fleet: FleetModel | None = None) -> Settings:
        """The run's :class:`~feiqiu_etl.config.Settings` from every layer. Raises :class:`ConfigError`."""
        named = {"api_base": self.api_base, "api_token": self.token, "db_dsn": self.dsn}
        return load_settings(connector=connector, environ=self.environ, dotenv=self.dotenv, sets=self.overrides,
                             flags={**self.flags, **named}, fleet_base=fleet.api_base if fleet else None)


@dataclass(frozen=True)
class LaneInput:
    """A validated lane: token, base URL, stores, its layered settings and each task's pipeline settings."""

    name: str
    token: Secret
    token_source: str
    api_base: str
    stores: tuple[StorePlan, ...]
    specs: tuple[OdsTaskSpec, ...]
    configs: Mapping[str, PipelineConfig]
    settings: Settings


@dataclass(frozen=True)
class PlanInputs:
    """Everything validated; what :func:`feiqiu_etl.plan.builder.build_plan` needs besides history."""

    connector: Connector
    settings: Settings
    lanes: tuple[LaneInput, ...]
    windows: WindowSettings
    load_ods: bool
    dwd: DwdPlan | None
    dwd_mapping: Any
    timeout: float | None
    wait_for_lane: float | None
    unsafe_gaps: bool

    @property
    def stores(self) -> tuple[int, ...]:
        return tuple(s.site_id for lane in self.lanes for s in lane.stores)

    @property
    def api_timeout(self) -> float:
        """HTTP timeout per request, s (``api.timeout``; default: the connector's)."""
        return self.settings.api.timeout

    @property
    def connect_timeout(self) -> float:
        """HTTP connect timeout, s: ``api.connect_timeout``, at most :attr:`api_timeout`."""
        return min(self.settings.api.timeout, self.settings.api.connect_timeout)

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(attempts=self.settings.api.retry_attempts, base=self.settings.api.retry_backoff)


def prepare(options: RunOptions) -> PlanInputs:
    """Validate ``options``. Raises :class:`ConfigError` (one line) for anything wrong."""
    try:
        connector = load_connector(options.connector_path)
        fleet = load_fleet(options.fleet_path) if options.fleet_path else None
    except (ConnectorError, FleetError) as exc:
        raise ConfigError(str(exc)) from None
    settings = options.settings(connector, fleet)
    if options.dwd_only and not options.load_dwd:
        raise ConfigError("--no-dwd and --dwd-only exclude each other")
    if options.timeout is not None and not 0 < options.timeout <= MAX_TIMEOUT:
        raise ConfigError(f"--timeout must be > 0 and <= {MAX_TIMEOUT:g} seconds, got {options.timeout:g}")
    if options.wait_for_lane is not None and not 0 <= options.wait_for_lane <= MAX_TIMEOUT:
        raise ConfigError(f"--wait-for-lane must be >= 0 and <= {MAX_TIMEOUT:g} seconds")
    load_ods = not options.dwd_only
    try:
        specs = connector.select(options.task_codes or None)
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    start, end = options.window_start, options.window_end
    if options.backfill or options.backfill_from or options.backfill_to:
        start, end = backfill_window(options)
        specs = tuple(s for s in specs if s.kind == "windowed")
        if not specs:
            raise ConfigError("--backfill re-fetches windowed tasks; none of the selected tasks has windows "
                              "(a snapshot is fetched whole by every run)")
    windows = window_settings(settings, start, end, now=options.now)
    lanes = _lanes(options, connector, settings, specs, fleet) if load_ods else ()
    dwd = None
    mapping = None
    if options.load_dwd or options.dwd_only:
        mapping = _dwd_mapping(connector, options.dwd_tables)
        dwd = DwdPlan(tuple(options.dwd_tables) or None, settings.dwd.parallel_workers, options.dwd_full)
    return PlanInputs(connector=connector, settings=settings, lanes=lanes, windows=windows, load_ods=load_ods,
                      dwd=dwd, dwd_mapping=mapping, timeout=options.timeout, wait_for_lane=options.wait_for_lane,
                      unsafe_gaps=options.unsafe_gaps)


def window_settings(settings: Settings, start: str | None, end: str | None,
                    now: datetime | None = None) -> WindowSettings:
    """``--window-start/--window-end`` and the ``window.*`` settings. Raises :class:`ConfigError`."""
    explicit = None
    if start or end:
        if not (start and end):
            raise ConfigError("--window-start and --window-end go together")
        bounds = []
        for flag, text in (("--window-start", start), ("--window-end", end)):
            try:
                bounds.append(parse_local(text))
            except ValueError as exc:
                raise ConfigError(f"{flag}: {exc}") from None
        try:
            explicit = Window(*bounds)
        except ValueError as exc:
            raise ConfigError(f"bad window: {exc}") from None
        latest = (now or local_now()) + timedelta(days=366)
        if explicit.start < EARLIEST_WINDOW or explicit.end > latest:
            raise ConfigError(f"bad window: it must lie between {fmt(EARLIEST_WINDOW)} and a year from now")
    w = settings.window
    return WindowSettings(explicit=explicit, segment=timedelta(days=w.segment_days),
                          lookback=timedelta(hours=w.lookback_hours), initial=timedelta(days=w.initial_days), now=now)


def backfill_window(options: RunOptions) -> tuple[str, str]:
    """``--backfill --from DATE --to DATE`` as the explicit window ``[from 00:00, to + 1 day 00:00)``
    (Asia/Shanghai): an explicit window is fetched whole whatever is finished, records its segments and leaves
    the horizon and every other window alone. Raises :class:`ConfigError` (one line)."""
    from feiqiu_etl.connector.windows import day_range

    if not options.backfill:
        raise ConfigError("--from/--to go with --backfill (run --backfill --from DATE --to DATE)")
    if options.window_start or options.window_end:
        raise ConfigError("--backfill takes --from/--to dates, not --window-start/--window-end")
    if options.dwd_only:
        raise ConfigError("--backfill fetches ODS; --dwd-only sends no request")
    if not (options.backfill_from and options.backfill_to):
        raise ConfigError("--backfill needs --from DATE and --to DATE (YYYY-MM-DD, both days included)")
    try:
        first, end = day_range(options.backfill_from, options.backfill_to)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return fmt(first), fmt(end)


def _lanes(options: RunOptions, connector: Connector, settings: Settings, specs: tuple[OdsTaskSpec, ...],
           fleet: FleetModel | None) -> tuple[LaneInput, ...]:
    if fleet is not None:
        if options.site_ids:  # whether or not a single token is set too
            raise ConfigError("--fleet and --site-id exclude each other (put the store in the fleet file, or pick "
                              "stores of it with --stores)")
        return _fleet_lanes(options, connector, settings, specs, fleet)
    if options.lanes or options.stores:
        raise ConfigError("--lanes and --stores filter a --fleet file")
    base = _api_base(settings.api_base)
    token = reveal(settings.api_token)
    if not token:
        raise ConfigError(f"no API token: set {TOKEN_ENV} or pass --token")
    if problem := token_problem(token):
        raise ConfigError(f"the API token ({TOKEN_ENV} or --token) {problem}")
    if not options.site_ids:
        raise ConfigError("at least one --site-id is required")
    stores = tuple(StorePlan(_site(s)) for s in dict.fromkeys(options.site_ids))
    configs = _configs(DEFAULT_LANE, settings, specs, connector, options.unsafe_gaps)
    return (LaneInput(DEFAULT_LANE, Secret(token), TOKEN_ENV, base, stores, specs, configs, settings),)


def _fleet_lanes(options: RunOptions, connector: Connector, settings: Settings, specs: tuple[OdsTaskSpec, ...],
                 fleet: FleetModel) -> tuple[LaneInput, ...]:
    try:
        chosen = [lane for lane in fleet.lanes if not options.lanes or lane.name in options.lanes]
        unknown = set(options.lanes) - {lane.name for lane in fleet.lanes}
        if unknown:
            raise ConfigError(f"--lanes: no lane {sorted(unknown)[0]!r} in {options.fleet_path} "
                              f"(lanes: {', '.join(lane.name for lane in fleet.lanes)})")
        known_sites = {s.site_id for lane in chosen for s in lane.stores}
        missing = set(options.stores) - known_sites
        if missing:
            raise ConfigError(f"--stores: store {sorted(missing)[0]} is in no selected lane of {options.fleet_path}")
        environ = os.environ if options.environ is None else options.environ
        tokens = resolve_tokens(fleet.__class__(api_base=fleet.api_base, lanes=chosen), environ, options.fleet_path)
        seen: dict[str, Any] = {}
        for lane in chosen:  # the upstream bans a token, not a lane: one token must be one serial lane
            other = seen.setdefault(tokens[lane.name], lane)
            if other is not lane:
                raise FleetError(f"{options.fleet_path}: lanes {other.name} (${other.token_env}) and {lane.name} "
                                 f"(${lane.token_env}) hold the same token; one token is one lane: put their "
                                 "stores in one lane")
    except FleetError as exc:
        raise ConfigError(str(exc)) from None
    out = []
    for lane in chosen:
        stores = tuple(StorePlan(s.site_id, s.name) for s in lane.stores
                       if not options.stores or s.site_id in options.stores)
        if not stores:
            continue
        lane_specs = specs
        if lane.tasks:
            try:
                lane_specs = tuple(s for s in connector.select(lane.tasks) if s in specs)
            except KeyError as exc:
                raise ConfigError(f"{options.fleet_path}: lane {lane.name}: {exc.args[0]}") from None
        try:
            lane_settings = settings.for_lane(lane.name, _lane_keys(lane.pipeline, options.fleet_path, lane.name),
                                              lane.api_base, lane.deadline)
            configs = _configs(lane.name, lane_settings, lane_specs, connector, options.unsafe_gaps)
        except ConfigError as exc:
            if not lane.pipeline or str(exc).startswith(str(options.fleet_path)):
                raise
            index = fleet.lanes.index(lane)
            raise ConfigError(f"{options.fleet_path}: lanes[{index}] ({lane.name}).pipeline: {exc}") from None
        base = _api_base(lane_settings.api_base, where=f"lane {lane.name}")
        out.append(LaneInput(lane.name, Secret(tokens[lane.name]), lane.token_env, base, stores, lane_specs, configs,
                             lane_settings))
    if not out:
        raise ConfigError("--lanes/--stores selected no store")
    return tuple(out)


def _lane_keys(pipeline: Mapping[str, Any], path: str | None, lane: str) -> dict[str, Any]:
    keys = {}
    for key, value in pipeline.items():
        dotted = key if key.startswith("pipeline.") else f"pipeline.{key}"
        if dotted.count(".") == 1 and dotted.split(".")[1] not in PipelineConfig.keys():
            raise ConfigError(f"{path}: lane {lane}: pipeline.{key}: unknown key; allowed: "
                              f"{', '.join(PipelineConfig.keys())} or <task_code>.<key>")
        keys[dotted] = value
    return keys


def _configs(lane: str, settings: Settings, specs: tuple[OdsTaskSpec, ...], connector: Connector,
             unsafe: bool) -> dict[str, PipelineConfig]:
    """Each task's pipeline settings; a gap below the upstream's minimum is refused unless ``unsafe``."""
    configs = {}
    for spec in specs:
        configs[spec.code] = settings.pipeline_config(spec.code)
        unsafe_gap = gap_below_minimum(settings, spec, connector, lane)
        if unsafe_gap and not unsafe:
            raise ConfigError(f"{unsafe_gap[1]}; raise it, or pass --unsafe-gaps on purpose (e.g. against a "
                              "simulator started with tiny gaps)")
    return configs


def gap_below_minimum(settings: Settings, spec: OdsTaskSpec, connector: Connector,
                      lane: str = DEFAULT_LANE) -> tuple[str, str] | None:
    """``(key, sentence)`` when the task's effective ``rate_min`` (s) is below the upstream's minimum gap for
    its gap class (docs/upstream-api.md §2.2): the key that set it and why ``run``/``plan`` refuse it without
    ``--unsafe-gaps``; None when it is safe."""
    rate_min, key, source = settings.resolve(spec.code, "rate_min")
    minimum = connector.min_gap(spec.gap_class)
    if rate_min >= minimum:
        return None
    if source == "connector":
        key = f"connector {spec.code}.pipeline.rate_min"
    where = "" if lane == DEFAULT_LANE or f"lane {lane}" in source else f" (lane {lane})"
    return key, (f"{key} = {rate_min:g} s ({source}){where} is below the upstream's minimum gap of {minimum:g} s "
                 f"for {spec.gap_class} endpoints such as {spec.code} (docs/upstream-api.md §2.2)")


def _api_base(base: str | None, where: str = "") -> str:
    if not base:
        raise ConfigError(f"no API base URL{' for ' + where if where else ''}: set FEIQIU_API_BASE or pass --api-base")
    problem = base_url_problem(base)
    if problem:
        from feiqiu_etl.textsafe import redact_url

        raise ConfigError(f"--api-base {problem}, got {redact_url(base)!r}")
    return base


def _site(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**53:
        raise ConfigError(f"--site-id must be a positive integer below 2^53, got {value!r}")
    return value


def _dwd_mapping(connector: Connector, tables: list[str]):
    """Load and check the DWD mapping and ``tables`` up front (raises ``ConfigError``)."""
    from feiqiu_etl.connector.dwd_mapping import DwdMappingError, load_dwd_mapping

    path = connector.dwd_mapping_path()
    if path is None:
        raise ConfigError(f"connector {connector.name} has no dwd_mapping; use --no-dwd")
    try:
        mapping = load_dwd_mapping(path)
        mapping.select(tables or None)
    except (DwdMappingError, ValueError, KeyError) as exc:
        raise ConfigError(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)) from None
    return mapping
