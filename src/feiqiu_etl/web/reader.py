"""The role the web page reads as (issue 27): never a superuser, never the loading role.

``feiqiu-etl web --reader-dsn DSN`` (env ``ETL_READER_DSN``) names one (docs/web-reader.md shows how to make
it); it is refused when it is, or can become, a superuser
(:func:`feiqiu_etl.db.reader_session.role_problem`). Without one, a DSN whose role may create roles (the embedded
server's superuser, or a loading role with CREATEROLE) makes a role for this server: ``feiqiu_web_<random>``,
LOGIN with a random password that lives only in this process, no superuser, ``default_transaction_read_only``,
SELECT on the database's schemas now and later (:func:`~feiqiu_etl.db.embedded.reader.ensure_reader_role`);
it is dropped when the server stops. Otherwise the command ends with one line (exit 2).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Iterator

import psycopg
from psycopg import sql


class ReaderProblem(Exception):
    """The web page has no read-only role to read as (one line)."""


@contextlib.contextmanager
def web_reader(dsn: str, reader_dsn: str | None = None, *, connect_timeout: float = 10.0) -> Iterator[str]:
    """The DSN the web page reads with (see the module docstring), while the body runs. Raises
    :class:`ReaderProblem`."""
    from psycopg.conninfo import make_conninfo

    from feiqiu_etl.db.connection import connect
    from feiqiu_etl.db.reader_session import role_problem

    if reader_dsn:
        with connect(reader_dsn, connect_timeout=connect_timeout) as conn:
            problem = role_problem(conn)
            read_only = conn.execute("SHOW default_transaction_read_only").fetchone()[0]
        if problem:
            raise ReaderProblem(f"--reader-dsn: {problem}")
        if read_only != "on":
            raise ReaderProblem("--reader-dsn: its role must have default_transaction_read_only = on "
                                "(ALTER ROLE … SET default_transaction_read_only = on)")
        yield reader_dsn
        return
    from feiqiu_etl.db.embedded.reader import ensure_reader_role

    role, password = f"feiqiu_web_{secrets.token_hex(4)}", secrets.token_urlsafe(24)
    with connect(dsn, connect_timeout=connect_timeout) as conn:
        conn.autocommit = True
        may = conn.execute("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (may and may[0]):
            raise ReaderProblem("the web page reads as a read-only role: give --reader-dsn (env ETL_READER_DSN), "
                                "or a DSN whose role may create one (CREATEROLE)")
        ensure_reader_role(conn, role, password, lock_down=False)
    try:
        yield make_conninfo(dsn, user=role, password=password)
    finally:
        with contextlib.suppress(psycopg.Error), connect(dsn, connect_timeout=connect_timeout) as conn:
            conn.autocommit = True
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
