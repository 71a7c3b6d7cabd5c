"""Read-side queries over the registry that need more than the registry knows: a run's record with the alerts
sent about it. Returns frozen records (:class:`~feiqiu_etl.registry.records.RunDetail`); reads only."""

from __future__ import annotations

from dataclasses import replace

import psycopg

from feiqiu_etl import registry
from feiqiu_etl.alerts.record import alerts_of_run
from feiqiu_etl.registry.records import RunDetail


def run_detail(conn: psycopg.Connection, run_id: str, *, with_log: bool = True) -> RunDetail | None:
    """One run (``show``, the run page, ``GET /api/runs/ID``): its record, the ``alerts`` sent about it
    (:func:`feiqiu_etl.alerts.record.alerts_of_run`) and, when ``with_log``, its stored ``log``; None when
    there is no such run."""
    run = registry.get_run(conn, run_id, with_log=with_log)
    if run is None:
        return None
    return replace(run, alerts=alerts_of_run(conn, run.run_id))
