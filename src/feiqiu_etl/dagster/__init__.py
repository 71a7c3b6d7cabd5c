"""Scale-out on Dagster (the optional extra ``feiqiu-etl[dagster]``): a fleet file as Dagster definitions.

``dagster dev -m feiqiu_etl.dagster`` loads :data:`defs`, built from the fleet file named by ``$FEIQIU_FLEET``
when Dagster loads the code location (not at import). Programs and tests call :func:`build_definitions`
directly. Only this package imports ``dagster``; the rest of feiqiu-etl never does. docs/scale-out.md explains
the pools (one per token, limit 1), the PostgreSQL lane guard underneath, and what happens when a worker dies.

Environment read by :data:`defs`: ``FEIQIU_FLEET`` (required), ``FEIQIU_CONNECTOR`` (optional connector file),
``FEIQIU_DAGSTER_CRON`` (default ``0 3 * * *``, Asia/Shanghai), ``FEIQIU_UNSAFE_GAPS`` (``1``: the CLI's
``--unsafe-gaps``, for a simulator with tiny gaps; never against the real upstream), and when a step runs
``ETL_DB_DSN``, the tokens' variables, ``FEIQIU_API_BASE`` and any ``PIPELINE_*``/``DWD_*``/``WINDOW_*`` setting,
exactly as the CLI reads them (one code path: :func:`feiqiu_etl.config.load_settings`).
"""

from __future__ import annotations

import os
from typing import Mapping

import dagster as dg

from feiqiu_etl.dagster.definitions import (DEFAULT_CRON, DEFAULT_WAIT_FOR_LANE, DWD_KEY, DailySchedule,
                                            FleetDefinitionsError, FleetSettings, build_definitions, lane_key,
                                            pool_name)

FLEET_ENV = "FEIQIU_FLEET"
CONNECTOR_ENV = "FEIQIU_CONNECTOR"
CRON_ENV = "FEIQIU_DAGSTER_CRON"
UNSAFE_GAPS_ENV = "FEIQIU_UNSAFE_GAPS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def definitions_from_env(environ: Mapping[str, str] | None = None) -> dg.Definitions:
    """:func:`build_definitions` from ``$FEIQIU_FLEET`` (and the optional variables above). Raises
    :class:`FleetDefinitionsError` (one line) when it is unset or the file is bad."""
    env = os.environ if environ is None else environ
    path = (env.get(FLEET_ENV) or "").strip()
    if not path:
        raise FleetDefinitionsError(f"set {FLEET_ENV} to the fleet file (e.g. {FLEET_ENV}=fleet.yaml dagster dev -m "
                                    "feiqiu_etl.dagster); docs/scale-out.md shows one")
    unsafe = (env.get(UNSAFE_GAPS_ENV) or "").strip().lower()
    if unsafe not in _TRUE | _FALSE:
        raise FleetDefinitionsError(f"{UNSAFE_GAPS_ENV} must be 1 or 0, got {unsafe[:20]!r}")
    return build_definitions(FleetSettings(path, connector_path=env.get(CONNECTOR_ENV) or None,
                                           unsafe_gaps=unsafe in _TRUE),
                             schedule=DailySchedule(cron=env.get(CRON_ENV) or DEFAULT_CRON))


@dg.definitions
def defs() -> dg.Definitions:
    """What ``dagster dev -m feiqiu_etl.dagster`` loads (see :func:`definitions_from_env`)."""
    return definitions_from_env()


__all__ = ["CONNECTOR_ENV", "CRON_ENV", "DEFAULT_CRON", "DEFAULT_WAIT_FOR_LANE", "DWD_KEY", "DailySchedule",
           "FLEET_ENV", "FleetDefinitionsError", "FleetSettings", "UNSAFE_GAPS_ENV", "build_definitions",
           "definitions_from_env", "defs", "lane_key", "pool_name"]
