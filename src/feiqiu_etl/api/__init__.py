"""HTTP client for APIs that follow the Feiqiu conventions (envelope, bearer token, POST JSON).

The names below are imported on first use (PEP 562): a module that needs only :mod:`.errors` or :mod:`.retry`
does not load httpx (issue 27.6: read-only commands in under a second)."""

import importlib
from typing import Any

_FACE = {"APIClient": "client", "RetryPolicy": "retry", **{name: "errors" for name in (
    "ApiError", "AuthError", "BusinessError", "ConfigurationError", "MalformedResponse", "NotFoundError",
    "RateLimitedError", "ServerError", "SiteForbiddenError", "TransportFailure")}}
"""The names of this face and the module of each."""

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
