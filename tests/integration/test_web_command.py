"""``feiqiu-etl web`` as a real process: refuses a non-loopback bind without a token (exit 2, one line), a
short token and a port in use; never shows the token or the DB password in a page, a response or its log;
stops with exit 0 on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx
import pytest

from webkit import WebServer

TOKEN = "command-test-token-0123456789"


def _web(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "feiqiu_etl", "web", *args], capture_output=True, text=True,
                          timeout=60, env={**{k: v for k, v in os.environ.items() if k != "FEIQIU_WEB_TOKEN"},
                                           **(env or {})})


@pytest.mark.parametrize("host", ["127.0.0.2", "0.0.0.0", "::"])
def test_a_non_loopback_bind_without_a_token_is_refused_in_one_line(host):
    done = _web("--host", host, "--port", "0", "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs --auth-token (or FEIQIU_WEB_TOKEN)" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_short_token_and_a_busy_port_are_one_line_errors():
    short = _web("--host", "127.0.0.2", "--port", "0", "--dsn", "postgresql://x@127.0.0.1:1/x",
                 env={"FEIQIU_WEB_TOKEN": "short"})
    assert short.returncode == 2 and "at least 16 characters" in short.stderr and "short" not in \
        short.stderr.replace("at least", "")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        taken = _web("--port", str(port), "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1


def test_token_and_password_never_appear_and_sigterm_stops_cleanly(pg_dsn):
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(pg_dsn)
    password = params.get("password")
    if not password and params.get("passfile"):  # the embedded server: the DSN names its passfile
        from pathlib import Path

        lines = [ln.rsplit(":", 2) for ln in Path(params["passfile"]).read_text().splitlines()
                 if ln and not ln.startswith("#")]
        password = next((pw for _, user, pw in lines if user == params.get("user")), None)
    assert password, "this test needs a server that asks for a password (the embedded test server does)"
    server = WebServer(pg_dsn, "-v", host="127.0.0.2", env={"FEIQIU_WEB_TOKEN": TOKEN})
    try:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        bodies = [httpx.get(server.url + path, headers=bearer).text
                  for path in ("/", "/live", "/freshness", "/api/runs", "/api/status", "/api/freshness",
                               "/api/statistics")]
        bodies.append(httpx.post(server.url + "/login", data={"token": TOKEN, "next": "/"}).text)
        assert "(user postgres) on " in bodies[0]  # the footer names the database, never its password
        for body in bodies:
            assert TOKEN not in body and password not in body
        assert httpx.get(server.url + "/api/runs").status_code == 401
    finally:
        code, log = server.stop(signal.SIGTERM)
    assert code == 0, log
    assert "Traceback" not in log and "Application shutdown complete" in log
    assert "GET /api/runs" in log  # -v: the access log is on
    assert TOKEN not in log and password not in log
