"""The route handlers of ``feiqiu-etl web``: four pages, the JSON API they use, login/logout and the error
pages. Each handler reads the shared :class:`~feiqiu_etl.web.state.AppState` from ``request.app.state.web``;
:data:`ROUTES` and :data:`ERROR_HANDLERS` are what :func:`feiqiu_etl.web.app.create_app` mounts.

Handlers that touch the database are plain functions (Starlette runs them in its thread pool: psycopg blocks);
the others are ``async``. Nothing here writes to the database except a cancel request
(:func:`feiqiu_etl.registry.request_cancel`). Bad query parameters raise :class:`BadRequest` (400).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import psycopg
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from feiqiu_etl.app.reads import run_detail
from feiqiu_etl.db.connection import scrub
from feiqiu_etl.errortext import one_line
from feiqiu_etl.numbers import parse_float, parse_int
from feiqiu_etl import registry
from feiqiu_etl.statistics import RunStatistics
from feiqiu_etl.web import charts, i18n, ids, overview, queries  # noqa: F401 - ids: the {run_id:run_id} path parameter
from feiqiu_etl.web.format import ts
from feiqiu_etl.web.i18n import N_
from feiqiu_etl.web.security import SESSION_COOKIE, SESSION_TTL, Throttled, client_address, retry_after
from feiqiu_etl.web.state import HERE, AppState
from feiqiu_etl.web.timeline import attempt_counts, timeline_svg
from feiqiu_etl.common.status import RECORDED, Status

PER_PAGE = 50
MAX_PER_PAGE = 500
RUNS_PARAMS = ("status", "store", "page", "per_page")
"""Query parameters of the Runs page: ``/?status=…`` (the old address of Runs) is sent on to ``/runs``."""
LANG_COOKIE_AGE = 365 * 86400


class BadRequest(Exception):
    """A query parameter that cannot be used; one line for the page or the JSON body (400). ``message`` is a
    catalog message (English, :func:`~feiqiu_etl.web.i18n.N_`) with ``%(name)s`` fields from ``values``: the
    JSON body says it in English, the page in the request's language."""

    def __init__(self, message: str, **values: Any):
        self.message, self.values = message, values
        super().__init__(message % values if values else message)

    def text(self, translate) -> str:
        """The message in a language (``translate``: English → that language)."""
        message = translate(self.message)
        return message % self.values if self.values else message


def _state(request: Request) -> AppState:
    return request.app.state.web


# ------------------------------------------------------------------------------------------------------ pages
def runs_page(request: Request) -> Response:
    """``/runs``: runs newest first, paged, filtered by status and store; running runs with their live totals."""
    web = _state(request)
    q = _runs_query(request)
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
    web = _state(request)
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
    log_site = _int(request, "site", 0, 0, 2**53) or None
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
    with _state(request).db() as conn:
        run = registry.get_run(conn, request.path_params["run_id"], with_log=False)
        if run is None:
            raise HTTPException(404, "no such run")
        attempts = registry.run_requests(conn, run.run_id)
    return Response(_timeline(run, attempts), media_type="image/svg+xml")


def live_page(request: Request) -> Response:
    """``/live``: the running runs, first drawn from the status embedded in the page, then from the stream."""
    web = _state(request)
    initial = json.dumps(queries.jsonable(web.read_status()), ensure_ascii=False)
    return web.page(request, "live.html", nav="live", initial=Markup(_script_json(initial)))


def freshness_page(request: Request) -> Response:
    """``/freshness``: per store and task the end of the last complete window or snapshot, red past ``?hours=``."""
    web = _state(request)
    hours = _hours(request, web.settings.stale_hours)
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
    web = _state(request)
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
    web = _state(request)
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
    web = _state(request)
    hours = _hours(request, web.settings.stale_hours)
    lang = web.language(request)
    with web.db() as conn:
        model = overview.build_overview(conn, web.settings, hours, web.finished_runs)
    last = (model["now"] - timedelta(hours=12)).date()  # the night queries.finished_runs gives a run started now
    bar_label = i18n.gettext(lang, N_("rows per night {first} – {last}: {low} to {high}"))
    for store in model["stores"]:
        store["chart"] = Markup(charts.night_bars(store["nights"], last, nights=overview.NIGHTS, label=bar_label))
    return web.page(request, "overview.html", nav="overview", m=model, hours=hours,
                    connector=web.settings.connector)


def api_overview(request: Request) -> Response:
    """``GET /api/overview?hours=``: the overview's payload (``build_overview``) as JSON."""
    web = _state(request)
    hours = _hours(request, web.settings.stale_hours)
    with web.db() as conn:
        model = overview.build_overview(conn, web.settings, hours, web.finished_runs)
    for store in model["stores"]:
        store["nights"] = {d.isoformat(): n for d, n in sorted(store["nights"].items())}
    model["cells"] = {str(site): row for site, row in model["cells"].items()}
    return JSONResponse(queries.jsonable(model))


