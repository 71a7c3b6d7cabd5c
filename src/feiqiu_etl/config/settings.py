"""The settings model: every setting of feiqiu-etl, its bounds, its layers and where each value came from.

One :class:`Settings` (pydantic-settings) is built by :func:`load_settings` — the one way the CLI, ``plan``,
the Dagster steps and the web server build it — from these layers, lowest precedence first (:class:`Source`
is the order, written once):

===========  =========================================================================================
default      the built-in defaults declared on the fields below
connector    the connector file: each task's ``pipeline:`` defaults (e.g. the 8.5 s group-buy gap),
             ``api.timeout`` (its ``timeout_seconds``) and ``integrity.*`` (its ``integrity:``)
fleet file   a fleet file's top-level ``api_base``
.env         variables a ``.env`` file put into the environment (the real environment wins)
environment  the real environment
--set        ``--set KEY=VALUE``
flag         the dedicated flags (``--pipeline-rate-min`` …, ``--api-base``, ``--token``, ``--dsn``)
fleet lane   a fleet lane's ``pipeline:`` settings and ``api_base`` (that lane only)
===========  =========================================================================================

Pipeline keys have a second dimension, how specific they are: a task-level key
(``pipeline.<task_code>.<key>``, from any layer; the connector's task defaults are task-level values of the
connector layer) beats the global key (``pipeline.<key>``), which beats the built-in default
(:meth:`Settings.resolve`, the only place that rule is written).

Every value of every layer is validated when it is read — also one that a higher layer overrides (a bad
``--set`` under a flag is still an error) — against the bounds declared on its field; a problem is one line
(:class:`ConfigError`). Environment names (spec §4.1): ``PIPELINE_WORKERS`` → ``pipeline.workers``;
``PIPELINE_ODS_GROUP_PACKAGE.RATE_MIN`` or ``PIPELINE_ODS_GROUP_PACKAGE__RATE_MIN`` →
``pipeline.ods_group_package.rate_min``; ``DWD_PARALLEL_WORKERS`` → ``dwd.parallel_workers``; plus the named
variables ``FEIQIU_API_TOKEN``, ``FEIQIU_API_BASE``, ``ETL_DB_DSN``, ``FEIQIU_WEB_TOKEN`` and
``FEIQIU_ETL_HOME``. Secrets (the API token, the DSN with its password, the web token) are ``SecretStr``.
The sections of the model (``pipeline.*``, ``integrity.*`` …: fields, defaults, bounds) are declared in
:mod:`feiqiu_etl.config.sections` and re-exported here.
"""

from __future__ import annotations

import enum
import logging
import os
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from feiqiu_etl.config.dotenv import DotEnv
from feiqiu_etl.config.errors import ConfigError
from feiqiu_etl.config.sections import (ApiSection, DbSection, DetailSection, DisplaySection, DwdSection,
                                        IntegritySection, LaneSection, PipelineKeys, PipelineSection,
                                        ProgressSection, RunSection, SqlSection, StateSection, WebSection,
                                        WindowSection)
from feiqiu_etl.pipeline.config import PipelineConfig

__all__ = ["ApiSection", "DbSection", "DetailSection", "DisplaySection", "DwdSection", "GLOBAL_KEYS",
           "IntegritySection", "Layer", "LaneSection", "NAMED", "PipelineKeys", "PipelineSection",
           "ProgressSection", "READ_ELSEWHERE", "Resolved", "RunSection", "Settings", "Source", "SqlSection",
           "StateSection", "WebSection", "WindowSection", "env_to_key", "flags", "load_settings", "read_layer",
           "reveal"]


class Source(enum.IntEnum):
    """Where a value came from, lowest precedence first: the override order between layers."""

    DEFAULT = 0
    CONNECTOR = 1
    FLEET = 2
    DOTENV = 3
    ENVIRONMENT = 4
    SET = 5
    FLAG = 6
    LANE = 7

    @property
    def label(self) -> str:
        """What ``config show`` prints (a lane's layer adds its name: ``fleet lane north``)."""
        return {"DOTENV": ".env", "SET": "--set", "FLEET": "fleet file", "LANE": "fleet lane"}.get(
            self.name, self.name.lower())


# --------------------------------------------------------------------------------------------- the model
def _named(env: str, flag: str | None = None) -> dict:
    return {"env": env, "flag": flag}


