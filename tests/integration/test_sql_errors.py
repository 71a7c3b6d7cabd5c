"""``feiqiu-etl sql`` says where a refused statement went wrong, on one line (fresh-user trial: psql's caret line
arrived flattened, "LINE 1: selec 1 ^"), with the server's hint, and explains a second statement instead of
"cannot insert multiple commands into a prepared statement". Real PostgreSQL errors, formatted as the CLI does."""

from __future__ import annotations

import psycopg
import pytest

from feiqiu_etl.cli.sql import sql_error_text
from feiqiu_etl.db.reader_session import bound_session, run_statement


def _refusal(dsn: str, query: str) -> psycopg.Error:
    """The error the sql command's own statement path gets (one prepared statement, read only, bounded)."""
    with psycopg.connect(dsn) as conn:
        bound_session(conn, 30)
        with pytest.raises(psycopg.Error) as info:
            run_statement(conn, query, 30)
    return info.value


@pytest.mark.parametrize("query, line", [
    ("selec 1", 'syntax error at or near "selec" (at character 1: >>>selec 1)'),
    ("SELECT nosuchcol FROM pg_class", 'column "nosuchcol" does not exist (at character 8: SELECT >>>nosuchcol FROM '
                                       'pg_class)'),
    ("SELECT relnamee FROM pg_class", 'column "relnamee" does not exist (at character 8: SELECT >>>relnamee FROM '
                                      'pg_class); hint: Perhaps you meant to reference the column "pg_class.relname".'),
    ("SELECT 1 FROM " + "x" * 60 + " WHERE nosuch", f'relation "{"x" * 60}" does not exist (at character 15: '
                                                    f'SELECT 1 FROM >>>{"x" * 30}…)'),
    ("SELECT 1; SELECT 2", "one statement per call: this text holds more than one (it is sent as one prepared "
                           "statement, so a second one can never run outside the read-only transaction); run them "
                           "one by one (the server said: multiple commands in a prepared statement)"),
])
def test_a_refused_statement_is_one_line_that_says_where(pg_dsn, query, line):
    text = sql_error_text(_refusal(pg_dsn, query), query)
    assert text == line
    assert "\n" not in text and "LINE 1" not in text
