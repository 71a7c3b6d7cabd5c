"""``AppState``: what every route handler of the web page shares — settings, access rules, the connection pool,
the templates and the live feed — built once per application by :func:`feiqiu_etl.web.app.create_app`.

Handlers (:mod:`.routes`, :mod:`.api`) find it as ``request.app.state.web`` (:func:`app_state`). It opens
nothing when built: the pool opens when the application starts (:meth:`AppState.lifespan`) and closes, with the
live feed, when it stops.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from psycopg_pool import ConnectionPool
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

from feiqiu_etl.db.connection import SESSION_TIME_ZONE, connect, redact_dsn
from feiqiu_etl.db.watchdog import DatabaseWatchdog
from feiqiu_etl.web import queries
from feiqiu_etl.web import i18n
from feiqiu_etl.web.format import filters
from feiqiu_etl.web.live import LiveFeed
from feiqiu_etl.web.metrics import MetricsEndpoint
from feiqiu_etl.web.security import Security

if TYPE_CHECKING:
    from feiqiu_etl.web.settings import WebSettings

HERE = Path(__file__).parent


class AppState:
    """See module docstring. ``settings`` as given; ``security`` the access rules; ``pool`` the database
    connections (at most ``settings.pool_size``; one read — its checkout and its statements — is given
    ``settings.read_timeout`` s: ``watchdog``, the runs' :class:`~feiqiu_etl.db.watchdog.DatabaseWatchdog`, shuts the
    connection of a read down once the server has not answered anything for that long, so a frozen server is a
    connection error, answered 503, and the broken connection leaves the pool; the next read connects anew);
    ``feed`` the one poller behind every Live page; ``metrics`` what ``/metrics`` serves (read on each scrape,
    :mod:`.metrics`); ``shown_dsn`` what the footer says of the database."""

    def __init__(self, settings: WebSettings):
        self.settings = settings
        self.security = Security(settings.token, settings.host)
        kwargs = {"options": f"-c TimeZone={SESSION_TIME_ZONE}",
                  "connect_timeout": max(1, round(settings.connect_timeout))}
        self.pool = ConnectionPool(settings.reader_dsn or settings.dsn, min_size=1, max_size=settings.pool_size,
                                   open=False, name="feiqiu-web", kwargs=kwargs,
                                   timeout=min(settings.connect_timeout, settings.read_timeout))
        # the loading role, for the page's only writes (a cancel, the sweep): one connection, made when needed
        self.writer = ConnectionPool(settings.dsn, min_size=0, max_size=1, open=False, name="feiqiu-web-writer",
                                     kwargs=kwargs, timeout=min(settings.connect_timeout, settings.read_timeout))
        self.watchdog = DatabaseWatchdog(settings.read_timeout, name="web-db-watchdog",
                                         probe=lambda: connect(settings.dsn, connect_timeout=settings.connect_timeout))
        self.templates = {lang: _templates(lang, settings) for lang in i18n.LANGUAGES}
        self.shown_dsn = describe_dsn(settings.dsn)
        self.feed = LiveFeed(self.read_status, sweep=self.sweep, interval=settings.poll_interval)
        self.metrics = MetricsEndpoint(self.db, settings)
        from feiqiu_etl.web.overview import FinishedRuns

        self.finished_runs = FinishedRuns()  # the overview's summaries of finished runs, per run id

    @contextlib.contextmanager
    def db(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, watched while lent (psycopg and pool errors propagate: the app answers 503; a
        server silent for ``settings.read_timeout`` s: the connection is shut down, a connection error)."""
        with self.pool.connection() as conn, self.watchdog.track(conn, "web read"):
            yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[psycopg.Connection]:
        """A connection of the loading role, for a write (a cancel, the sweep), watched like :meth:`db`."""
        with self.writer.connection() as conn, self.watchdog.track(conn, "web write"):
            yield conn

    def read_status(self) -> dict:
        """``/api/status``: running runs with their live status, runs ended in the last 10 minutes."""
        with self.db() as conn:
            return queries.status_payload(conn)

    def sweep(self) -> None:
        """Mark runs whose process vanished INTERRUPTED."""
        from feiqiu_etl.alerts import sweep_and_alert

        with self.write() as conn:
            sweep_and_alert(conn, self.settings.run_stale_after)

    def language(self, request: Request) -> str:
        """The request's language (:func:`feiqiu_etl.web.i18n.choose`: switch cookie, ``web.language``,
        ``Accept-Language``)."""
        return i18n.choose(request.cookies.get(i18n.COOKIE), self.settings.language,
                           request.headers.get("accept-language"))

    def gettext(self, request: Request, message: str) -> str:
        """``message`` in the request's language (for texts built in Python: errors, login messages)."""
        return i18n.gettext(self.language(request), message)

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """``template`` rendered with ``context`` plus what every page shows (CSRF token, who is logged in,
        the database and the version once logged in — never before (issue 27) —, the display zone with its offset:
        the zone of every time on the page), in the request's language (:meth:`language`)."""
        from feiqiu_etl.formats import display_zone_label

        lang = self.language(request)
        context.update(request=request, csrf_token=self.security.csrf_token(request.state.session),
                       auth=request.state.auth, shown_dsn=self.shown_dsn, version=self.settings.version,
                       time_zone=display_zone_label(), lang=lang)
        context.setdefault("store_names", self.settings.store_names)
        context.setdefault("nav", "")
        response = HTMLResponse(self.templates[lang].get_template(template).render(**context), status)
        response.headers["Content-Language"] = lang
        response.headers["Vary"] = "Accept-Language, Cookie"
        return response

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Open the pool on startup; on shutdown end the live feed and close the pool (2 s at most)."""
        await run_in_threadpool(self.pool.open, False)
        await run_in_threadpool(self.writer.open, False)
        try:
            yield
        finally:
            self.feed.close()
            self.watchdog.stop()
            await run_in_threadpool(self.pool.close, 2.0)
            await run_in_threadpool(self.writer.close, 2.0)


def app_state(request: Request) -> AppState:
    """The :class:`AppState` of the application serving ``request`` (``request.app.state.web``)."""
    return request.app.state.web


def _templates(lang: str, settings: "WebSettings | None" = None) -> Environment:
    """The templates in ``lang``: Jinja2's i18n extension with that language's gettext catalog (newstyle:
    ``_("%(n)s rows", n=3)`` formats and escapes), its filters (:func:`feiqiu_etl.web.format.filters`) and
    ``js_i18n``, the JSON catalog of the page's JavaScript."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), extensions=["jinja2.ext.i18n"],
                      autoescape=select_autoescape(["html", "svg"], default=True))
    env.install_gettext_translations(i18n.translations(lang), newstyle=True)
    env.filters.update(filters(lang, settings.task_names if settings else {}))
    env.globals.update(lang=lang, languages=i18n.LANGUAGES, language_names=i18n.NAMES, Markup=Markup,
                       js_i18n=json.dumps(dict(i18n.js_catalog(lang)), ensure_ascii=False)
                       .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
    return env


def describe_dsn(dsn: str) -> str:
    """``feiqiu_etl (user postgres) on /run/dir:5432`` — database, user, host and port; never the password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - unparseable: the redacted form (or nothing)
        return redact_dsn(dsn)
    where = f"{p.get('host') or 'localhost'}{':' + str(p['port']) if p.get('port') else ''}"
    return f"{p.get('dbname') or p.get('user') or '?'} (user {p.get('user') or '?'}) on {where}"
