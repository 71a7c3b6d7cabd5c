"""Issue 18 item 8: retention of the run registry. ``runs prune --older-than`` and ``run.retention_days`` (at
the end of a run) remove old runs' stored logs and request timelines (``--records``: the records too), never a
RUNNING run, never a row of ODS or DWD nor the bookkeeping of what is loaded; ``show`` and the run page say when
a run's timeline was pruned."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

import httpx
import psycopg
from psycopg import sql

from clikit import cli, one_line_error
from feiqiu_etl.simulator import Simulator
from flowkit import run_flow, sim_config
from webkit import WebServer, attempt, seed_run

BOOKKEEPING = ("window_progress", "window_horizon", "detail_pending", "detail_checked", "snapshot_done")


def fingerprint(dsn: str) -> dict[str, tuple[int, str]]:
    """``{schema.table: (rows, md5 of every row's text in order)}`` of every ODS and DWD table and of the
    bookkeeping tables of etl_meta that say what is loaded."""
    out = {}
    with psycopg.connect(dsn) as conn:
        tables = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                              "WHERE table_schema IN ('ods', 'dwd') AND table_type = 'BASE TABLE' "
                              "OR table_schema = 'etl_meta' AND table_name = ANY(%s)", (list(BOOKKEEPING),)).fetchall()
        for schema, name in tables:
            query = sql.SQL("SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') "
                            "FROM {} t").format(sql.Identifier(schema, name))
            out[f"{schema}.{name}"] = tuple(conn.execute(query).fetchone())
    return out


def registry_rows(conn: psycopg.Connection, run_id: str) -> tuple[int, int]:
    """(stored log rows, request timeline rows) of a run."""
    return (conn.execute("SELECT count(*) FROM etl_meta.run_log WHERE run_id = %s", (run_id,)).fetchone()[0],
            conn.execute("SELECT count(*) FROM etl_meta.run_request WHERE run_id = %s", (run_id,)).fetchone()[0])


def age(conn: psycopg.Connection, run_id: str, days: float) -> None:
    """Move a run ``days`` into the past (start, end, heartbeat)."""
    conn.execute("UPDATE etl_meta.run SET started_at = started_at - make_interval(days => %s), "
                 "finished_at = finished_at - make_interval(days => %s), "
                 "heartbeat_at = heartbeat_at - make_interval(days => %s) WHERE run_id = %s",
                 (days, days, days, run_id))
    conn.commit()


def seeded(conn: psycopg.Connection, run_id: str, *, days_ago: float, status: str = "SUCCESS") -> str:
    """A run with 3 log lines and 4 lane attempts that started ``days_ago`` days ago."""
    at = datetime.now(timezone.utc) - timedelta(days=days_ago)
    log = [{"ts": at, "level": "INFO", "message": f"line {i}"} for i in range(3)]
    return seed_run(conn, run_id, status=status, started_at=at, log=log,
                    requests=[attempt(i, at + timedelta(seconds=i)) for i in range(4)])


def test_prune_removes_old_logs_and_timelines_and_leaves_every_ods_dwd_row(pg_dsn):
    with Simulator(sim_config(seed=5)) as sim:
        old = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER", "ODS_SETTLEMENT"], load_dwd=True)
    assert old.status == "SUCCESS" and old.dwd["succeeded"] > 0
    with psycopg.connect(pg_dsn) as conn:
        logs, requests = registry_rows(conn, old.run_id)
        assert logs > 0 and requests > 0
        age(conn, old.run_id, 100)
        running = seeded(conn, "20250101T000000Z-running0", days_ago=200, status="RUNNING")  # this pid: alive
        recent = seeded(conn, "20261101T000000Z-recent00", days_ago=30)
        failed = seeded(conn, "20250102T000000Z-failed00", days_ago=95, status="FAILED")
        old_record = conn.execute("SELECT status, rows_written, requests, summary->'tasks' FROM etl_meta.run "
                                  "WHERE run_id = %s", (old.run_id,)).fetchone()
    before = fingerprint(pg_dsn)
    assert sum(rows for rows, _ in before.values()) > 0
    assert any(k.startswith("dwd.") and rows > 0 for k, (rows, _) in before.items())

    proc = cli("runs", "prune", "--older-than", "90d", "--dsn", pg_dsn)
    assert proc.returncode == 0, proc.stderr
    assert "pruned the log and request timeline of 2 run(s)" in proc.stdout, proc.stdout
    assert f"{logs + 3} log row(s), {requests + 4} request row(s)" in proc.stdout, proc.stdout

    assert fingerprint(pg_dsn) == before  # not one ODS/DWD row, nor what says which windows are loaded
    with psycopg.connect(pg_dsn) as conn:
        assert registry_rows(conn, old.run_id) == (0, 0)
        assert registry_rows(conn, failed) == (0, 0)
        assert registry_rows(conn, running) == (3, 4)   # never a RUNNING run, however old
        assert registry_rows(conn, recent) == (3, 4)
        record = conn.execute("SELECT status, rows_written, requests, summary->'tasks', pruned_at, "
                              "summary ? 'timeline' FROM etl_meta.run WHERE run_id = %s", (old.run_id,)).fetchone()
        assert record[:4] == old_record and record[4] is not None and record[5] is False
        pruned = {r[0] for r in conn.execute("SELECT run_id FROM etl_meta.run WHERE pruned_at IS NOT NULL")}
    assert pruned == {old.run_id, failed}

    shown = cli("show", old.run_id, "--dsn", pg_dsn)
    assert shown.returncode == 0 and "timeline pruned on " in shown.stdout, shown.stdout + shown.stderr
    as_json = cli("show", old.run_id, "--dsn", pg_dsn, "--json")
    assert '"pruned_at": "' in as_json.stdout and '"log": []' in as_json.stdout
    with WebServer(pg_dsn) as web:
        page = httpx.get(f"{web.url}/runs/{old.run_id}", timeout=10).text
        kept = httpx.get(f"{web.url}/runs/{recent}", timeout=10).text
    assert "Timeline pruned on" in page and "Log pruned on" in page
    assert "Timeline pruned on" not in kept

    again = cli("runs", "prune", "--older-than", "90d", "--dsn", pg_dsn)
    assert again.returncode == 0 and again.stdout.startswith("nothing to prune"), again.stdout

    records = cli("runs", "prune", "--older-than", "2160h", "--records", "--json", "--dsn", pg_dsn)
    assert records.returncode == 0, records.stderr
    assert '"records": 2' in records.stdout, records.stdout
    assert fingerprint(pg_dsn) == before
    with psycopg.connect(pg_dsn) as conn:
        left = {r[0] for r in conn.execute("SELECT run_id FROM etl_meta.run")}
    assert left == {running, recent}


def test_retention_at_the_end_of_a_run_never_raises(caplog):
    from feiqiu_etl.registry.retention import prune_after_run

    def unreachable(dsn):
        raise psycopg.OperationalError("connection refused")

    began = time.monotonic()
    assert prune_after_run("postgresql://etl@127.0.0.1:1/x", 90, connect=unreachable) is None
    assert prune_after_run("postgresql://etl@127.0.0.1:1/x", 0, connect=unreachable) is None  # off: not even tried
    assert time.monotonic() - began < 1
    warned = [r.getMessage() for r in caplog.records if r.name == "feiqiu_etl.retention"]
    assert warned == ["retention: could not prune runs older than 90 days: OperationalError: connection refused"], warned


def test_bad_durations_are_one_line_and_exit_2(pg_dsn):
    for bad in ("90", "0d"):  # the others: tests/unit/test_retention_durations.py
        proc = cli("runs", "prune", "--older-than", bad, "--dsn", pg_dsn)
        assert proc.returncode == 2, (bad, proc.stdout, proc.stderr)
        assert "--older-than" in one_line_error(proc)
    off = cli("runs", "prune", "--dsn", pg_dsn, env={**os.environ, "RUN_RETENTION_DAYS": "0"})
    assert off.returncode == 2 and "retention is off (run.retention_days = 0)" in one_line_error(off)


def test_a_run_prunes_runs_past_retention_days_at_its_end_and_0_keeps_them(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        from feiqiu_etl.db.schema import ensure_schemas

        ensure_schemas(conn)
        very_old = seeded(conn, "20250101T000000Z-veryold0", days_ago=100)
        middle = seeded(conn, "20250601T000000Z-middle00", days_ago=40)
    with Simulator(sim_config(seed=6)) as sim:
        first = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], overrides={"run.retention_days": 60})
        assert first.status == "SUCCESS"
        with psycopg.connect(pg_dsn) as conn:
            assert registry_rows(conn, very_old) == (0, 0)
            assert registry_rows(conn, middle) == (3, 4)
            assert registry_rows(conn, first.run_id)[0] > 0
            age(conn, middle, 1000)
        second = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], overrides={"run.retention_days": 0})
        assert second.status == "SUCCESS"
    with psycopg.connect(pg_dsn) as conn:
        assert registry_rows(conn, middle) == (3, 4)  # 0 = keep forever
        assert conn.execute("SELECT pruned_at FROM etl_meta.run WHERE run_id = %s", (middle,)).fetchone()[0] is None
