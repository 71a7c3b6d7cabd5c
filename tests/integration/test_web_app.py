"""The web application in process (Starlette's TestClient) on real PostgreSQL: JSON API, pages, escaping of
upstream text, CSRF on cancel, token/session rules, the loopback Host check, freshness thresholds."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from starlette.testclient import TestClient

from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl import registry
from feiqiu_etl.statistics import RunStatistics
from feiqiu_etl.web import WebSettings, create_app
from webkit import attempt, seed_run

TOKEN = "a-long-enough-test-token-0123"
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
CODES = ("ODS_PAYMENT", "ODS_MEMBER", "ODS_SETTLEMENT")


@pytest.fixture
def conn(pg_dsn):
    with connect(pg_dsn) as c:
        ensure_schemas(c)
        yield c


def client(dsn: str, **kw) -> TestClient:
    settings = WebSettings(dsn=dsn, connector="feiqiu", task_codes=CODES, **kw)
    return TestClient(create_app(settings), base_url="http://127.0.0.1:8080")


def _seed_history(conn) -> list[str]:
    now = datetime.now(timezone.utc)
    ids = []
    for i, (status, store) in enumerate([("SUCCESS", 1001), ("FAILED", 1002), ("PARTIAL", 1001),
                                         ("CANCELLED", 1003), ("SUCCESS", 1002)]):
        ids.append(seed_run(conn, f"run-{i:02d}", status=status, stores=(store,),
                            started_at=now - timedelta(hours=10 - i), rows=100 * i, n_requests=10 + i,
                            error=None if status == "SUCCESS" else f"problem {i}"))
    return ids


def test_runs_api_is_newest_first_paged_and_filtered(conn, pg_dsn):
    ids = _seed_history(conn)
    with client(pg_dsn) as c:
        body = c.get("/api/runs").json()
        assert body["total"] == 5 and [r["run_id"] for r in body["runs"]] == ids[::-1]
        assert body["runs"][0]["rows_written"] == 400 and body["runs"][0]["requests"] == 14
        page2 = c.get("/api/runs?limit=2&offset=2").json()
        assert [r["run_id"] for r in page2["runs"]] == ids[::-1][2:4]
        assert [r["run_id"] for r in c.get("/api/runs?status=failed").json()["runs"]] == ["run-01"]
        assert [r["run_id"] for r in c.get("/api/runs?store=1001").json()["runs"]] == ["run-02", "run-00"]
        bad = c.get("/api/runs?status=bogus")
        assert bad.status_code == 400 and "status must be one of" in bad.json()["error"]
        html = c.get("/?per_page=1&page=2&store=1002").text
        assert "run-01" in html and "run-04" not in html  # page 2 of the store's runs (newest first)
        assert 'class="badge failed"' in html and "2 runs matching · page 2 of 2" in html
        assert 'href="/?store=1002&amp;page=1&amp;per_page=1"' in html or "per_page=1" in html
        full = c.get("/runs").text
        assert full.count('<tr data-run-id=') == 5
        assert re.search(r'<option value="1003"\s*>', full)  # store filter offers every store seen


def test_run_page_escapes_upstream_text_everywhere(conn, pg_dsn):
    now = datetime.now(timezone.utc)
    summary = {"lanes": [{"name": "default", "status": "FAILED", "stores": [
        {"site_id": 1001, "name": XSS, "status": "FAILED", "reason": XSS, "tasks_done": 1, "tasks": 1, "rows": 0,
         "requests": 2}]}],
        "tasks": [{"task": "ODS_PAYMENT", "site_id": 1001, "lane": "default", "status": "FAILED", "windows": [
            ["2024-03-01 00:00:00", "2024-03-02 00:00:00"]], "errors": [{"stage": "request", "error": XSS}],
            "total_requests": 2, "timing": {"total": 1.5}}],
        "timeline": {"rows": [[0.0, 0], [1.0, 5]]}}
    seed_run(conn, "run-xss", status="FAILED", error=XSS, summary=summary, started_at=now - timedelta(seconds=5),
             log=[{"ts": now, "level": "ERROR", "message": XSS}],
             requests=[attempt(1, now - timedelta(seconds=4), request=XSS, outcome="error", detail=XSS)])
    with client(pg_dsn) as c:
        html = c.get("/runs/run-xss").text
        assert "<script>window" not in html and "<img src=x" not in html
        assert html.count("&lt;script&gt;window.__xss=1&lt;/script&gt;") >= 5  # error, reason, name, task error, log, svg
        svg = c.get("/runs/run-xss/timeline.svg")
        assert svg.headers["content-type"].startswith("image/svg+xml") and "<script>" not in svg.text
        assert c.get("/runs/run-x").status_code == 200  # a unique prefix redirects to the run
        assert c.get("/runs/nope").status_code == 404
        api = c.get("/api/runs/run-xss").json()
        assert api["error"] == XSS and api["log"][0]["message"] == XSS  # JSON carries the text as it is
        requests = c.get("/api/runs/run-xss/requests").json()
        assert requests["counts"]["outcome"] == {"error": 1} and requests["requests"][0]["detail"] == XSS
        only = c.get("/runs/run-xss?task=ODS_MEMBER&site=1001").text  # the log of one task: none here
        assert "No log stored for ODS_MEMBER" in only and "0 of 1 entries" in only
        csp = c.get("/runs/run-xss").headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_cancel_needs_post_with_the_pages_csrf_token(conn, pg_dsn):
    seed_run(conn, "run-live", status="RUNNING")
    seed_run(conn, "run-done", status="SUCCESS")
    with client(pg_dsn) as c:
        assert c.get("/api/runs/run-live/cancel").status_code == 405
        assert c.post("/api/runs/run-live/cancel").status_code == 403
        assert c.post("/api/runs/run-live/cancel", headers={"X-CSRF-Token": "0" * 64}).status_code == 403
        token = c.get("/api/csrf").json()["csrf_token"]
        assert f'<meta name="csrf-token" content="{token}">' in c.get("/live").text
        other_site = c.post("/api/runs/run-live/cancel", headers={"X-CSRF-Token": token,
                                                                   "Origin": "http://evil.example"})
        assert other_site.status_code == 403
        assert registry.get_run(conn, "run-live", with_log=False).cancel_requested_at is None
        ok = c.post("/api/runs/run-live/cancel", headers={"X-CSRF-Token": token, "Origin": "http://127.0.0.1:8080"})
        assert ok.status_code == 202 and ok.json() == {"run_id": "run-live", "requested": True,
                                                       "status_before": "RUNNING"}
        run = registry.get_run(conn, "run-live", with_log=False)
        assert run.cancel_requested_at is not None and run.cancel_requested_by.startswith("web page")
        done = c.post("/api/runs/run-done/cancel", headers={"X-CSRF-Token": token})
        assert done.status_code == 409 and done.json()["status"] == "SUCCESS"
        assert c.post("/api/runs/none/cancel", headers={"X-CSRF-Token": token}).status_code == 404
        form = c.post("/api/runs/run-live/cancel", data={"csrf_token": token}, follow_redirects=False)
        assert form.status_code == 303 and form.headers["location"] == "/live"  # the no-JavaScript path
        stats = c.get("/api/statistics").json()
        assert stats["security"]["csrf_refused"] == 3


def test_with_a_token_every_request_needs_it_or_the_login_cookie(conn, pg_dsn):
    seed_run(conn, "run-a", status="RUNNING")
    with client(pg_dsn, token=TOKEN, host="0.0.0.0") as c:
        for path in ("/", "/live", "/freshness", "/runs/run-a", "/api/runs", "/api/status", "/api/freshness",
                     "/api/runs/run-a", "/api/csrf", "/api/status/stream", "/runs/run-a/timeline.svg"):
            r = c.get(path)
            assert r.status_code == 401, path
            assert TOKEN not in r.text
        assert c.post("/api/runs/run-a/cancel").status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert c.get("/api/runs", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        page = c.get("/live", headers={"Accept": "text/html"})
        assert page.status_code == 401 and 'name="token"' in page.text and 'value="/live"' in page.text
        assert c.get("/static/app.css").status_code == 200  # our own stylesheet, no data
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        api = c.get("/api/runs", headers=bearer)
        assert api.status_code == 200 and api.json()["total"] == 1 and TOKEN not in api.text
        # API clients with the token need no CSRF token
        assert c.post("/api/runs/run-a/cancel", headers=bearer).status_code == 202
        wrong = c.post("/login", data={"token": "not-it", "next": "/live"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not the token" in wrong.text and "not-it" not in wrong.text
        evil = c.post("/login", data={"token": TOKEN, "next": "//evil.example/x"}, follow_redirects=False)
        assert evil.status_code == 303 and evil.headers["location"] == "/"  # never off-site
        login = c.post("/login", data={"token": TOKEN, "next": "/live"}, follow_redirects=False)
        assert login.status_code == 303 and login.headers["location"] == "/live"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        assert c.get("/").status_code == 200  # the client keeps the session cookie
        assert c.post("/api/runs/run-a/cancel").status_code == 403  # a browser session needs the CSRF token
        token = c.get("/api/csrf").json()["csrf_token"]
        assert c.post("/api/runs/run-a/cancel", headers={"X-CSRF-Token": token}).status_code == 202
        assert c.post("/logout", data={"csrf_token": token}, follow_redirects=False).status_code == 303
        assert c.get("/api/runs").status_code == 401
        stats = c.get("/api/statistics", headers=bearer).json()["security"]
        assert stats["logins"] == 2 and stats["failed_logins"] == 1 and stats["sessions"] == 1


def test_without_a_token_only_loopback_host_names_are_answered(conn, pg_dsn):
    with client(pg_dsn) as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/runs", headers={"Host": "localhost:8080"}).status_code == 200
        assert c.get("/api/runs", headers={"Host": "[::1]:8080"}).status_code == 200
        rebound = c.get("/api/runs", headers={"Host": "evil.example:8080"})  # DNS rebinding
        assert rebound.status_code == 421


def test_freshness_marks_old_and_never_loaded_tasks(conn, pg_dsn):
    now = datetime.now(timezone.utc)
    conn.execute("INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, window_end, "
                 "run_id) VALUES ('feiqiu', 'ODS_PAYMENT', 1001, %s, %s, 'r1')",
                 (now - timedelta(hours=30), now - timedelta(hours=5)))
    conn.execute("INSERT INTO etl_meta.snapshot_done (connector, task_code, site_id, completed_at, run_id) "
                 "VALUES ('feiqiu', 'ODS_MEMBER', 1001, %s, 'r1')", (now - timedelta(minutes=10),))
    conn.execute("INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record, attempts) "
                 "VALUES ('feiqiu', 'ODS_MEMBER', 1001, '42', '{}', 2)")
    conn.commit()
    with client(pg_dsn, stale_hours=26) as c:
        rows = {r["task"]: r for r in c.get("/api/freshness").json()["rows"]}
        assert set(rows) == set(CODES)
        assert rows["ODS_PAYMENT"]["kind"] == "windowed" and not rows["ODS_PAYMENT"]["stale"]
        assert 5 * 3600 - 60 < rows["ODS_PAYMENT"]["age_seconds"] < 5 * 3600 + 60
        assert rows["ODS_MEMBER"]["owed_details"] == 1 and not rows["ODS_MEMBER"]["stale"]
        assert rows["ODS_SETTLEMENT"]["kind"] is None and rows["ODS_SETTLEMENT"]["stale"]  # never loaded
        strict = {r["task"]: r for r in c.get("/api/freshness?hours=1").json()["rows"]}
        assert strict["ODS_PAYMENT"]["stale"] and not strict["ODS_MEMBER"]["stale"]
        html = c.get("/freshness?hours=1").text
        assert html.count('<tr class="stale"') == 2 and html.count('<tr class="fresh"') == 1
        assert "2 of 3 older than 1 h" in html
        assert c.get("/api/freshness?hours=-1").status_code == 400
        assert c.get("/freshness?hours=abc").status_code == 400


def test_status_lists_running_and_just_finished_runs(conn, pg_dsn):
    seed_run(conn, "run-going", status="RUNNING")
    registry.heartbeat(conn, "run-going", {"run_id": "run-going", "phase": "ods", "lanes": [], "rows_written": 7,
                                           "requests_sent": 3, "tasks_done": 0, "tasks": 2})
    seed_run(conn, "run-ended", status="CANCELLED", seconds=1)
    with client(pg_dsn) as c:
        status = c.get("/api/status").json()
        assert [r["run_id"] for r in status["running"]] == ["run-going"]
        assert status["running"][0]["live"]["rows_written"] == 7
        schema = c.get("/api/status/schema").json()  # the type of `live`, for clients (live.js reads its names)
        assert schema == RunStatistics.json_schema() and {"lanes", "rows_per_s", "eta_s"} <= set(schema["properties"])
        assert [(r["run_id"], r["status"]) for r in status["finished"]] == [("run-ended", "CANCELLED")]
        going = c.get("/runs/run-going").text  # a running run's page: what it has so far, a Cancel button
        assert "Results appear when the run ends" in going and 'data-cancel="run-going"' in going
        html = c.get("/runs").text
        row = html[html.index('data-run-id="run-going"'):]
        assert re.search(r'<td class="num">7</td><td class="num">3</td>', row)  # live totals of a running run


def test_database_errors_are_one_line_503_without_the_password(pg_dsn, conn):
    with client(pg_dsn) as c:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("ALTER TABLE etl_meta.run RENAME TO run_gone")
        try:
            r = c.get("/api/runs")
            assert r.status_code == 503 and r.json()["error"].startswith("database unavailable: ")
            page = c.get("/")
            assert page.status_code == 503 and "Database unavailable" in page.text
        finally:
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("ALTER TABLE etl_meta.run_gone RENAME TO run")
