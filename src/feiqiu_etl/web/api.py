"""The JSON API of ``feiqiu-etl web`` (``/api/…``) and ``/metrics``: what the pages poll and what scripts and
Prometheus read, behind the same access rules as the pages.

Each handler reads the shared :class:`~feiqiu_etl.web.state.AppState`
(:func:`~feiqiu_etl.web.state.app_state`).
Bodies are JSON (:func:`json_response`: dates, decimals and records made JSON first); an unknown run is 404
``{"error": …}``, a bad query parameter 400 (:class:`~feiqiu_etl.web.params.BadRequest`). Nothing here writes
to the database except a cancel request (:func:`feiqiu_etl.registry.request_cancel`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from feiqiu_etl import registry
from feiqiu_etl.app.reads import run_detail
from feiqiu_etl.common.status import Status
from feiqiu_etl.statistics import RunStatistics
from feiqiu_etl.web import overview, queries
from feiqiu_etl.web.params import MAX_PER_PAGE, hours_param, int_param, runs_query
from feiqiu_etl.web.state import AppState, app_state
from feiqiu_etl.web.timeline import attempt_counts


def json_response(data: Any, status: int = 200) -> JSONResponse:
    """``data`` as a JSON response with ``status`` (records, dates and decimals made JSON first)."""
    return JSONResponse(queries.jsonable(data), status)


def api_overview(request: Request) -> Response:
    """``GET /api/overview?hours=``: the overview's payload (``build_overview``) as JSON."""
    web = app_state(request)
    hours = hours_param(request, web.settings.stale_hours)
    with web.db() as conn:
        model = overview.build_overview(conn, web.settings, hours, web.finished_runs)
    for store in model["stores"]:
        store["nights"] = {d.isoformat(): n for d, n in sorted(store["nights"].items())}
    model["cells"] = {str(site): row for site, row in model["cells"].items()}
    return json_response(model)


def api_runs(request: Request) -> Response:
    """``GET /api/runs``: ``{total, limit, offset, runs}`` (the rows of ``runs --json``)."""
    q = runs_query(request)
    limit = int_param(request, "limit", q["per_page"], 1, MAX_PER_PAGE)
    offset = int_param(request, "offset", (q["page"] - 1) * q["per_page"], 0, 10**9)
    with app_state(request).db() as conn:
        total = registry.count_runs(conn, status=q["status"], store=q["store"])
        rows = registry.list_runs(conn, limit=limit, offset=offset, status=q["status"], store=q["store"])
    return json_response({"total": total, "limit": limit, "offset": offset, "runs": rows})


def api_run(request: Request) -> Response:
    """``GET /api/runs/{id}``: the run as ``show --json`` gives it (``id`` may be a unique prefix or ``last``)."""
    with app_state(request).db() as conn:
        rid = registry.resolve_run_id(conn, request.path_params["run_id"])
        run = run_detail(conn, rid) if rid else None
    if run is None:
        return json_response({"error": "no such run"}, 404)
    return json_response(run)


def api_requests(request: Request) -> Response:
    """``GET /api/runs/{id}/requests``: ``{run_id, counts, requests}`` (every lane attempt)."""
    with app_state(request).db() as conn:
        rid = registry.resolve_run_id(conn, request.path_params["run_id"])
        if rid is None:
            return json_response({"error": "no such run"}, 404)
        attempts = registry.run_requests(conn, rid)
    return json_response({"run_id": rid, "counts": attempt_counts(attempts), "requests": attempts})


def api_status(request: Request) -> Response:
    """``GET /api/status``: ``{now, running, finished}``; each running run's ``live`` is a
    :class:`~feiqiu_etl.statistics.RunStatistics` (see ``/api/status/schema``)."""
    return json_response(app_state(request).read_status())


async def api_status_schema(request: Request) -> Response:
    """``GET /api/status/schema``: the JSON Schema of a running run's ``live`` status."""
    return json_response(RunStatistics.json_schema())


async def api_stream(request: Request) -> Response:
    """``GET /api/status/stream``: the ``/api/status`` payload as server-sent events, whenever it changes."""
    feed = app_state(request).feed

    async def events():
        yield "retry: 2000\n\n"
        async for payload in feed.listen():
            yield ": keep-alive\n\n" if payload is None else f"data: {payload}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def api_freshness(request: Request) -> Response:
    """``GET /api/freshness?hours=``: ``{connector, stale_after_hours, rows, …}`` (queries.freshness_report)."""
    web = app_state(request)
    hours = hours_param(request, web.settings.stale_hours)
    with web.db() as conn:
        return json_response(queries.freshness_report(conn, web.settings, hours))


def metrics(request: Request) -> Response:
    """``GET /metrics``: the run registry in the Prometheus text format, read now (:mod:`.metrics`; behind the
    same access rules as every page: Prometheus sends ``Authorization: Bearer``)."""
    from feiqiu_etl.web.metrics import CONTENT_TYPE

    return Response(app_state(request).metrics.render(), media_type=CONTENT_TYPE)


def api_csrf(request: Request) -> Response:
    """``GET /api/csrf``: this session's CSRF token."""
    return json_response({"csrf_token": app_state(request).security.csrf_token(request.state.session)})


def api_statistics(request: Request) -> Response:
    """``GET /api/statistics``: counters of the live feed, of access control, of ``/metrics``, of the overview's
    cache of finished runs and of the connection pool."""
    web = app_state(request)
    stats = web.pool.get_stats()
    return json_response({"feed": asdict(web.feed.statistics()), "security": asdict(web.security.statistics()),
                          "metrics": asdict(web.metrics.statistics()), "overview": web.finished_runs.statistics(),
                          "pool": {k: stats.get(k) for k in ("pool_size", "pool_available", "requests_num",
                                                             "requests_waiting", "connections_errors")}})


async def api_cancel(request: Request) -> Response:
    """``POST /api/runs/{id}/cancel``: 202 requested, 404 no such run, 409 not running, 403 bad CSRF token (a form
    post is redirected to ``/live`` instead of 202)."""
    web = app_state(request)
    form_token, is_form = None, request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data"))
    if is_form:
        form_token = str((await request.form()).get("csrf_token") or "")
    if not web.security.check_csrf(request, form_token):
        return json_response({"error": "missing or wrong CSRF token (send X-CSRF-Token from the page, or "
                                       "Authorization: Bearer)"}, 403)
    run_id = request.path_params["run_id"]
    who = f"web page ({request.client.host if request.client else 'unknown'})"
    before = await run_in_threadpool(_cancel, web, run_id, who)
    if before is None:
        return json_response({"error": "no such run", "run_id": run_id}, 404)
    if before != Status.RUNNING:
        return json_response({"error": f"run is not running (status {before})", "run_id": run_id,
                              "status": before}, 409)
    if is_form:
        return RedirectResponse("/live", 303)
    return json_response({"run_id": run_id, "requested": True, "status_before": before}, 202)


def _cancel(web: AppState, run_id: str, who: str) -> str | None:
    with web.write() as conn:
        return registry.request_cancel(conn, run_id, by=who)
