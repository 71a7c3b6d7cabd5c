"""``run``, ``plan`` and ``demo``: a run of the flow, what a run would request, and the demo (the simulator and
the embedded server)."""

from __future__ import annotations

import sys

import click

from feiqiu_etl.cli.numeric import FLOAT, INT, IntRange
from feiqiu_etl.cli.options import (DURATION, collect_sets, common_options, emit, flag_options, layers, redacted_args,
                                    setup_logging, to_run_options, use_alerts, with_run_options)
from feiqiu_etl.app.database import check_database, connector_for, database
from feiqiu_etl.app.planning import plan_run, prepare_inputs
from feiqiu_etl.app.run import RunRequest
from feiqiu_etl.cli.signals import run_with_signals
from feiqiu_etl.db.embedded import DEFAULT_DATABASE
from feiqiu_etl.registry import Invocation
from feiqiu_etl.textsafe import terminal_json


@click.command()
@with_run_options
@click.option("--timeout", type=DURATION, metavar="DURATION",
              help="cancel the run after this long: 45m, 90s, 2h or plain seconds")
@click.option("--wait-for-lane", type=DURATION, metavar="DURATION",
              help="if another run holds a token's lane, wait up to this long: 45m, 90s or plain seconds (default: exit 6 at once)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("--no-progress", is_flag=True, help="no progress display or progress lines on stderr")
@click.option("--alerts", "alerts_path", envvar="FEIQIU_ALERTS", type=click.Path(dir_okay=False), metavar="FILE",
              help="alerts file (env FEIQIU_ALERTS): where to send alerts about this run (docs/guides/alerts.md)")
@common_options
@click.pass_context
def run(ctx, timeout, wait_for_lane, as_json, no_progress, alerts_path, verbose, log_format, **p) -> None:
    """Run the flow: every lane (token) at once, each strictly serial, then DWD."""
    setup_logging(verbose, log_format)
    options = to_run_options(p, timeout, wait_for_lane)
    alerts = use_alerts(alerts_path)
    args = redacted_args({**p, "timeout": timeout, "wait_for_lane": wait_for_lane, "alerts": alerts_path})
    request = RunRequest(options, Invocation(command="run", args=args), embedded=DEFAULT_DATABASE, alerts=alerts)
    result = run_with_signals(request, progress=not no_progress)
    emit(result, as_json)
    sys.exit(result.exit_code)


@click.command()
@with_run_options
@click.option("--json", "as_json", is_flag=True, help="print the plan as one JSON object")
@common_options
def plan(as_json, verbose, log_format, **p) -> None:
    """Show what a run would request: lanes, stores, tasks, windows, estimated requests and lane time.

    Reads the warehouse's history (finished windows, owed details, past runs); sends no request."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.config.settings import reveal

    inputs = prepare_inputs(to_run_options(p))
    timeout = inputs.settings.db.connect_timeout
    with database(reveal(inputs.settings.db_dsn), connect_timeout=timeout) as dsn:
        check_database(dsn, None, timeout)
        with connector_for(timeout)(dsn) as conn:
            result = plan_run(inputs, conn)
    data = result.to_dict()
    if as_json:
        click.echo(terminal_json(data))
        return
    from feiqiu_etl.cli.views.plan import render_plan

    render_plan(data)


@click.command()
@click.option("--dsn", help="PostgreSQL DSN (ETL_DB_DSN is NOT used: the demo never writes into the warehouse "
                           "by accident); default: database feiqiu_demo on the embedded server")
@click.option("--seed", type=INT, default=7, show_default=True, help="simulated data seed")
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True,
              help="simulated store size")
@click.option("--days", type=IntRange(1, 31), default=3, show_default=True,
              help="days of simulated history to load")
@flag_options("pipeline.workers", "pipeline.batch_size")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", expose_value=False, callback=collect_sets,
              help="any setting (repeatable)")
@click.option("--no-dwd", is_flag=True, help="load ODS only")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@common_options
def demo(dsn, seed, scale, days, no_dwd, as_json, verbose, log_format) -> None:
    """Start PostgreSQL and the simulator, load every task with demo-sized gaps, print a summary."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.cli.demo import run_demo

    overrides, flags = layers()
    result = run_demo(dsn=dsn, seed=seed, scale=scale, days=days, overrides=overrides, load_dwd=not no_dwd,
                      quiet=as_json, flags=flags)
    emit(result, as_json)
    sys.exit(result.exit_code)

