"""What the command modules share: the options every command accepts (``--env-file``, ``-v``, ``--log-format``,
``--dsn``/``--demo``, ``--json``), the run and settings options and their parsing into
:class:`~feiqiu_etl.plan.RunOptions` and :class:`~feiqiu_etl.config.Settings`, logging setup, the warehouse
connection of an operations command and how a result is printed. Every module of :mod:`feiqiu_etl.cli`
imports this one; it imports none of them."""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import TYPE_CHECKING, Any, Iterator

import click
import psycopg

from feiqiu_etl import logs
from feiqiu_etl.alerts.choice import FROM_ENVIRONMENT
from feiqiu_etl.formats import use_display_zone
from feiqiu_etl.config import ConfigError, DotEnv, Settings, load_settings, read_dotenv
from feiqiu_etl.config.settings import flags as setting_flags
from feiqiu_etl.errortext import one_line
from feiqiu_etl.app.database import check_database, connector_for, database
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl import registry
from feiqiu_etl.textsafe import escape, terminal_json

if TYPE_CHECKING:
    from feiqiu_etl.alerts.config import AlertChoice


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


def setup_logging(verbose: int = 0, log_format: str | None = None) -> None:
    obj = _root_obj()
    logs.setup(verbose + obj.get("verbose", 0), log_format or obj.get("log_format") or "text")


def collect_sets(ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]) -> None:
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


def layers() -> tuple[dict, dict]:
    """``(--set layer, flags layer)`` this command line gave (``{dotted key: text}`` each)."""
    obj = _root_obj()
    return dict(obj.get("sets", {})), dict(obj.get("flags", {}))


def parse_ids(values: tuple[str, ...], flag: str) -> list[int]:
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
        loaded = load_settings(dotenv=_dotenv(), flags=flags)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    use_display_zone(loaded.display.timezone)
    return loaded


def redacted_args(params: dict[str, Any]) -> dict[str, Any]:
    """The command's parameters for the run record: the token never, a DSN without its password, the API
    base without its secrets (:func:`feiqiu_etl.registry.redact_args`)."""
    from feiqiu_etl.registry import redact_args

    return redact_args(params)


def use_alerts(path: str | None):
    """The command's alert configuration (:class:`~feiqiu_etl.alerts.AlertConfig`, None without a target): the
    alerts file ``path`` and ``FEIQIU_ALERT_URLS``, validated; the command passes it to what it runs. An invalid
    one is a :class:`UsageFailure` (one line naming the file and the field, exit 2) before anything starts."""
    from feiqiu_etl.alerts import AlertsConfigError, load_alerts

    try:
        return load_alerts(path)
    except AlertsConfigError as exc:
        raise UsageFailure(str(exc)) from None


def emit(result, as_json: bool) -> None:
    data = result.to_dict()
    if as_json:
        click.echo(terminal_json(data))
        return
    from feiqiu_etl.cli.views.summary import render_summary

    render_summary(data)
    if data.get("alerts"):
        from feiqiu_etl.alerts.record import alert_lines

        click.echo("\n".join(escape(line) for line in alert_lines(data["alerts"])), err=True)


class Duration(click.ParamType):
    """A duration option in the one form every command takes (:func:`feiqiu_etl.formats.parse_seconds`: ``45m``,
    ``90s``, ``2h``, plain seconds), as seconds (float)."""

    name = "duration"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, (int, float)):
            return value
        from feiqiu_etl.formats import parse_seconds

        try:
            return parse_seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


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
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", expose_value=False, callback=collect_sets,
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
    click.option("--site-id", "site_ids", multiple=True, metavar="SITE_ID", help="store id(s); repeat or comma-separate"),
    click.option("--token", help="API token (prefer env FEIQIU_API_TOKEN)"),
    click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
                 help="fleet file: named lanes (one per token) and their stores"),
    click.option("--lanes", "lanes_csv", default="", help="with --fleet: only these lanes (comma-separated)"),
    click.option("--stores", "stores_csv", default="", metavar="SITE_ID,...",
                 help="with --fleet: only these stores (comma-separated ids)"),
    click.option("--tasks", "tasks_csv", default="", help="comma-separated task codes (default: all)"),
    click.option("--window-start", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), inclusive'),
    click.option("--window-end", help='"YYYY-MM-DD HH:MM:SS" (Asia/Shanghai), exclusive'),
    click.option("--backfill", is_flag=True,
                 help="re-fetch --from/--to of the windowed tasks even where finished; nothing else"),
    click.option("--from", "backfill_from", metavar="DATE", help="with --backfill: first day, YYYY-MM-DD (Asia/Shanghai)"),
    click.option("--to", "backfill_to", metavar="DATE", help="with --backfill: last day, included"),
    click.option("--now", "now_text", metavar='"YYYY-MM-DD HH:MM:SS"',
                 help="treat this Asia/Shanghai time as now: incremental windows end here (a replay, or a simulator "
                      "whose clock was moved; not after the current time)"),
    click.option("--deadline", metavar="06:00|45m", expose_value=False,
                 callback=functools.partial(_collect_flag, "run.deadline"),
                 help="stop sending requests at this time of day (display zone) or this long after the start "
                      "(45m, 90s); recent data first, gaps narrowed within safe bounds (run.deadline)"),
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


