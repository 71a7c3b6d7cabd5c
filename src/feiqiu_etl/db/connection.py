"""Connection helpers: one psycopg connection per thread, sessions in Asia/Shanghai (warehouse-model §1)."""

from __future__ import annotations

import re

import psycopg

from feiqiu_etl.textsafe import redact_url, url_secrets

SESSION_TIME_ZONE = "Asia/Shanghai"


DEFAULT_CONNECT_TIMEOUT = 10.0


def connect(dsn: str, *, autocommit: bool = False, connect_timeout: float | None = None,
            **params: object) -> psycopg.Connection:
    """Open a connection with ``TIME ZONE 'Asia/Shanghai'`` within ``connect_timeout`` seconds (default 10;
    a server that accepts TCP and never answers fails in that time, not minutes later). ``params``: more libpq
    connection parameters (e.g. ``keepalives``). Raises ``psycopg.OperationalError``."""
    timeout = max(1, round(connect_timeout or DEFAULT_CONNECT_TIMEOUT))
    conn = psycopg.connect(dsn, autocommit=autocommit, options=f"-c TimeZone={SESSION_TIME_ZONE}",
                           connect_timeout=timeout, **params)
    return conn


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with its password replaced by ``***`` (safe for logs and error messages).

    URIs: :func:`feiqiu_etl.textsafe.redact_url` (the one URL redactor: the user info's password, ``password=``
    and other secret query parameters). Keyword form: parsed with libpq's rules (quotes included). Anything
    unparseable is not shown at all.
    """
    if "://" in dsn:
        return redact_url(dsn)
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - never echo what we cannot parse
        return "<connection string not shown>"
    for key in _KEYWORD_SECRETS:
        if params.get(key):
            params[key] = "***"
        else:  # an empty password (the embedded server's DSNs name a passfile) is not shown as if it were one
            params.pop(key, None)
    return make_conninfo(**params)


_KEYWORD_SECRETS = ("password", "sslpassword")
"""libpq keywords whose values are secrets."""


def scrub(text: str, dsn: str) -> str:
    """Remove ``dsn``'s password — and the pieces of it that libpq may take for a host, port or database
    when it is not percent-encoded — from ``text``, e.g. a driver error message."""
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(dsn: str) -> set[str]:
    if "://" in dsn:
        found = url_secrets(dsn)
    else:
        found = set()
        try:
            from psycopg.conninfo import conninfo_to_dict

            params = conninfo_to_dict(dsn)
            found.update(params.get(key) or "" for key in _KEYWORD_SECRETS)
        except Exception:  # noqa: BLE001
            pass
    pieces = {p for secret in found for p in re.split(r"[@/?:#&=]", secret)}
    return {p for p in found | pieces if len(p) >= 3}
