"""Text from the upstream reaches no terminal raw (issue 21, finding 4): the issue's exact ``msg`` — it clears the
screen, sets the title and forges a log line — served by an upstream that answers every request with it, then a
real ``feiqiu-etl run`` (text and JSON logs) and ``show``: no escape character, no BEL, no forged line at the
start of a line; the text is still readable (escaped), and ``--json`` keeps it exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

PAYLOAD = "\x1b[2J\x1b]0;pwned-title\x07…\n2026-12-01 00:00:00 ERROR [default 1 ODS_FAKE] forged line"
FORGED = "2026-12-01 00:00:00 ERROR [default 1 ODS_FAKE]"
RAW = ("\x1b", "\x07", "\x9b")


@pytest.fixture
def hostile_upstream():
    """An upstream whose every answer is a business error carrying :data:`PAYLOAD` (40101: the token refused)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"code": 40101, "msg": PAYLOAD, "data": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ETL_DB_DSN", "FEIQIU_API_BASE")}
    return subprocess.run([sys.executable, "-m", "feiqiu_etl", *args], capture_output=True, text=True, timeout=120,
                          env={**env, "FEIQIU_API_TOKEN": "fq_test_token"})


def _holds_payload(value) -> bool:
    """Whether a string somewhere in a parsed JSON value holds :data:`PAYLOAD` exactly."""
    if isinstance(value, str):
        return PAYLOAD in value
    if isinstance(value, dict):
        return any(_holds_payload(v) for v in value.values())
    return isinstance(value, list) and any(_holds_payload(v) for v in value)


def _safe(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text[:2000])
    assert not any(line.startswith(FORGED) for line in text.splitlines()), text[-2000:]


def test_upstream_text_is_escaped_in_the_runs_stderr_and_in_show(hostile_upstream, pg_dsn):
    run = ["run", "--api-base", hostile_upstream, "--site-id", "8640015201004417", "--dsn", pg_dsn,
           "--tasks", "ODS_PAYMENT", "--no-dwd", "--no-progress", "--unsafe-gaps", "--set", "pipeline.rate_min=0.01",
           "--set", "pipeline.rate_max=0.02", "--window-start", "2024-03-01 00:00:00",
           "--window-end", "2024-03-02 00:00:00"]
    text = _cli(*run, "-v")
    assert text.returncode == 4, text.stderr[-2000:]
    _safe(text.stderr)
    _safe(text.stdout)  # the summary
    assert "\\x1b[2J\\x1b]0;pwned-title\\x07…\\n" + FORGED in text.stderr  # readable, on the same line

    logs = _cli(*run, "--log-format", "json", "--json")
    assert logs.returncode == 4
    _safe(logs.stderr)
    records = [json.loads(line) for line in logs.stderr.splitlines()]  # every line one JSON record
    assert any(PAYLOAD in r["message"] for r in records)  # the exact text for a log shipper
    assert _holds_payload(json.loads(logs.stdout))

    for args in (["show", "last"], ["runs"], ["show", "last", "--json"]):
        shown = _cli(*args, "--dsn", pg_dsn)
        assert shown.returncode == 0, shown.stderr
        _safe(shown.stdout + shown.stderr)
    shown = _cli("show", "last", "--dsn", pg_dsn)
    assert "\\x1b]0;pwned-title\\x07" in shown.stdout
    record = json.loads(_cli("show", "last", "--json", "--dsn", pg_dsn).stdout)
    assert _holds_payload(record)  # stored as it came: evidence


def test_database_text_is_escaped_in_sql_output(pg_dsn):
    """``sql`` prints rows from the database: same escaping, and rich markup in data is shown, not obeyed."""
    import psycopg

    from feiqiu_etl.db.embedded import ensure_reader_role

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ensure_reader_role(conn, "sec21_escape_reader", "pw-escape-reader-0123")
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(pg_dsn)
    params.pop("passfile", None)
    reader = conninfo.make_conninfo(**{**params, "user": "sec21_escape_reader", "password": "pw-escape-reader-0123"})
    try:
        query = "SELECT %s AS evil, '[/x] [bold]b' AS markup" % "E'\\x1b[2J\\x1b]0;t\\x07\\n2026 ERROR forged'"
        table = _cli("sql", "--dsn", reader, query)
        assert table.returncode == 0, table.stderr
        _safe(table.stdout)
        assert "[/x] [bold]b" in table.stdout and "\\x1b[2J" in table.stdout
        rows = _cli("sql", "--dsn", reader, "--json", query)
        _safe(rows.stdout)
        assert json.loads(rows.stdout)[0]["evil"] == "\x1b[2J\x1b]0;t\x07\n2026 ERROR forged"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("DROP OWNED BY sec21_escape_reader")
            conn.execute("DROP ROLE sec21_escape_reader")
