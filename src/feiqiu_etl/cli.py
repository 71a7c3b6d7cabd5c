"""Command line: ``feiqiu-etl run | plan | demo | runs | show | status | cancel | details | config | sql |
tasks | simulate | web | freshness | alerts test``.

Exit codes (README lists every cause): 0 SUCCESS, 2 usage or configuration error (before any request),
3 PARTIAL, 4 FAILED, 5 CANCELLED, 6 the token's lane is held by another run, 7 the database went away
during the run, 8 stale data (``freshness --fail-stale``), 130 a second Ctrl-C. With ``--json`` stdout carries exactly one JSON object; logs go to
stderr. Secrets (the API token, DB passwords) are never printed.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import click

from feiqiu_etl import logs
from feiqiu_etl.config import ConfigError, DotEnv, Settings, load_settings, read_dotenv
from feiqiu_etl.config.settings import flags as setting_flags
from feiqiu_etl.errortext import one_line
from feiqiu_etl.flowcli import UsageFailure, database
from feiqiu_etl.textsafe import escape, terminal_json

# ---------------------------------------------------------------------------------------------- helpers
def _root_obj() -> dict:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    root = ctx.find_root()
    if root.obj is None:
        root.obj = {}
    return root.obj


def _load_env(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--env-file`` given after the command: load it now (eagerly, before options that read env vars)."""
    if value is None or ctx.resilient_parsing:
        return value
    try:
        loaded = read_dotenv(value, required=True)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    obj = _root_obj()
    obj["dotenv"] = obj.get("dotenv", DotEnv()) | loaded
    return value


def common_options(fn):
    """``--env-file``, ``-v`` and ``--log-format``, accepted after the command too."""
    fn = click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
                      help="stderr log lines as text or one JSON object per line")(fn)
    fn = click.option("-v", "--verbose", count=True, help="more log output on stderr (-v INFO, -vv DEBUG)")(fn)
    fn = click.option("--env-file", "command_env_file", is_eager=True, expose_value=False, callback=_load_env,
                      type=click.Path(dir_okay=False), help="also read settings from this file (must exist)")(fn)
    return fn


def _setup_logging(verbose: int = 0, log_format: str | None = None) -> None:
    obj = _root_obj()
    logs.setup(verbose + obj.get("verbose", 0), log_format or obj.get("log_format") or "text")


def _collect_sets(ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]) -> None:
    """``--set KEY=VALUE`` (repeatable): into this command line's ``--set`` layer, as text."""
    if ctx.resilient_parsing:
        return
    layer = _root_obj().setdefault("sets", {})
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise UsageFailure(f"--set expects KEY=VALUE, got {pair!r}")
        layer[key.strip()] = value.strip()


