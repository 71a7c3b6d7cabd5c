"""The frictions of issue 27, each as a user meets it (real processes, real PostgreSQL where one is needed):
YAML errors that name every problem and the key a typo means; date errors that name the field; the lane-wait
warning only when another run held the lane; one duration form; no source paths in help; one metavar per
concept; one zone per column in ``state show``."""

from __future__ import annotations

import logging
import os
import re
import time

import psycopg
import pytest

from clikit import cli
from feiqiu_etl.alerts.config import AlertsConfigError, load_alerts
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl.formats import parse_seconds
from feiqiu_etl.registry.lane_guard import LaneGuard

SITE = 8640015201004417


def test_a_fleet_typo_names_every_problem_and_the_key_it_means(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"lanes:\n  - name: north\n    token_evn: FQ_A\n    taks: [ODS_MEMBER]\n"
                     f"    stores: [{{site_id: {SITE}}}]\n  - name: south\n    token_env: FQ_B\n    stores: []\n"
                     f"    max_active_store: 2\n", encoding="utf-8")
    t0 = time.monotonic()
    proc = cli("plan", "--fleet", str(fleet))
    took = time.monotonic() - t0
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert "lanes[0] (north).token_evn: unknown key (did you mean token_env?)" in line
    assert "lanes[0] (north).taks: unknown key (did you mean tasks?)" in line
    assert "token_env: Field required" not in line  # explained by the typo, not a second puzzle
    assert "(and 1 more)" not in line and "lanes[1] (south)" in line
    assert took < 10  # before the database starts


def test_an_alerts_typo_names_the_key_it_means(tmp_path):
    path = tmp_path / "alerts.yaml"
    path.write_text("alerts:\n  targts: []\n  rules: {stale_hour: 3}\n", encoding="utf-8")
    with pytest.raises(AlertsConfigError) as info:
        load_alerts(str(path), environ={})
    text = str(info.value)
    assert "alerts.targts: unknown key (did you mean targets?)" in text
    assert "alerts.rules.stale_hour: unknown key (did you mean stale_hours?)" in text


@pytest.mark.parametrize("args, expected", [
    (["--window-start", "2026-13-01 00:00:00", "--window-end", "2026-12-02 00:00:00"],
     "--window-start: month 13 is not 01..12"),
    (["--window-start", "2026-11-01 00:00:00", "--window-end", "2026-11-31 00:00:00"],
     "--window-end: day 31 is not in 2026-11 (01..30)"),
    (["--window-start", "2026-11-01 24:00:00", "--window-end", "2026-11-02 00:00:00"],
     "--window-start: hour 24 is not 00..23"),
    (["--backfill", "--from", "2026-02-30", "--to", "2026-03-01"], "--from: day 30 is not in 2026-02 (01..28)"),
])
def test_a_date_error_names_the_field_that_is_wrong(args, expected):
    proc = cli("plan", "--site-id", str(SITE), "--token", "x" * 20, *args)
    assert proc.returncode == 2
    assert expected in proc.stderr and "expected 'YYYY-MM-DD" not in proc.stderr


def test_the_lane_wait_warning_only_when_another_run_held_the_lane(pg_dsn, caplog):
    with connect(pg_dsn) as conn:
        ensure_schemas(conn)

    def slow(dsn: str) -> psycopg.Connection:  # a slow database, no competitor
        time.sleep(0.6)
        return connect(dsn)

    caplog.set_level(logging.INFO, logger="feiqiu_etl")
    guard = LaneGuard(pg_dsn, "run-slow-db", connect=slow)
    try:
        assert guard.acquire_all([("default", "feiqiu:aaaa")], wait=5) == {"default": None}
    finally:
        guard.release()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "lane" in r.getMessage()]
    caplog.clear()
    holder = LaneGuard(pg_dsn, "run-holder", connect=connect)
    waiter = LaneGuard(pg_dsn, "run-waiter", connect=connect)
    try:
        assert holder.acquire_all([("default", "feiqiu:bbbb")]) == {"default": None}
        import threading

        threading.Timer(0.6, holder.release).start()
        assert waiter.acquire_all([("default", "feiqiu:bbbb")], wait=10) == {"default": None}
    finally:
        waiter.release()
        holder.release()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("got the lane after waiting" in w and "another run" in w for w in warnings), warnings