class Settings(BaseSettings):
    """Every effective setting, typed and within bounds, plus where each came from (:meth:`source`).

    Build it with :func:`load_settings`; a lane's settings with :meth:`for_lane`; a task's pipeline settings
    with :meth:`pipeline_config`."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **sources: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the merged layers given to the constructor: :func:`load_settings` reads the environment and
        ``.env`` itself, with the rules pydantic-settings has no place for (an unknown name in ``.env`` is an
        error, in the real environment it is ignored; task-level names; the source of each value)."""
        return (init_settings,)

    pipeline: PipelineSection = PipelineSection()
    dwd: DwdSection = DwdSection()
    window: WindowSection = WindowSection()
    api: ApiSection = ApiSection()
    lane: LaneSection = LaneSection()
    detail: DetailSection = DetailSection()
    integrity: IntegritySection = IntegritySection()
    db: DbSection = DbSection()
    run: RunSection = RunSection()
    progress: ProgressSection = ProgressSection()
    sql: SqlSection = SqlSection()
    state: StateSection = StateSection()
    display: DisplaySection = DisplaySection()
    web: WebSection = WebSection()
    api_token: SecretStr | None = Field(None, json_schema_extra=_named("FEIQIU_API_TOKEN", "--token"))
    api_base: str | None = Field(None, json_schema_extra=_named("FEIQIU_API_BASE", "--api-base"))
    db_dsn: SecretStr | None = Field(None, json_schema_extra=_named("ETL_DB_DSN", "--dsn"))
    web_token: SecretStr | None = Field(None, json_schema_extra=_named("FEIQIU_WEB_TOKEN", "--auth-token"))
    home: str | None = Field(None, json_schema_extra=_named("FEIQIU_ETL_HOME"))

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)
    _layers: tuple["Layer", ...] = PrivateAttr(default=())
    _tasks: frozenset[str] | None = PrivateAttr(default=None)

    # ------------------------------------------------------------------------------------------ reading
    def source(self, key: str) -> str:
        """Where the value of ``key`` (a dotted key or a named field such as ``api_base``) came from:
        ``default``, ``connector``, ``fleet file``, ``.env``, ``environment``, ``--set``, ``flag`` or
        ``fleet lane NAME``."""
        return self._sources.get(key, Source.DEFAULT.label)

    def resolve(self, task: str | None, name: str) -> "Resolved":
        """A pipeline setting ``name`` of ``task`` (None: the global value) and the key and layer that set it.
        The specificity rule: the task-level key (the connector's task defaults are task-level values) >
        the global key > the built-in default; within a level the highest layer won already."""
        keys = ([f"pipeline.{task.lower()}.{name}"] if task else []) + [f"pipeline.{name}"]
        for key in keys:
            if key in self._sources:
                level = self.pipeline.tasks[task.lower()] if key.count(".") == 2 else self.pipeline
                return Resolved(getattr(level, name), key, self._sources[key])
        return Resolved(getattr(_BUILT_IN_PIPELINE, name), keys[-1], Source.DEFAULT.label)

    def pipeline_config(self, task: str) -> PipelineConfig:
        """The frozen pipeline settings of ``task``. Raises :class:`ConfigError` when the merged values do
        not fit together (``rate_min`` above ``rate_max``)."""
        try:
            return PipelineConfig(**{name: self.resolve(task, name).value for name in PipelineConfig.keys()})
        except ValidationError as exc:
            raise ConfigError(f"pipeline config for {task}: {_problem(None, exc.errors()[0])}") from None

    def effective(self, tasks: Iterable[str] = ()) -> dict[str, tuple[Any, str]]:
        """``{key: (value, source)}`` of every global key, and of each ``pipeline.<task>.<key>`` of ``tasks`` that
        a task-level value set (the connector's defaults included). No secrets."""
        out: dict[str, tuple[Any, str]] = {}
        for key in GLOBAL_KEYS:
            namespace, name = key.split(".")
            if namespace == "pipeline":
                found = self.resolve(None, name)
                out[key] = (found.value, found.source)
            else:
                out[key] = (getattr(getattr(self, namespace), name), self.source(key))
        for task in tasks:
            for name in PipelineConfig.keys():
                found = self.resolve(task, name)
                if found.key.count(".") == 2:
                    out[found.key] = (found.value, found.source)
        return out

    # ------------------------------------------------------------------------------------------ layering
    def for_lane(self, name: str, pipeline: Mapping[str, Any], api_base: str | None = None,
                 deadline: str | None = None) -> "Settings":
        """These settings with a fleet lane's layer on top: its ``pipeline`` keys (dotted, ``pipeline.`` optional:
        ``rate_min``, ``ODS_MEMBER.rate_min``), its ``api_base`` and its ``deadline`` (``run.deadline``). Raises
        :class:`ConfigError`."""
        values: dict[str, Any] = {}
        for key, value in pipeline.items():
            values[(key if key.startswith("pipeline.") else f"pipeline.{key}").lower()] = value
        if api_base is not None:
            values["api_base"] = api_base
        if deadline is not None:
            values["run.deadline"] = deadline
        layer = read_layer(Source.LANE, values, self._tasks, label=f"{Source.LANE.label} {name}")
        return _build((*self._layers, layer), self._tasks)