def _collect_flag(key: str, ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A settings flag (``--pipeline-rate-min 6``): into this command line's flags layer under ``key``, as
    text; the settings model types and checks it."""
    if value is not None and not ctx.resilient_parsing:
        _root_obj().setdefault("flags", {})[key] = value


def _layers() -> tuple[dict, dict]:
    """``(--set layer, flags layer)`` this command line gave (``{dotted key: text}`` each)."""
    obj = _root_obj()
    return dict(obj.get("sets", {})), dict(obj.get("flags", {}))


def _parse_ids(values: tuple[str, ...], flag: str) -> list[int]:
    sites: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if not (part.isascii() and part.isdigit()) or not 0 < int(part) < 2**53:
                raise UsageFailure(f"{flag} must be a positive integer below 2^53, got {part!r}")
            sites.append(int(part))
    return sites


def _csv(value: str) -> list[str]:
    return [c.strip() for c in (value or "").split(",") if c.strip()]


def _dotenv() -> DotEnv:
    """What the ``.env`` files of this command line put into the environment."""
    return _root_obj().get("dotenv", DotEnv())


def settings(flags: dict[str, Any] | None = None) -> Settings:
    """The settings of a command without a connector (``sql``, ``web``, the operations commands): the
    environment, ``.env`` and ``flags`` (``{"db_dsn": --dsn}`` …), as :func:`feiqiu_etl.config.load_settings`
    builds them for every command. Raises :class:`UsageFailure` (one line)."""
    try:
        return load_settings(dotenv=_dotenv(), flags=flags)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None


def _redacted_args(params: dict[str, Any]) -> dict[str, Any]:
    """The command's parameters for the run record: the token never, a DSN without its password, the API
    base without its secrets (:func:`feiqiu_etl.runs.registry.redact_args`)."""
    from feiqiu_etl.runs.registry import redact_args

    return redact_args(params)


def use_alerts(path: str | None) -> None:
    """Validate the alerts file ``path`` and ``FEIQIU_ALERT_URLS`` and use them in this process; an invalid
    one is a :class:`UsageFailure` (one line naming the file and the field, exit 2) before anything starts."""
    from feiqiu_etl.alerts import AlertsConfigError, activate, load_alerts

    try:
        activate(load_alerts(path))
    except AlertsConfigError as exc:
        raise UsageFailure(str(exc)) from None


def _emit(result, as_json: bool) -> None:
    data = result.to_dict()
    if as_json:
        click.echo(terminal_json(data))
        return
    from feiqiu_etl.report import render_summary

    render_summary(data)
    if data.get("alerts"):
        from feiqiu_etl.alerts.record import alert_lines

        click.echo("\n".join(escape(line) for line in alert_lines(data["alerts"])), err=True)


def flag_options(*keys: str):
    """The click options of the settings flags (declared on the settings model: :func:`setting_flags`), all of
    them or those of ``keys``. Their text goes to the model as it is: it is typed (and checked) only there."""
    def apply(fn):
        for flag, key, text in reversed(setting_flags()):
            if not keys or key in keys:
                fn = click.option(flag, metavar="N" if key.endswith(("workers", "size")) else "SECONDS",
                                  help=f"{text} ({key})", expose_value=False,
                                  callback=functools.partial(_collect_flag, key))(fn)
        return fn
    return apply


pipeline_options = [
    flag_options(),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", expose_value=False, callback=_collect_sets,
                 help="any setting, e.g. pipeline.ods_group_package.rate_min=9 (repeatable)"),
    click.option("--unsafe-gaps", is_flag=True,
                 help="allow gaps below the upstream's documented minimum (e.g. against a simulator started "
                      "with tiny gaps); never use it against the real API"),
]


def with_pipeline_options(fn):
    for option in reversed(pipeline_options):
        fn = option(fn)
    return fn


run_options = [
    click.option("--api-base", help="API base URL (env FEIQIU_API_BASE)"),
    click.option("--site-id", "site_ids", multiple=True, help="store id(s); repeat or comma-separate"),
    click.option("--token", help="API token (prefer env FEIQIU_API_TOKEN)"),
    click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
                 help="fleet file: named lanes (one per token) and their stores"),
    click.option("--lanes", "lanes_csv", default="", help="with --fleet: only these lanes (comma-separated)"),
    click.option("--stores", "stores_csv", default="", help="with --fleet: only these stores (comma-separated ids)"),
    click.option("--tasks", "tasks_csv", default="", help="comma-separated task codes (default: all)"),
    click.option("--window-start", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), inclusive'),
    click.option("--window-end", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), exclusive'),
    click.option("--now", "now_text", metavar='"YYYY-MM-DD HH:MM:SS"',
                 help="treat this Asia/Shanghai time as now: incremental windows end here (a replay, or a simulator "
                      "whose clock was moved; not after the current time)"),
    click.option("--dsn", help="PostgreSQL DSN (env ETL_DB_DSN); default: embedded server"),
    click.option("--connector", "connector_path", type=click.Path(dir_okay=False), help="connector YAML (default: Feiqiu)"),
    click.option("--no-dwd", is_flag=True, help="load ODS only"),
    click.option("--dwd-only", is_flag=True, help="skip ODS; load DWD from what ODS holds"),
    click.option("--dwd-tables", default="", help="comma-separated DWD tables to load (default: all)"),
    click.option("--dwd-full", is_flag=True, help="compare every dimension in full instead of what changed"),
]


def with_run_options(fn):
    fn = with_pipeline_options(fn)
    for option in reversed(run_options):
        fn = option(fn)
    return fn


def _run_options(p: dict, timeout: float | None = None, wait_for_lane: float | None = None):
    from feiqiu_etl.plan import RunOptions

    sets, flags = _layers()
    return RunOptions(
        api_base=p.get("api_base"), token=p.get("token"), dsn=p.get("dsn"), flags=flags, overrides=sets,
        site_ids=_parse_ids(p.get("site_ids") or (), "--site-id"),
        fleet_path=p.get("fleet_path"), lanes=_csv(p.get("lanes_csv", "")),
        stores=_parse_ids(tuple(_csv(p.get("stores_csv", ""))), "--stores"),
        task_codes=_csv(p.get("tasks_csv", "")), connector_path=p.get("connector_path"),
        window_start=p.get("window_start"), window_end=p.get("window_end"),
        timeout=timeout, load_dwd=not p.get("no_dwd", False), dwd_only=p.get("dwd_only", False),
        dwd_tables=_csv(p.get("dwd_tables", "")), dwd_full=p.get("dwd_full", False),
        unsafe_gaps=p.get("unsafe_gaps", False), wait_for_lane=wait_for_lane, dotenv=_dotenv(),
        now=_parse_now(p.get("now_text")),
    )


def _parse_now(text: str | None):
    """``--now``: a naive Asia/Shanghai time between 2000-01-01 and the current time, or ``None``."""
    if text is None:
        return None
    from feiqiu_etl.connector.windows import EARLIEST_WINDOW, fmt, local_now, parse_local

    try:
        value = parse_local(text)
    except ValueError as exc:
        raise UsageFailure(f"--now: {exc}") from None
    if not EARLIEST_WINDOW <= value <= local_now():
        raise UsageFailure(f"--now must lie between {fmt(EARLIEST_WINDOW)} and the current time, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------------- commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="feiqiu-etl")
@click.option("--env-file", default=".env", show_default=True, type=click.Path(dir_okay=False),
              help="read settings and FEIQIU_API_TOKEN / FEIQIU_API_BASE / ETL_DB_DSN from this file "
                   "(the real environment wins)")
@click.option("-v", "--verbose", count=True, help="more log output on stderr (also accepted after the command)")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="stderr log lines as text or one JSON object per line")
@click.pass_context
def main(ctx: click.Context, env_file: str, verbose: int, log_format: str) -> None:
    """Pull the Feiqiu store API through one rate-limited request lane per token into PostgreSQL (ODS + DWD)."""
    explicit = ctx.get_parameter_source("env_file") != click.core.ParameterSource.DEFAULT
    try:
        dotenv = read_dotenv(env_file, required=explicit)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    ctx.obj = {"verbose": verbose, "dotenv": dotenv, "log_format": log_format}


@main.command()
@with_run_options
@click.option("--timeout", type=float, help="cancel the run after this many seconds")
@click.option("--wait-for-lane", type=float, metavar="SECONDS",
              help="if another run holds a token's lane, wait up to this long (default: exit 6 at once)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("--no-progress", is_flag=True, help="no progress display or progress lines on stderr")
@click.option("--alerts", "alerts_path", envvar="FEIQIU_ALERTS", type=click.Path(dir_okay=False), metavar="FILE",
              help="alerts file (env FEIQIU_ALERTS): where to send alerts about this run (README \"Alerts\")")
@common_options
@click.pass_context
def run(ctx, timeout, wait_for_lane, as_json, no_progress, alerts_path, verbose, log_format, **p) -> None:
    """Run the flow: every lane (token) at once, each strictly serial, then DWD."""
    _setup_logging(verbose, log_format)
    from feiqiu_etl.flowcli import execute_flow

    options = _run_options(p, timeout, wait_for_lane)
    use_alerts(alerts_path)
    args = _redacted_args({**p, "timeout": timeout, "wait_for_lane": wait_for_lane, "alerts": alerts_path})
    result = execute_flow(options, command="run", args=args, progress=not no_progress)
    _emit(result, as_json)
    sys.exit(result.exit_code)


@main.command()
@with_run_options
@click.option("--json", "as_json", is_flag=True, help="print the plan as one JSON object")
@common_options
def plan(as_json, verbose, log_format, **p) -> None:
    """Show what a run would request: lanes, stores, tasks, windows, estimated requests and lane time.

    Reads the warehouse's history (finished windows, owed details, past runs); sends no request."""
    _setup_logging(verbose, log_format)
    from feiqiu_etl.flowcli import check_database, plan_run, prepare_inputs, connector_for

    from feiqiu_etl.config.settings import reveal

    inputs = prepare_inputs(_run_options(p))
    timeout = inputs.settings.db.connect_timeout
    with database(reveal(inputs.settings.db_dsn)) as dsn:
        check_database(dsn, None, timeout)
        with connector_for(timeout)(dsn) as conn:
            result = plan_run(inputs, conn)
    data = result.to_dict()
    if as_json:
        click.echo(terminal_json(data))
        return
    from feiqiu_etl.report import render_plan

    render_plan(data)


@main.command()
@click.option("--dsn", help="PostgreSQL DSN (ETL_DB_DSN is NOT used: the demo never writes into the warehouse "
                           "by accident); default: database feiqiu_demo on the embedded server")
@click.option("--seed", type=int, default=7, show_default=True, help="simulated data seed")
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True,
              help="simulated store size")
