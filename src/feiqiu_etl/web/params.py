"""The query parameters of the web page and its JSON API, checked: whole numbers and hours within bounds, the
Runs page's filter and paging, and the local path to go to after login.

A parameter that cannot be used raises :class:`BadRequest` (one line; the pages answer 400 in the request's
language, the API in English). Readers take a ``request`` with ``query_params`` (a Starlette request, or any
object that has that mapping).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from feiqiu_etl.common.status import RECORDED
from feiqiu_etl.numbers import parse_float, parse_int
from feiqiu_etl.web.i18n import N_

PER_PAGE = 50
MAX_PER_PAGE = 500
RUNS_PARAMS = ("status", "store", "page", "per_page")
"""Query parameters of the Runs page: ``/?status=…`` (the old address of Runs) is sent on to ``/runs``."""


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


def safe_next(value: str | None) -> str:
    """A local path to go to after login (never another site: no scheme, no ``//``, no backslash)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value or "://" in value:
        return "/"
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The whole number ``?name=`` (ASCII digits), ``default`` when absent or empty. Raises :class:`BadRequest`
    for another text or a value outside ``[low, high]``."""
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


def runs_query(request: Request) -> dict[str, Any]:
    """The Runs page's ``{status, store, page, per_page}`` (None: no filter). Raises :class:`BadRequest` for a
    status that is not a recorded one or a number out of bounds."""
    status = (request.query_params.get("status") or "").strip().upper() or None
    if status is not None and status not in RECORDED:
        raise BadRequest(N_("status must be one of %(known)s, got %(raw)s"), known=", ".join(RECORDED),
                         raw=repr(status[:40]))
    store = int_param(request, "store", 0, 0, 2**53) or None
    return {"status": status, "store": store, "page": int_param(request, "page", 1, 1, 10**7),
            "per_page": int_param(request, "per_page", PER_PAGE, 1, MAX_PER_PAGE)}


def hours_param(request: Request, default: float) -> float:
    """``?hours=`` (a finite number, above 0 and at most a year), ``default`` when absent or empty. Raises
    :class:`BadRequest`."""
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
