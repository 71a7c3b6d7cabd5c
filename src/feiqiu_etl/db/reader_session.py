"""The session of ``feiqiu-etl sql``: one statement, as a role that cannot become anything dangerous, bounded in
time, never committed (issue 21, findings 1, 7 and 11).

**What the role can become.** ``SET ROLE`` is allowed to any role the *login* role is a member of, directly or
through other roles, whether the membership is inherited or not (``NOINHERIT`` only stops privileges from
applying without ``SET ROLE``). So :func:`role_problem` follows every membership of the session's roles in
``pg_auth_members``, at any depth and whatever its options, and refuses when any role reached is a superuser or
one of :data:`DANGEROUS_ROLES` (running programs, reading or writing the server's files: ``COPY … TO PROGRAM``,
``pg_read_file``, ``COPY … TO '/file'``, none of which a READ ONLY transaction stops).

**SET ROLE inside the statement is harmless, not forbidden.** PostgreSQL has no privilege that forbids
``SET ROLE``, and it decides what ``SET ROLE`` may reach from the *session* user, so running the statement after a
``SET ROLE`` to some powerless role would not help: the statement could ``RESET ROLE``. Instead the login role
itself must be a role with no such memberships: every role the statement could switch to has been checked
before it runs. ``SET SESSION AUTHORIZATION`` needs a session user that logged in as a superuser, which is
refused. A statement that switches to a harmless role it belongs to still runs in a READ ONLY transaction.

**Bounded.** :func:`bound_session` sets ``statement_timeout`` (``sql.timeout``, which the statement cannot lift:
PostgreSQL arms the timer before the statement starts), ``lock_timeout``, idle timeouts, server-side TCP
keepalives and ``client_connection_check_interval`` (PostgreSQL 14+: the server checks every second that the
client is still there, so a killed client leaves no backend working). :func:`run_statement` adds a client-side
watchdog: the query is cancelled ``CANCEL_GRACE`` s after the limit if the server did not stop it, and the socket
is shut down ``ABANDON_GRACE`` s after that (a frozen server).

**Never committed.** The transaction is rolled back at the end: PostgreSQL delivers a ``NOTIFY`` (also one sent
by ``pg_notify`` inside a function) only when its transaction commits, and there is no privilege for ``NOTIFY``
that could be revoked, so a statement run here can never signal the ETL.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from dataclasses import dataclass

import psycopg

DANGEROUS_ROLES = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")
"""Predefined roles whose members may run programs or read or write files on the database server."""

MAX_TIMEOUT = 86400.0
CANCEL_GRACE = 2.0
"""Seconds after the limit before the client cancels a statement the server did not stop itself."""
ABANDON_GRACE = 3.0
"""Seconds after that cancel before the client shuts the connection down (the server does not answer)."""
CHECK_INTERVAL_MS = 1000
"""``client_connection_check_interval``: how often the server checks that the client is still there."""
KEEPALIVE = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
             "tcp_user_timeout": 30000}
"""Client-side TCP keepalives (libpq; ignored on a Unix socket): a dead server is noticed within ~30 s."""


class StatementTimeout(Exception):
    """The statement ran longer than its limit and was cancelled (``str()``: one line)."""


_REACHABLE = """
WITH RECURSIVE reach(oid) AS (
    SELECT oid FROM pg_roles WHERE rolname IN (session_user, current_user)
    UNION
    SELECT m.roleid FROM pg_auth_members m JOIN reach r ON m.member = r.oid)
SELECT r.rolname, r.rolsuper, r.rolname = ANY(%s) AS dangerous,
       r.rolname IN (session_user, current_user) AS itself