@click.option("--days", type=click.IntRange(1, 31), default=3, show_default=True,
              help="days of simulated history to load")
@flag_options("pipeline.workers", "pipeline.batch_size")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", expose_value=False, callback=_collect_sets,
              help="any setting (repeatable)")
@click.option("--no-dwd", is_flag=True, help="load ODS only")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@common_options
def demo(dsn, seed, scale, days, no_dwd, as_json, verbose, log_format) -> None:
    """Start PostgreSQL and the simulator, load every task with demo-sized gaps, print a summary."""
    _setup_logging(verbose, log_format)
    from feiqiu_etl.demo import run_demo

    overrides, flags = _layers()
    result = run_demo(dsn=dsn, seed=seed, scale=scale, days=days, overrides=overrides, load_dwd=not no_dwd,
                      quiet=as_json, flags=flags)
    _emit(result, as_json)
    sys.exit(result.exit_code)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 = any free port")
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--scale", type=click.Choice(["small", "medium", "large"]), default="small", show_default=True)
@click.option("--days", type=click.IntRange(1, 366), default=3, show_default=True, help="days of history")
@click.option("--gap-standard", type=click.FloatRange(0, 3600), default=3.0, show_default=True,
              help="risk-control gap G, standard class (s)")
@click.option("--gap-groupbuy", type=click.FloatRange(0, 3600), default=8.0, show_default=True,
              help="risk-control gap G, groupbuy class (s)")
