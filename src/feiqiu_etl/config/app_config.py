"""``AppConfig``: dotted keys (``pipeline.workers``, ``pipeline.ods_group_package.rate_min``,
``dwd.parallel_workers``, ``window.lookback_hours`` …) from three layers, highest first:

1. CLI: ``--set KEY=VALUE`` and the dedicated flags (``--pipeline-workers`` …);
2. environment variables, after loading ``.env`` (python-dotenv; real environment wins);
3. built-in defaults.

Environment names (spec §4.1): ``PIPELINE_WORKERS`` → ``pipeline.workers``; task-level
``PIPELINE_ODS_GROUP_PACKAGE.RATE_MIN`` (or ``PIPELINE_ODS_GROUP_PACKAGE__RATE_MIN``) →
``pipeline.ods_group_package.rate_min``; ``DWD_PARALLEL_WORKERS`` → ``dwd.parallel_workers``;
``WINDOW_LOOKBACK_HOURS`` → ``window.lookback_hours``. Unknown keys are rejected with a one-line
:class:`ConfigError` so a typo never silently does nothing. Secrets (``api.token``) are never printed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, MutableMapping

from feiqiu_etl.pipeline.config import PipelineConfig

NAMESPACES = ("pipeline", "dwd", "window", "api", "lane", "detail", "db", "run", "progress")
GLOBAL_KEYS: dict[str, str] = {
    **{f"pipeline.{k}": f"PipelineConfig.{k}" for k in PipelineConfig.keys()},
    "dwd.parallel_workers": "DWD tables merged in parallel (default 4)",
    "window.lookback_hours": "incremental runs re-fetch this many hours before the high-water mark, for tasks whose "
                             "connector entry sets no lookback_minutes (default 48)",
    "window.initial_days": "first incremental run fetches this many days back (default 7)",
    "window.segment_days": "maximum window segment length in days, <= 31 (default 31, the API's limit)",
    "api.timeout": "HTTP timeout per request in seconds (default: the connector's timeout_seconds, 30)",
    "api.retry_attempts": "attempts per request including the first (default 3)",
    "api.retry_backoff": "first retry backoff in seconds, doubled each attempt (default 1)",
    "api.connect_timeout": "HTTP connect timeout in seconds (default 10, at most api.timeout)",
    "lane.max_transport_failures": "abort a lane after this many requests in a row reached no server (default 5)",
    "lane.max_active_stores": "stores of one lane that take turns on it at once (default 8)",
    "detail.max_attempts": "runs that may fail on an owed detail before it is given up (default 5)",
    "detail.recheck_share": "share of a lane's requests spent re-fetching the details checked longest ago, so a "
                            "corrupted detail is repaired within a bounded number of runs (default 0.02; 0 = off)",
    "db.connect_timeout": "PostgreSQL connect timeout in seconds (default 10)",
    "db.unavailable_limit": "seconds the database may stay unreachable during a run before it fails (default 60)",
    "run.heartbeat_seconds": "how often a run publishes its status and heartbeat, s (default 1)",
    "run.stale_after": "a RUNNING run whose heartbeat is older than this (s) and whose process is gone is "
                       "INTERRUPTED (default 30)",
    "progress.heartbeat_seconds": "without a terminal, print a progress line this often, s (default 30; 0 = never)",
}
DEFAULTS: dict[str, Any] = {
    "dwd.parallel_workers": 4,
    "window.lookback_hours": 48.0,
    "window.initial_days": 7.0,
    "window.segment_days": 31.0,
    "api.retry_attempts": 3,
    "api.retry_backoff": 1.0,
    "api.connect_timeout": 10.0,
    "lane.max_transport_failures": 5,
    "lane.max_active_stores": 8,
    "detail.max_attempts": 5,
    "detail.recheck_share": 0.02,
    "db.connect_timeout": 10.0,
    "db.unavailable_limit": 60.0,
    "run.heartbeat_seconds": 1.0,
    "run.stale_after": 30.0,
    "progress.heartbeat_seconds": 30.0,
}
SOURCES = ("default", "connector", ".env", "environment", "--set", "flag", "fleet")
"""Where a setting came from, lowest precedence first (``config show`` prints it)."""


MAX_ENV_BYTES = 2**20
"""Largest ``.env`` file read (bytes); python-dotenv parses a huge one for minutes without a word."""


class ConfigError(ValueError):
    """Invalid configuration; ``str()`` is a one-line message (the CLI exits 2 before any request)."""


class AppConfig:
    """Resolved settings. ``get(key, default)`` follows CLI > environment > defaults."""

    def __init__(self, values: Mapping[str, Any] | None = None, *, task_codes: Iterable[str] = ()):
        self._task_codes = {c.lower() for c in task_codes}
        self._values: dict[str, Any] = {}
        self._sources: dict[str, str] = {}
        for key, value in (values or {}).items():
            self.set(key, value)

    @classmethod
    def load(
        cls,
        *,
        task_codes: Iterable[str],
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        strict_names: Iterable[str] = (),
        override_sources: Mapping[str, str] | None = None,
    ) -> "AppConfig":
        """Defaults, then ``environ`` (default: ``os.environ``; the CLI loads ``.env`` into it first with
        :func:`load_env_file`), then ``overrides``. A variable named in ``strict_names`` (those that came
        from the ``.env`` file, which exists for us) in our namespaces (``PIPELINE_``, ``DWD_``, ``WINDOW_``)
        that names no known key is a :class:`ConfigError`; in the real environment such variables may
        belong to other software (e.g. Azure's ``PIPELINE_WORKSPACE``) and are ignored."""
        strict = set(strict_names)
        env = dict(os.environ if environ is None else environ)
        cfg = cls(task_codes=task_codes)
        for name, value in env.items():
            key = env_to_key(name)
            if key is None:
                continue
            if cfg._known(key):
                cfg._values[key] = value
                cfg._sources[key] = ".env" if name in strict else "environment"
            elif name in strict and not name.upper().startswith("API_"):  # API_* is too generic to claim
                raise ConfigError(f"unknown setting {name} in .env: no key {key!r}")
        sources = override_sources or {}
        for key, value in (overrides or {}).items():
            cfg.set(key, value, source=sources.get(key, "--set"))
        return cfg

    def set(self, key: str, value: Any, *, source: str = "--set") -> None:
        key = key.strip().lower()
        if not self._known(key):
            raise ConfigError(f"unknown configuration key {key!r} (known: {', '.join(sorted(GLOBAL_KEYS))}, "
                              "or pipeline.<task_code>.<key>)")
        self._values[key] = value
        self._sources[key] = source

    def layered(self, overrides: Mapping[str, Any], source: str) -> "AppConfig":
        """A copy with ``overrides`` on top (e.g. a fleet lane's pipeline settings); raises
        :class:`ConfigError` for an unknown key."""
        copy = AppConfig(task_codes=self._task_codes)
        copy._values = dict(self._values)
        copy._sources = dict(self._sources)
        for key, value in overrides.items():
            copy.set(key, value, source=source)
        return copy

    def source(self, key: str) -> str:
        """Where the effective value of ``key`` came from: ``default``, ``.env``, ``environment``, ``--set``,
        ``flag`` or a fleet lane (``fleet lane NAME``)."""
        key = key.lower()
        return self._sources.get(key, "default")

    def explicit(self, key: str) -> bool:
        """True when ``key`` was set by a layer (not the built-in default)."""
        return key.lower() in self._values

    def get(self, key: str, default: Any = None) -> Any:
        key = key.lower()
        if key in self._values:
            return self._values[key]
        return DEFAULTS.get(key, default)

    def number(self, key: str, kind: type = float, *, minimum: float | None = None, maximum: float | None = None,
               default: Any = None):
        """``get(key, default)`` converted to ``kind`` and range-checked; raises :class:`ConfigError`."""
        raw = self.get(key, default)
        try:
            value = kind(raw) if kind is float else int(str(raw).strip())
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected {kind.__name__}, got {raw!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {raw!r}")
        if minimum is not None and value < minimum or maximum is not None and value > maximum:
            raise ConfigError(f"{key}: {value:g} is outside [{minimum:g}, {maximum:g}]")
        return value

    def pipeline_config(self, task_code: str, task_defaults: Mapping[str, Any] | None = None) -> PipelineConfig:
        try:
            return PipelineConfig.from_app_config(self, task_code, task_defaults)
        except ValueError as exc:
            raise ConfigError(f"pipeline config for {task_code}: {exc}") from None

    def _known(self, key: str) -> bool:
        if key in GLOBAL_KEYS:
            return True
        parts = key.split(".")
        return (
            len(parts) == 3 and parts[0] == "pipeline" and parts[2] in PipelineConfig.keys()
            and (not self._task_codes or parts[1] in self._task_codes)
        )


def env_to_key(name: str) -> str | None:
    """Map an environment variable name to a dotted key, or None if it is not ours."""
    upper = name.upper()
    for ns in NAMESPACES:
        prefix = ns.upper() + "_"
        if not upper.startswith(prefix):
            continue
        rest = name[len(prefix):].lower()
        if "." in rest:
            task, _, key = rest.rpartition(".")
            return f"{ns}.{task}.{key}"
        if "__" in rest:
            task, _, key = rest.rpartition("__")
            return f"{ns}.{task}.{key}"
        return f"{ns}.{rest}"
    return None


def load_env_file(path: str | Path = ".env", environ: MutableMapping[str, str] | None = None, *,
                  required: bool = False) -> set[str]:
    """Load ``path`` (if it exists) into ``environ`` (default ``os.environ``) without overriding what is
    already set. Returns the names the file defines. Raises :class:`ConfigError` (one line) for a line
    python-dotenv cannot parse, a file that is not UTF-8, or a missing file when ``required``."""
    import logging

    from dotenv import dotenv_values

    target = os.environ if environ is None else environ
    p = Path(path)
    if not p.is_file():
        if required:
            raise ConfigError(f"{p}: {'not a regular file' if p.exists() else 'no such env file'}")
        return set()
    if p.stat().st_size > MAX_ENV_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size:,} bytes, more than the {MAX_ENV_BYTES // 2**20} MiB an env "
                          "file may have")
    problems: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            problems.append(record.getMessage())

    logger = logging.getLogger("dotenv.main")
    handler, propagate = _Catch(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        values = dotenv_values(p, encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    if problems:
        raise ConfigError(f"{p}: {problems[0].rstrip('.')}")
    for name, value in values.items():
        _check_env_entry(p, name, value)
    for name, value in values.items():
        if value is not None and name not in target:
            target[name] = value
    return set(values)


#: Longest value a ``.env`` line may set, characters. Real settings are short; a child process cannot even
#: receive a variable above 128 KiB (Linux MAX_ARG_STRLEN), so a huge value is a mistake in the file.
MAX_ENV_VALUE = 32 * 1024


def _check_env_entry(path: Path, name: str, value: str | None) -> None:
    """Raise :class:`ConfigError` (naming the file and the variable, never the value) for a name or value
    the environment cannot hold: a NUL byte, ``=`` or an empty name, or a value above :data:`MAX_ENV_VALUE`."""
    shown = name.replace("\0", "\\0")[:80]
    if not name or "\0" in name or "=" in name:
        raise ConfigError(f"{path}: '{shown}' is not a valid variable name")
    if value is None:
        return
    if "\0" in value:
        raise ConfigError(f"{path}: the value of {shown} holds a NUL byte")
    if len(value) > MAX_ENV_VALUE:
        raise ConfigError(f"{path}: the value of {shown} is {len(value):,} characters long; at most "
                          f"{MAX_ENV_VALUE:,} are allowed")
