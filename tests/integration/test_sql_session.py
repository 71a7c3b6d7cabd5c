"""``feiqiu-etl sql`` judges what a role can *become* and bounds its statement (issue 21, findings 1, 7, 11).

On the test's real PostgreSQL: the issue's exact attack through a NOINHERIT member of
``pg_execute_server_program`` (and of ``postgres``, of ``pg_read_server_files``, through an intermediate role,
with PostgreSQL 16's ``INHERIT FALSE, SET FALSE``) is refused with one line before anything runs, while the same
statement on a plain connection of that role does run a program (so the refusal is what stops it). ``SET ROLE``
inside the statement reaches only harmless roles and still cannot write. ``SELECT pg_sleep(3600)`` ends after
``--timeout``; a killed client leaves no backend; a ``NOTIFY`` sent through ``sql`` never reaches a listener.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from psycopg import conninfo, sql

from clikit import one_line_error, open_folder
from feiqiu_etl.db.reader_session import StatementTimeout, bound_session, run_statement
from feiqiu_etl.db.schema import ensure_schemas

PASSWORD = "p-" + uuid.uuid4().hex[:12]


def _sql(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("ETL_DB_DSN", "SQL_TIMEOUT")}
    return subprocess.run([sys.executable, "-m", "feiqiu_etl", "sql", *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=timeout)


@pytest.fixture
def outbox(fresh_home):
    """A folder every account can write to, so only the server's privileges decide whether a program ran."""
    yield from open_folder(fresh_home)


@pytest.fixture
def roles(pg_dsn):
    """``make(name_suffix, *statements)`` creates a LOGIN role (``{role}`` in the statements names it) as the
    superuser and returns its DSN; every role made is dropped afterwards."""
    made: list[str] = []
    params = conninfo.conninfo_to_dict(pg_dsn)
    params.pop("passfile", None)
    admin = psycopg.connect(pg_dsn, autocommit=True)
    ensure_schemas(admin)

    def make(suffix: str, *statements: str) -> str:
        role = f"sec21_{suffix}_{uuid.uuid4().hex[:6]}"
        made.append(role)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
        for statement in statements:
            admin.execute(statement.format(role=role))
        return conninfo.make_conninfo(**{**params, "user": role, "password": PASSWORD})

    make.admin = admin
    yield make
    for role in reversed(made):
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    admin.close()


def _attack(marker) -> str:
    """The issue's statement: become the dangerous role inside the statement, then run a program."""
    return (f"DO $$BEGIN SET ROLE pg_execute_server_program; COPY (SELECT current_user) TO PROGRAM 'id > {marker}'; "
            "END$$")


def test_the_issues_noinherit_escalation_is_refused_before_anything_runs(roles, outbox):
    marker = outbox / "x"
    sneaky = roles("sneaky1", "ALTER ROLE {role} NOINHERIT", "GRANT pg_execute_server_program TO {role}",
                   "GRANT USAGE ON SCHEMA ods, dwd, etl_meta TO {role}")
    with psycopg.connect(sneaky, autocommit=True) as conn:  # the role really can run a program on its own
        conn.execute(_attack(marker))
    assert marker.exists() and "uid=" in marker.read_text()
    marker.unlink()

    refused = _sql("--dsn", sneaky, _attack(marker))
    line = one_line_error(refused)
    assert refused.returncode == 2 and "can become pg_execute_server_program" in line, line
    assert "read-only role" in line and not marker.exists()


