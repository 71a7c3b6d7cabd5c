"""``feiqiu-etl sql`` can only read (issue 11, finding 2): on the embedded server it logs in as the read-only
role ``feiqiu_reader``, so ``COPY … TO PROGRAM`` and ``COPY … TO '/file'`` fail with one line and no effect;
with ``--dsn`` a role that could run programs or write files is refused; a read-only role reads normally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg import conninfo, sql

from feiqiu_etl.db.embedded import DEFAULT_DATABASE, EmbeddedPostgres, ensure_reader_role
from feiqiu_etl.cli.demo import DEMO_DATABASE
from feiqiu_etl.simulator import Simulator
from clikit import one_line_error, open_folder
from flowkit import run_flow, sim_config


def _sql(*args: str, home=None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ETL_DB_DSN"}
    if home is not None:
        env["FEIQIU_ETL_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "feiqiu_etl", "sql", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture
def marker(fresh_home):
    """A path in a folder every account can write to, so only the server's privileges decide."""
    for folder in open_folder(fresh_home):
        yield folder / "pwned"


def test_copy_to_program_and_to_file_fail_on_the_embedded_server(fresh_home, marker):
    program = _sql(f"COPY (SELECT 1) TO PROGRAM 'id > {marker}'", home=fresh_home)
    assert program.returncode == 2 and "external program" in one_line_error(program)
    to_file = _sql(f"COPY (SELECT 1) TO '{marker}'", home=fresh_home)
    assert to_file.returncode == 2 and "to a file" in one_line_error(to_file)
    lo_export = _sql(f"SELECT lo_export(0, '{marker}')", home=fresh_home)
    assert lo_export.returncode == 2 and "permission denied" in one_line_error(lo_export)
    assert not marker.exists()
    who = _sql("--json", "SELECT current_user AS u, current_setting('default_transaction_read_only') AS ro",
               home=fresh_home)
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout) == [{"u": "feiqiu_reader", "ro": "on"}]


def test_normal_selects_work_on_the_warehouse_and_the_demo_database(fresh_home):
    server = EmbeddedPostgres(fresh_home / "pgdata").start()  # the CLI processes join this server
    try:
        with Simulator(sim_config(seed=9)) as sim:
            for database in (DEFAULT_DATABASE, DEMO_DATABASE):
                assert run_flow(sim, server.ensure_database(database), tasks=["ODS_MEMBER"]).status == "SUCCESS"
            members = len(sim.dataset.records("ODS_MEMBER", sim.config.site_ids[0]))
        for args in ([], ["--demo"]):
            proc = _sql(*args, "--json", "SELECT count(*) AS n FROM ods.member", home=fresh_home)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout) == [{"n": members}]
        denied = _sql("--demo", "DELETE FROM ods.member", home=fresh_home)
        assert denied.returncode == 2 and "read-only" in one_line_error(denied)
        with psycopg.connect(server.dsn(DEMO_DATABASE)) as conn:
            assert conn.execute("SELECT count(*) FROM ods.member").fetchone()[0] == members
    finally:
        server.stop()


def test_a_superuser_dsn_is_refused_with_one_line(pg_dsn, marker):
    proc = _sql("--dsn", pg_dsn, f"COPY (SELECT 1) TO PROGRAM 'id > {marker}'")
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "superuser" in line and "read-only role" in line
    assert not marker.exists()


@pytest.fixture
def reader_dsn(pg_dsn):
    """A DSN of a fresh login role made like the embedded reader (pg_read_all_data, read-only default)."""
    role, password = f"reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ensure_reader_role(conn, role, password)
    params = conninfo.conninfo_to_dict(pg_dsn)
    params.pop("passfile", None)
    yield conninfo.make_conninfo(**{**params, "user": role, "password": password})
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.timeout(900)  # a hang guard: ~15 commands, each a process start (slow on a busy machine)
def test_sql_command_reads_but_never_writes(pg_dsn, reader_dsn, marker):
    with Simulator(sim_config(seed=9)) as sim:
        assert run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"]).status == "SUCCESS"
        members = len(sim.dataset.records("ODS_MEMBER", sim.config.site_ids[0]))
    ok = _sql("--dsn", reader_dsn, "--json", "SELECT count(*) AS n FROM ods.member")  # created after the role
    assert ok.returncode == 0 and json.loads(ok.stdout) == [{"n": members}], ok.stderr
    for secret in ("SELECT rolpassword FROM pg_authid", "SELECT passwd FROM pg_shadow"):
        shown = _sql("--dsn", reader_dsn, secret)  # the server's password verifiers stay hidden
        assert shown.returncode == 2 and "SCRAM" not in shown.stdout + shown.stderr, shown.stdout
    for move in ("SELECT pg_advisory_lock(42)", "SELECT pg_try_advisory_lock(1, 2)",
                 "SELECT pg_notify('feiqiu_etl_cancel', 'x')"):  # hold a lane, fake a cancel
        refused = _sql("--dsn", reader_dsn, move)
        assert refused.returncode == 2 and "permission denied" in refused.stderr, (move, refused.stderr)
    denied = _sql("--dsn", reader_dsn, "DELETE FROM ods.member")
    assert denied.returncode == 2 and "read-only" in denied.stderr
    for sneaky in ("COMMIT; DELETE FROM ods.member", "SET TRANSACTION READ WRITE; DELETE FROM ods.member",
                   "ROLLBACK; DELETE FROM ods.member RETURNING 1", "SELECT 1; SELECT 2"):
        proc = _sql("--dsn", reader_dsn, sneaky)
        assert proc.returncode == 2 and "multiple commands" in proc.stderr, sneaky
    program = _sql("--dsn", reader_dsn, f"COPY (SELECT 1) TO PROGRAM 'id > {marker}'")
    assert program.returncode == 2 and "external program" in one_line_error(program)
    assert not marker.exists()
    still = _sql("--dsn", reader_dsn, "--json", "SELECT count(*) AS n FROM ods.member WHERE member_id::text LIKE '%'")
    assert json.loads(still.stdout) == [{"n": members}]