def to_run_options(p: dict, timeout: float | None = None, wait_for_lane: float | None = None):
    from feiqiu_etl.plan import RunOptions

    sets, flags = layers()
    return RunOptions(
        api_base=p.get("api_base"), token=p.get("token"), dsn=p.get("dsn"), flags=flags, overrides=sets,
        site_ids=parse_ids(p.get("site_ids") or (), "--site-id"),
        fleet_path=p.get("fleet_path"), lanes=_csv(p.get("lanes_csv", "")),
        stores=parse_ids(tuple(_csv(p.get("stores_csv", ""))), "--stores"),
        task_codes=_csv(p.get("tasks_csv", "")), connector_path=p.get("connector_path"),
        window_start=p.get("window_start"), window_end=p.get("window_end"), backfill=p.get("backfill", False),
        backfill_from=p.get("backfill_from"), backfill_to=p.get("backfill_to"),
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


def dsn_option(fn):
    fn = click.option("--demo", is_flag=True, help="the demo's database (feiqiu_demo) on the embedded server")(fn)
    return click.option("--dsn", help="PostgreSQL DSN (env ETL_DB_DSN); default: embedded server")(fn)
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON on stdout")


@contextlib.contextmanager
def warehouse(dsn: str | None, demo: bool = False,
              alerts: AlertChoice = FROM_ENVIRONMENT) -> Iterator[psycopg.Connection]:
    """The warehouse connection of an operations command: schemas ensured, vanished runs INTERRUPTED (alerted to
    ``alerts``: the command's configuration, default the environment's). ``dsn`` is the ``--dsn`` flag (else
    ``$ETL_DB_DSN``, else the embedded server); ``demo`` opens the demo's database on the embedded server
    instead."""
    from feiqiu_etl.alerts import sweep_and_alert
    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE
    from feiqiu_etl.db.watchdog import DatabaseWatchdog
    from feiqiu_etl.db.schema import ensure_schemas
    from feiqiu_etl.db.embedded import DEMO_DATABASE

    config = settings({"db_dsn": dsn})
    dsn = None if demo else reveal(config.db_dsn)
    timeout, stale = config.db.connect_timeout, config.run.stale_after
    with database(dsn, DEMO_DATABASE if demo else DEFAULT_DATABASE, connect_timeout=timeout) as real_dsn:
        check_database(real_dsn, None, timeout)
        connect = connector_for(timeout)
        # A server that stops answering for db.connect_timeout s (frozen) drops the connection: one line, exit 2.
        watchdog = DatabaseWatchdog(timeout, name="command-db-watchdog", probe=lambda: connect(real_dsn))
        try:
            with connect(real_dsn) as conn, watchdog.track(conn, "command"):
                ensure_schemas(conn)
                sweep_and_alert(conn, stale, alerts)
                yield conn
        except psycopg.Error as exc:
            from feiqiu_etl.db.connection import scrub

            raise UsageFailure(f"database error: {scrub(one_line(exc, None, with_type=False), real_dsn)}") from None
        finally:
            watchdog.stop()


def echo_json(data) -> None:
    """JSON as the web API gives it (:func:`registry.jsonable`): seconds as numbers, ISO 8601 times."""
    click.echo(terminal_json(registry.jsonable(data)))


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0 = any free port); one-line error if impossible."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError as exc:
        raise UsageFailure(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def say(text: str, *, err: bool = False) -> None:
    """A plain message to stdout (stderr with ``err``), wrapped between words on a terminal
    (:func:`feiqiu_etl.cli.views.console.say`; imported here lazily, as rich is)."""
    from feiqiu_etl.cli.views.console import say as print_message

    print_message(text, err=err)