@pytest.mark.parametrize("text, seconds", [("45m", 2700), ("90s", 90), ("2h", 7200), ("1h30m", 5400), ("90", 90),
                                           ("2.5", 2.5), ("2d", 172800)])
def test_durations_take_one_form(text, seconds):
    assert parse_seconds(text) == seconds


def test_run_timeout_takes_the_duration_form_and_names_the_forms_when_wrong():
    bad = cli("run", "--site-id", str(SITE), "--token", "x" * 20, "--timeout", "1h30x")
    assert bad.returncode == 2 and "45m, 90s, 2h" in bad.stderr
    # a valid duration passes the option (the run then fails later, on the far-future window: not on --timeout)
    good = cli("run", "--site-id", str(SITE), "--token", "x" * 20, "--timeout", "90m", "--window-start",
               "2100-01-01 00:00:00", "--window-end", "2100-01-02 00:00:00")
    assert good.returncode == 2 and "--timeout" not in good.stderr


def test_help_texts_show_no_source_paths_and_one_metavar_per_store():
    commands = [["runs"], ["run"], ["plan"], ["check"], ["freshness"], ["details"], ["status"], ["state", "show"],
                ["state", "reset"], ["runs", "prune"], ["web"], ["sql"]]
    for command in commands:
        text = cli(*command, "--help").stdout
        assert not re.search(r"\b[\w/]+\.py\b|\bcli/", text), (command, text)
        for flag in ("--site-id", "--store"):
            for line in text.splitlines():
                found = re.match(rf"\s+{flag} (\S+)", line)
                if found:
                    assert found.group(1) == "SITE_ID", (command, line)


def test_state_show_has_one_zone_per_column(pg_dsn):
    from datetime import datetime, timezone

    env_zone = {"DISPLAY_TIMEZONE": "UTC"}
    with connect(pg_dsn) as conn:
        ensure_schemas(conn)
        conn.execute("INSERT INTO etl_meta.snapshot_done VALUES ('feiqiu', 'ODS_GOODS', %s, %s, 'r1')",
                     (SITE, datetime(2026, 3, 4, 12, 0, tzinfo=timezone.utc)))
        conn.execute("INSERT INTO etl_meta.window_horizon VALUES ('feiqiu', 'ODS_PAYMENT', %s, "
                     "'2026-03-01 00:00:00+08')", (SITE,))
        conn.commit()
    import os

    out = cli("state", "show", "--dsn", pg_dsn, env={**os.environ, **env_zone, "COLUMNS": "200"}).stdout
    header = next(line for line in out.splitlines() if "horizon" in line)
    assert "horizon/snapshot" not in header and "snapshot (UTC)" in header
    goods = next(line for line in out.splitlines() if "ODS_GOODS" in line)
    payment = next(line for line in out.splitlines() if "ODS_PAYMENT" in line)
    assert "2026-03-04 12:00" in goods and "+" not in goods  # in the display zone its header names
    assert "2026-03-01" in payment and "+" not in payment  # a window time, the title's zone


def test_plan_of_a_fleet_lists_every_store_of_a_lane_named_or_not(tmp_path, pg_dsn):
    # fresh-user trial: the "stores:" line of a lane listed the named stores only, so an unnamed one was missing
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"lanes:\n  - name: north\n    token_env: FQ_A\n    stores:\n"
                     f"      - {{site_id: {SITE}, name: north-1}}\n      - {{site_id: {SITE + 1}}}\n", encoding="utf-8")
    env = {**os.environ, "FQ_A": "tok_abcdefgh1234", "COLUMNS": "200"}
    proc = cli("plan", "--fleet", str(fleet), "--api-base", "http://127.0.0.1:9", "--dsn", pg_dsn, env=env,
               timeout=180)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x.strip() for x in proc.stdout.splitlines() if x.strip().startswith("stores:")]
    assert line == f"stores: …{str(SITE)[-4:]} north-1, …{str(SITE + 1)[-4:]} (no name)", proc.stdout
