"""``feiqiu-etl web``: serve the admin web page (:mod:`feiqiu_etl.web`) on the warehouse — the embedded
server by default (started here and stopped when the command ends, like every other command) or ``--dsn``.

It binds 127.0.0.1 by default. Any other address needs ``--auth-token`` (or ``FEIQIU_WEB_TOKEN``), else the
command refuses to start (exit 2, one line, before the database starts). The address is bound before the
database starts, so a port in use is a one-line error too. Ctrl-C or SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket

import click

from feiqiu_etl.cli.numeric import FloatRange, IntRange
from feiqiu_etl.cli.options import common_options, dsn_option, listen, settings, setup_logging, warehouse
from feiqiu_etl.app.database import database
from feiqiu_etl.app.errors import UsageFailure

MIN_TOKEN_LENGTH = 16  # web.security.MIN_TOKEN_CHARACTERS (not imported here: it loads Starlette)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to bind; anything but 127.0.0.1, ::1 or localhost needs --auth-token")
@click.option("--port", type=IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port (0 = any free port; the address is printed on stderr)")
@click.option("--auth-token", metavar="TOKEN",
              help="require this token (Authorization: Bearer, or the login form) on every request "
                   f"(env FEIQIU_WEB_TOKEN, preferred: a command line is visible to other users); at least "
                   f"{MIN_TOKEN_LENGTH} characters that are not whitespace, not all the same")
@click.option("--stale-hours", type=FloatRange(0.01, 8760), default=26.0, show_default=True,
              help="Freshness page: red when the last complete window or snapshot is older than this")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False),
              help="connector YAML whose tasks the Freshness page lists (default: the bundled Feiqiu connector)")
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
              help="Freshness page: judge only the tasks each store of this fleet file is scheduled for")
@click.option("--reader-dsn", envvar="ETL_READER_DSN", metavar="DSN",
              help="read the warehouse as this read-only role (env ETL_READER_DSN); default: a role made for this "
                   "server (needs a DSN whose role may create roles)")
@dsn_option
@common_options
def web(host, port, auth_token, stale_hours, connector_path, fleet_path, reader_dsn, dsn, demo, verbose,
        log_format) -> None:
    """Serve the admin web page: runs, one run with its lane timeline, live lanes with Cancel, freshness,
    and the JSON API (docs/guides/web.md)."""
    setup_logging(verbose, log_format)
    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.web.security import needs_token, token_problem

    config = settings({"web_token": auth_token, "db_dsn": dsn})
    auth_token = reveal(config.web_token)
    if needs_token(host) and not auth_token:
        raise UsageFailure(f"binding {host} needs --auth-token (or FEIQIU_WEB_TOKEN); without a token only "
                           "127.0.0.1, ::1 and localhost are served")
    if auth_token is not None and token_problem(auth_token):
        raise UsageFailure(token_problem(auth_token))
    from feiqiu_etl.connector import load_connector
    from feiqiu_etl.connector.model import ConnectorError

    try:
        connector = load_connector(connector_path)
    except (ConnectorError, OSError) as exc:
        raise UsageFailure(str(exc)) from None
    from feiqiu_etl.cli.freshness import schedule_for

    schedule = schedule_for(fleet_path, connector)
    sock = listen(host, port)
    try:
        _serve(sock, config, _Page(host=host, stale_hours=stale_hours, connector=connector, schedule=schedule,
                                   store_names=_store_names(fleet_path), reader_dsn=reader_dsn), demo, verbose)
    finally:
        sock.close()


def _store_names(fleet_path: str | None) -> dict[int, str]:
    """``{site_id: name}`` of the fleet file's stores that have a name (the page shows them); {} without one
    (the file was validated already by ``schedule_for``)."""
    if not fleet_path:
        return {}
    from feiqiu_etl.plan.fleet import load_fleet

    return {s.site_id: s.name for lane in load_fleet(fleet_path).lanes for s in lane.stores if s.name}


@dataclasses.dataclass(frozen=True)
class _Page:
    """What the command's options say the page serves: the bound ``host``, the freshness threshold
    ``stale_hours`` (hours), the ``connector``, what the fleet file says (the freshness ``schedule``, or None
    for every task, and the ``store_names``) and the ``reader_dsn`` to read as (None: a role made for it)."""

    host: str
    stale_hours: float
    connector: object
    schedule: object = None
    store_names: dict = dataclasses.field(default_factory=dict)
    reader_dsn: str | None = None


def _serve(sock: socket.socket, config, page: _Page, demo: bool, verbose: int) -> None:
    """Serve ``page`` on ``sock`` with the command's :class:`~feiqiu_etl.config.Settings` ``config`` (web token,
    DSN, run and database timeouts, web language) until a signal stops it; the pages read as
    ``page.reader_dsn``'s role or one made for the server (:mod:`feiqiu_etl.web.reader`)."""
    host, stale_hours, connector, reader_dsn = page.host, page.stale_hours, page.connector, page.reader_dsn
    import psycopg

    from feiqiu_etl.config.settings import reveal
    from feiqiu_etl.db.connection import scrub
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE
    from feiqiu_etl.db.embedded import DEMO_DATABASE
    from feiqiu_etl.errortext import one_line
    from feiqiu_etl.web import WebSettings

    token, dsn = reveal(config.web_token), reveal(config.db_dsn)
    with database(None if demo else dsn, DEMO_DATABASE if demo else DEFAULT_DATABASE,
                  connect_timeout=config.db.connect_timeout) as real_dsn:
        with warehouse(real_dsn):  # reachable, schemas up to date, vanished runs INTERRUPTED
            pass
        from feiqiu_etl.web.reader import ReaderProblem, web_reader

        try:
            with web_reader(real_dsn, reader_dsn, connect_timeout=config.db.connect_timeout) as read_dsn:
                settings = WebSettings(
                    dsn=real_dsn, reader_dsn=read_dsn, token=token, host=host, connector=connector.name,
                    task_codes=tuple(t.code for t in connector.tasks), schedule=page.schedule,
                    stale_hours=stale_hours, run_stale_after=config.run.stale_after,
                    connect_timeout=config.db.connect_timeout, language=config.web.language,
                    task_names={t.code: dict(t.names) for t in connector.tasks},
                    store_names=page.store_names)
                _run_server(sock, settings, verbose, real_dsn)
        except ReaderProblem as exc:
            raise UsageFailure(str(exc)) from None
        except psycopg.Error as exc:  # --reader-dsn cannot connect, or the role cannot be made
            raise UsageFailure(f"the web page's read-only role: {scrub(one_line(exc, None, with_type=False), real_dsn)}") from None


