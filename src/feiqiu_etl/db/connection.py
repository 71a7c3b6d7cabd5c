"""Connection helpers: one psycopg connection per thread, sessions in Asia/Shanghai (warehouse-model §1)."""

from __future__ import annotations

import re

import psycopg

SESSION_TIME_ZONE = "Asia/Shanghai"


def connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection with ``TIME ZONE 'Asia/Shanghai'``. Raises ``psycopg.OperationalError``."""
    conn = psycopg.connect(dsn, autocommit=autocommit, options=f"-c TimeZone={SESSION_TIME_ZONE}")
    return conn


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with its password replaced by ``***`` (safe for logs and error messages).

    URIs: everything between ``user:`` and the *last* ``@`` of the authority is the password (passwords
    may contain ``@``); ``password=`` in the query is masked too. Keyword form: parsed with libpq's rules
    (quotes included). Anything unparseable is not shown at all.
    """
    if "://" in dsn:
        scheme, _, rest = dsn.partition("://")
        head, question, query = rest.partition("?")
        if "@" in head:
            userinfo, _, host = head.rpartition("@")
            user = userinfo.split(":", 1)[0]
            head = f"{user}:***@{host}" if ":" in userinfo else f"{userinfo}@{host}"
        query = re.sub(r"(?i)(password=)[^&]*", r"\1***", query)
        return f"{scheme}://{head}{question}{query}"
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - never echo what we cannot parse
        return "<connection string not shown>"
    if "password" in params:
        params["password"] = "***"
    return make_conninfo(**params)


def scrub(text: str, dsn: str) -> str:
    """Remove ``dsn``'s password (and its ``@``-separated pieces, which libpq may mistake for a host name)
    from ``text``, e.g. a driver error message."""
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(dsn: str) -> set[str]:
    password = None
    if "://" in dsn:
        head = dsn.partition("://")[2].partition("?")[0]
        userinfo = head.rpartition("@")[0]
        if ":" in userinfo:
            password = userinfo.split(":", 1)[1]
        match = re.search(r"(?i)password=([^&]*)", dsn.partition("?")[2])
        extra = {match.group(1)} if match and match.group(1) else set()
    else:
        extra = set()
        try:
            from psycopg.conninfo import conninfo_to_dict

            password = conninfo_to_dict(dsn).get("password")
        except Exception:  # noqa: BLE001
            password = None
    found = extra | ({password} if password else set())
    return {piece for secret in found for piece in [secret, *secret.split("@")] if len(piece) >= 3}
