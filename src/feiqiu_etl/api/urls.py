"""The API base URL's one rule (``--api-base``, ``FEIQIU_API_BASE``, a fleet file's ``api_base``): an http(s) URL
with a host, a valid port, and no whitespace or control character — refused in one line before any request
(adversarial trial: ``http://[::1`` and a URL holding an escape sequence ended as internal errors, exit 1; one with
a space sent requests that answered 404). Standard library only: no HTTP client is loaded to check it."""

from __future__ import annotations

from urllib.parse import urlsplit


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an API base URL (a few words), or None when it can."""
    if not url.startswith(("http://", "https://")):
        return "must be an http(s) URL"
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "holds whitespace or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        return f"is no valid URL ({exc})"
    if not parts.hostname:
        return "names no host"
    return None
