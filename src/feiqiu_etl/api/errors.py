"""Typed API errors (upstream-api.md §2). ``retryable`` says whether the client may try again;
``retry_after`` (seconds) is a *minimum* wait hint from ``Retry-After`` or ``data.retryAfter``.
Messages never contain the bearer token."""

from __future__ import annotations

from feiqiu_etl.pipeline.errors import AbortPipeline, LaneBackoff


class ApiError(Exception):
    retryable = False

    def __init__(self, message: str, *, endpoint: str = "", code: int | None = None,
                 http_status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.code = code
        self.http_status = http_status
        self.retry_after = retry_after

    def __str__(self) -> str:
        parts = [self.args[0] if self.args else self.__class__.__name__]
        if self.code is not None:
            parts.append(f"code={self.code}")
        if self.http_status is not None:
            parts.append(f"http={self.http_status}")
        if self.endpoint:
            parts.append(f"endpoint={self.endpoint}")
        return " ".join(parts)


class BusinessError(ApiError):
    """A non-zero envelope ``code`` that must not be retried (40001, 40002, 40003, …)."""


class NotFoundError(BusinessError):
    """40401: detail of an unknown or deleted id — skip the record (a detail failure, no retry). A definitive
    answer, not a sign of trouble: it does not count towards ``max_consecutive_failures``."""

    counts_as_failure = False


class AuthError(BusinessError, AbortPipeline):
    """40101: token missing, unknown or expired — abort the run."""


class SiteForbiddenError(BusinessError, AbortPipeline):
    """40103: the token may not access this ``siteId`` — abort this store."""


class ConfigurationError(ApiError, AbortPipeline):
    """HTTP 404 (unknown path) or another response that proves the configuration is wrong."""


class RateLimitedError(ApiError):
    """42901/42902 (risk control) or HTTP 429 (gateway throttling): wait at least ``retry_after``.

    ``lane_backoff`` tells the lane what the upstream demanded (upstream-api.md §2.2): a 42901 means the
    request came too early or overlapped ("throttled": the lane raises the floor of its gap class), a
    42902 that the token is banned ("banned"), a 429 that the gateway throttles ("hold"). The wait binds
    the whole lane, whatever request comes next.
    """

    retryable = True

    @property
    def lane_backoff(self) -> LaneBackoff | None:
        if not self.retry_after:
            return None
        kind = {42901: "throttled", 42902: "banned"}.get(self.code or 0, "hold")
        detail = f"code {self.code}" if self.code is not None else f"HTTP {self.http_status}"
        return LaneBackoff(self.retry_after, kind, detail)  # type: ignore[arg-type]


class ServerError(ApiError):
    """HTTP 5xx or business 50001: transient, retry with backoff (still respecting the gap)."""

    retryable = True


class TransportFailure(ApiError):
    """Connection error or timeout (no complete response). ``hold_lane_seconds`` > 0 asks the lane to
    send nothing for that long (after a timeout the server may still be processing the request).
    ``transport_failure`` is True when the request never reached a server (refused, DNS, connect
    timeout): the lane's circuit breaker counts those."""

    retryable = True

    def __init__(self, message: str, *, hold_lane_seconds: float = 0.0, unreachable: bool = False, **kw):
        super().__init__(message, **kw)
        self.hold_lane_seconds = hold_lane_seconds
        self.transport_failure = unreachable


class MalformedResponse(ApiError):
    """HTTP 200 whose body is not a JSON envelope (gateway garbage); retried like a 5xx."""

    retryable = True