class Resolved(NamedTuple):
    value: Any
    key: str
    source: str


_BUILT_IN_PIPELINE = PipelineConfig()
_SECTIONS: dict[str, type[BaseModel]] = {name: Settings.model_fields[name].annotation for name in (
    "pipeline", "dwd", "window", "api", "lane", "detail", "integrity", "db", "run", "progress", "sql", "state", "display",
    "web")}
NAMED: dict[str, str] = {field.json_schema_extra["env"]: name for name, field in Settings.model_fields.items()
                         if isinstance(field.json_schema_extra, dict)}
"""The named environment variables and their fields (``FEIQIU_API_TOKEN`` → ``api_token`` …)."""
GLOBAL_KEYS: tuple[str, ...] = tuple(sorted(f"{ns}.{name}" for ns, section in _SECTIONS.items()
                                            for name in section.model_fields if name != "tasks"))
"""Every dotted key but the task-level ones (``pipeline.<task_code>.<key>``)."""


def flags() -> list[tuple[str, str, str]]:
    """``(flag, key, help)`` of the dedicated flags of settings keys, e.g. ``("--pipeline-rate-min",
    "pipeline.rate_min", "minimum gap between requests, s")``: the CLI declares its options from these."""
    out = []
    for name, field in PipelineKeys.model_fields.items():
        extra = field.json_schema_extra
        if isinstance(extra, dict) and "flag" in extra:
            out.append((extra["flag"], f"pipeline.{name}", extra["help"]))
    return out


# ---------------------------------------------------------------------------------------------- layers
@dataclass(frozen=True)
class Layer:
    """The typed values one layer gives: ``{dotted key or named field: value}``."""

    source: Source
    label: str
    values: Mapping[str, Any]


