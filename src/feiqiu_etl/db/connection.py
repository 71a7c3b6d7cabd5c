"""Connection helpers: sessions in Asia/Shanghai (warehouse-model §1), bounded in time on both sides, and the
run's bounded pool.

Every connection a run opens carries server-side limits (:class:`DbLimits`: ``statement_timeout``, the same
``lock_timeout``, ``idle_in_transaction_session_timeout``) and client-side TCP keepalives with
``tcp_user_timeout`` (libpq ignores both on a Unix socket, where a frozen server is caught by the watchdog of
:mod:`feiqiu_etl.db.watchdog` instead, which uses :func:`abandon`). :func:`open_pool` builds the psycopg-pool
:class:`~psycopg_pool.ConnectionPool` the lanes of a run share: at most ``DbLimits.pool_size`` connections,
whatever the number of lanes.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from dataclasses import dataclass
from typing import Callable

import psycopg

from feiqiu_etl.textsafe import redact_url, url_secrets

SESSION_TIME_ZONE = "Asia/Shanghai"


DEFAULT_CONNECT_TIMEOUT = 10.0
KEEPALIVE = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
             "tcp_user_timeout": 30000}
"""Client-side TCP keepalives and ``tcp_user_timeout`` (ms) of libpq: over TCP a dead or unreachable server is
noticed within ~30 s even in the middle of a read. libpq ignores them on a Unix socket."""


@dataclass(frozen=True)
class DbLimits:
    """How long a run waits on its database (seconds; settings ``db.*``).

    ``connect_timeout`` bounds a connect; ``unavailable_limit`` how long the database may stay away (every wait
    for it — reconnects, the lanes' pause, a pool checkout — ends by then, resumed or failed); ``pool_size`` is
    the most connections the lanes of one run share; ``statement_timeout`` bounds one statement on a live server,
    lock waits included (PostgreSQL's ``statement_timeout`` and ``lock_timeout``; an open transaction left idle
    that long is ended by the server too)."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    unavailable_limit: float = 60.0
    pool_size: int = 16
    statement_timeout: float = 600.0

    @classmethod
    def of(cls, db: object) -> "DbLimits":
        """The limits of the settings model's ``db`` section (:class:`~feiqiu_etl.config.settings.DbSection`)."""
        return cls(db.connect_timeout, db.unavailable_limit, db.pool_size, db.statement_timeout)  # type: ignore[attr-defined]

    def session_options(self) -> str:
        """The ``options`` startup parameter: the time zone and the server-side limits."""
        ms = max(1, round(self.statement_timeout * 1000))
        return (f"-c TimeZone={SESSION_TIME_ZONE} -c statement_timeout={ms} -c lock_timeout={ms} "
                f"-c idle_in_transaction_session_timeout={ms}")


def connect(dsn: str, *, autocommit: bool = False, connect_timeout: float | None = None,
            limits: DbLimits | None = None, **params: object) -> psycopg.Connection:
    """Open a connection with ``TIME ZONE 'Asia/Shanghai'`` within ``connect_timeout`` seconds (default 10;
    a server that accepts TCP and never answers fails in that time, not minutes later). With ``limits`` the
    session also gets its server-side limits and the client-side :data:`KEEPALIVE`. ``params``: more libpq
    connection parameters. Raises ``psycopg.OperationalError``."""
    timeout = max(1, round(connect_timeout or DEFAULT_CONNECT_TIMEOUT))
    options = f"-c TimeZone={SESSION_TIME_ZONE}"
    if limits is not None:
        options = limits.session_options()
        params = {**KEEPALIVE, **params}
    conn = psycopg.connect(dsn, autocommit=autocommit, options=options, connect_timeout=timeout, **params)
    return conn


def no_answer(exc: BaseException, timeout: float) -> str | None:
    """``PostgreSQL did not answer within N s`` when ``exc`` is a connect that timed out (a server frozen or
    overloaded: it accepted the connection and said nothing), else None — so a frozen server is not reported as
    a missing database or a refused login (issue 28 item 7)."""
    text = str(exc).lower()
    if isinstance(exc, TimeoutError) or "timeout expired" in text or "timed out" in text:
        return f"PostgreSQL did not answer within {timeout:g} s"
    return None


def abandon(conn: psycopg.Connection) -> None:
    """Shut the socket of ``conn`` down from any thread, so that a read or write blocked on a server that does not
    answer (frozen, ``SIGSTOP``) returns at once with a connection error in the thread that uses it. Works on a
    duplicate descriptor (the connection's own stays psycopg's, which closes it); never raises."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


def bounded_session(conn: psycopg.Connection, seconds: float) -> psycopg.Connection:
    """``conn`` with a client-side bound on all the work done on it: ``seconds`` after this call its socket is
    shut down (:func:`abandon`) if it is still open, so a statement on a server that stopped answering — where no
    server-side timeout fires — ends with a connection error instead of waiting for ever (issue 28 item 1: the
    end-of-run work). Closing the connection earlier makes the timer a no-op. Returns ``conn``."""
    import threading

    timer = threading.Timer(seconds, lambda: None if conn.closed else abandon(conn))
    timer.daemon = True
    timer.start()
    return conn


def open_pool(dsn: str, connect_fn: Callable[[str], psycopg.Connection], limits: DbLimits, *,
              name: str = "feiqiu-etl") -> "psycopg_pool.ConnectionPool":  # noqa: F821 - imported below
    """A :class:`psycopg_pool.ConnectionPool` of at most ``limits.pool_size`` connections opened by ``connect_fn``
    (so they carry the run's session limits, and an embedded server that died is started again). It opens
    connections on demand (none kept idle beyond the run's need); a caller waits at most the ``timeout`` it
    gives ``getconn`` (``psycopg_pool.PoolTimeout``, a ``psycopg.OperationalError``). Failed background connects
    are retried for at most ``limits.unavailable_limit`` s. Opened at once; close it with ``close()``."""
    import logging

    from psycopg_pool import ConnectionPool

    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # our own lines say what happened, once

    class RunConnection(psycopg.Connection):
        """The pool opens its connections with ``connect_fn`` (psycopg-pool calls ``connection_class.connect``)."""

        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: object) -> psycopg.Connection:  # type: ignore[override]
            return connect_fn(conninfo)

    return ConnectionPool(dsn, connection_class=RunConnection, min_size=0, max_size=limits.pool_size, open=True,
                          name=name, timeout=limits.unavailable_limit, max_idle=60.0,
                          reconnect_timeout=limits.unavailable_limit, num_workers=2)


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
