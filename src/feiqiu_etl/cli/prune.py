"""``runs prune``: retention of the run registry from the command line (:mod:`feiqiu_etl.registry.retention`
does the work; ``run.retention_days`` applies the same rule at the end of every run)."""

from __future__ import annotations

import click

from feiqiu_etl.cli.options import common_options, dsn_option, echo_json, json_option, say, settings, setup_logging, \
    warehouse
from feiqiu_etl.app.errors import UsageFailure

PRUNE_BUDGET = 600.0
"""Seconds ``runs prune`` may spend (batches of 200 runs, each statement at most 30 s); a rerun goes on."""


@click.command("prune")
@click.option("--older-than", "older_than", metavar="DURATION",
              help="runs that ended longer ago than this: 90d, 12h, 30m, 2w (default: run.retention_days)")
@click.option("--records", is_flag=True,
              help="delete the run records too (with their alerts), not only their log and request timeline")
@dsn_option
@json_option
@common_options
def runs_prune(older_than, records, dsn, demo, as_json, verbose, log_format) -> None:
    """Remove the stored log and request timeline of runs that ended before a cutoff (the records, counts and
    errors stay, marked 'timeline pruned on …'; with --records the records go too). Never a RUNNING run,
    never ODS/DWD data or what says which windows are loaded."""
    from datetime import timedelta

    from feiqiu_etl.registry.retention import parse_duration, prune

    setup_logging(verbose, log_format)
    if older_than is None:
        days = settings({"db_dsn": dsn}).run.retention_days
        if not days:
            raise UsageFailure("retention is off (run.retention_days = 0): give --older-than, e.g. 90d")
        age = timedelta(days=days)
    else:
        try:
            age = parse_duration(older_than)
        except ValueError as exc:
            raise UsageFailure(f"--older-than: {exc}") from None
    with warehouse(dsn, demo) as conn:
        result = prune(conn, age, records=records, budget_s=PRUNE_BUDGET, statement_timeout_s=30.0)
    if as_json:
        echo_json(result.to_dict())
        return
    from feiqiu_etl.formats import when

    cutoff = when(result.cutoff)
    if not result.runs:
        say(f"nothing to prune: no finished run ended before {cutoff}")
        return
    what = (f"deleted {result.records} run record(s)" if records
            else f"pruned the log and request timeline of {result.runs} run(s)")
    say(f"{what} that ended before {cutoff}: {result.log_rows} log row(s), {result.request_rows} "
        f"request row(s){f', {result.alert_rows} alert row(s)' if records else ''} deleted; ODS/DWD "
        f"data untouched ({result.seconds:.2f} s)")
    if not result.complete:
        say(f"stopped after {PRUNE_BUDGET:.0f} s: run it again to prune the rest")
