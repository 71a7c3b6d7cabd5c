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

``GET /metrics``: the registry for Prometheus (:mod:`.metrics`).

JSON API: ``GET /api/runs``, ``/api/runs/{id}``, ``/api/runs/{id}/requests``, ``/api/status``,
``/api/status/schema``, ``/api/status/stream`` (SSE), ``/api/freshness``, ``/api/csrf``, ``/api/statistics``;
``POST /api/runs/{id}/cancel`` (202 requested, 404 no such run, 409 not running, 403 bad CSRF token). Access
rules: :mod:`.security`. Database errors answer 503 with the driver's message, the DSN's password scrubbed.

This module only assembles the application: the handlers are in :mod:`.routes`, what they share (pool,
templates, live feed, access rules) in :class:`~feiqiu_etl.web.state.AppState`.
"""

from __future__ import annotations

import functools

from starlette.applications import Starlette

from feiqiu_etl.web import routes
from feiqiu_etl.web.security import AccessGuard
from feiqiu_etl.web.settings import WebSettings
from feiqiu_etl.web.state import AppState


def create_app(settings: WebSettings) -> "_Guarded":
    """The application for ``settings`` (its connection pool opens on startup, closes on shutdown), behind the
    access guard of :mod:`.security`: nothing is served before the access rules ran, errors included."""
    state = AppState(settings)
    app = Starlette(routes=routes.ROUTES, exception_handlers=routes.ERROR_HANDLERS, lifespan=state.lifespan)
    app.state.web = state
    app.state.feed, app.state.security, app.state.pool = state.feed, state.security, state.pool
    return _Guarded(app, state.security, functools.partial(routes.show_login, state))


class _Guarded(AccessGuard):
    """The guarded application; ``.app`` is the Starlette app (``.state`` has web, feed, security, pool)."""

    @property
    def state(self):
        return self.app.state
