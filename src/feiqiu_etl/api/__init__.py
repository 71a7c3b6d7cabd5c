"""HTTP client for APIs that follow the Feiqiu conventions (envelope, bearer token, POST JSON).

The names below are imported on first use (PEP 562): a module that needs only :mod:`.errors` or :mod:`.retry`
does not load httpx (issue 27.6: read-only commands in under a second)."""

from feiqiu_etl.common.lazyface import lazy_face

_FACE = {"APIClient": ".client", "RetryPolicy": ".retry", **{name: ".errors" for name in (
    "ApiError", "AuthError", "BusinessError", "ConfigurationError", "MalformedResponse", "NotFoundError",
    "RateLimitedError", "ServerError", "SiteForbiddenError", "TransportFailure")}}
"""The names of this face and the module of each."""

__all__ = sorted(_FACE)


__getattr__ = lazy_face(__name__, _FACE, globals())