def history_page(request: Request) -> Response:
    """``/history?site=&task=``: one cell of the overview over the last 30 days — its freshness now, every run
    that ran it with the result, and the age of its data at each load as a chart (windowed tasks)."""
    web = _state(request)
    site = _int(request, "site", 0, 1, 2**53)
    task = (request.query_params.get("task") or "").strip().upper()
    if not site or task not in web.settings.task_codes:
        raise BadRequest(N_("site and task are required (a task of the connector)"))
    hours = _hours(request, web.settings.stale_hours)
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


# -------------------------------------------------------------------------------------------------------- API
def api_runs(request: Request) -> Response:
    """``GET /api/runs``: ``{total, limit, offset, runs}`` (the rows of ``runs --json``)."""
    q = _runs_query(request)
    limit = _int(request, "limit", q["per_page"], 1, MAX_PER_PAGE)
    offset = _int(request, "offset", (q["page"] - 1) * q["per_page"], 0, 10**9)
    with _state(request).db() as conn:
        total = registry.count_runs(conn, status=q["status"], store=q["store"])
        rows = registry.list_runs(conn, limit=limit, offset=offset, status=q["status"], store=q["store"])
    return _json({"total": total, "limit": limit, "offset": offset, "runs": rows})


def api_run(request: Request) -> Response:
    """``GET /api/runs/{id}``: the run as ``show --json`` gives it (``id`` may be a unique prefix or ``last``)."""
    with _state(request).db() as conn:
        rid = registry.resolve_run_id(conn, request.path_params["run_id"])
        run = run_detail(conn, rid) if rid else None
    if run is None:
        return _json({"error": "no such run"}, 404)
    return _json(run)


def api_requests(request: Request) -> Response:
    """``GET /api/runs/{id}/requests``: ``{run_id, counts, requests}`` (every lane attempt)."""
    with _state(request).db() as conn:
        rid = registry.resolve_run_id(conn, request.path_params["run_id"])
        if rid is None:
            return _json({"error": "no such run"}, 404)
        attempts = registry.run_requests(conn, rid)
    return _json({"run_id": rid, "counts": attempt_counts(attempts), "requests": attempts})


def api_status(request: Request) -> Response:
    """``GET /api/status``: ``{now, running, finished}``; each running run's ``live`` is a
    :class:`~feiqiu_etl.statistics.RunStatistics` (see ``/api/status/schema``)."""
    return _json(_state(request).read_status())


async def api_status_schema(request: Request) -> Response:
    """``GET /api/status/schema``: the JSON Schema of a running run's ``live`` status."""
    return _json(RunStatistics.json_schema())


async def api_stream(request: Request) -> Response:
    """``GET /api/status/stream``: the ``/api/status`` payload as server-sent events, whenever it changes."""
    feed = _state(request).feed

    async def events():
        yield "retry: 2000\n\n"
        async for payload in feed.listen():
            yield ": keep-alive\n\n" if payload is None else f"data: {payload}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def api_freshness(request: Request) -> Response:
    """``GET /api/freshness?hours=``: ``{connector, stale_after_hours, rows, …}`` (queries.freshness_report)."""
    web = _state(request)
    hours = _hours(request, web.settings.stale_hours)
    with web.db() as conn:
        return _json(queries.freshness_report(conn, web.settings, hours))


def metrics(request: Request) -> Response:
    """``GET /metrics``: the run registry in the Prometheus text format, read now (:mod:`.metrics`; behind the
    same access rules as every page: Prometheus sends ``Authorization: Bearer``)."""
    from feiqiu_etl.web.metrics import CONTENT_TYPE

    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


def api_csrf(request: Request) -> Response:
    """``GET /api/csrf``: this session's CSRF token."""
    return _json({"csrf_token": _state(request).security.csrf_token(request.state.session)})


def api_statistics(request: Request) -> Response:
    """``GET /api/statistics``: counters of the live feed, of access control, of ``/metrics``, of the overview's
    cache of finished runs and of the connection pool."""
    web = _state(request)
    stats = web.pool.get_stats()
    return _json({"feed": asdict(web.feed.statistics()), "security": asdict(web.security.statistics()),
                  "metrics": asdict(web.metrics.statistics()), "overview": web.finished_runs.statistics(),
                  "pool": {k: stats.get(k) for k in ("pool_size", "pool_available", "requests_num",
                                                     "requests_waiting", "connections_errors")}})


