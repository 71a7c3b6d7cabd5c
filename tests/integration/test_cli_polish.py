"""Findings of a fresh-user trial of the operations commands, each as real processes on real PostgreSQL:
``config show`` with bad values and unsafe gaps, JSON types of ``runs``/``status``/``show`` (the same as the
web API), ambiguous run prefixes, empty filtered listings, unknown ``details --task``, and how
``status --watch`` ends."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone

import pytest

from clikit import PY, cli, cli_json, wait_for
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from feiqiu_etl import registry
from webkit import seed_run


@pytest.fixture
def conn(pg_dsn):
    with connect(pg_dsn) as c:
        ensure_schemas(c)
        yield c


def _home_env(home, **more) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "FEIQIU_", "ETL_"))}
    return {**env, "FEIQIU_ETL_HOME": str(home), "FEIQIU_API_TOKEN": "fq_tok_trial", **more}


BAD_VALUES = [
    (["--set", "pipeline.workers=inf"], {}),
    (["--set", "pipeline.workers=abc"], {}),
    (["--set", "pipeline.workers=999"], {}),
    (["--set", "pipeline.ods_member.workers=abc"], {}),
    ([], {"PIPELINE_RATE_MIN": "abc"}),
]


@pytest.mark.parametrize("args, env", BAD_VALUES)
def test_config_show_rejects_a_bad_pipeline_value_with_the_line_run_and_plan_give(fresh_home, tmp_path, args, env):
    e = _home_env(fresh_home, **env)
    shown = subprocess.run([*PY, "config", "show", *args], capture_output=True, text=True, env=e, cwd=tmp_path)
    plan = subprocess.run([*PY, "plan", "--site-id", "1", "--api-base", "http://127.0.0.1:9", *args],
                          capture_output=True, text=True, env=e, cwd=tmp_path)
    assert plan.returncode == 2, plan.stderr
    assert shown.returncode == 2, shown.stderr
    assert "internal error" not in shown.stderr and "Traceback" not in shown.stderr
    assert shown.stderr.strip().splitlines() == plan.stderr.strip().splitlines()[-1:]
    assert shown.stderr.startswith("Error: pipeline config for ")


def test_config_show_marks_a_rate_min_that_run_would_refuse(fresh_home, tmp_path):
    e = _home_env(fresh_home)
    table = subprocess.run([*PY, "config", "show", "--pipeline-rate-min", "1"], capture_output=True, text=True,
                           env=e, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("pipeline.rate_min "))
    assert "(!)" in row
    text = " ".join(table.stdout.split())  # the note may fold
    assert "(!) pipeline.rate_min = 1 s (flag) is below the upstream's minimum gap of 3 s" in text
    assert "refuse it without --unsafe-gaps" in text
    rows = json.loads(subprocess.run([*PY, "config", "show", "--pipeline-rate-min", "1", "--json"],
                                     capture_output=True, text=True, env=e, cwd=tmp_path).stdout)
    flagged = [r for r in rows if r.get("warning")]
    assert [r["key"] for r in flagged] == ["pipeline.rate_min"] and "--unsafe-gaps" in flagged[0]["warning"]
    unsafe = subprocess.run([*PY, "config", "show", "--pipeline-rate-min", "1", "--unsafe-gaps"],
                            capture_output=True, text=True, env=e, cwd=tmp_path)
    safe = subprocess.run([*PY, "config", "show"], capture_output=True, text=True, env=e, cwd=tmp_path)
    assert unsafe.returncode == safe.returncode == 0
    assert "(!)" not in unsafe.stdout and "(!)" not in safe.stdout


def test_json_durations_are_seconds_as_numbers_and_runs_json_is_the_web_apis_rows(conn, pg_dsn):
    from starlette.testclient import TestClient

    from feiqiu_etl.web import WebSettings, create_app

    now = datetime.now(timezone.utc)
    seed_run(conn, "20261201T050000-done", status="SUCCESS", started_at=now - timedelta(minutes=5), seconds=4.39)
    seed_run(conn, "20261201T050100-live", status="RUNNING")
    registry.heartbeat(conn, "20261201T050100-live", {"run_id": "20261201T050100-live", "lanes": []})
    listed = cli_json("runs", "--dsn", pg_dsn)
    done = next(r for r in listed if r["run_id"] == "20261201T050000-done")
    assert isinstance(done["duration"], float) and abs(done["duration"] - 4.39) < 1e-6
    assert all(isinstance(r["duration"], float) for r in listed)
    (status,) = cli_json("status", "--dsn", pg_dsn)
    assert isinstance(status["heartbeat_age"], float) and isinstance(status["duration"], float)
    shown = cli_json("show", "--dsn", pg_dsn, "20261201T050000-done")
    assert isinstance(shown["duration"], float) and shown["duration"] == done["duration"]
    started = datetime.fromisoformat(done["started_at"])  # ISO 8601 with its offset
    assert "T" in done["started_at"] and started.utcoffset() is not None
    assert abs(started - (now - timedelta(minutes=5))) < timedelta(seconds=1)

    settings = WebSettings(dsn=pg_dsn, connector="feiqiu", task_codes=("ODS_PAYMENT",))
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080") as c:
        api = c.get("/api/runs").json()["runs"]
        api_run = c.get("/api/runs/20261201T050000-done").json()
    assert [r["run_id"] for r in api] == [r["run_id"] for r in listed]
    for mine, theirs in zip(listed, api):
        assert mine.keys() == theirs.keys()
        assert {k: type(v) for k, v in mine.items()} == {k: type(v) for k, v in theirs.items()}
    assert done == next(r for r in api if r["run_id"] == done["run_id"])
    assert {k: v for k, v in shown.items() if k != "log"} == {k: v for k, v in api_run.items() if k != "log"}

    table = cli("runs", "--dsn", pg_dsn).stdout
    header = table.splitlines()[0]
    assert "started (UTC)" in header  # the zone the column shows
    line = next(line for line in table.splitlines() if "20261201T050000-done" in line)
    assert started.astimezone(timezone.utc).strftime("%m-%d %H:%M:%S") in line


def test_show_with_an_ambiguous_prefix_lists_the_matches(conn, pg_dsn):
    now = datetime.now(timezone.utc)
    for i, rid in enumerate(("20261201T133301-aaaa", "20261201T133355-bbbb", "20261201T140000-cccc")):
        seed_run(conn, rid, started_at=now - timedelta(minutes=10 - i))
    ambiguous = cli("show", "--dsn", pg_dsn, "20261201T1333")
    assert ambiguous.returncode == 2, ambiguous.stderr
    assert len(ambiguous.stderr.strip().splitlines()) == 1
    assert "ambiguous" in ambiguous.stderr
    assert "20261201T133301-aaaa" in ambiguous.stderr and "20261201T133355-bbbb" in ambiguous.stderr
    assert "20261201T140000-cccc" not in ambiguous.stderr
    assert cli_json("show", "--dsn", pg_dsn, "20261201T14")["run_id"] == "20261201T140000-cccc"
    assert cli_json("show", "--dsn", pg_dsn, "last")["run_id"] == "20261201T140000-cccc"
    missing = cli("show", "--dsn", pg_dsn, "2025")
    assert missing.returncode == 2 and "no run '2025'" in missing.stderr and "ambiguous" not in missing.stderr


def test_runs_filtered_to_nothing_says_what_matched_nothing(conn, pg_dsn):
    seed_run(conn, "20261201T090000-ok", status="SUCCESS", stores=(1001,))
    failed = cli("runs", "--dsn", pg_dsn, "--status", "FAILED")
    assert failed.returncode == 0, failed.stderr
    assert "no FAILED runs" in failed.stdout and "no runs recorded yet" not in failed.stdout
    store = cli("runs", "--dsn", pg_dsn, "--store", "42")
    assert "no runs of store 42" in store.stdout and "recorded yet" not in store.stdout
    assert "20261201T090000-ok" in cli("runs", "--dsn", pg_dsn, "--status", "success").stdout


def test_details_of_an_unknown_task_is_one_line_and_exit_2(conn, pg_dsn):
    unknown = cli("details", "--dsn", pg_dsn, "--task", "NOPE")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [unknown.stderr.strip().splitlines()[0]]
    assert unknown.stderr.startswith("Error: unknown task 'NOPE'; known: ODS_MEMBER")
    known = cli("details", "--dsn", pg_dsn, "--task", "ods_settlement")
    assert known.returncode == 0 and "0 owed detail(s)" in known.stdout


def test_status_watch_says_how_the_watched_run_ended(conn, pg_dsn):
    idle = cli("status", "--dsn", pg_dsn, "--watch")
    assert idle.returncode == 0 and idle.stdout.strip() == cli("status", "--dsn", pg_dsn).stdout.strip()
    assert idle.stdout.strip() == "no run is in progress"
    rid = seed_run(conn, "20261201T100000-watched", status="RUNNING")
    snapshot = {"run_id": rid, "phase": "ods", "tasks_done": 0, "tasks": 1, "rows_written": 0, "eta_s": 3,
                "lanes": []}
    registry.heartbeat(conn, rid, snapshot)
    watch = subprocess.Popen([*PY, "status", "--dsn", pg_dsn, "--watch"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: cli_json("status", "--dsn", pg_dsn), what="the run to show as running")
        time.sleep(2.5)  # the watcher has seen the run
        assert watch.poll() is None
        registry.finish_run(conn, rid, status="CANCELLED", exit_code=5, summary=None)
        out, err = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, err
    assert f"run {rid} ended CANCELLED (exit 5)" in out
    assert "no run is in progress" not in out.lower()


def test_with_json_logs_a_usage_error_is_a_json_record_too():
    proc = cli("run", "--log-format", "json", "--api-base", "http://127.0.0.1:9", "--site-id", "1", "--token", "t",
               "--set", "pipeline.workers=abc")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    record = json.loads(lines[0])
    assert record["level"] == "ERROR" and "pipeline.workers" in record["message"]


def test_config_show_says_whether_the_api_base_came_from_the_flag_or_the_environment():
    def base(*args, **env):
        rows = json.loads(cli("config", "show", "--json", *args, env={**os.environ, **env}).stdout)
        return next((r["value"], r["source"]) for r in rows if r["key"] == "FEIQIU_API_BASE")

    env = {k: v for k, v in os.environ.items() if k != "FEIQIU_API_BASE"}
    assert base("--api-base", "http://x:1", FEIQIU_API_BASE="http://env:1") == ("http://x:1", "flag")
    assert base(FEIQIU_API_BASE="http://env:1") == ("http://env:1", "environment")
    rows = json.loads(cli("config", "show", "--json", env=env).stdout)
    assert next(r["source"] for r in rows if r["key"] == "FEIQIU_API_BASE") == "-"


def test_an_empty_run_id_is_refused_by_show_and_cancel(pg_dsn):
    for command in ("show", "cancel"):
        proc = cli(command, "", "--dsn", pg_dsn)
        assert proc.returncode == 2 and "an empty run id" in proc.stderr, (command, proc.stderr)


def test_sql_refuses_an_empty_query():
    proc = cli("sql", "  ; ")
    assert proc.returncode == 2 and "an empty query" in proc.stderr


def test_a_set_value_under_a_flag_is_still_checked(fresh_home, tmp_path):
    """Issue 21 item 8: the flag wins, but the --set value under it is a mistake all the same (exit 2, one line)."""
    e = _home_env(fresh_home)
    for command in (["plan", "--site-id", "1", "--api-base", "http://127.0.0.1:9"], ["config", "show"]):
        proc = subprocess.run([*PY, *command, "--pipeline-rate-max", "4", "--set", "pipeline.rate_max=garbage"],
                              capture_output=True, text=True, env=e, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "Error: pipeline config for all tasks: pipeline.rate_max: expected float, got 'garbage'"]


@pytest.mark.parametrize("args, line", [
    (["run", "--timeout", "abc"], "Error: --timeout: not a duration: 'abc' (45m, 90s, 2h, 1h30m or plain seconds)"),
    (["run", "--timeout", "-5"], "Error: --timeout: not a duration: '-5' (45m, 90s, 2h, 1h30m or plain seconds)"),
    (["check", "--wait-for-lane", "5x"],
     "Error: --wait-for-lane: not a duration: '5x' (45m, 90s, 2h, 1h30m or plain seconds)"),
    (["freshness", "--hours", "abc"],
     "Error: --hours: the value must be a finite number written in ASCII digits, got 'abc'"),
    (["demo", "--days", "99"], "Error: --days: 99 is not in the range 1<=x<=31."),
])
def test_a_refused_option_value_is_one_line_and_exit_2(args, line):
    """Adversarial trial: ``--timeout abc`` printed click's usage block (3 lines and an empty one) where a settings
    flag's or ``--older-than``'s bad value is one line. Every value click refuses is one line now, exit 2."""
    proc = cli(*args)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [line], proc.stderr
    json_logs = cli("--log-format", "json", *args)
    assert json_logs.returncode == 2 and json.loads(json_logs.stderr)["message"] == line.removeprefix("Error: ")


@pytest.mark.parametrize("args, argument", [(["sql"], "QUERY"), (["show"], "RUN_ID"), (["cancel"], "RUN_ID")])
def test_a_missing_argument_is_named(args, argument):
    """Fresh-user trial: ``feiqiu-etl sql`` said ``Error: query: `` (a missing argument is a BadParameter too, with
    an empty message); it keeps click's usage and names the argument."""
    proc = cli(*args)
    assert proc.returncode == 2 and f"Error: Missing argument '{argument}'." in proc.stderr.splitlines(), proc.stderr
    assert proc.stderr.startswith("Usage: ") and f"{args[0]} --help" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [[], ["state"], ["config"], ["alerts"]])
def test_a_group_without_its_command_prints_its_help_as_help(args):
    """Fresh-user trial: ``feiqiu-etl`` alone printed its help on one line with literal backslash-n (the one-line
    escape of error text had reached click's "no command: here is the help")."""
    proc = cli(*args)
    text = proc.stdout + proc.stderr
    assert "\\n" not in text and text.startswith("Usage: "), text[:300]
    assert len(text.splitlines()) > 5 and ("Commands:" in text), text[:300]


def test_an_unknown_option_keeps_clicks_usage_and_its_suggestion():
    proc = cli("run", "--timout", "5")
    assert proc.returncode == 2 and "Usage: " in proc.stderr and "'--timeout'" in proc.stderr
