"""The web page tells the truth (issue 27.3) — ``feiqiu-etl web`` as a real process on a real PostgreSQL:

* it reads as a role made for it: no superuser, read-only, cannot write even when it asks to; dropped at exit;
* before login nothing about the deployment shows: an unauthenticated GET of every page names no database,
  user, socket path or version;
* after login the footer names the display zone with its offset, the zone of every time on the page.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from webkit import WebServer, seed_run

TOKEN = "truth-test-token-0123456789abc"
PAGES = ("/", "/live", "/freshness", "/login", "/runs/2024truth-1", "/runs/2024truth-1/timeline.svg", "/no-such-page",
         "/api/runs", "/api/status", "/api/freshness", "/metrics", "/api/statistics", "/static/app.css")


@pytest.fixture
def seeded(pg_dsn):
    with connect(pg_dsn) as conn:
        ensure_schemas(conn)
        seed_run(conn, "2024truth-1", status="SUCCESS", started_at=datetime.now(timezone.utc) - timedelta(hours=1),
                 seconds=30, stores=(8640015201004417,), rows=10, n_requests=5)
    return pg_dsn


def web_roles(dsn: str) -> list[tuple[str, bool]]:
    """(role, superuser) of the sessions on this database other than ours."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT a.usename, r.rolsuper FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = "
                            "a.usename WHERE a.datname = %s AND a.pid <> pg_backend_pid()", (name,)).fetchall()


def test_the_page_reads_as_a_role_that_is_no_superuser_and_cannot_write(seeded):
    server = WebServer(seeded)
    try:
        assert httpx.get(server.url + "/api/runs", timeout=10).status_code == 200
        readers = [(role, sup) for role, sup in web_roles(seeded) if role.startswith("feiqiu_web_")]
        assert readers and not any(sup for _, sup in readers)
        role = readers[0][0]
        with psycopg.connect(seeded, autocommit=True) as conn:
            attrs = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles "
                                 "WHERE rolname = %s", (role,)).fetchone()
            assert attrs == (False, False, False, False)
            # as that role (by SET ROLE from the superuser): even a transaction that asks to write cannot
            conn.execute(psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(role)))
            assert conn.execute("SELECT count(*) FROM etl_meta.run").fetchone()[0] == 1  # it reads
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("BEGIN READ WRITE")
                try:
                    conn.execute("UPDATE etl_meta.run SET status = 'FAILED'")
                finally:
                    conn.execute("ROLLBACK")
            conn.execute("RESET ROLE")
    finally:
        code, log = server.stop()
    assert code == 0, log
    with psycopg.connect(seeded) as conn:  # the role lived only as long as the server
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0] == 0


def test_nothing_about_the_deployment_shows_before_login(seeded):
    parts = conninfo_to_dict(seeded)
    import feiqiu_etl

    secrets = [parts["dbname"], parts.get("user") or "postgres", parts.get("host") or "", feiqiu_etl.__version__]
    server = WebServer(seeded, "--auth-token", TOKEN)
    try:
        with httpx.Client(base_url=server.url, timeout=10, follow_redirects=True,
                          headers={"Accept": "text/html,*/*"}) as client:
            for path in PAGES:
                response = client.get(path)
                body = response.text
                for secret in filter(None, secrets):
                    assert secret not in body, (path, response.status_code, secret)
                if path in ("/", "/live", "/freshness", "/login"):  # the login page, with its footer
                    assert "Log in" in body and "times in" in body  # the zone is no secret, the deployment is
            logged = client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert parts["dbname"] in logged.text and feiqiu_etl.__version__ in logged.text  # after login: shown
    finally:
        code, log = server.stop()
    assert code == 0, log


def test_the_footer_names_the_display_zone_with_its_offset_the_zone_of_every_time(seeded):
    server = WebServer(seeded, env={"DISPLAY_TIMEZONE": "Asia/Kolkata"})
    try:
        page = httpx.get(server.url + "/", timeout=10).text
        run = httpx.get(server.url + "/runs/2024truth-1", timeout=10).text
    finally:
        code, log = server.stop()
    assert code == 0, log
    footer = re.sub(r"<[^>]+>", "", page.split("<footer>")[1].split("</footer>")[0])  # its text (i18n spans)
    assert "times in Asia/Kolkata (+05:30)" in " ".join(footer.split())
    assert "Asia/Shanghai" not in footer
    offsets = set(re.findall(r"\d\d:\d\d(?::\d\d)? ([+-]\d\d:\d\d)", run))
    assert offsets == {"+05:30"}, offsets
