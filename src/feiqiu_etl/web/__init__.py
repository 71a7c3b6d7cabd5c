"""The admin web page (``feiqiu-etl web``): runs, one run with its lane timeline, live lanes with Cancel,
and freshness, plus the JSON API the pages use.

Layout: :mod:`.app` (assembly, Starlette), :mod:`.routes` (the pages and the route table), :mod:`.api` (the
JSON API), :mod:`.params` (query parameters), :mod:`.security` (token, session cookie, CSRF, host check),
:mod:`.live` (one database poller feeding every open Live page over server-sent events), :mod:`.queries`
(the few reads the run registry does not offer), :mod:`.timeline` (the server-drawn SVG chart),
:mod:`.format` (template filters), ``templates/`` (Jinja2, autoescaped) and ``static/`` (our own CSS and
plain JavaScript; no third-party front-end code, nothing from a CDN, so the page works offline).

It only reads the registry and asks for cancels through it (:func:`feiqiu_etl.registry.request_cancel`);
it never writes anything else, never shows the API token or a database password.
"""

from feiqiu_etl.web.app import WebSettings, create_app

__all__ = ["WebSettings", "create_app"]
