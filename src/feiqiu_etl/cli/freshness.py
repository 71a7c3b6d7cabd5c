"""``feiqiu-etl freshness``: the web page's freshness table from a shell, with an exit code for monitors.

Per store and task: the end of the newest finished window (or the last complete snapshot), its age, the
owed details, and whether it is stale — by the one rule of :mod:`feiqiu_etl.registry.freshness`, judging only
the tasks each store is scheduled for (``--fleet``: each lane's ``tasks:``; else every task of the
connector). ``--fail-stale`` exits 8 when a row is stale (0 otherwise), like dbt's ``source freshness``.
When alerts are configured (``--alerts FILE``, ``FEIQIU_ALERTS``, ``FEIQIU_ALERT_URLS``) and the stale
rule is on, the stale rows are also sent as one ``STALE`` alert (each store/task once per age).
"""

from __future__ import annotations

import sys

import click

from feiqiu_etl.cli.numeric import FloatRange
from feiqiu_etl.common import exitcodes
from feiqiu_etl.cli.options import (common_options, dsn_option, echo_json, json_option, setup_logging, use_alerts,
                                    warehouse)
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl.registry.freshness import DEFAULT_STALE_HOURS, Schedule


def schedule_for(fleet_path: str | None, connector, site_ids: list[int] | None = None) -> Schedule:
    """The schedule of ``--fleet`` (each lane's stores and tasks), of ``--site-id`` (those stores, every task of
    ``connector``) or, without either, every task of ``connector`` for every store seen; a bad fleet file is a
    one-line :class:`UsageFailure`."""
    codes = tuple(t.code for t in connector.tasks)
    if site_ids and fleet_path:
        raise UsageFailure("--site-id and --fleet exclude each other")
    if site_ids:
        return Schedule(by_store={site: codes for site in site_ids}, source="--site-id")
    if not fleet_path:
        return Schedule.everything(codes)
    from feiqiu_etl.plan.fleet import FleetError
    from feiqiu_etl.plan.fleet import schedule_from_fleet

    try:
        return schedule_from_fleet(fleet_path, codes)
    except FleetError as exc:
        raise UsageFailure(str(exc)) from None


@click.command()
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
              help="judge only the stores of this fleet file and the tasks each lane runs (its tasks:)")
@click.option("--site-id", "site_ids", multiple=True, metavar="SITE_ID",
              help="judge only these stores (repeat or comma-separate), every task of the connector")
@click.option("--hours", type=FloatRange(0.01, 8760), default=None,
              help=f"stale when older than this (default: the alerts file's rules.stale_hours, else "
                   f"{DEFAULT_STALE_HOURS:g})")
@click.option("--fail-stale", is_flag=True, help=f"exit {exitcodes.STALE} when something is stale")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False),
              help="connector YAML whose tasks are judged (default: the bundled Feiqiu connector)")
@click.option("--alerts", "alerts_path", envvar="FEIQIU_ALERTS", type=click.Path(dir_okay=False), metavar="FILE",
              help="alerts file (env FEIQIU_ALERTS): send the stale rows as one alert")
@dsn_option
@json_option
@common_options
def freshness(fleet_path, site_ids, hours, fail_stale, connector_path, alerts_path, dsn, demo, as_json, verbose,
              log_format) -> None:
    """How fresh the data of each store and task is (the web page's Freshness table). Exit 0, or with
    --fail-stale 8 when some scheduled store/task is older than --hours or never loaded, and when no store is
    named (--site-id, --fleet) and none was ever loaded."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.alerts import after_freshness
    from feiqiu_etl.connector import ConnectorError, load_connector
    from feiqiu_etl.registry.freshness import freshness_report

    try:
        connector = load_connector(connector_path)
    except (ConnectorError, OSError) as exc:
        raise UsageFailure(str(exc)) from None
    from feiqiu_etl.cli.options import parse_ids

    schedule = schedule_for(fleet_path, connector, parse_ids(site_ids, "--site-id"))
    config = use_alerts(alerts_path)
    if hours is None:
        hours = (config.rules.stale_hours if config is not None else None) or DEFAULT_STALE_HOURS
    with warehouse(dsn, demo, config) as conn:
        report = freshness_report(conn, connector.name, schedule, hours)
        report["alerts"] = after_freshness(conn, connector.name, report["rows"], hours, config) if config else []
    if as_json:
        echo_json(report)
    else:
        _render(report)
    if fail_stale:
        lines = never_loaded_lines(report["rows"])
        if not report["rows"]:
            lines = ["never loaded: no store was ever loaded and none is named (--site-id, --fleet)"]
        for line in lines:
            click.echo(line, err=True)
        if report["stale"] or not report["rows"]:
            sys.exit(exitcodes.STALE)


def never_loaded_lines(rows: list[dict]) -> list[str]:
    """One line per store none of whose scheduled tasks ever finished: ``store N: never loaded (k tasks)``."""
    by: dict[int, list[dict]] = {}
    for row in rows:
        by.setdefault(row["site_id"], []).append(row)
    return [f"store {site}: never loaded ({len(tasks)} scheduled task(s), none finished)"
            for site, tasks in by.items() if all(t.get("kind") is None for t in tasks)]


def _render(report: dict) -> None:
    from feiqiu_etl.alerts.record import alert_lines
    from feiqiu_etl.cli.views.console import say
    from feiqiu_etl.cli.views.freshness import render_freshness

    render_freshness(report)
    for text in alert_lines(report.get("alerts") or []):
        say(text)
