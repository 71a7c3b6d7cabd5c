"""``sql``: one read-only SQL statement against the warehouse, its rows printed."""

from __future__ import annotations

import json
from typing import Any

import click

from feiqiu_etl.cli.options import settings
from feiqiu_etl.errortext import one_line
from feiqiu_etl.app.database import database
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl.textsafe import terminal_json


@click.command()
@click.argument("query")
@click.option("--dsn", help="PostgreSQL DSN of a read-only role (env ETL_DB_DSN; the docs: 'A read-only "
                           "role for sql'); default: the embedded server's read-only role")
@click.option("--demo", is_flag=True, help="query the demo's database (feiqiu_demo) on the embedded server")
@click.option("--json", "as_json", is_flag=True, help="rows as a JSON array of objects")
@click.option("--timeout", metavar="SECONDS", help="sql.timeout: cancel the statement after this many seconds "
                                                   "(env SQL_TIMEOUT; default 60)")
@click.pass_context
def sql(ctx, query, dsn, demo, as_json, timeout) -> None:
    """Run ONE read-only SQL statement against the warehouse and print the rows (e.g. after the demo).

    On the embedded server it logs in as the role feiqiu_reader, which can only read (the database's schemas):
    it can neither write, run programs nor read or write files (COPY ... TO PROGRAM / TO 'file'). With --dsn a
    role that is, or can become (SET ROLE, any membership, inherited or not), a superuser or a member of
    pg_execute_server_program, pg_read_server_files or pg_write_server_files is refused. The statement is sent
    as a prepared statement (so a second statement is refused) inside a READ ONLY transaction that is rolled
    back (so nothing is written and no NOTIFY is sent), and cancelled after --timeout seconds (exit 2).

    Without --dsn the embedded server's data folder is <home>/pgdata (home: FEIQIU_ETL_HOME, else
    /var/lib/feiqiu-etl as root, else ~/.local/share/feiqiu-etl); as root, when its account feiqiu_etl_pg
    cannot enter the home (under /root, made by mktemp -d), /var/lib/feiqiu-etl/homes/<hash of the
    home>/pgdata. `feiqiu-etl config show` prints which."""
    import psycopg

    from feiqiu_etl.db.connection import connect, scrub
    from feiqiu_etl.db.embedded import DEFAULT_DATABASE
    from feiqiu_etl.db.reader_session import KEEPALIVE, StatementTimeout, bound_session, role_problem, run_statement
    from feiqiu_etl.db.schema import ensure_schemas
    from feiqiu_etl.db.embedded import DEMO_DATABASE

    if not query.strip().rstrip(";").strip():
        raise UsageFailure("an empty query: give one SQL statement, e.g. \"SELECT count(*) FROM ods.settlement\"")
    if demo and dsn is not None:
        raise UsageFailure("--demo reads the embedded demo database; it does not go with --dsn")
    from feiqiu_etl.config.settings import reveal

    config = settings({"db_dsn": dsn, "sql.timeout": timeout})
    dsn, timeout = None if demo else reveal(config.db_dsn), config.sql.timeout

    def prepare(superuser_dsn: str) -> None:  # a fresh home has no etl_meta yet: the documented queries must work
        with connect(superuser_dsn, connect_timeout=config.db.connect_timeout) as conn:
            ensure_schemas(conn)

    with database(dsn, DEMO_DATABASE if demo else DEFAULT_DATABASE, reader=True, prepare=prepare,
                  connect_timeout=config.db.connect_timeout) as real_dsn:
        try:
            with connect(real_dsn, connect_timeout=config.db.connect_timeout, **KEEPALIVE) as conn:
                problem = role_problem(conn)
                if problem:
                    raise UsageFailure(problem)
                bound_session(conn, timeout)
                result = run_statement(conn, query, timeout)
        except StatementTimeout as exc:
            raise UsageFailure(str(exc)) from None
        except psycopg.Error as exc:
            raise UsageFailure(scrub(sql_error_text(exc, query), real_dsn)) from None
    columns, rows = result.columns, result.rows
    if as_json:
        click.echo(terminal_json([dict(zip(columns, r)) for r in rows]))
        return
    from feiqiu_etl.cli.views.tables import render_rows

    render_rows(columns, [tuple(_sql_text(v) for v in r) for r in rows])


def sql_error_text(exc: Exception, query: str) -> str:
    """One line for a statement the server refused: its message, where in the statement (a ``>>>`` before the
    character the server names, as psql's caret line does, on one line) and its hint; a second statement is
    explained (sent as a prepared statement, the text may hold only one). Upstream text goes through
    :func:`one_line`; the caller escapes it for the terminal."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or one_line(exc, None, with_type=False)
    if "cannot insert multiple commands into a prepared statement" in primary:
        return ("one statement per call: this text holds more than one (it is sent as one prepared statement, so "
                "a second one can never run outside the read-only transaction); run them one by one (the server "
                "said: multiple commands in a prepared statement)")
    text = primary
    position = getattr(diag, "statement_position", None)
    if position and str(position).isdigit() and 0 < int(position) <= len(query) + 1:
        at = int(position) - 1
        before, after = query[max(0, at - 30):at], query[at:at + 30]
        text += f" (at character {position}: {'…' if at > 30 else ''}{before}>>>{after}{'…' if len(query) > at + 30 else ''})"
    hint = getattr(diag, "message_hint", None)
    if hint:
        text += f"; hint: {hint}"
    return " ".join(text.split())


def _sql_text(value: Any) -> Any:
    """jsonb values (dicts, lists) print as JSON, not as Python repr."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value