FROM reach JOIN pg_roles r USING (oid)
WHERE r.rolsuper OR r.rolname = ANY(%s)
ORDER BY itself DESC, r.rolsuper DESC, r.rolname
"""


def role_problem(conn: psycopg.Connection) -> str | None:
    """None when neither the session's role nor any role it can become (``SET ROLE``: any membership, direct or
    through other roles, inherited or not) is a superuser or one of :data:`DANGEROUS_ROLES`; else a one-line
    reason naming the role and what it can become. Reads ``pg_roles`` and ``pg_auth_members`` (readable by every
    role; if they are not, the query's error propagates and the caller refuses)."""
    login = conn.execute("SELECT session_user").fetchone()[0]
    found = conn.execute(_REACHABLE, (list(DANGEROUS_ROLES), list(DANGEROUS_ROLES))).fetchall()
    if not found:
        return None
    powers = []
    for name, superuser, _, itself in found:
        what = "a superuser" if superuser else f"a member of {name}"
        powers.append(what if itself else f"can become {'the superuser ' + name if superuser else name} "
                                          "(SET ROLE: a membership, inherited or not)")
    shown = powers[0] if powers[0].startswith("can") else f"is {powers[0]}"
    more = f" (and {len(powers) - 1} more)" if len(powers) > 1 else ""
    return (f"refusing to run: role {login} {shown}{more}, so it may run programs or read and write files on the "
            "server; use a read-only role for sql (docs/operations/reader-role.md)")


def bound_session(conn: psycopg.Connection, timeout: float) -> None:
    """Limit the session of ``conn`` (see the module docstring): ``timeout`` s per statement and per lock wait,
    idle limits, TCP keepalives and, on PostgreSQL 14+, ``client_connection_check_interval``. Settings the server
    does not know (older versions) are skipped. Commits (a rolled-back ``set_config`` would be undone)."""
    ms = str(max(1, round(timeout * 1000)))
    idle = str(max(10_000, round(timeout * 1000)))
    settings = [("statement_timeout", ms), ("lock_timeout", ms), ("idle_in_transaction_session_timeout", idle),
                ("idle_session_timeout", idle), ("client_connection_check_interval", str(CHECK_INTERVAL_MS)),
                ("tcp_keepalives_idle", "10"), ("tcp_keepalives_interval", "5"), ("tcp_keepalives_count", "3"),
                ("tcp_user_timeout", "30000")]
    conn.execute("SELECT set_config(v.name, v.value, false) FROM unnest(%s::text[], %s::text[]) AS v(name, value) "
                 "WHERE v.name IN (SELECT name FROM pg_settings)", ([n for n, _ in settings], [v for _, v in settings]))
    conn.commit()


@dataclass(frozen=True)
class StatementResult:
    columns: list[str]
    rows: list[tuple]


def run_statement(conn: psycopg.Connection, query: str, timeout: float) -> StatementResult:
    """Run ``query`` as ONE prepared statement (a second statement is refused by the server) in a READ ONLY
    transaction that is rolled back afterwards, with the client-side watchdog of the module docstring.
    ``conn`` must be bounded by :func:`bound_session` with the same ``timeout``. Raises
    :class:`StatementTimeout` past the limit, ``psycopg.Error`` for anything the server refuses."""
    conn.rollback()
    conn.read_only = True
    watchdog = _Watchdog(conn, timeout)
    try:
        with watchdog:
            cur = conn.execute(query, prepare=True)
            columns = [d.name for d in cur.description or []]
            rows = cur.fetchall() if cur.description else []
            conn.rollback()  # never COMMIT: a NOTIFY in the statement is never delivered
    except psycopg.errors.QueryCanceled as exc:
        if watchdog.fired or "statement timeout" in str(exc) or "lock timeout" in str(exc):
            raise StatementTimeout(_limit_message(timeout)) from None
        raise
    except psycopg.OperationalError:
        if watchdog.fired:
            raise StatementTimeout(_limit_message(timeout) + "; the server did not answer the cancel") from None
        raise
    return StatementResult(columns, rows)


def _limit_message(timeout: float) -> str:
    return (f"the statement ran longer than sql.timeout ({timeout:g} s) and was cancelled; give it more time with "
            "--timeout SECONDS (or SQL_TIMEOUT)")


class _Watchdog:
    """While the body runs: ``CANCEL_GRACE`` s past ``timeout``, cancel the query; ``ABANDON_GRACE`` s later,
    shut the connection's socket down so that a read blocked on a frozen server returns."""

    def __init__(self, conn: psycopg.Connection, timeout: float):
        self._conn = conn
        self._timeout = timeout
        self._done = threading.Event()
        self.fired = False
        self._thread = threading.Thread(target=self._watch, name="sql-watchdog", daemon=True)

    def __enter__(self) -> "_Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(1)

    def _watch(self) -> None:
        if self._done.wait(self._timeout + CANCEL_GRACE):
            return
        self.fired = True
        with contextlib.suppress(Exception):
            self._conn.cancel_safe(timeout=ABANDON_GRACE)
        if self._done.wait(ABANDON_GRACE):
            return
        with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)  # on a duplicate: the connection's own descriptor stays psycopg's
