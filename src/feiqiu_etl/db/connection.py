"""Connection helpers: one psycopg connection per thread, sessions in Asia/Shanghai (warehouse-model §1)."""

from __future__ import annotations

import re

import psycopg

SESSION_TIME_ZONE = "Asia/Shanghai"


DEFAULT_CONNECT_TIMEOUT = 10.0


def connect(dsn: str, *, autocommit: bool = False, connect_timeout: float | None = None) -> psycopg.Connection:
    """Open a connection with ``TIME ZONE 'Asia/Shanghai'`` within ``connect_timeout`` seconds (default 10;
    a server that accepts TCP and never answers fails in that time, not minutes later).
    Raises ``psycopg.OperationalError``."""
    timeout = max(1, round(connect_timeout or DEFAULT_CONNECT_TIMEOUT))
    conn = psycopg.connect(dsn, autocommit=autocommit, options=f"-c TimeZone={SESSION_TIME_ZONE}",
                           connect_timeout=timeout)
    return conn


#: Server roles whose members may run programs or write files on the database server.
DANGEROUS_ROLES = ("pg_execute_server_program", "pg_write_server_files")


def check_read_only_role(conn: psycopg.Connection) -> str | None:
    """None when the connected role can neither run programs nor write files on the server; else a one-line
    reason (it is a superuser or has the privileges of a role in :data:`DANGEROUS_ROLES`), naming the role.

    ``feiqiu-etl sql`` refuses such roles: a READ ONLY transaction does not stop ``COPY … TO PROGRAM`` or
    ``COPY … TO '/file'``."""
    name, superuser, dangerous = conn.execute(
        "SELECT current_user, rolsuper, ARRAY(SELECT r FROM unnest(%s::text[]) r"
        " WHERE pg_has_role(current_user, r, 'USAGE')) FROM pg_roles WHERE rolname = current_user",
        (list(DANGEROUS_ROLES),)).fetchone()
    if superuser:
        powers = ["a superuser"]
    elif dangerous:
        powers = [f"a member of {r}" for r in dangerous]
    else:
        return None
    return (f"refusing to run: role {name} is {' and '.join(powers)}, so it may run programs or write files on "
            "the server; use a read-only role for sql (README: a read-only role for sql)")


def _split_uri(dsn: str) -> tuple[str, str | None, str, str] | None:
    """``scheme://user:password@rest`` → (scheme, user, password or None, rest). The *last* ``@`` ends the
    credentials, so a password may contain ``@``, ``/``, ``?`` or ``:`` even when not percent-encoded."""
    if "://" not in dsn:
        return None
    scheme, _, rest = dsn.partition("://")
    at = rest.rfind("@")
    if at < 0:
        return scheme, None, "", rest
    userinfo, host = rest[:at], rest[at + 1:]
    user, colon, password = userinfo.partition(":")
    return scheme, user, password if colon else "", host


_QUERY_PASSWORD = re.compile(r"(?i)(password=)([^&]*)")


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with its password replaced by ``***`` (safe for logs and error messages).

    URIs: see :func:`_split_uri`; ``password=`` in the query is masked too. Keyword form: parsed with
    libpq's rules (quotes included). Anything unparseable is not shown at all.
    """
    parts = _split_uri(dsn)
    if parts is not None:
        scheme, user, password, host = parts
        host = _QUERY_PASSWORD.sub(r"\1***", host)
        if user is None:
            return f"{scheme}://{host}"
        return f"{scheme}://{user}{':***' if password else ''}@{host}"
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - never echo what we cannot parse
        return "<connection string not shown>"
    if params.get("password"):
        params["password"] = "***"
    else:  # an empty password (the embedded server's DSNs name a passfile) is not shown as if it were one
        params.pop("password", None)
    return make_conninfo(**params)


def scrub(text: str, dsn: str) -> str:
    """Remove ``dsn``'s password — and the pieces of it that libpq may take for a host, port or database
    when it is not percent-encoded — from ``text``, e.g. a driver error message."""
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(dsn: str) -> set[str]:
    found: set[str] = set()
    parts = _split_uri(dsn)
    if parts is not None:
        found.add(parts[2])
        found.update(m.group(2) for m in _QUERY_PASSWORD.finditer(parts[3]))
    else:
        try:
            from psycopg.conninfo import conninfo_to_dict

            found.add(conninfo_to_dict(dsn).get("password") or "")
        except Exception:  # noqa: BLE001
            pass
    pieces = {p for secret in found for p in re.split(r"[@/?:#&=]", secret)}
    return {p for p in found | pieces if len(p) >= 3}
