"""The Dagster instance the fleet is deployed on: what ``$DAGSTER_HOME/dagster.yaml`` says, written by one
function, so that the file docs/scale-out.md shows, the one ``feiqiu-etl dagster dev`` writes and the one the
deployment test runs (tests/integration/test_dagster_deployment.py) cannot drift apart.

What the file sets, and why (docs/scale-out.md "Deploying on several machines" tells the story):

* **storage on PostgreSQL** (``dagster-postgres``): the run queue, the event log and the pools' slots live in
  one database that the daemon, the webserver and every run worker on every machine share. A pool limit is
  only as wide as the storage that counts its slots;
* **the daemon's queued run coordinator**: a submitted run waits in the queue (status QUEUED, with the reason
  on the run's page) while its lane's pool is full, instead of starting a run worker that then sits blocked;
* **pools**: every lane's asset is in the pool named after its lane key; ``default_limit: 1`` gives every such
  pool one slot, so one step per token at a time across all runs and machines. ``granularity: op`` (Dagster's
  default) means the step claims the slot in the storage itself, so runs started without the queue
  (``dagster asset materialize``, a second deployment on the same storage) are held too; the queue does not
  launch a run whose pool is full (``op_granularity_run_buffer: 0``);
* **run monitoring** with ``free_slots_after_run_end_seconds``: a run worker killed mid-step (kill -9, OOM) is
  marked failed by the code server that launched it (within a second or two), but its claimed slot stays
  claimed until the monitoring daemon frees the slots of ended runs (Dagster issues #28456, #32560); without
  it the lane's queue would wait forever. A lost machine takes its code server along: then only
  ``max_runtime_seconds`` ends the run (terminated, then cancelled) and frees the slot.

Only text is written here; nothing in this module imports ``dagster``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import yaml

STORAGE_SCHEME = "postgresql+psycopg2"
"""The driver dagster-postgres needs, named: SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3 (which
feiqiu-etl installs), and dagster-postgres 0.29's event log then fails on every event (``NOTIFY run_events,
$1``: psycopg 3 binds parameters on the server, where NOTIFY takes none)."""
STORAGE_URL_ENV = "FEIQIU_DAGSTER_PG_URL"
"""The variable the written ``dagster.yaml`` reads Dagster's storage URL from (unless a URL is given)."""


@dataclass(frozen=True)
class InstanceSettings:
    """The knobs of :func:`instance_yaml` (seconds unless said otherwise; Dagster's names in brackets).

    ``storage_url``: a SQLAlchemy URL for Dagster's own database, written into the file (it must hold no
    password: use a passfile or ``~/.pgpass``); None writes ``{env: storage_url_env}`` instead, so the file can
    be the same on every machine. ``dequeue_interval`` [dequeue_interval_seconds]: how often the daemon looks
    at the queue. ``max_concurrent_runs``: runs in progress at once, all lanes together (Dagster's default
    10); a lane is a run, so this bounds the tokens that work at once. ``monitoring_interval``
    [poll_interval_seconds] and ``free_slots_after`` [free_slots_after_run_end_seconds]: a dead run's pool
    slot is free at most about their sum (plus one ``dequeue_interval``) after Dagster marked the run ended.
    ``start_timeout`` [start_timeout_seconds]: a run whose worker never starts is failed after this long.
    ``max_runtime`` [max_runtime_seconds]: a run still going after this long is terminated (a graceful cancel;
    the next run resumes). It is what ends a run whose machine was lost: the default run launcher cannot ask a
    dead machine how its run worker is, so only this (or a hand) marks such a run ended and frees its slot.
    ``telemetry``: Dagster's anonymous usage statistics (off unless asked for).
    """

    storage_url: str | None = None
    storage_url_env: str = STORAGE_URL_ENV
    dequeue_interval: int = 5
    max_concurrent_runs: int = 10
    monitoring_interval: int = 30
    free_slots_after: int = 60
    start_timeout: int = 180
    max_runtime: int = 24 * 3600
    telemetry: bool = False

    def __post_init__(self) -> None:
        for name in ("dequeue_interval", "monitoring_interval", "free_slots_after", "start_timeout", "max_runtime"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1 second (Dagster takes whole seconds)")
        if self.max_concurrent_runs < 1:
            raise ValueError("max_concurrent_runs must be at least 1")


def instance_config(settings: InstanceSettings = InstanceSettings()) -> dict[str, Any]:
    """The ``dagster.yaml`` mapping (see the module docstring for each part)."""
    url: Any = settings.storage_url if settings.storage_url else {"env": settings.storage_url_env}
    return {
        "storage": {"postgres": {"postgres_url": url}},
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"dequeue_interval_seconds": int(settings.dequeue_interval)},
        },
        "concurrency": {
            "pools": {"default_limit": 1, "granularity": "op", "op_granularity_run_buffer": 0},
            "runs": {"max_concurrent_runs": int(settings.max_concurrent_runs)},
        },
        "run_monitoring": {
            "enabled": True,
            "poll_interval_seconds": int(settings.monitoring_interval),
            "free_slots_after_run_end_seconds": int(settings.free_slots_after),
            "start_timeout_seconds": int(settings.start_timeout),
            "max_runtime_seconds": int(settings.max_runtime),
            "max_resume_run_attempts": 0,  # the default run launcher cannot resume a run; a rerun resumes it
        },
        "telemetry": {"enabled": bool(settings.telemetry)},
    }


def instance_yaml(settings: InstanceSettings = InstanceSettings()) -> str:
    """:func:`instance_config` as YAML text, with a header saying where it comes from."""
    return ("# Dagster instance for feiqiu-etl (docs/scale-out.md); written by feiqiu_etl.dagster.instance\n"
            + yaml.safe_dump(instance_config(settings), sort_keys=False, allow_unicode=True))


def storage_url(dsn: str) -> str:
    """A libpq DSN (keywords or URL, e.g. the embedded server's ``host=/…/run port=5432 dbname=dagster
    user=postgres passfile=/…/pgpass``) as the URL dagster-postgres takes (scheme :data:`STORAGE_SCHEME`),
    every other keyword (``host`` of a Unix socket, ``passfile``, ``sslmode`` …) as a query parameter. A
    password in the DSN is refused (``ValueError``): the URL ends up in a file and in Dagster's logs; use a
    passfile."""
    import psycopg.conninfo as ci

    try:
        params = {k: v for k, v in ci.conninfo_to_dict(dsn).items() if v is not None}
    except Exception as exc:  # noqa: BLE001 - psycopg.ProgrammingError: say what, not the DSN
        raise ValueError(f"not a PostgreSQL connection string ({type(exc).__name__})") from None
    if params.pop("password", ""):
        raise ValueError("the DSN holds a password; Dagster's storage URL must not: use a passfile (~/.pgpass)")
    user = quote(str(params.pop("user", "")), safe="")
    database = quote(str(params.pop("dbname", "")), safe="")
    host = params.get("host", "")
    netloc = f"{user}@" if user else ""
    if host and not str(host).startswith("/") and "," not in str(host):
        netloc += quote(str(params.pop("host")), safe="")
        if "port" in params:
            netloc += f":{params.pop('port')}"
    query = urlencode(sorted(params.items()))
    return f"{STORAGE_SCHEME}://{netloc}/{database}" + (f"?{query}" if query else "")
