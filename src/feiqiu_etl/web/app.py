"""The Starlette application of ``feiqiu-etl web``: four pages and the JSON API they use.

Pages (server-rendered, Jinja2 with autoescape; a little plain JavaScript of our own in ``static/``):

* ``GET /`` Runs — newest first, paged (``?page=``, ``?per_page=`` ≤ 500), filters ``?status=`` and
  ``?store=``;
* ``GET /runs/{id}`` one run — per store and task the counts, windows, errors in full, timings, the stored log,
  and the lane timeline (SVG drawn here, also alone at ``/runs/{id}/timeline.svg``);
* ``GET /live`` every running run, updated about once a second from ``/api/status/stream`` (server-sent
  events), with a Cancel button (confirmation, then ``POST /api/runs/{id}/cancel`` with the CSRF token);
* ``GET /freshness`` per store and task the end of the last complete window or snapshot, its age, owed
  details; red past ``?hours=`` (default ``--stale-hours``).

JSON API: ``GET /api/runs``, ``/api/runs/{id}``, ``/api/runs/{id}/requests``, ``/api/status``,
``/api/status/stream`` (SSE), ``/api/freshness``, ``/api/csrf``, ``/api/statistics``; ``POST
/api/runs/{id}/cancel`` (202 requested, 404 no such run, 409 not running, 403 bad CSRF token). Access rules:
:mod:`.security`. Database errors answer 503 with the driver's message, the DSN's password scrubbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from feiqiu_etl.db.connection import SESSION_TIME_ZONE, redact_dsn, scrub
from feiqiu_etl.runs import registry
from feiqiu_etl.web import ids, queries  # noqa: F401 - ids: the {run_id:run_id} path parameter
from feiqiu_etl.web.format import FILTERS
from feiqiu_etl.web.live import LiveFeed
from feiqiu_etl.web.security import (SESSION_COOKIE, SESSION_TTL, AccessGuard, Security, client_address,
                                     retry_after)
from feiqiu_etl.web.timeline import attempt_counts, timeline_svg

HERE = Path(__file__).parent
PER_PAGE = 50
MAX_PER_PAGE = 500


@dataclass(frozen=True)
class WebSettings:
    """What the server needs. ``token`` None serves without authentication (loopback only, enforced by the
    command); ``stale_hours`` is the default freshness threshold; ``poll_interval`` the live feed's (s)."""

    dsn: str
    token: str | None = None
    host: str = "127.0.0.1"
    connector: str = "feiqiu"
    task_codes: tuple[str, ...] = ()
    schedule: Any = None  # runs.freshness.Schedule from ``web --fleet``; None: every task of the connector
    stale_hours: float = 26.0
    poll_interval: float = 0.25
    run_stale_after: float = 30.0
    connect_timeout: float = 10.0
    pool_size: int = 4
    version: str = field(default_factory=lambda: __import__("feiqiu_etl").__version__)


class BadRequest(Exception):
    """A query parameter that cannot be used; one line for the page or the JSON body (400)."""


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html", "svg"],
                                                                                               default=True))
    env.filters.update(FILTERS)
    return env