def _run_server(sock: socket.socket, settings, verbose: int, real_dsn: str) -> None:
    """Serve the app of ``settings`` on ``sock`` until a signal stops it."""
    import uvicorn

    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.web import create_app

    app = create_app(settings)
    server = _server(uvicorn.Config(
        app, log_config=None, log_level="info" if verbose else "warning", access_log=verbose > 0, lifespan="on",
        timeout_graceful_shutdown=2, server_header=False, proxy_headers=False), app.state.feed)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    click.echo(f"feiqiu-etl web: serving http://{shown}:{bound[1]}/ on {redact_dsn(real_dsn)} "
               f"({'token required' if settings.token else 'no token: loopback only'}); Ctrl-C stops", err=True)
    server.run(sockets=[sock])
    if not server.started:
        raise UsageFailure("the web server did not start (see the lines above)")
    logging.getLogger("feiqiu_etl.web").info("web server stopped")


def _server(config, feed):
    """A ``uvicorn.Server`` that also ends the open Live streams at once on Ctrl-C/SIGTERM (otherwise the
    graceful shutdown waits for them)."""
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            feed.close()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            """Like uvicorn's, except that the signal which stopped the server is not raised again
            afterwards: Ctrl-C and SIGTERM end the command normally (exit 0), not with "Aborted!"."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)
