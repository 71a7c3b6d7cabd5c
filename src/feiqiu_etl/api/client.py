"""``APIClient``: one logical request = up to ``attempts`` HTTP POSTs, every attempt sent through the
flow's serial lane (so retries also wait their gap and stay strictly serial).

* httpx with connection reuse and a timeout on every request (upstream-api.md §2.3: ~30 s);
* tenacity decides *whether* and *how long* to wait between attempts (exponential backoff with jitter;
  ``Retry-After`` / ``data.retryAfter`` are minimums, ``0`` or a past date mean "no hint"); the wait
  itself is spent in the lane (cancellable), never in a bare ``sleep``;
* JSON is parsed with exact integers (ids above 2^53 survive, Q2);
* the bearer token is kept private: it never appears in ``repr``, logs, errors or results.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Callable

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from feiqiu_etl.api.retry import RetryPolicy

from feiqiu_etl.api.errors import (
    ApiError, AuthError, BusinessError, ConfigurationError, MalformedResponse, NotFoundError,
    RateLimitedError, ServerError, SiteForbiddenError, TransportFailure,
)
from feiqiu_etl import jsonfast
from feiqiu_etl.errortext import one_line
from feiqiu_etl.textsafe import redact_url
from feiqiu_etl.pipeline.models import PipelineRequest


TIMEOUT_HOLD_FACTOR = 2.0


@dataclass(frozen=True, kw_only=True)
class EnvelopeRules:
    """Where the envelope keeps its fields and what each business code means (upstream-api.md §2.1). No
    defaults: the values are the connector file's ``api.envelope`` and ``api.errors``, read once
    (:func:`feiqiu_etl.runner.flow_runner.envelope_rules`)."""

    code_field: str
    ok_code: int
    message_field: str
    data_field: str
    retry: frozenset[int]
    rate_limited: frozenset[int]
    retry_after_field: str
    abort_run: frozenset[int]
    abort_site: frozenset[int]
    not_found: frozenset[int]


class APIClient:
    """POST-JSON client for one base URL and token. Use :meth:`fetch` as a pipeline transport."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        rules: EnvelopeRules,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        self._base = base_url.rstrip("/")
        self.__token = token
        self._retry = retry
        self._rules = rules
        self._rng = rng or random.Random()
        self._http = httpx.Client(
            base_url=self._base,
            timeout=httpx.Timeout(timeout, connect=min(connect_timeout or 10.0, timeout)),
            headers={"Content-Type": "application/json; charset=utf-8"},
            transport=transport,
            follow_redirects=False,
        )
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"<APIClient {redact_url(self._base)} token=***>"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "APIClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- pipeline transport
    def fetch(self, request: PipelineRequest, send: Callable[..., Any]) -> dict:
        """Perform ``request`` with retries; every attempt goes through ``send`` (the lane).

        Returns the parsed envelope (a dict). Raises the typed errors of :mod:`feiqiu_etl.api.errors`
        after the last attempt, or ``Cancelled`` from the lane.
        """
        pending_wait = [0.0]

        def remember(seconds: float) -> None:
            pending_wait[0] = seconds

        retrying = Retrying(
            stop=stop_after_attempt(self._retry.attempts),
            retry=retry_if_exception(lambda e: isinstance(e, ApiError) and e.retryable),
            wait=self._retry.wait(self._rng),
            sleep=remember,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                wait, pending_wait[0] = pending_wait[0], 0.0
                return send(lambda: self.post(request.endpoint, request.params), min_wait=wait)
        raise AssertionError("unreachable")  # pragma: no cover

    # -------------------------------------------------------------- one attempt
    def post(self, endpoint: str, body: dict) -> dict:
        """One HTTP POST; returns the envelope or raises a typed :class:`ApiError`."""
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        try:
            resp = self._http.post(endpoint, content=content, headers={"Authorization": f"Bearer {self.__token}"})
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never reached a server: nothing to hold
            raise TransportFailure(f"cannot connect: {_reason(exc)}", endpoint=endpoint, unreachable=True) from None
        except httpx.TimeoutException as exc:
            # The server may still be working on it (pages can take up to 10 s, upstream-api.md §2.3):
            # keep the lane closed for twice the timeout so that no next request, retry or not,
            # overlaps it (§2.2 rule 1: an overlap is a violation; three ban the token).
            raise TransportFailure(f"timeout: {exc.__class__.__name__}", endpoint=endpoint,
                                   hold_lane_seconds=TIMEOUT_HOLD_FACTOR * self._timeout) from None
        except httpx.HTTPError as exc:
            raise TransportFailure(f"transport error: {exc.__class__.__name__}", endpoint=endpoint) from None
        return self._interpret(endpoint, resp)

    def _interpret(self, endpoint: str, resp: httpx.Response) -> dict:
        status = resp.status_code
        if status == 429:
            raise RateLimitedError("gateway throttling", endpoint=endpoint, http_status=429,
                                   retry_after=parse_retry_after(resp.headers.get("Retry-After")))
        if status >= 500:
            raise ServerError("gateway/server error", endpoint=endpoint, http_status=status)
        if status == 404:
            raise ConfigurationError("unknown path (check the connector's endpoint)", endpoint=endpoint, http_status=404)
        if status != 200:
            raise ApiError("unexpected HTTP status", endpoint=endpoint, http_status=status)
        try:
            envelope = jsonfast.loads(resp.content)  # exact: orjson, stdlib where orjson refuses
        except ValueError:
            raise MalformedResponse("body is not JSON", endpoint=endpoint, http_status=status) from None
        except RecursionError:  # e.g. 100,000 nested arrays: Python's parser gives up; retried like any bad body
            raise MalformedResponse("body is nested too deeply", endpoint=endpoint, http_status=status) from None
        r = self._rules
        if not isinstance(envelope, dict) or type(envelope.get(r.code_field)) is not int:  # bool is no code
            raise MalformedResponse("body is not an envelope", endpoint=endpoint, http_status=status)
        code = envelope[r.code_field]
        if code == r.ok_code:
            return envelope
        raise self._business_error(endpoint, code, envelope)

    def _business_error(self, endpoint: str, code: int, envelope: dict) -> ApiError:
        r = self._rules
        msg = str(envelope.get(r.message_field) or "")[:200]
        data = envelope.get(r.data_field)
        text = f"business error: {msg}" if msg else "business error"
        if code in r.rate_limited:
            hint = data.get(r.retry_after_field) if isinstance(data, dict) else None
            return RateLimitedError(text, endpoint=endpoint, code=code, retry_after=_positive(hint))
        if code in r.retry:
            return ServerError(text, endpoint=endpoint, code=code)
        if code in r.abort_run:
            return AuthError(text, endpoint=endpoint, code=code)
        if code in r.abort_site:
            return SiteForbiddenError(text, endpoint=endpoint, code=code)
        if code in r.not_found:
            return NotFoundError(text, endpoint=endpoint, code=code)
        return BusinessError(text, endpoint=endpoint, code=code)


def _reason(exc: BaseException) -> str:
    """A short reason for a transport error, never the URL with credentials or the request body."""
    return one_line(exc, 160)


MAX_HINT = 3600.0
"""Longest wait a server hint may impose (s). Feiqiu bans last 300 s; anything beyond an hour is garbage."""


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
        return None
    return min(float(value), MAX_HINT) if value > 0 else None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds (delta or HTTP date). ``0``, a past date or garbage → None (no hint)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_HINT) if int(value) > 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = when.timestamp() - (now if now is not None else time.time())
    return min(delta, MAX_HINT) if delta > 0 else None