def create_app(settings: WebSettings) -> Starlette:
    """The application for ``settings`` (its connection pool opens on startup, closes on shutdown)."""
    security = Security(settings.token, settings.host)
    pool = ConnectionPool(settings.dsn, min_size=1, max_size=settings.pool_size, open=False, name="feiqiu-web",
                          kwargs={"options": f"-c TimeZone={SESSION_TIME_ZONE}",
                                  "connect_timeout": max(1, round(settings.connect_timeout))},
                          timeout=settings.connect_timeout)
    env = _templates()
    shown_dsn = _describe_dsn(settings.dsn)

    @contextlib.contextmanager
    def db() -> Iterator[psycopg.Connection]:
        with pool.connection() as conn:
            yield conn

    def read_status() -> dict:
        with db() as conn:
            return queries.status_payload(conn)

    def sweep() -> None:
        with db() as conn:
            registry.sweep_interrupted(conn, settings.run_stale_after)

    feed = LiveFeed(read_status, sweep=sweep, interval=settings.poll_interval)

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.update(request=request, csrf_token=security.csrf_token(request.state.session),
                       auth=request.state.auth, shown_dsn=shown_dsn, version=settings.version,
                       time_zone=SESSION_TIME_ZONE)
        context.setdefault("nav", "")
        return HTMLResponse(env.get_template(template).render(**context), status)

    async def login_page(request: Request, status: int = 200, error: str | None = None) -> Response:
        nxt = request.query_params.get("next") or (request.url.path if request.url.path != "/login" else "/")
        if request.url.query and request.url.path != "/login":
            nxt += "?" + request.url.query
        return page(request, "login.html", status, next=_safe_next(nxt), error=error)

    # ----------------------------------------------------------------------------------------------- pages
    def runs_page(request: Request) -> Response:
        q = _runs_query(request)
        with db() as conn:
            total = registry.count_runs(conn, status=q["status"], store=q["store"])
            rows = registry.list_runs(conn, limit=q["per_page"], offset=(q["page"] - 1) * q["per_page"],
                                      status=q["status"], store=q["store"])
            live = queries.live_totals(conn, [r["run_id"] for r in rows if r["status"] == "RUNNING"])
            stores = queries.store_ids(conn)
        pages = max(1, -(-total // q["per_page"]))

        def link(**change) -> str:
            params = {k: v for k, v in {**q, **change}.items() if v not in (None, "") and
                      not (k == "per_page" and v == PER_PAGE) and not (k == "page" and v == 1)}
            return "/" + (f"?{urlencode(params)}" if params else "")

        return page(request, "runs.html", nav="runs", runs=rows, live=live, total=total, q=q, pages=pages,
                    stores=stores, statuses=registry.STATUSES, link=link)

    def run_page(request: Request) -> Response:
        wanted = request.path_params["run_id"]
        with db() as conn:
            rid = registry.resolve_run_id(conn, wanted)
            if rid is None:
                raise HTTPException(404, f"no run {wanted!r}")
            if rid != wanted:
                return RedirectResponse(f"/runs/{rid}", 303)
            run = registry.get_run(conn, rid)
            attempts = registry.run_requests(conn, rid)
        summary = run.get("summary") or {}
        svg = _timeline(run, attempts)
        tasks = summary.get("tasks") or []
        stores: dict[Any, dict] = {}
        for lane in summary.get("lanes") or []:
            for store in lane.get("stores") or []:
                stores[store["site_id"]] = {**store, "lane": lane.get("name")}
        by_store: dict[Any, list] = {}
        for t in tasks:
            by_store.setdefault(t.get("site_id"), []).append(t)
        log_task = request.query_params.get("task") or None
        log_site = _int(request, "site", 0, 0, 2**53) or None
        log = [e for e in run.get("log") or [] if (log_task is None or e.get("task") == log_task)
               and (log_site is None or e.get("site_id") == log_site)]
        return page(request, "run.html", nav="runs", run=run, summary=summary, stores=stores, by_store=by_store,
                    log=log, log_task=log_task, log_site=log_site,
                    svg=Markup(svg), counts=attempt_counts(attempts), attempts=len(attempts),
                    config_json=json.dumps(queries.jsonable(run.get("config")), indent=1, ensure_ascii=False),
                    args_json=json.dumps(queries.jsonable(run.get("args")), indent=1, ensure_ascii=False))

    def timeline_image(request: Request) -> Response:
        with db() as conn:
            run = registry.get_run(conn, request.path_params["run_id"], with_log=False)
            if run is None:
                raise HTTPException(404, "no such run")
            attempts = registry.run_requests(conn, run["run_id"])
        return Response(_timeline(run, attempts), media_type="image/svg+xml")

    def live_page(request: Request) -> Response:
        initial = json.dumps(queries.jsonable(read_status()), ensure_ascii=False)
        return page(request, "live.html", nav="live", initial=Markup(_script_json(initial)))

    def freshness_page(request: Request) -> Response:
        hours = _hours(request, settings.stale_hours)
        with db() as conn:
            report = queries.freshness_report(conn, settings, hours)
        return page(request, "freshness.html", nav="freshness", rows=report["rows"], hours=hours,
                    stale=report["stale"], connector=settings.connector)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            if request.state.auth in ("session", "bearer", "open"):
                return RedirectResponse(_safe_next(request.query_params.get("next")), 303)
            return await login_page(request)
        if not security.origin_allowed(request):
            return JSONResponse({"error": "cross-site login refused"}, 403)
        form = await request.form()
        address = client_address(request.scope)  # from here to the check: no await (one step, see security)
        wait = security.throttle.wait(address)
        if wait > 0:
            response = await login_page(request, 429, error="Too many failed logins from your address: try again "
                                                           f"in {retry_after(wait)} s.")
            response.headers["Retry-After"] = retry_after(wait)
            return response
        sid = security.login(str(form.get("token") or ""), address)
        if sid is None:
            await asyncio.sleep(0.5)  # slows guessing down
            return await login_page(request, 401, error="That is not the token this server was started with.")
        response = RedirectResponse(_safe_next(str(form.get("next") or "/")), 303)
        response.set_cookie(SESSION_COOKIE, sid, max_age=int(SESSION_TTL), httponly=True, samesite="strict",
                            path="/")
        return response

    async def logout(request: Request) -> Response:
        form = await request.form()
        if not security.check_csrf(request, str(form.get("csrf_token") or "")):
            return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
        security.logout(request.state.session)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # ------------------------------------------------------------------------------------------------- API
    def api_runs(request: Request) -> Response:
        q = _runs_query(request)
        limit = _int(request, "limit", q["per_page"], 1, MAX_PER_PAGE)
        offset = _int(request, "offset", (q["page"] - 1) * q["per_page"], 0, 10**9)
        with db() as conn:
            total = registry.count_runs(conn, status=q["status"], store=q["store"])
            rows = registry.list_runs(conn, limit=limit, offset=offset, status=q["status"], store=q["store"])
        return _json({"total": total, "limit": limit, "offset": offset, "runs": rows})

    def api_run(request: Request) -> Response:
        with db() as conn:
            rid = registry.resolve_run_id(conn, request.path_params["run_id"])
            run = registry.get_run(conn, rid) if rid else None
        if run is None:
            return _json({"error": "no such run"}, 404)
        return _json(run)

    def api_requests(request: Request) -> Response:
        with db() as conn:
            rid = registry.resolve_run_id(conn, request.path_params["run_id"])
            if rid is None:
                return _json({"error": "no such run"}, 404)
            attempts = registry.run_requests(conn, rid)
        return _json({"run_id": rid, "counts": attempt_counts(attempts), "requests": attempts})

    def api_status(request: Request) -> Response:
        return _json(read_status())

    async def api_stream(request: Request) -> Response:
        async def events():
            yield "retry: 2000\n\n"
            async for payload in feed.listen():
                yield ": keep-alive\n\n" if payload is None else f"data: {payload}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    def api_freshness(request: Request) -> Response:
        hours = _hours(request, settings.stale_hours)
        with db() as conn:
            return _json(queries.freshness_report(conn, settings, hours))

    def api_csrf(request: Request) -> Response:
        return _json({"csrf_token": security.csrf_token(request.state.session)})

    def api_statistics(request: Request) -> Response:
        stats = pool.get_stats()
        return _json({"feed": asdict(feed.statistics()), "security": asdict(security.statistics()),
                      "pool": {k: stats.get(k) for k in ("pool_size", "pool_available", "requests_num",
                                                         "requests_waiting", "connections_errors")}})

    async def api_cancel(request: Request) -> Response:
        form_token, is_form = None, request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data"))
        if is_form:
            form_token = str((await request.form()).get("csrf_token") or "")
        if not security.check_csrf(request, form_token):
            return _json({"error": "missing or wrong CSRF token (send X-CSRF-Token from the page, or "
                                   "Authorization: Bearer)"}, 403)
        run_id = request.path_params["run_id"]
        who = f"web page ({request.client.host if request.client else 'unknown'})"
        before = await run_in_threadpool(_cancel, run_id, who)
        if before is None:
            return _json({"error": "no such run", "run_id": run_id}, 404)
        if before != "RUNNING":
            return _json({"error": f"run is not running (status {before})", "run_id": run_id, "status": before},
                         409)
        if is_form:
            return RedirectResponse("/live", 303)
        return _json({"run_id": run_id, "requested": True, "status_before": before}, 202)

    def _cancel(run_id: str, who: str) -> str | None:
        with db() as conn:
            return registry.request_cancel(conn, run_id, by=who)

    # ------------------------------------------------------------------------------------- errors, lifecycle
    async def not_found(request: Request, exc: HTTPException) -> Response:
        if request.url.path.startswith("/api/"):
            return _json({"error": exc.detail}, exc.status_code)
        return page(request, "error.html", exc.status_code, title=str(exc.status_code), message=exc.detail)

    async def bad_request(request: Request, exc: BadRequest) -> Response:
        if request.url.path.startswith("/api/"):
            return _json({"error": str(exc)}, 400)
        return page(request, "error.html", 400, title="Bad request", message=str(exc))

    async def database_error(request: Request, exc: Exception) -> Response:
        message = "database unavailable: " + scrub(" ".join(str(exc).split())[:300] or exc.__class__.__name__,
                                                   settings.dsn)
        if request.url.path.startswith("/api/"):
            return _json({"error": message}, 503)
        return page(request, "error.html", 503, title="Database unavailable", message=message)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await run_in_threadpool(pool.open, False)
        try:
            yield
        finally:
            feed.close()
            await run_in_threadpool(pool.close, 2.0)

    routes = [
        Route("/", runs_page),
        Route("/runs/{run_id:run_id}", run_page),
        Route("/runs/{run_id:run_id}/timeline.svg", timeline_image),
        Route("/live", live_page),
        Route("/freshness", freshness_page),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id:run_id}", api_run),
        Route("/api/runs/{run_id:run_id}/requests", api_requests),
        Route("/api/runs/{run_id:run_id}/cancel", api_cancel, methods=["POST"]),
        Route("/api/status", api_status),
        Route("/api/status/stream", api_stream),
        Route("/api/freshness", api_freshness),
        Route("/api/csrf", api_csrf),
        Route("/api/statistics", api_statistics),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers = {HTTPException: not_found, BadRequest: bad_request, psycopg.Error: database_error}
    try:
        from psycopg_pool import PoolTimeout

        handlers[PoolTimeout] = database_error
    except ImportError:  # pragma: no cover
        pass
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.feed, app.state.security, app.state.pool = feed, security, pool
    # the guard wraps everything, errors included: nothing is served before the access rules ran
    return _Guarded(app, security, login_page)


class _Guarded(AccessGuard):
    """The guarded application; ``.app`` is the Starlette app (``.state`` has feed, security, pool)."""

    @property
    def state(self):
        return self.app.state


# ---------------------------------------------------------------------------------------------- helpers
def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(queries.jsonable(data), status)


def _describe_dsn(dsn: str) -> str:
    """``feiqiu_etl (user postgres) on /run/dir:5432`` — database, user, host and port; never the password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - unparseable: the redacted form (or nothing)
        return redact_dsn(dsn)
    where = f"{p.get('host') or 'localhost'}{':' + str(p['port']) if p.get('port') else ''}"
    return f"{p.get('dbname') or p.get('user') or '?'} (user {p.get('user') or '?'}) on {where}"


def _script_json(text: str) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, no ``<!--``)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _safe_next(value: str | None) -> str:
    """A local path to go to after login (never another site: no scheme, no ``//``, no backslash)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value or "://" in value:
        return "/"
    return value


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def _runs_query(request: Request) -> dict[str, Any]:
    status = (request.query_params.get("status") or "").strip().upper() or None
    if status is not None and status not in registry.STATUSES:
        raise BadRequest(f"status must be one of {', '.join(registry.STATUSES)}, got {status[:40]!r}")
    store = _int(request, "store", 0, 0, 2**53) or None
    return {"status": status, "store": store, "page": _int(request, "page", 1, 1, 10**7),
            "per_page": _int(request, "per_page", PER_PAGE, 1, MAX_PER_PAGE)}


def _hours(request: Request, default: float) -> float:
    raw = request.query_params.get("hours")
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"hours must be a number, got {raw[:40]!r}") from None
    if not 0 < value <= 24 * 365 or value != value:
        raise BadRequest(f"hours must be above 0 and at most {24 * 365}, got {raw[:40]}")
    return value


def _timeline(run: dict, attempts: list[dict]) -> str:
    summary = run.get("summary") or {}
    finished = run.get("status") != "RUNNING"
    return timeline_svg(attempts, started_at=run["started_at"],
                        seconds=float(run["duration"]) if finished and run.get("duration") is not None else None,
                        rows_series=(summary.get("timeline") or {}).get("rows"),
                        lanes=[lane["name"] for lane in summary.get("lanes") or [] if lane.get("name")])
