"""Invalid run ids — a NUL byte, control characters, an over-long id — are a 404 of the web API and one line of
``show``/``cancel`` (exit 2), never a database error or a 503 (issue 21, finding 9). Real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import psycopg

from feiqiu_etl.db.schema import ensure_schemas
from webkit import WebServer, seed_run

TOKEN = "invalid-ids-token-0123456789"
BAD = ["%00", "run%00-a", "%1b%5b2J", "x" * 129, "run-a%0a2026", "%E2%80%AE", "a%20b", "..%2f..%2fetc"]


def test_the_web_api_answers_404_for_ids_that_cannot_be_run_ids(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        ensure_schemas(conn)
        seed_run(conn, "run-a", status="SUCCESS")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with WebServer(pg_dsn, env={"FEIQIU_WEB_TOKEN": TOKEN}) as server:
        client = httpx.Client(base_url=server.url, headers=bearer, timeout=30)
        for bad in BAD:
            for method, path in (("GET", f"/api/runs/{bad}"), ("GET", f"/api/runs/{bad}/requests"),
                                 ("POST", f"/api/runs/{bad}/cancel"), ("GET", f"/runs/{bad}"),
                                 ("GET", f"/runs/{bad}/timeline.svg")):
                r = client.request(method, path)
                assert r.status_code in (400, 404), (path, r.status_code, r.text[:200])
                assert "unavailable" not in r.text.lower() and "0x00" not in r.text, (path, r.text[:200])
                if path.startswith("/api/"):
                    assert list(r.json()) == ["error"] and "\n" not in r.json()["error"], (path, r.text)
        assert client.get("/api/runs/run-a").json()["status"] == "SUCCESS"  # valid ids still work
        assert client.get("/api/runs/run-").json()["run_id"] == "run-a"
        assert client.get("/api/statistics").json()["pool"]["connections_errors"] in (0, None)
        client.close()
        code, log = server.stop()
    assert code == 0 and "Traceback" not in log


def test_show_and_cancel_refuse_invalid_ids_in_one_line(pg_dsn):
    env = {k: v for k, v in os.environ.items() if k != "ETL_DB_DSN"}
    for command in ("show", "cancel"):
        for bad in ("\x1b[2J\x1b]0;pwned\x07", "r" * 5000, "run\u202eid", "a b"):
            done = subprocess.run([sys.executable, "-m", "feiqiu_etl", command, bad, "--dsn", pg_dsn],
                                  capture_output=True, text=True, timeout=60, env=env)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1 and "not a run id" in lines[0], (command, done.stderr)
            assert "\x1b" not in done.stderr and "\u202e" not in done.stderr and len(lines[0]) < 300
    shown = subprocess.run([sys.executable, "-m", "feiqiu_etl", "show", "nope", "--dsn", pg_dsn, "--json"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 2 and "no run 'nope'" in shown.stderr and not json.loads("[]")
