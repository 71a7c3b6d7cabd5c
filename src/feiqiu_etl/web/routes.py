"""The page handlers of ``feiqiu-etl web`` (overview, runs, one run, live, freshness, history), login/logout,
the language switch and the error pages, and the route table: :data:`ROUTES` (these pages, the JSON API of
:mod:`.api`, the static files) and :data:`ERROR_HANDLERS` are what :func:`feiqiu_etl.web.app.create_app` mounts.
Each handler reads the shared :class:`~feiqiu_etl.web.state.AppState` (:func:`~feiqiu_etl.web.state.app_state`).

Handlers that touch the database are plain functions (Starlette runs them in its thread pool: psycopg blocks);
the others are ``async``. Nothing here writes to the database. Bad query parameters raise
:class:`~feiqiu_etl.web.params.BadRequest` (400; checked in :mod:`.params`).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import psycopg
from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from feiqiu_etl import registry
from feiqiu_etl.app.reads import run_detail
from feiqiu_etl.common.status import RECORDED, Status
from feiqiu_etl.db.connection import scrub
from feiqiu_etl.errortext import one_line
from feiqiu_etl.web import api, charts, i18n, overview, queries
from feiqiu_etl.web import ids  # noqa: F401 - registers the {run_id:run_id} path parameter
from feiqiu_etl.web.api import json_response
from feiqiu_etl.web.format import ts
from feiqiu_etl.web.i18n import N_
from feiqiu_etl.web.params import PER_PAGE, RUNS_PARAMS, BadRequest, hours_param, int_param, runs_query, safe_next
from feiqiu_etl.web.security import SESSION_COOKIE, SESSION_TTL, Throttled, client_address, retry_after
from feiqiu_etl.web.state import HERE, AppState, app_state
from feiqiu_etl.web.timeline import attempt_counts, timeline_svg

LANG_COOKIE_AGE = 365 * 86400


# ------------------------------------------------------------------------------------------------------ pages
def runs_page(request: Request) -> Response:
    """``/runs``: runs newest first, paged, filtered by status and store; running runs with their live totals."""
    web = app_state(request)
    q = runs_query(request)
    with web.db() as conn:
        total = registry.count_runs(conn, status=q["status"], store=q["store"])
        rows = registry.list_runs(conn, limit=q["per_page"], offset=(q["page"] - 1) * q["per_page"],
                                  status=q["status"], store=q["store"])
        live = queries.live_totals(conn, [r.run_id for r in rows if r.status == Status.RUNNING])
        stores = queries.store_ids(conn)
    pages = max(1, -(-total // q["per_page"]))

    def link(**change) -> str:
        params = {k: v for k, v in {**q, **change}.items() if v not in (None, "") and
                  not (k == "per_page" and v == PER_PAGE) and not (k == "page" and v == 1)}
        return "/runs" + (f"?{urlencode(params)}" if params else "")

    return web.page(request, "runs.html", nav="runs", runs=rows, live=live, total=total, q=q, pages=pages,
                    stores=stores, statuses=RECORDED, link=link)


def run_page(request: Request) -> Response:
    """``/runs/{id}``: one run per store and task, its errors, log (``?task=``, ``?site=``) and lane timeline."""
    web = app_state(request)
    wanted = request.path_params["run_id"]
    with web.db() as conn:
        rid = registry.resolve_run_id(conn, wanted)
        if rid is None:
            raise HTTPException(404, web.gettext(request, N_("no run %(id)s")) % {"id": repr(wanted)})
        if rid != wanted:
            return RedirectResponse(f"/runs/{rid}", 303)
        run = run_detail(conn, rid)
        attempts = registry.run_requests(conn, rid)
    summary = run.summary or {}
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
    log_site = int_param(request, "site", 0, 0, 2**53) or None
    log = [e for e in run.log or [] if (log_task is None or e.get("task") == log_task)
           and (log_site is None or e.get("site_id") == log_site)]
    from feiqiu_etl.formats import reconcile_lines  # the same lines as `show RUN` (issue 25)

    return web.page(request, "run.html", nav="runs", run=run, summary=summary, stores=stores, by_store=by_store,
                    log=log, log_task=log_task, log_site=log_site, reconcile=reconcile_lines(tasks),
                    svg=Markup(svg), counts=attempt_counts(attempts), attempts=len(attempts),
                    config_json=json.dumps(queries.jsonable(run.config), indent=1, ensure_ascii=False),
                    args_json=json.dumps(queries.jsonable(run.args), indent=1, ensure_ascii=False))


def timeline_image(request: Request) -> Response:
    """``/runs/{id}/timeline.svg``: the lane timeline alone."""
    with app_state(request).db() as conn:
        run = registry.get_run(conn, request.path_params["run_id"], with_log=False)
        if run is None:
            raise HTTPException(404, "no such run")
        attempts = registry.run_requests(conn, run.run_id)
    return Response(_timeline(run, attempts), media_type="image/svg+xml")


def live_page(request: Request) -> Response:
    """``/live``: the running runs, first drawn from the status embedded in the page, then from the stream."""
    web = app_state(request)
    initial = json.dumps(queries.jsonable(web.read_status()), ensure_ascii=False)
    return web.page(request, "live.html", nav="live", initial=Markup(_script_json(initial)))


def freshness_page(request: Request) -> Response:
    """``/freshness``: per store and task the end of the last complete window or snapshot, red past ``?hours=``."""
    web = app_state(request)
    hours = hours_param(request, web.settings.stale_hours)
    with web.db() as conn:
        report = queries.freshness_report(conn, web.settings, hours)
    return web.page(request, "freshness.html", nav="freshness", rows=report["rows"], hours=hours,
                    stale=report["stale"], connector=web.settings.connector)


async def show_login(web: AppState, request: Request, status: int = 200, error: str | None = None) -> Response:
    """The login form (also what the access guard answers a browser without a session, with 401)."""
    nxt = request.query_params.get("next") or (request.url.path if request.url.path != "/login" else "/")
    if request.url.query and request.url.path != "/login":
        nxt += "?" + request.url.query
    return web.page(request, "login.html", status, next=safe_next(nxt), error=error)


async def login(request: Request) -> Response:
    """``GET /login``: the form (or where to go when already in); ``POST``: check the token, set the cookie."""
    web = app_state(request)
    if request.method == "GET":
        if request.state.auth in ("session", "bearer", "open"):
            return RedirectResponse(safe_next(request.query_params.get("next")), 303)
        return await show_login(web, request)
    if not web.security.origin_allowed(request):
        return JSONResponse({"error": "cross-site login refused"}, 403)
    form = await request.form()
    address = client_address(request.scope)  # from here to the check: no await (one step, see security)
    try:
        sid = web.security.login(str(form.get("token") or ""), address)  # the right token first: never locked out
    except Throttled as throttled:
        wait = throttled.wait
        response = await show_login(web, request, 429, error=web.gettext(request, N_(
            "Too many failed logins from your address: try again in %(s)s s.")) % {"s": retry_after(wait)})
        response.headers["Retry-After"] = retry_after(wait)
        return response
    if sid is None:
        await asyncio.sleep(0.5)  # slows guessing down
        return await show_login(web, request, 401, error=web.gettext(
            request, N_("That is not the token this server was started with.")))
    response = RedirectResponse(safe_next(str(form.get("next") or "/")), 303)
    response.set_cookie(SESSION_COOKIE, sid, max_age=int(SESSION_TTL), httponly=True, samesite="strict", path="/")
    return response


async def logout(request: Request) -> Response:
    """``POST /logout`` (with the page's CSRF token): end the session."""
    web = app_state(request)
    form = await request.form()
    if not web.security.check_csrf(request, str(form.get("csrf_token") or "")):
        return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
    web.security.logout(request.state.session)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# ---------------------------------------------------------------------------- overview, history, language
def overview_page(request: Request) -> Response:
    """``/``: the chain overview. The Runs page's parameters (``/?status=…``) redirect to ``/runs``."""
    if any(k in request.query_params for k in RUNS_PARAMS):
        return RedirectResponse("/runs?" + request.url.query, 303)
    web = app_state(request)
    hours = hours_param(request, web.settings.stale_hours)
    lang = web.language(request)
    with web.db() as conn:
        model = overview.build_overview(conn, web.settings, hours, web.finished_runs)
    last = (model["now"] - timedelta(hours=12)).date()  # the night queries.finished_runs gives a run started now
    bar_label = i18n.gettext(lang, N_("rows per night {first} – {last}: {low} to {high}"))
    for store in model["stores"]:
        store["chart"] = Markup(charts.night_bars(store["nights"], last, nights=overview.NIGHTS, label=bar_label))
    return web.page(request, "overview.html", nav="overview", m=model, hours=hours,
                    connector=web.settings.connector)


def history_page(request: Request) -> Response:
    """``/history?site=&task=``: one cell of the overview over the last 30 days — its freshness now, every run
    that ran it with the result, and the age of its data at each load as a chart (windowed tasks)."""
    web = app_state(request)
    site = int_param(request, "site", 0, 1, 2**53)
    task = (request.query_params.get("task") or "").strip().upper()
    if not site or task not in web.settings.task_codes:
        raise BadRequest(N_("site and task are required (a task of the connector)"))
    hours = hours_param(request, web.settings.stale_hours)
    lang = web.language(request)
    with web.db() as conn:
        report = queries.freshness_report(conn, web.settings, hours)
        data = queries.cell_history(conn, web.settings.connector, site, task, overview.NIGHTS)
    row = next((r for r in report["rows"] if r["site_id"] == site and r["task"] == task), None)
    start = data["now"] - timedelta(days=overview.NIGHTS)
    span = (data["now"] - start).total_seconds()
    points = [(max(0.0, min(1.0, (p["completed_at"] - start).total_seconds() / span)),
               max(0.0, float(p["lag_seconds"]) / 3600.0)) for p in data["loads"]]
    axis = [ts(start, seconds=False)[:10], ts(start + timedelta(days=overview.NIGHTS / 2), seconds=False)[:10],
            ts(data["now"], seconds=False)[:10]]
    svg = charts.age_trend(points, stale_hours=hours, axis=axis,
                           label=i18n.gettext(lang, N_("{hours} h")))
    name = dict(getattr(web.settings, "store_names", {}) or {}).get(site)
    return web.page(request, "history.html", nav="overview", site=site, task=task, row=row, hours=hours,
                    runs=data["runs"], loads=data["loads"], chart=Markup(svg), store_name=name,
                    colour=overview.colour(row["age_seconds"], hours * 3600) if row else "never")


async def switch_language(request: Request) -> Response:
    """``/lang/<code>?next=/path``: remember ``code`` (zh-CN, en) in the ``lang`` cookie for a year and go back
    to ``next`` (a local path only)."""
    code = i18n.normalise(request.path_params["code"])
    if code not in i18n.LANGUAGES:
        raise HTTPException(404, "Not Found")
    response = RedirectResponse(safe_next(request.query_params.get("next")), 303)
    response.set_cookie(i18n.COOKIE, code, max_age=LANG_COOKIE_AGE, samesite="lax", path="/", httponly=True)
    return response


# --------------------------------------------------------------------------------------------------- errors
_TRANSLATED_DETAILS = (N_("Not Found"), N_("no such run"))  # Starlette's 404 and ours, shown in the page's language


async def not_found(request: Request, exc: HTTPException) -> Response:
    if request.url.path.startswith("/api/"):
        return json_response({"error": exc.detail}, exc.status_code)
    web = app_state(request)
    detail = web.gettext(request, exc.detail) if exc.detail in _TRANSLATED_DETAILS else exc.detail
    return web.page(request, "error.html", exc.status_code, title=str(exc.status_code), message=detail)


async def bad_request(request: Request, exc: BadRequest) -> Response:
    if request.url.path.startswith("/api/"):
        return json_response({"error": str(exc)}, 400)
    web = app_state(request)
    return web.page(request, "error.html", 400, title=web.gettext(request, N_("Bad request")),
                    message=exc.text(lambda m: web.gettext(request, m)))


async def database_error(request: Request, exc: Exception) -> Response:
    web = app_state(request)
    reason = scrub(one_line(exc, with_type=False), web.settings.dsn)
    if request.url.path.startswith("/api/"):
        return json_response({"error": "database unavailable: " + reason}, 503)
    return web.page(request, "error.html", 503, title=web.gettext(request, N_("Database unavailable")),
                    message=web.gettext(request, N_("database unavailable: %(reason)s")) % {"reason": reason})


def _error_handlers() -> dict:
    handlers: dict = {HTTPException: not_found, BadRequest: bad_request, psycopg.Error: database_error}
    try:
        from psycopg_pool import PoolTimeout

        handlers[PoolTimeout] = database_error
    except ImportError:  # pragma: no cover
        pass
    return handlers


ROUTES = [
    Route("/", overview_page),
    Route("/runs", runs_page),
    Route("/history", history_page),
    Route("/lang/{code}", switch_language),
    Route("/api/overview", api.api_overview),
    Route("/runs/{run_id:run_id}", run_page),
    Route("/runs/{run_id:run_id}/timeline.svg", timeline_image),
    Route("/live", live_page),
    Route("/freshness", freshness_page),
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
    Route("/api/runs", api.api_runs),
    Route("/api/runs/{run_id:run_id}", api.api_run),
    Route("/api/runs/{run_id:run_id}/requests", api.api_requests),
    Route("/api/runs/{run_id:run_id}/cancel", api.api_cancel, methods=["POST"]),
    Route("/api/status", api.api_status),
    Route("/api/status/schema", api.api_status_schema),
    Route("/api/status/stream", api.api_stream),
    Route("/api/freshness", api.api_freshness),
    Route("/api/csrf", api.api_csrf),
    Route("/api/statistics", api.api_statistics),
    Route("/metrics", api.metrics),
    Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
]
ERROR_HANDLERS = _error_handlers()


# -------------------------------------------------------------------------------------------------- helpers
def _script_json(text: str) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, no ``<!--``)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _timeline(run: registry.RunDetail, attempts: list[dict]) -> str:
    summary = run.summary or {}
    finished = run.status != Status.RUNNING
    return timeline_svg(attempts, started_at=run.started_at,
                        seconds=float(run.duration) if finished and run.duration is not None else None,
                        rows_series=(summary.get("timeline") or {}).get("rows"),
                        lanes=[lane["name"] for lane in summary.get("lanes") or [] if lane.get("name")])