def test_every_way_to_become_a_dangerous_role_is_refused(roles, outbox):
    marker = outbox / "y"
    server_major = roles.admin.info.server_version // 10000
    attacks = {
        "noinherit member of postgres": (roles("su", "ALTER ROLE {role} NOINHERIT", "GRANT postgres TO {role}"),
                                         "the superuser postgres"),
        "reads server files": (roles("rd", "ALTER ROLE {role} NOINHERIT", "GRANT pg_read_server_files TO {role}"),
                               "pg_read_server_files"),
        "writes server files": (roles("wr", "GRANT pg_write_server_files TO {role}"), "pg_write_server_files"),
    }
    middle = roles("mid", "ALTER ROLE {role} NOLOGIN NOINHERIT", "GRANT pg_execute_server_program TO {role}")
    middle_role = conninfo.conninfo_to_dict(middle)["user"]
    attacks["through another role"] = (roles("via", "ALTER ROLE {role} NOINHERIT", f"GRANT {middle_role} TO {{role}}"),
                                       "pg_execute_server_program")
    if server_major >= 16:  # a membership that can neither be inherited nor SET: still a membership
        attacks["inherit false, set false"] = (
            roles("opt", "GRANT pg_execute_server_program TO {role} WITH INHERIT FALSE, SET FALSE"),
            "pg_execute_server_program")
    for what, (dsn, named) in attacks.items():
        proc = _sql("--dsn", dsn, _attack(marker))
        line = one_line_error(proc)
        assert proc.returncode == 2 and f"can become {named}" in line, (what, line)
    assert not marker.exists()
    # with a superuser session the superuser postgres could still terminate backends and read verifiers:
    su = attacks["noinherit member of postgres"][0]
    for statement in ("DO $$BEGIN SET ROLE postgres; PERFORM pg_terminate_backend(pg_backend_pid()); END$$",
                      "DO $$BEGIN SET ROLE postgres; PERFORM count(*) FROM pg_authid; END$$"):
        assert _sql("--dsn", su, statement).returncode == 2


def test_set_role_inside_the_statement_reaches_only_harmless_roles_and_cannot_write(roles):
    owner = roles("owner", "ALTER ROLE {role} NOLOGIN", "GRANT USAGE, CREATE ON SCHEMA etl_meta TO {role}")
    owner_role = conninfo.conninfo_to_dict(owner)["user"]
    roles.admin.execute(sql.SQL("CREATE TABLE etl_meta.sec21_t (v int)"))
    roles.admin.execute(sql.SQL("INSERT INTO etl_meta.sec21_t VALUES (1)"))
    roles.admin.execute(sql.SQL("ALTER TABLE etl_meta.sec21_t OWNER TO {}").format(sql.Identifier(owner_role)))
    member = roles("member", "ALTER ROLE {role} NOINHERIT", f"GRANT {owner_role} TO {{role}}",
                   "GRANT USAGE ON SCHEMA etl_meta TO {role}")
    ok = _sql("--dsn", member, "--json", f"DO $$BEGIN SET ROLE {owner_role}; PERFORM count(*) FROM etl_meta.sec21_t; "
                                         "END$$")
    assert ok.returncode == 0, ok.stderr  # allowed: the role it becomes is harmless
    for statement in (f"DO $$BEGIN SET ROLE {owner_role}; DELETE FROM etl_meta.sec21_t; END$$",
                      f"DO $$BEGIN SET ROLE {owner_role}; DROP TABLE etl_meta.sec21_t; END$$",
                      "DO $$BEGIN SET SESSION AUTHORIZATION postgres; END$$",
                      "SET SESSION AUTHORIZATION postgres"):
        proc = _sql("--dsn", member, statement)
        line = one_line_error(proc)
        assert proc.returncode == 2 and ("read-only" in line or "permission denied" in line), (statement, line)
    assert roles.admin.execute("SELECT count(*) FROM etl_meta.sec21_t").fetchone()[0] == 1


