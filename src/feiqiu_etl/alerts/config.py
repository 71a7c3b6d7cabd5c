"""The alerts configuration: an ``alerts:`` section in a small YAML file, and ``FEIQIU_ALERT_URLS``.

::

    alerts:
      language: zh                     # en (default) or zh
      web_url: http://etl-host:8080    # optional: messages link to /runs/ID and /freshness
      timeout_seconds: 10              # total time sending may take at one moment (retries included)
      attempts: 3                      # tries per target within that time
      targets:
        - name: ops-feishu
          url_env: FEIQIU_ALERT_FEISHU   # the Apprise URL is in this variable, never in the file
        - name: mail
          url_env: FEIQIU_ALERT_MAIL
          reasons: [failed, interrupted, stale]   # optional: only these reasons go to this target
      rules:                           # every rule is on by default
        failed: true
        partial: true
        interrupted: true
        deadline: true                 # a lane reached its --deadline; the rest is the next run's
        timeout: true                  # CANCELLED by --timeout
        token_refused: true            # 40101
        store_refused: true            # 40103
        banned: true                   # 42902
        reconcile: true                # a listing short, over or an unexpected zero (issue 25)
        deletions_held: true           # a snapshot's mass soft delete held back until confirmed (issue 25)
        consecutive_failures: 3        # a store failed in this many runs in a row (0 = off)
        stale_hours: 26                # data older than this, per store and task (null = off)

The file is passed with ``--alerts FILE`` (or ``FEIQIU_ALERTS=FILE``, which every command reads, so that the
command that finds a killed run INTERRUPTED alerts too). ``FEIQIU_ALERT_URLS`` (Apprise URLs separated by whitespace,
newlines or ``;``, as Apprise takes them; a comma separates two URLs only where the next one begins with
``SCHEME://``, so ``mailto://…?to=a@x.com,b@y.com`` stays one URL: :func:`split_urls`, issue 28 item 6) adds one target per URL that receives every reason, with or without a file. A target's URL carries its
secret (a bot key, a password), so it is read from an environment variable whose NAME the file gives;
nothing here ever prints a URL. Errors are one line naming the file and the field
(``alerts.yaml: alerts.targets[0] (ops).url_env: environment variable FQ_X is not set``); the CLI exits 2.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Union

from pydantic import Field, field_validator, model_validator

from feiqiu_etl.alerts.choice import FromEnvironment
from feiqiu_etl.alerts.rules import RULE_NAMES
from feiqiu_etl.common.yamldoc import Strict, load_definition

ENV_FILE = "FEIQIU_ALERTS"
ENV_URLS = "FEIQIU_ALERT_URLS"
MAX_URLS = 20

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
log = logging.getLogger("feiqiu_etl.alerts")


class AlertsConfigError(ValueError):
    """The alerts file or ``FEIQIU_ALERT_URLS`` is invalid; ``str()`` is one line (never a URL)."""


class TargetModel(Strict):
    name: str
    url_env: str
    reasons: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"target names are 1-40 letters, digits, '.', '-' or '_', got {v!r}")
        return v

    @field_validator("url_env")
    @classmethod
    def _env(cls, v: str) -> str:
        if not _ENV_NAME.match(v):  # the value is not shown: it may be a URL with its secret pasted by mistake
            raise ValueError("must be the NAME of an environment variable in upper case (e.g. FEIQIU_ALERT_OPS) "
                             "that holds the Apprise URL, never the URL itself")
        return v

    @field_validator("reasons")
    @classmethod
    def _reasons(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        out = [r.strip().lower() for r in v]
        unknown = [r for r in out if r not in RULE_NAMES]
        if unknown:
            raise ValueError(f"unknown reason {unknown[0]!r}; reasons are {', '.join(RULE_NAMES)}")
        return out


class RulesModel(Strict):
    failed: bool = True
    partial: bool = True
    interrupted: bool = True
    deadline: bool = True
    timeout: bool = True
    token_refused: bool = True
    store_refused: bool = True
    banned: bool = True
    reconcile: bool = True
    deletions_held: bool = True
    consecutive_failures: int = Field(3, ge=0, le=1000)
    stale_hours: float | None = Field(26.0, gt=0, le=8760)


class AlertsModel(Strict):
    language: Literal["en", "zh"] = "en"
    web_url: str | None = None
    timeout_seconds: float = Field(10.0, gt=0, le=300)
    attempts: int = Field(3, ge=1, le=10)
    targets: list[TargetModel] = []
    rules: RulesModel = RulesModel()

    @field_validator("web_url")
    @classmethod
    def _web(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/?#]+", v):
            raise ValueError(f"must be an http(s) URL, got {v!r}")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _unique(self) -> "AlertsModel":
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"target names repeat: {names}")
        return self


class AlertsFileModel(Strict):
    alerts: AlertsModel


@dataclass(frozen=True)
class Target:
    """Where alerts go. ``url`` is the Apprise URL with its secret: never logged or recorded; ``shown`` is
    its redacted form (:func:`feiqiu_etl.alerts.sending.redact`). ``reasons`` None: every reason."""

    name: str
    url: str = field(repr=False)
    shown: str
    reasons: frozenset[str] | None = None

    @property
    def label(self) -> str:
        """``name (shown)``: how logs, records and ``show`` name this target."""
        return f"{self.name} ({self.shown})"

    def wants(self, reason: str) -> bool:
        return self.reasons is None or reason.lower() in self.reasons


@dataclass(frozen=True)
class AlertConfig:
    """The resolved configuration: targets with their URLs, the rules and how to send."""

    targets: tuple[Target, ...]
    rules: RulesModel = RulesModel()
    language: str = "en"
    web_url: str | None = None
    timeout_seconds: float = 10.0
    attempts: int = 3
    source: str = ""

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)


def load_alerts(path: str | Path | None, environ: Mapping[str, str] | None = None) -> AlertConfig | None:
    """The configuration from the file ``path`` (may be None) plus ``FEIQIU_ALERT_URLS`` in ``environ``
    (default ``os.environ``); None when neither gives a target. Raises :class:`AlertsConfigError`."""
    from feiqiu_etl.alerts.sending import redact, usable

    env = os.environ if environ is None else environ
    model, targets, source = AlertsModel(), [], ""
    if path:
        p = Path(path)
        model = load_definition(p, AlertsFileModel, AlertsConfigError, what="alerts file", root="alerts",
                                expect="an alerts file is a YAML mapping with an 'alerts' section",
                                section="alerts").alerts
        source = str(p)
        for i, t in enumerate(model.targets):
            where = f"{p}: alerts.targets[{i}] ({t.name}).url_env"
            url = (env.get(t.url_env) or "").strip()
            if not url:
                raise AlertsConfigError(f"{where}: environment variable {t.url_env} is not set")
            problem = usable(url)
            if problem:
                raise AlertsConfigError(f"{where}: the URL in {t.url_env} {problem}")
            targets.append(Target(t.name, url, redact(url), frozenset(t.reasons) if t.reasons is not None else None))
    urls = split_urls(env.get(ENV_URLS) or "")
    if len(urls) > MAX_URLS:
        raise AlertsConfigError(f"{ENV_URLS}: {len(urls)} URLs, at most {MAX_URLS}")
    for i, url in enumerate(urls, 1):
        problem = usable(url)
        if problem:
            raise AlertsConfigError(f"{ENV_URLS}: URL {i} {problem}")
        name = f"url{i}"
        while any(t.name == name for t in targets):
            name += "_"
        targets.append(Target(name, url, redact(url)))
    if urls:
        source = f"{source} + {ENV_URLS}" if source else ENV_URLS
    if not targets:
        return None
    return AlertConfig(tuple(targets), model.rules, model.language, model.web_url, model.timeout_seconds,
                       model.attempts, source)


_warned: set[str] = set()  # invalid environment configurations already logged (each once per process)
_lock = threading.Lock()


_URL_SEPARATOR = re.compile(r"[\s;]+|,\s*(?=[A-Za-z][A-Za-z0-9+.-]{0,31}://)")


def split_urls(text: str) -> list[str]:
    """The URLs of a ``FEIQIU_ALERT_URLS`` value: separated by whitespace, newlines or ``;`` (as Apprise reads a
    list of URLs), or by a comma that a new ``SCHEME://`` follows (the older form ``url1,url2`` keeps working);
    a comma inside a URL (``mailto://…?to=a@x.com,b@y.com``) is part of it."""
    return [u.strip(",") for u in _URL_SEPARATOR.split(text) if u.strip(",")]


AlertChoice = Union[AlertConfig, None, FromEnvironment]
"""An alert configuration (None: no alerts) or :data:`~feiqiu_etl.alerts.choice.FROM_ENVIRONMENT`."""


def resolve(choice: AlertChoice) -> AlertConfig | None:
    """``choice`` itself, or the environment's configuration (:func:`from_environment`) for
    :data:`~feiqiu_etl.alerts.choice.FROM_ENVIRONMENT`."""
    return from_environment() if isinstance(choice, FromEnvironment) else choice


def from_environment(environ: Mapping[str, str] | None = None) -> AlertConfig | None:
    """The configuration of the environment ``environ`` (default ``os.environ``): the ``FEIQIU_ALERTS`` file and
    ``FEIQIU_ALERT_URLS``, read on every call. An invalid one is logged once per process (WARNING) and gives None
    here: a command that is not about alerts never fails because of them."""
    env = os.environ if environ is None else environ
    try:
        return load_alerts(env.get(ENV_FILE) or None, env)
    except AlertsConfigError as exc:
        with _lock:
            first = str(exc) not in _warned
            _warned.add(str(exc))
        if first:
            log.warning("alerts are off: %s", exc)
        return None