def _build(layers: tuple[Layer, ...], tasks: frozenset[str] | None) -> Settings:
    """The model from ``layers``: the highest :class:`Source` that has a key gives its value and its source
    (one pass in that order: the override order between layers is this loop). Dotted keys become the model's
    shape on the way (``pipeline.ods_x.rate_min`` → ``pipeline`` / ``tasks`` / ``ods_x`` / ``rate_min``)."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in sorted(layers, key=lambda layer: layer.source):
        for key, value in layer.values.items():
            sources[key] = layer.label
            path = key.split(".")
            node = merged
            for part in (path[:1] + ["tasks", path[1]] if len(path) == 3 else path[:-1]):
                node = node.setdefault(part, {})
            node[path[-1]] = value
    try:
        settings = Settings(**merged)
    except ValidationError as exc:  # every value was checked on reading: only a bug gets here
        raise ConfigError(_problem(None, exc.errors()[0])) from None
    settings._sources, settings._layers, settings._tasks = sources, layers, tasks
    return settings


def load_settings(*, connector: Any = None, environ: Mapping[str, str] | None = None, dotenv: DotEnv = DotEnv(),
                  sets: Mapping[str, Any] | None = None, flags: Mapping[str, Any] | None = None,
                  fleet_base: str | None = None) -> Settings:
    """The settings of a command, from every layer (module docstring): ``connector`` (a
    :class:`~feiqiu_etl.connector.model.Connector`; None: no task is known and any task code is accepted),
    ``environ`` (default ``os.environ``, into which the CLI loaded ``.env`` first; ``dotenv`` says which names
    that file set), ``sets`` (``--set`` keys), ``flags`` (``{dotted key or named field: value}``, None values
    ignored), ``fleet_base`` (a fleet file's top-level ``api_base``). Raises :class:`ConfigError` (one line)."""
    tasks = frozenset(t.code.lower() for t in connector.tasks) if connector is not None else None
    env = os.environ if environ is None else environ
    layers = [*_environment(env, dotenv, tasks),
              read_layer(Source.SET, sets or {}, tasks),
              read_layer(Source.FLAG, {k: v for k, v in (flags or {}).items() if v is not None}, tasks, named=True),
              read_layer(Source.FLEET, {"api_base": fleet_base} if fleet_base else {}, tasks, named=True)]
    if connector is not None:
        defaults = {f"pipeline.{t.code.lower()}.{k}": v for t in connector.tasks for k, v in t.pipeline.items()}
        model = getattr(connector, "model", None)  # a connector without its YAML model (tests): no integrity data
        integrity = ({f"integrity.{k}": v for k, v in model.integrity.model_dump().items()}
                     if model is not None else {})
        layers.append(read_layer(Source.CONNECTOR, {"api.timeout": connector.api.timeout_seconds, **integrity,
                                                    **defaults}, tasks))
    return _build(tuple(layers), tasks)


def read_layer(source: Source, raw: Mapping[str, Any], tasks: frozenset[str] | None, *, label: str | None = None,
               named: bool = False) -> Layer:
    """One layer's values, each checked against its field (text becomes typed here, and only here). ``named``
    layers may also set the named fields (``api_base`` …). Raises :class:`ConfigError` for an unknown key or a
    bad value, naming the key."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        key = key.strip() if key in NAMED.values() else key.strip().lower()
        if key in NAMED.values() and (named or source in (Source.DOTENV, Source.ENVIRONMENT, Source.LANE)):
            values[key] = _typed_named(key, value)
            continue
        owner, name = _owner(key, tasks), key.rsplit(".", 1)[-1]
        if owner is None:
            raise ConfigError(f"unknown configuration key {key!r} (known: {', '.join(GLOBAL_KEYS)}, "
                              "or pipeline.<task_code>.<key>)")
        if isinstance(value, bool):  # YAML's `true` is no number
            raise ConfigError(_scoped(key, f"{key}: expected a number, got {value!r}"))
        try:  # text becomes typed here: the field's type and bounds
            values[key] = getattr(owner.model_validate({name: value}), name)
        except ValidationError as exc:
            raise ConfigError(_scoped(key, _problem(key, exc.errors()[0]))) from None
    return Layer(source, label or source.label, values)


def _environment(environ: Mapping[str, str], dotenv: DotEnv, tasks: frozenset[str] | None) -> tuple[Layer, Layer]:
    """The ``.env`` and the environment layers. A variable a ``.env`` defined in our namespaces that names no
    setting is an error (the file exists for us); in the real environment it may belong to other software
    (e.g. Azure's ``PIPELINE_WORKSPACE``) and is ignored, as is any ``API_*`` (too generic to claim)."""
    found: dict[Source, dict[str, str]] = {Source.DOTENV: {}, Source.ENVIRONMENT: {}}
    for line in dotenv.repeats:
        logging.getLogger(__name__).warning("%s", line)
    for name, value in environ.items():
        key = NAMED.get(name) or env_to_key(name)
        if key is None and name in dotenv.defined:
            _near_miss(name, dotenv.where(name))
        if key is None or name in NAMED and not value:
            continue
        if name not in NAMED and _owner(key, tasks) is None:
            if name in dotenv.defined and not name.upper().startswith("API_"):
                raise ConfigError(f"unknown setting {name} in .env: no key {key!r}")
            if name in dotenv.defined:  # an API_* name is no error (too generic), but one slip from ours is said
                _near_miss(name, dotenv.where(name))
            continue
        found[Source.DOTENV if name in dotenv.applied else Source.ENVIRONMENT][key] = value
    return tuple(read_layer(source, values, tasks) for source, values in found.items())  # type: ignore[return-value]


READ_ELSEWHERE = ("ETL_READER_DSN", "FEIQIU_ALERTS", "FEIQIU_ALERT_URLS", "FEIQIU_CONNECTOR", "FEIQIU_FLEET",
                  "FEIQIU_UNSAFE_GAPS", "FEIQIU_DAGSTER_CRON", "FEIQIU_DAGSTER_PG_URL")
"""Variables of ours that a command reads itself (not settings keys): a ``.env`` name one letter off them is
a misspelling too."""


def _near_miss(name: str, where: str) -> None:
    """Warn (stderr, one line naming ``where``, ``file:line``; never the value) when a ``.env`` name that no
    setting reads is one slip from one of ours (``FEIQIU_API_TOKN``; ``API_TIMEOT``, or ``API_TOKN`` for
    ``FEIQIU_API_TOKEN``): it is not an error, as a fleet file's ``token_env`` may be any name."""
    import difflib

    ours = {n: n for n in (*NAMED, *READ_ELSEWHERE)}
    if name.upper().startswith("API_"):
        ours |= {f"API_{k.upper()}": f"API_{k.upper()}" for k in _SECTIONS["api"].model_fields}
        ours |= {n.removeprefix("FEIQIU_"): n for n in NAMED if n.startswith("FEIQIU_API_")}
    match = difflib.get_close_matches(name.upper(), list(ours), n=1, cutoff=0.88)
    if match and name not in ours.values():
        logging.getLogger(__name__).warning("%s: %s is read by nothing (did you mean %s?)", where,
                                            name.encode("unicode_escape").decode()[:80], ours[match[0]])


def _owner(key: str, tasks: frozenset[str] | None) -> type[BaseModel] | None:
    """The section model that declares ``key``, or None for an unknown key (or task)."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] in _SECTIONS and parts[1] in _SECTIONS[parts[0]].model_fields \
            and parts[1] != "tasks":
        return _SECTIONS[parts[0]]
    if len(parts) == 3 and parts[0] == "pipeline" and parts[2] in PipelineKeys.model_fields \
            and (tasks is None or parts[1] in tasks):
        return PipelineKeys
    return None


def _typed_named(name: str, value: Any) -> Any:
    """A named field's value; a secret exactly as given (its own rules judge it, e.g. the web token's), other
    text without surrounding blanks; an empty value is no value."""
    annotation = Settings.model_fields[name].annotation
    adapter = TypeAdapter(annotation)
    text = str(value) if SecretStr in typing.get_args(annotation) else str(value).strip()
    try:
        return adapter.validate_python(text or None)
    except ValidationError as exc:
        raise ConfigError(f"{Settings.model_fields[name].json_schema_extra['env']}: "
                          f"{exc.errors()[0]['msg']}") from None


def _scoped(key: str, problem: str) -> str:
    """``pipeline config for <TASK|all tasks>: …`` for a pipeline key (what ``run``, ``plan`` and ``config show``
    say alike); other keys as they are."""
    parts = key.split(".")
    if parts[0] != "pipeline":
        return problem
    return f"pipeline config for {parts[1].upper() if len(parts) == 3 else 'all tasks'}: {problem}"


def _problem(key: str | None, error: Mapping[str, Any]) -> str:
    """One pydantic error as one line, naming ``key`` (or the field pydantic names)."""
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    named = key
    key = key or ".".join(str(p) for p in error.get("loc", ()))
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
              "less_than": ("<", "lt")}
    if kind == "finite_number":
        return f"{key}: expected a finite number, got {got!r}"
    if kind in bounds:
        op, bound = bounds[kind]
        return f"{key} must be {op} {ctx[bound]:g}, got {got}"
    if kind.startswith("int_"):
        return f"{key}: expected int, got {got!r}"
    if kind.startswith("float_"):
        return f"{key}: expected float, got {got!r}"
    if kind == "value_error":  # a validator's own sentence; named by its key when the key is known
        return f"{named}: {ctx.get('error', error['msg'])}" if named else str(ctx.get("error", error["msg"]))
    return f"{key}: {error['msg']}"


def env_to_key(name: str) -> str | None:
    """Map an environment variable name to a dotted key (``PIPELINE_ODS_MEMBER__WORKERS`` →
    ``pipeline.ods_member.workers``), or None if it is in none of our namespaces."""
    upper = name.upper()
    for ns in _SECTIONS:
        prefix = ns.upper() + "_"
        if not upper.startswith(prefix):
            continue
        rest = name[len(prefix):].lower()
        for separator in (".", "__"):
            if separator in rest:
                task, _, key = rest.rpartition(separator)
                return f"{ns}.{task}.{key}"
        return f"{ns}.{rest}"
    return None


def reveal(secret: SecretStr | None) -> str | None:
    """The text of a secret setting, for the one place that uses it (a connection, a request header)."""
    return secret.get_secret_value() if secret is not None else None