async def api_cancel(request: Request) -> Response:
    """``POST /api/runs/{id}/cancel``: 202 requested, 404 no such run, 409 not running, 403 bad CSRF token (a form
    post is redirected to ``/live`` instead of 202)."""
    web = _state(request)
    form_token, is_form = None, request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data"))
    if is_form:
        form_token = str((await request.form()).get("csrf_token") or "")
    if not web.security.check_csrf(request, form_token):
        return _json({"error": "missing or wrong CSRF token (send X-CSRF-Token from the page, or "
                               "Authorization: Bearer)"}, 403)
    run_id = request.path_params["run_id"]
    who = f"web page ({request.client.host if request.client else 'unknown'})"
    before = await run_in_threadpool(_cancel, web, run_id, who)
    if before is None:
        return _json({"error": "no such run", "run_id": run_id}, 404)
    if before != Status.RUNNING:
        return _json({"error": f"run is not running (status {before})", "run_id": run_id, "status": before}, 409)
    if is_form:
        return RedirectResponse("/live", 303)
    return _json({"run_id": run_id, "requested": True, "status_before": before}, 202)


def _cancel(web: AppState, run_id: str, who: str) -> str | None:
    with web.write() as conn:
        return registry.request_cancel(conn, run_id, by=who)


# --------------------------------------------------------------------------------------------------- errors
_TRANSLATED_DETAILS = (N_("Not Found"), N_("no such run"))  # Starlette's 404 and ours, shown in the page's language


async def not_found(request: Request, exc: HTTPException) -> Response:
    if request.url.path.startswith("/api/"):
        return _json({"error": exc.detail}, exc.status_code)
    web = _state(request)
    detail = web.gettext(request, exc.detail) if exc.detail in _TRANSLATED_DETAILS else exc.detail
    return web.page(request, "error.html", exc.status_code, title=str(exc.status_code), message=detail)


async def bad_request(request: Request, exc: BadRequest) -> Response:
    if request.url.path.startswith("/api/"):
        return _json({"error": str(exc)}, 400)
    web = _state(request)
    return web.page(request, "error.html", 400, title=web.gettext(request, N_("Bad request")),
                    message=exc.text(lambda m: web.gettext(request, m)))


async def database_error(request: Request, exc: Exception) -> Response:
    web = _state(request)
    reason = scrub(one_line(exc, with_type=False), web.settings.dsn)
    if request.url.path.startswith("/api/"):
        return _json({"error": "database unavailable: " + reason}, 503)
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
    Route("/api/overview", api_overview),
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
    Route("/api/status/schema", api_status_schema),
    Route("/api/status/stream", api_stream),
    Route("/api/freshness", api_freshness),
    Route("/api/csrf", api_csrf),
    Route("/api/statistics", api_statistics),
    Route("/metrics", metrics),
    Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
]
ERROR_HANDLERS = _error_handlers()


# -------------------------------------------------------------------------------------------------- helpers
def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(queries.jsonable(data), status)


def _script_json(text: str) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, no ``<!--``)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def safe_next(value: str | None) -> str:
    """A local path to go to after login (never another site: no scheme, no ``//``, no backslash)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value or "://" in value:
        return "/"
    return value


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = parse_int(raw, name)  # ASCII digits only (issue 28 item 7)
    except ValueError:
        raise BadRequest(N_("%(name)s must be a whole number, got %(raw)s"), name=name, raw=repr(raw[:40])) from None
    if not low <= value <= high:
        raise BadRequest(N_("%(name)s must be between %(low)s and %(high)s, got %(value)s"), name=name, low=low,
                         high=high, value=value)
    return value


def _runs_query(request: Request) -> dict[str, Any]:
    status = (request.query_params.get("status") or "").strip().upper() or None
    if status is not None and status not in RECORDED:
        raise BadRequest(N_("status must be one of %(known)s, got %(raw)s"), known=", ".join(RECORDED),
                         raw=repr(status[:40]))
    store = _int(request, "store", 0, 0, 2**53) or None
    return {"status": status, "store": store, "page": _int(request, "page", 1, 1, 10**7),
            "per_page": _int(request, "per_page", PER_PAGE, 1, MAX_PER_PAGE)}


def _hours(request: Request, default: float) -> float:
    raw = request.query_params.get("hours")
    if raw in (None, ""):
        return default
    try:
        value = parse_float(raw, "hours")  # finite, ASCII digits (issue 28 items 3, 7)
    except ValueError:
        raise BadRequest(N_("hours must be a number, got %(raw)s"), raw=repr(raw[:40])) from None
    if not 0 < value <= 24 * 365:
        raise BadRequest(N_("hours must be above 0 and at most %(max)s, got %(raw)s"), max=24 * 365, raw=raw[:40])
    return value


def _timeline(run: registry.RunDetail, attempts: list[dict]) -> str:
    summary = run.summary or {}
    finished = run.status != Status.RUNNING
    return timeline_svg(attempts, started_at=run.started_at,
                        seconds=float(run.duration) if finished and run.duration is not None else None,
                        rows_series=(summary.get("timeline") or {}).get("rows"),
                        lanes=[lane["name"] for lane in summary.get("lanes") or [] if lane.get("name")])
