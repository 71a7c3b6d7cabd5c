"""The ``feiqiu-etl`` group (its own options: ``--env-file``, ``-v``, ``--log-format``), the commands of the
modules of :mod:`feiqiu_etl.cli` attached to it, and :func:`entry`, the console script's last line of defence.

A command's module is imported when the command is asked for (:data:`COMMANDS`, click's lazy-group pattern):
``feiqiu-etl runs`` does not import the simulator, the runner, Dagster or the web page (issue 27.6: read-only
commands in under a second). ``--help`` of the group imports them all, for their one-line help."""

from __future__ import annotations

import os
import sys

import click

import importlib

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.config import ConfigError, read_dotenv
from feiqiu_etl.errortext import one_line
from feiqiu_etl.app.errors import AppError, UsageFailure
from feiqiu_etl.textsafe import escape


class CommandFailure(click.ClickException):
    """An :class:`~feiqiu_etl.app.errors.AppError` as the command line reports it: ``Error: <one line>`` on
    stderr and the error's exit code."""

    def __init__(self, error: AppError):
        super().__init__(error.message)
        self.exit_code = error.exit_code


COMMANDS: dict[str, str] = {
    "check": "check:check", "run": "run:run", "plan": "run:plan", "demo": "run:demo",
    "simulate": "simulate:simulate", "sql": "sql:sql", "tasks": "tasks:tasks_cmd", "runs": "ops:runs",
    "show": "ops:show", "status": "ops:status", "cancel": "ops:cancel", "details": "ops:details",
    "config": "config:config", "freshness": "freshness:freshness", "alerts": "alerts:alerts",
    "dagster": "dagster:dagster", "state": "state:state", "web": "web:web",
}
"""Command name → ``module:attribute`` under :mod:`feiqiu_etl.cli`, imported on first use."""


class _Main(SuggestingGroup):
    """The group whose commands' application errors become :class:`CommandFailure` (click's one-line error and
    exit code, also under ``click.testing.CliRunner``), and whose commands load lazily (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands} - ({"web"} if not _web_available() else set()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            if name == "web" and not _web_available():
                return None
            module, attribute = COMMANDS[name].split(":")
            command = getattr(importlib.import_module(f"feiqiu_etl.cli.{module}"), attribute)
            if name == "runs":
                from feiqiu_etl.cli.prune import runs_prune

                command.add_command(runs_prune)
            self.add_command(command, name)
        return self.commands.get(name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AppError as exc:
            raise CommandFailure(exc) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
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



def _web_available() -> bool:
    """The web page's dependencies (Starlette, uvicorn, Jinja2) are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn", "jinja2"))


def _json_logs_asked(argv: list[str] | None = None) -> bool:
    """``--log-format json`` (or ``=json``) anywhere on the command line, parsed or not."""
    args = sys.argv[1:] if argv is None else argv
    return "--log-format=json" in args or any(a == "--log-format" and b == "json" for a, b in zip(args, args[1:]))


def _exit_now(code: int) -> None:
    """Exit with ``code`` after the exit handlers ran and the output was flushed. Not ``sys.exit``: a
    KeyboardInterrupt that landed inside an ``exec`` (a dataclass being built while a command imports lazily)
    leaves CPython's "unhandled KeyboardInterrupt" flag set, and the interpreter would then end itself with
    SIGINT (exit -2) instead of ``code`` (seen about once in five with a SIGTERM 0.45 s after start)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _refused_value(exc: click.ClickException) -> str | None:
    """An option value click refused (``click.BadParameter``: a number, a duration, a choice) as the one line
    the command's own checks print (``--older-than: not a duration: …``, a settings flag's error), without
    click's usage block: ``--timeout: not a duration: 'abc' (…)``. None for any other error (an unknown option
    keeps click's usage and its "did you mean")."""
    if not isinstance(exc, click.BadParameter) or isinstance(exc, click.MissingParameter):
        return None  # a missing argument keeps click's usage and "Missing argument 'QUERY'"
    if exc.param_hint is not None:
        hint = exc.param_hint if isinstance(exc.param_hint, str) else " / ".join(exc.param_hint)
    elif exc.param is not None:
        hint = max(exc.param.opts, key=len) if exc.param.opts else exc.param.human_readable_name
    else:
        return exc.message
    return f"{hint.strip(chr(39))}: {exc.message}"


def entry() -> None:
    """The console script: ``main`` with a last line of defence — whatever escapes becomes one line on
    stderr and a documented exit code (7 for the database, 1 for a bug), never a traceback (``-vv`` adds it)."""
    import logging
    import traceback

    try:
        main.main(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # `feiqiu-etl`, `feiqiu-etl state`: our own help, as is
        exc.show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.message = escape(exc.message)  # it may quote text from outside (a file, the database): one line
        refused = _refused_value(exc)
        if _json_logs_asked():  # a log shipper reading --log-format json gets nothing but JSON
            from feiqiu_etl.logs import error_record

            click.echo(error_record(refused or exc.format_message()), err=True)
        elif refused is not None:
            click.echo(f"Error: {refused}", err=True)
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):  # a signal before a run took over, or in a command
        from feiqiu_etl.common import exitcodes

        click.echo("interrupted: stopped before finishing", err=True)
        _exit_now(exitcodes.CANCELLED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `feiqiu-etl runs --json | head -1`: quietly, exit 1 (Python's and rich's convention)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        import psycopg

        from feiqiu_etl.common import exitcodes
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
