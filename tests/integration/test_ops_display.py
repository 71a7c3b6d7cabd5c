"""How `runs`, `show`, the logs and the web page show runs (issue 18 items 4 and 6), as real processes on real
PostgreSQL: one display zone with offsets everywhere, window times in the upstream's zone, and a `runs` table that
never hides a non-zero rejection or error count at 80 columns."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from clikit import cli, cli_json
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from webkit import seed_run

START = datetime(2026, 12, 1, 2, 0, 5, tzinfo=timezone.utc)  # 10:00:05 in Asia/Shanghai


@pytest.fixture
def conn(pg_dsn):
    with connect(pg_dsn) as c:
        ensure_schemas(c)
        yield c


def _env(**more: str) -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("DISPLAY_TIMEZONE", "COLUMNS")} | more


def _history(conn) -> None:
    seed_run(conn, "20261201T020005Z-0000000a", status="INTERRUPTED", started_at=START, stores=(8640015201004417,
             8640015201004418), tasks=("ODS_MEMBER",) * 21, rows=71234, n_requests=1234)
    seed_run(conn, "20261201T030005Z-0000000b", status="FAILED", started_at=START + timedelta(hours=1),
             rows=12345, n_requests=4321, errors=1, error="boom")
    seed_run(conn, "20261201T040005Z-0000000c", status="PARTIAL", started_at=START + timedelta(hours=2),
             rows=99999, n_requests=8765, errors=2)


def _cell(table: str, run_id: str, column: str) -> str:
    lines = table.splitlines()
    header = lines[0]
    row = next(line for line in lines if line.startswith(run_id))
    start = header.index(column)
    # right-justified numbers end under their header's end
    end = start + len(column)
    return row[max(0, start - 6):end].split()[-1]


def test_runs_at_80_columns_never_hides_a_non_zero_error_count(conn, pg_dsn):
    _history(conn)
    proc = cli("runs", "--dsn", pg_dsn, env=_env(COLUMNS="80", DISPLAY_TIMEZONE="UTC"))
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    header = table.splitlines()[0].split()
    assert "err" in header and "rej" not in header, table  # the all-zero column went first
    assert _cell(table, "20261201T030005Z-0000000b", "err") == "1", table
    assert _cell(table, "20261201T040005Z-0000000c", "err") == "2", table
    assert "20261201T020005Z-0000000a" in table and "INTERRUPTED" in table


def test_runs_at_80_columns_keeps_rejections_and_errors_when_both_are_non_zero(conn, pg_dsn):
    _history(conn)
    seed_run(conn, "20261201T050005Z-0000000d", status="PARTIAL", started_at=START + timedelta(hours=3),
             rows=5, n_requests=50, rejections=7, errors=3)
    table = cli("runs", "--dsn", pg_dsn, env=_env(COLUMNS="80", DISPLAY_TIMEZONE="UTC")).stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    header = table.splitlines()[0].split()
    assert "rej" in header and "err" in header, table
    assert _cell(table, "20261201T050005Z-0000000d", "rej") == "7"
    assert _cell(table, "20261201T050005Z-0000000d", "err") == "3"


def test_one_display_zone_for_runs_show_json_and_the_web_page(conn, pg_dsn):
    _history(conn)
    summary = {"run_id": "20261201T060005Z-0000000e", "status": "SUCCESS", "lanes": [], "tasks": [
        {"task": "ODS_PAYMENT", "site_id": 8640015201004417, "status": "SUCCESS", "total_requests": 1,
         "total_fetched": 0, "total_inserted": 0, "total_updated": 0, "total_skipped": 0, "total_deleted": 0,
         "detail_success": 0, "detail_failure": 0, "detail_skipped": 0, "errors": [], "timing": {"total": 1},
         "windows": [["2024-03-01 00:00:00", "2024-03-02 00:00:00"]]}]}
    seed_run(conn, "20261201T060005Z-0000000e", started_at=START + timedelta(hours=4), summary=summary)
    shanghai = _env(DISPLAY_TIMEZONE="Asia/Shanghai", COLUMNS="120")
    table = cli("runs", "--dsn", pg_dsn, env=shanghai).stdout
    assert "started (+08:00)" in table.splitlines()[0], table
    assert "12-01 10:00:05" in next(line for line in table.splitlines() if "0000000a" in line), table
    listed = cli_json("runs", "--dsn", pg_dsn, env=shanghai)
    a = next(r for r in listed if r["run_id"].endswith("0000000a"))
    assert a["started_at"].startswith("2026-12-01T10:00:05") and a["started_at"].endswith("+08:00")
    shown = cli("show", "20261201T060005Z-0000000e", "--dsn", pg_dsn, env=shanghai).stdout
    assert "started 2026-12-01 14:00:05 +08:00" in shown, shown
    assert "2024-03-01 00:00:00 … 2024-03-02 00:00:00 (Asia/Shanghai, the upstream's time" in shown, shown
    utc = cli("show", "20261201T060005Z-0000000e", "--dsn", pg_dsn, env=_env(DISPLAY_TIMEZONE="UTC")).stdout
    assert "started 2026-12-01 06:00:05 +00:00" in utc and "UTC" not in utc.replace("(UTC)", ""), utc
    new_york = cli_json("show", "20261201T060005Z-0000000e", "--dsn", pg_dsn,
                        env=_env(DISPLAY_TIMEZONE="America/New_York"))
    assert new_york["started_at"] == "2026-12-01T01:00:05-05:00"
    bad = cli("runs", "--dsn", pg_dsn, env=_env(DISPLAY_TIMEZONE="Mars/Olympus"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Mars/Olympus" in bad.stderr

    from starlette.testclient import TestClient

    from feiqiu_etl.formats import use_display_zone
    from feiqiu_etl.web import WebSettings, create_app

    use_display_zone("Asia/Shanghai")  # what `feiqiu-etl web` does with display.timezone
    try:
        with TestClient(create_app(WebSettings(dsn=pg_dsn, connector="feiqiu")),
                        base_url="http://127.0.0.1:8080") as c:
            page = c.get("/runs").text
            api = c.get("/api/runs").json()["runs"]
    finally:
        use_display_zone("local")
    assert "2026-12-01 10:00:05 +08:00" in page
    assert next(r for r in api if r["run_id"].endswith("0000000a"))["started_at"] == "2026-12-01T10:00:05+08:00"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_api_for_a_one_task_run_says_upstream_unreachable_with_the_zones_offset(pg_dsn):
    """Before: "FAILED (store …: not one request succeeded)" and the task PARTIAL: its request's 3 attempts never
    reached the lane's breaker (5), and nothing was left to send."""
    args = ["run", "--api-base", f"http://127.0.0.1:{_closed_port()}", "--site-id", "8640015201004417", "--dsn",
            pg_dsn, "--tasks", "ODS_PAYMENT", "--no-dwd", "--no-progress", "--unsafe-gaps",
            "--set", "pipeline.rate_min=0.01", "--set", "pipeline.rate_max=0.02", "--set", "api.retry_backoff=0.01",
            "--window-start", "2024-03-01 00:00:00", "--window-end", "2024-03-02 00:00:00"]
    env = _env(FEIQIU_API_TOKEN="fq_test_token", DISPLAY_TIMEZONE="Asia/Shanghai", COLUMNS="200")
    text = cli(*args, env=env, timeout=120)
    assert text.returncode == 4, text.stderr
    head = text.stdout.splitlines()[0]
    assert ": FAILED (lane default: upstream unreachable: " in head and "not one request succeeded" not in head, head
    assert "Traceback" not in text.stderr
    stamped = [line for line in text.stderr.splitlines() if line[:4].isdigit()]
    assert stamped and all(line[20:26] == "+08:00" for line in stamped), text.stderr
    data = json.loads(cli(*args, "--json", "--log-format", "json", env=env, timeout=120).stdout)
    assert data["status"] == "FAILED" and data["error"].startswith("lane default: upstream unreachable: ")
    assert [t["status"] for t in data["tasks"]] == ["FAILED"]
    assert data["started_at"].endswith("+08:00") and data["finished_at"].endswith("+08:00")