@click.option("--ban-seconds", type=click.FloatRange(0, 86400), default=300.0, show_default=True,
              help="ban length after 3 violations within the violation window (s)")
@click.option("--violation-window", type=click.FloatRange(0, 86400), default=60.0, show_default=True,
              help="rolling window in which 3 violations ban the token (s)")
@click.option("--no-risk-control", is_flag=True, help="accept every request (no gaps, no bans)")
@click.option("--anchor", metavar='"YYYY-MM-DD HH:MM:SS"',
              help="where the history ends and the clock starts (Asia/Shanghai; default: now); POST /__sim/advance "
                   "moves it forward")
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
              help="serve a fleet file's lanes: each token (read from its token_env, or generated and printed) "
                   "may read its lane's stores")
@common_options
def simulate(host, port, seed, scale, days, gap_standard, gap_groupbuy, ban_seconds, violation_window, no_risk_control,
             anchor, fleet_path, verbose, log_format) -> None:
    """Serve the simulated Feiqiu API (docs/upstream-api.md) until Ctrl-C."""
    _setup_logging(verbose, log_format)
    from feiqiu_etl.connector.windows import parse_local
    from feiqiu_etl.simulator import RiskControlConfig, SimulatorConfig, serve_forever

    try:
        anchor_at = parse_local(anchor) if anchor else None
    except ValueError as exc:
        raise UsageFailure(f"--anchor: {exc}") from None
    tokens, site_ids = None, (8640015201004417,)
    if fleet_path:
        tokens, site_ids = _fleet_tokens(fleet_path)
    try:
        risk = RiskControlConfig(gap_standard=gap_standard, gap_groupbuy=gap_groupbuy, ban_seconds=ban_seconds,
                                 violation_window=violation_window, enabled=not no_risk_control)
        cfg = SimulatorConfig(seed=seed, scale=scale, days=days, host=host, port=port, risk=risk,
                              site_ids=site_ids, tokens=tokens, anchor=anchor_at)
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None
    try:
        serve_forever(cfg)
    except OSError as exc:
        raise UsageFailure(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _fleet_tokens(path: str) -> tuple[dict, tuple]:
    import os
    import secrets

    from feiqiu_etl.plan.fleet import FleetError, load_fleet

    try:
        fleet = load_fleet(path)
    except FleetError as exc:
        raise UsageFailure(str(exc)) from None
    tokens = {}
    for lane in fleet.lanes:
        token = os.environ.get(lane.token_env) or f"fq_{lane.name}_{secrets.token_urlsafe(9)}"
        if lane.token_env not in os.environ:
            click.echo(f"export {lane.token_env}={token}")
        tokens[token] = tuple(s.site_id for s in lane.stores)
    sites = tuple(s for sites in tokens.values() for s in sites)
    return tokens, sites


@main.command()
@click.argument("query")
@click.option("--dsn", help="PostgreSQL DSN of a read-only role (env ETL_DB_DSN; README: a read-only role for "
                           "sql); default: the embedded server's read-only role")
@click.option("--demo", is_flag=True, help="query the demo's database (feiqiu_demo) on the embedded server")
@click.option("--json", "as_json", is_flag=True, help="rows as a JSON array of objects")
@click.option("--timeout", metavar="SECONDS", help="sql.timeout: cancel the statement after this many seconds "
                                                   "(env SQL_TIMEOUT; default 60)")
@click.pass_context
def sql(ctx, query, dsn, demo, as_json, timeout) -> None:
    """Run ONE read-only SQL statement against the warehouse and print the rows (e.g. after the demo).

    On the embedded server it logs in as the role feiqiu_reader, which can only read (the database's schemas):
    it can neither write, run programs nor read or write files (COPY ... TO PROGRAM / TO 'file'). With --dsn a
    role that is, or can become (SET ROLE, any membership, inherited or not), a superuser or a member of
    pg_execute_server_program, pg_read_server_files or pg_write_server_files is refused. The statement is sent
    as a prepared statement (so a second statement is refused) inside a READ ONLY transaction that is rolled
    back (so nothing is written and no NOTIFY is sent), and cancelled after --timeout seconds (exit 2).

    Without --dsn the embedded server's data folder is <home>/pgdata (home: FEIQIU_ETL_HOME, else
    /var/lib/feiqiu-etl as root, else ~/.local/share/feiqiu-etl); as root, when its account feiqiu_etl_pg
    cannot enter the home (under /root, made by mktemp -d), /var/lib/feiqiu-etl/homes/<hash of the
    home>/pgdata. `feiqiu-etl config show` prints which."""
    import psycopg

    from feiqiu_etl.db.connection import connect, scrub
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE
    from feiqiu_etl.db.reader_session import KEEPALIVE, StatementTimeout, bound_session, role_problem, run_statement
    from feiqiu_etl.db.schema import ensure_schemas
    from feiqiu_etl.demo import DEMO_DATABASE

    if not query.strip().rstrip(";").strip():
        raise UsageFailure("an empty query: give one SQL statement, e.g. \"SELECT count(*) FROM ods.settlement\"")
    if demo and dsn is not None:
        raise UsageFailure("--demo reads the embedded demo database; it does not go with --dsn")
    from feiqiu_etl.config.settings import reveal

    config = settings({"db_dsn": dsn, "sql.timeout": timeout})
    dsn, timeout = None if demo else reveal(config.db_dsn), config.sql.timeout

    def prepare(superuser_dsn: str) -> None:  # a fresh home has no etl_meta yet: the documented queries must work
        with connect(superuser_dsn) as conn:
            ensure_schemas(conn)

    with database(dsn, DEMO_DATABASE if demo else DEFAULT_DATABASE, reader=True, prepare=prepare) as real_dsn:
        try:
            with connect(real_dsn, **KEEPALIVE) as conn:
                problem = role_problem(conn)
                if problem:
                    raise UsageFailure(problem)
                bound_session(conn, timeout)
                result = run_statement(conn, query, timeout)
        except StatementTimeout as exc:
            raise UsageFailure(str(exc)) from None
        except psycopg.Error as exc:
            raise UsageFailure(scrub(one_line(exc, None, with_type=False), real_dsn)) from None
    columns, rows = result.columns, result.rows
    if as_json:
        click.echo(terminal_json([dict(zip(columns, r)) for r in rows]))
        return
    from feiqiu_etl.report import render_rows

    render_rows(columns, [tuple(_sql_text(v) for v in r) for r in rows])


def _sql_text(value: Any) -> Any:
    """jsonb values (dicts, lists) print as JSON, not as Python repr."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


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
        "detail_table": t.detail_target_table, "gap_class": t.gap_class,
        "min_gap": connector.min_gap(t.gap_class), "pipeline_defaults": dict(t.pipeline),
        "volatile_fields": list(t.volatile_fields),
        "lookback_minutes": None if t.lookback is None else t.lookback.total_seconds() / 60,
        "expected_rows": list(t.expected_rows) if t.expected_rows else None,
        "expected_daily_rows": list(t.expected_daily_rows) if t.expected_daily_rows else None,
    } for t in connector.tasks]
    if as_json:
        click.echo(terminal_json({"connector": connector.name, "tasks": rows}))
        return
    from feiqiu_etl.report import render_tasks

    render_tasks(connector.name, rows)


from feiqiu_etl.commands import register  # noqa: E402 - the operations commands attach to ``main``

register(main)


def _json_logs_asked(argv: list[str] | None = None) -> bool:
    """``--log-format json`` (or ``=json``) anywhere on the command line, parsed or not."""
    args = sys.argv[1:] if argv is None else argv
    return "--log-format=json" in args or any(a == "--log-format" and b == "json" for a, b in zip(args, args[1:]))


def entry() -> None:
    """The console script: ``main`` with a last line of defence — whatever escapes becomes one line on
    stderr and a documented exit code (7 for the database, 1 for a bug), never a traceback (``-vv`` adds it)."""
    import logging
    import traceback

    try:
        main.main(standalone_mode=False)
    except click.ClickException as exc:
        exc.message = escape(exc.message)  # it may quote text from outside (a file, the database): one line
        if _json_logs_asked():  # a log shipper reading --log-format json gets nothing but JSON
            from feiqiu_etl.logs import error_record

            click.echo(error_record(exc.format_message()), err=True)
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):  # a signal before a run took over, or in a command
        from feiqiu_etl import exitcodes

        click.echo("interrupted: stopped before finishing", err=True)
        sys.exit(exitcodes.CANCELLED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `feiqiu-etl runs --json | head -1`: quietly, exit 1 (Python's and rich's convention)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        import psycopg

        from feiqiu_etl import exitcodes
        from feiqiu_etl.db.health import DatabaseUnavailable

        text = escape(one_line(exc, 400, with_type=False))
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        if isinstance(exc, (psycopg.Error, DatabaseUnavailable)):
            from feiqiu_etl.db.connection import scrub

            dsn = os.environ.get("ETL_DB_DSN", "")
            click.echo(f"Error: database unavailable: {scrub(text, dsn) if dsn else text}", err=True)
            sys.exit(exitcodes.DATABASE_LOST)
        click.echo(f"Error: internal error ({exc.__class__.__name__}: {text}); please report it "
                   "(run with -vv for the details)", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    entry()
