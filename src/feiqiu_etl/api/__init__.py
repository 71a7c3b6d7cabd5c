"""HTTP client for APIs that follow the Feiqiu conventions (envelope, bearer token, POST JSON)."""

from feiqiu_etl.api.client import APIClient, RetryPolicy
from feiqiu_etl.api.errors import (
    ApiError, AuthError, BusinessError, ConfigurationError, MalformedResponse, NotFoundError,
    RateLimitedError, ServerError, SiteForbiddenError, TransportFailure,
)

__all__ = [
    "APIClient", "ApiError", "AuthError", "BusinessError", "ConfigurationError", "MalformedResponse",
    "NotFoundError", "RateLimitedError", "RetryPolicy", "ServerError", "SiteForbiddenError", "TransportFailure",
]