def test_a_statement_that_sleeps_ends_after_the_timeout_with_one_line(roles):
    reader = roles("sleepy")
    started = time.monotonic()
    proc = _sql("--dsn", reader, "--timeout", "1", "SELECT pg_sleep(3600)")
    took = time.monotonic() - started
    line = one_line_error(proc)
    assert proc.returncode == 2 and "sql.timeout (1 s)" in line and took < 20, (took, line)
    # from the environment too, and a statement cannot lift its own limit
    proc = _sql("--dsn", reader, "DO $$BEGIN SET statement_timeout = 0; PERFORM pg_sleep(3600); END$$",
                env={"SQL_TIMEOUT": "1"})
    assert proc.returncode == 2 and "sql.timeout (1 s)" in one_line_error(proc)
    bad = _sql("--dsn", reader, "--timeout", "0", "SELECT 1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_killed_client_leaves_no_backend_working(roles):
    reader = roles("killed")
    marker = f"pg_sleep(3599.{uuid.uuid4().int % 1000:03d})"
    proc = subprocess.Popen([sys.executable, "-m", "feiqiu_etl", "sql", "--dsn", reader, "--timeout", "3600",
                             f"SELECT {marker}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def backends() -> list[int]:
        return [r[0] for r in roles.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()", (f"%{marker}%",))]

    try:
        deadline = time.monotonic() + 60
        while not backends():
            assert time.monotonic() < deadline and proc.poll() is None, "the statement never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        while backends() and time.monotonic() - killed < 10:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed
        assert not backends(), "the backend of a killed sql client is still working"
        assert gone_after < 5, gone_after  # client_connection_check_interval is 1 s
    finally:
        if proc.poll() is None:
            proc.kill()
        roles.admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s "
                            "AND pid <> pg_backend_pid()", (f"%{marker}%",))


def test_the_watchdog_ends_a_statement_on_a_frozen_backend(roles):
    """No server-side limit (``bound_session`` not called) and the backend stopped with SIGSTOP: the client
    cancels, then gives up on the connection, within the limit plus both graces."""
    reader = roles("frozen")
    with psycopg.connect(reader) as conn:
        pid = conn.info.backend_pid
        started = time.monotonic()
        with pytest.raises(StatementTimeout, match="did not answer"):
            try:
                freezer = subprocess.Popen([sys.executable, "-c", f"import os, signal, time; time.sleep(0.5); "
                                            f"os.kill({pid}, signal.SIGSTOP)"])
                run_statement(conn, "SELECT pg_sleep(30)", 0.5)
            finally:
                freezer.wait(10)
                os.kill(pid, signal.SIGCONT)
        assert time.monotonic() - started < 0.5 + 2 + 3 + 2


def test_a_bounded_session_keeps_its_limits_after_the_statement_transaction(roles):
    with psycopg.connect(roles("limits")) as conn:
        bound_session(conn, 2.5)
        shown = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name IN ('statement_timeout', "
                                  "'lock_timeout', 'client_connection_check_interval')").fetchall())
        conn.rollback()
        assert shown["statement_timeout"] == "2500" and shown["lock_timeout"] == "2500"
        assert shown.get("client_connection_check_interval", "1000") == "1000"
        with pytest.raises(StatementTimeout):
            run_statement(conn, "SELECT pg_sleep(10)", 2.5)


def test_a_notify_through_sql_never_reaches_a_listener(roles, pg_dsn):
    """PostgreSQL has no privilege for NOTIFY; ``sql`` never commits, and a notification is delivered only at
    commit. The same statements committed on a plain connection of the role do arrive (the control)."""
    reader = roles("notifier")
    listener = psycopg.connect(pg_dsn, autocommit=True)
    listener.execute("LISTEN feiqiu_etl_cancel")

    def received(seconds: float) -> list[str]:
        return [n.payload for n in listener.notifies(timeout=seconds, stop_after=10)]

    statements = ("NOTIFY feiqiu_etl_cancel, 'via-sql-statement'",
                  "DO $$BEGIN PERFORM pg_notify('feiqiu_etl_cancel', 'via-sql-function'); END$$",
                  "SELECT pg_notify('feiqiu_etl_cancel', 'via-sql-select')")
    try:
        for statement in statements:
            proc = _sql("--dsn", reader, statement)
            assert proc.returncode == 0, proc.stderr
        assert received(1.5) == []
        with psycopg.connect(reader, autocommit=True) as plain:  # the control: a committed NOTIFY arrives
            plain.execute("NOTIFY feiqiu_etl_cancel, 'committed'")
        assert received(5) == ["committed"]
    finally:
        listener.close()
