"""Issue 18 item 7: ``state show``, ``state reset`` and ``run --backfill``, against the real simulator and
PostgreSQL. What was re-fetched is read from the simulator's own request log (which list windows were asked
for), and the data after is compared with the data before (ODS and DWD)."""

from __future__ import annotations

import getpass
import json
import time
from datetime import timedelta

import psycopg
import pytest

from clikit import PY, cli, env_for, one_line_error, running_run, start
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.simulator import Simulator
from flowkit import ANCHOR, CONNECTOR, FAST, ods_rows, options, run_opts, sim_config

TASKS = ["ODS_PAYMENT", "ODS_SETTLEMENT", "ODS_MEMBER"]
DAYS = 4
NOW = ANCHOR  # 2024-03-04 00:00 Asia/Shanghai: every run of a test ends its incremental windows here
INCREMENTAL = {"window.initial_days": DAYS}  # the first incremental run reads the simulator's whole history


@pytest.fixture
def sim():
    with Simulator(sim_config(seed=31, days=DAYS)) as s:
        yield s


def _run(sim, dsn, **kw):
    kw.setdefault("overrides", INCREMENTAL)
    result = run_opts(options(sim, tasks=TASKS, window=False, now=NOW, **kw), dsn)
    assert result.status == "SUCCESS", result.to_dict().get("error")
    return result


def _requested(sim) -> set[tuple[str, str | None, str | None]]:
    """(path, startTime, endTime) of every accepted request since the log was last cleared (details: no
    window; their parent id is ignored)."""
    out = set()
    for e in sim.request_log():
        assert e.outcome == "accepted", (e.path, e.code)
        body = e.body or {}
        out.add((e.path, body.get("startTime"), body.get("endTime")))
    return out


def _details(sim) -> list:
    return [e.body for e in sim.request_log() if e.path.endswith("/detail")]


def _ods(dsn) -> dict:
    tables = {s.table for s in CONNECTOR.tasks if s.code in TASKS}
    tables |= {s.detail.target_table for s in CONNECTOR.tasks if s.code in TASKS and s.detail}
    return {t: ods_rows(dsn, t, live_only=False) for t in sorted(tables)}


def _dwd(dsn) -> dict:
    """Every DWD table's rows, without the columns that say when a row was loaded (the data, not the load)."""
    out = {}
    with psycopg.connect(dsn) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'dwd' ORDER BY 1")]
        for table in tables:
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'dwd' AND table_name = %s "
                "AND data_type NOT LIKE 'timestamp%%' AND column_name NOT LIKE '%%run_id' ORDER BY ordinal_position",
                (table,))]
            rows = conn.execute(f"SELECT {', '.join(cols)} FROM dwd.{table}").fetchall()
            out[table] = sorted(map(repr, rows))
    assert sum(len(v) for v in out.values()) > 0
    return out


def _progress(dsn, task: str) -> list[tuple]:
    """The task's finished segments (start, end, run, completed at), times in +08:00."""
    with psycopg.connect(dsn, options="-c timezone=Asia/Shanghai") as conn:
        return conn.execute("SELECT window_start, window_end, run_id, completed_at FROM etl_meta.window_progress "
                            "WHERE task_code = %s ORDER BY window_start", (task,)).fetchall()


def _cli(dsn, *args, **kw):
    return cli(*args, "--dsn", dsn, **kw)


def _window(day_from: str, day_to_excl: str) -> tuple[str, str]:
    return f"{day_from} 00:00:00", f"{day_to_excl} 00:00:00"


def test_reset_then_run_refetches_exactly_the_reset_range_and_ends_with_the_same_data(sim, pg_dsn):
    site = sim.config.site_ids[0]
    _run(sim, pg_dsn, load_dwd=True)
    sim.clear_log()
    _run(sim, pg_dsn, load_dwd=True)  # what a run without a reset asks for: the look-backs, the snapshot
    baseline = _requested(sim)
    ods_before, dwd_before = _ods(pg_dsn), _dwd(pg_dsn)
    shown = json.loads(_cli(pg_dsn, "state", "show", "--store", str(site), "--task", "ODS_PAYMENT", "--json").stdout)
    [payment] = shown["tasks"]
    assert payment["finished"] == [{"start": "2024-02-29T00:00:00+08:00", "end": "2024-03-04T00:00:00+08:00"}]
    assert payment["holes"] == [] and payment["high_water"] == "2024-03-04T00:00:00+08:00"
    assert {w["table"] for w in shown["dwd"]} == {"dwd.dwd_payment"}

    # 2024-02-29 (a whole day, in the upstream's zone) of ODS_PAYMENT, with its DWD watermark
    proc = _cli(pg_dsn, "state", "reset", "--store", str(site), "--task", "ods_payment", "--from", "2024-02-29",
                "--to", "2024-02-29", "--dwd", "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout)
    assert outcome["segments"] == 1 and outcome["kept"] == 1 and outcome["dwd_watermarks"] == ["dwd.dwd_payment"]
    assert outcome["user"] == getpass.getuser()
    assert _ods(pg_dsn) == ods_before  # a reset deletes no ODS row
    assert [(a.isoformat(), b.isoformat()) for a, b, _, _ in _progress(pg_dsn, "ODS_PAYMENT")] == [
        ("2024-03-01T00:00:00+08:00", "2024-03-04T00:00:00+08:00"),  # the first run's segment, cut
        ("2024-03-02T00:00:00+08:00", "2024-03-04T00:00:00+08:00")]  # the second run's look-back, untouched
    with psycopg.connect(pg_dsn, options="-c timezone=Asia/Shanghai") as conn:
        record = conn.execute("SELECT os_user, host, site_id, task_code, range_start, range_end, dwd "
                              "FROM etl_meta.state_reset").fetchall()
    assert len(record) == 1 and record[0][0] == getpass.getuser() and record[0][2:4] == (site, "ODS_PAYMENT")
    assert (record[0][4].isoformat(), record[0][5].isoformat(), record[0][6]) == (
        "2024-02-29T00:00:00+08:00", "2024-03-01T00:00:00+08:00", True)
    text = _cli(pg_dsn, "state", "show", "--store", str(site)).stdout
    assert "2024-02-29" in text and "reset #1" in text and getpass.getuser() in text

    sim.clear_log()
    _run(sim, pg_dsn, load_dwd=True)
    again = _requested(sim)
    assert again - baseline == {("/api/payment/list", *_window("2024-02-29", "2024-03-01"))}
    assert baseline - again == set()
    assert _details(sim) == []  # the same data: no parent changed, no detail asked for
    assert _ods(pg_dsn) == ods_before
    assert _dwd(pg_dsn) == dwd_before
    assert [(a.isoformat(), b.isoformat()) for a, b, _, _ in _progress(pg_dsn, "ODS_PAYMENT")][0] == (
        "2024-02-29T00:00:00+08:00", "2024-03-01T00:00:00+08:00")


def test_reset_of_a_whole_task_and_of_a_snapshot(sim, pg_dsn):
    site = sim.config.site_ids[0]
    _run(sim, pg_dsn)
    sim.clear_log()
    _run(sim, pg_dsn)
    baseline = _requested(sim)
    ods_before = _ods(pg_dsn)
    for task in ("ODS_SETTLEMENT", "ODS_MEMBER"):
        proc = _cli(pg_dsn, "state", "reset", "--store", str(site), "--task", task, "--yes")
        assert proc.returncode == 0 and proc.stdout.startswith("reset #"), proc.stderr
    sim.clear_log()
    _run(sim, pg_dsn)
    again = _requested(sim)
    # the settlement's horizon stays: everything from it to now is a hole again, fetched as one window
    assert again - baseline == {("/api/settlement/list", *_window("2024-02-29", "2024-03-04"))}
    assert {p for p, _, _ in baseline - again} == {"/api/settlement/list"}  # its 10-minute look-back, now inside
    assert _details(sim) == []
    assert _ods(pg_dsn) == ods_before


def test_backfill_refetches_the_range_even_where_finished_and_touches_nothing_else(sim, pg_dsn):
    site = sim.config.site_ids[0]
    _run(sim, pg_dsn, load_dwd=True)
    ods_before, dwd_before = _ods(pg_dsn), _dwd(pg_dsn)
    progress_before = {t: _progress(pg_dsn, t) for t in ("ODS_PAYMENT", "ODS_SETTLEMENT")}
    with psycopg.connect(pg_dsn) as conn:
        horizons = conn.execute("SELECT * FROM etl_meta.window_horizon ORDER BY task_code").fetchall()
        snapshot = conn.execute("SELECT * FROM etl_meta.snapshot_done").fetchall()
    sim.clear_log()
    sets = [f"--set={k}={v}" for k, v in FAST.items()]
    proc = cli("run", "--api-base", sim.base_url, "--site-id", str(site), "--dsn", pg_dsn, "--unsafe-gaps",
               "--no-progress", "--json", "--tasks", ",".join(TASKS), "--backfill", "--from", "2024-03-01",
               "--to", "2024-03-02", "--now", fmt(NOW), *sets, env=env_for(sim.config.token), timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert sorted(t["task"] for t in result["tasks"]) == ["ODS_PAYMENT", "ODS_SETTLEMENT"]  # no snapshot
    assert _requested(sim) == {("/api/payment/list", *_window("2024-03-01", "2024-03-03")),
                               ("/api/settlement/list", *_window("2024-03-01", "2024-03-03"))}
    assert _details(sim) == []
    assert _ods(pg_dsn) == ods_before and _dwd(pg_dsn) == dwd_before
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT * FROM etl_meta.window_horizon ORDER BY task_code").fetchall() == horizons
        assert conn.execute("SELECT * FROM etl_meta.snapshot_done").fetchall() == snapshot
    for task, before in progress_before.items():  # the finished segments stay as they were; the range is added
        after = _progress(pg_dsn, task)
        assert set(before) <= set(after), task
        added = [(a.isoformat(), b.isoformat()) for a, b, _, _ in set(after) - set(before)]
        assert added == [("2024-03-01T00:00:00+08:00", "2024-03-03T00:00:00+08:00")], task


BAD_RESET = [
    (["--store", "{site}", "--task", "ODS_NOPE", "--yes"], "unknown task 'ODS_NOPE'"),
    (["--store", "77", "--task", "ODS_PAYMENT", "--yes"], "no state recorded for store 77"),
    (["--store", "x1", "--task", "ODS_PAYMENT", "--yes"], "--site-id must be a positive integer"),
    (["--task", "ODS_PAYMENT", "--yes"], "needs --site-id"),
    (["--store", "{site}", "--task", "ODS_PAYMENT", "--from", "2024-03-02", "--to", "2024-03-01", "--yes"],
     "--from 2024-03-02 is after --to 2024-03-01"),
    (["--store", "{site}", "--task", "ODS_PAYMENT", "--from", "2024-02-30", "--yes"], "--from: day 30 is not in 2024-02 (01..29)"),
    (["--store", "{site}", "--task", "ODS_MEMBER", "--to", "2024-03-01", "--yes"], "snapshot task"),
    (["--store", "{site}", "--task", "ODS_PAYMENT"], "pass --yes"),  # no terminal to confirm on
    (["--store", "{site}", "--task", "ODS_PAYMENT", "--to", "9999-12-31", "--yes"],
     "--to: 9999-12-31 is after 2099-12-31"),  # was OverflowError, exit 1
]
BAD_BACKFILL = [
    (["--backfill", "--from", "2024-03-02", "--to", "2024-03-01"], "--from 2024-03-02 is after --to 2024-03-01"),
    (["--backfill", "--from", "2024-3-1x", "--to", "2024-03-01"], "--from: expected a date"),
    (["--backfill", "--from", "2024-03-01"], "needs --from DATE and --to DATE"),
    (["--from", "2024-03-01", "--to", "2024-03-02"], "go with --backfill"),
    (["--backfill", "--from", "2024-03-01", "--to", "2024-03-02", "--tasks", "ODS_MEMBER"], "none of the selected"),
    (["--backfill", "--from", "2024-03-01", "--to", "2024-03-02", "--tasks", "ODS_NOPE"], "unknown task"),
    (["--backfill", "--from", "2024-03-01", "--to", "9999-12-31"], "--to: 9999-12-31 is after 2099-12-31"),
]


def _invoke(*args: str, env: dict | None = None):
    """The command line in this process (fast); stderr as a real process prints it (``entry`` escapes the
    message the same way; one real process of each command below checks that path)."""
    from click.testing import CliRunner

    from feiqiu_etl.cli.app import main

    return CliRunner().invoke(main, list(args), env=env)


def test_bad_input_is_one_line_exit_2_before_any_request_and_changes_nothing(sim, pg_dsn):
    site = sim.config.site_ids[0]
    _run(sim, pg_dsn)
    progress = _progress(pg_dsn, "ODS_PAYMENT")
    sim.clear_log()
    env = {"FEIQIU_API_TOKEN": sim.config.token}
    for args, expected in BAD_RESET:
        result = _invoke("state", "reset", *[a.format(site=site) for a in args], "--dsn", pg_dsn)
        assert result.exit_code == 2 and expected in one_line_error(result), (args, result.stderr, result.exception)
    for args, expected in BAD_BACKFILL:
        result = _invoke("run", "--api-base", sim.base_url, "--site-id", str(site), "--dsn", pg_dsn,
                         "--unsafe-gaps", *args, env=env)
        assert result.exit_code == 2 and expected in one_line_error(result), (args, result.stderr, result.exception)
    for proc in (cli("state", "reset", "--store", str(site), "--task", "ODS_PAYMENT", "--from", "2024-03-02",
                     "--to", "2024-03-01", "--yes", "--dsn", pg_dsn),
                 cli("run", "--api-base", sim.base_url, "--site-id", str(site), "--dsn", pg_dsn, "--backfill",
                     "--from", "2024-03-02", "--to", "2024-03-01", env=env_for(sim.config.token))):
        assert proc.returncode == 2 and "is after --to" in one_line_error(proc), proc.stderr
    assert sim.request_log() == []
    assert _progress(pg_dsn, "ODS_PAYMENT") == progress
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM etl_meta.state_reset").fetchone()[0] == 0
    shown = _invoke("state", "show", "--store", "77", "--dsn", pg_dsn)
    assert shown.exit_code == 2 and "no state recorded for store 77" in one_line_error(shown)


def test_reset_is_refused_with_the_busy_code_while_a_run_holds_the_stores_lane(sim, pg_dsn):
    site = sim.config.site_ids[0]
    _run(sim, pg_dsn)
    progress = _progress(pg_dsn, "ODS_PAYMENT")
    slow = {**FAST, "pipeline.rate_min": 0.3, "pipeline.rate_max": 0.35}
    args = [*PY, "run", "--api-base", sim.base_url, "--site-id", str(site), "--dsn", pg_dsn, "--unsafe-gaps",
            "--no-progress", "--no-dwd", "--window-start", fmt(ANCHOR - timedelta(days=DAYS)), "--window-end",
            fmt(ANCHOR), *[f"--set={k}={v}" for k, v in slow.items()]]
    proc = start(args, env_for(sim.config.token))
    run = None
    try:
        run = running_run(pg_dsn)
        time.sleep(0.5)  # the lane is taken right after the run is recorded
        busy = _cli(pg_dsn, "state", "reset", "--store", str(site), "--task", "ODS_PAYMENT", "--yes")
        assert busy.returncode == 6, busy.stderr
        line = one_line_error(busy)
        assert f"store {site}" in line and run["run_id"] in line and "nothing was reset" in line
        accept = _cli(pg_dsn, "state", "accept-deletions", "--store", str(site), "--task", "ODS_GOODS")
        assert accept.returncode == 6, accept.stderr  # the same guard, saying what did not happen
        line = one_line_error(accept)
        assert run["run_id"] in line and "nothing was accepted" in line and "reset" not in line, line
    finally:
        if run is not None:
            cli("cancel", run["run_id"], "--dsn", pg_dsn)
        else:
            proc.kill()
        proc.communicate(timeout=60)
    assert set(progress) <= set(_progress(pg_dsn, "ODS_PAYMENT"))  # nothing forgotten
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM etl_meta.state_reset").fetchone()[0] == 0
    # the token's lane held by another process (e.g. a run of another store on the same token): still refused,
    # the lane found from the finished runs' summaries
    from feiqiu_etl.registry.lane_guard import lock_key

    with psycopg.connect(pg_dsn, autocommit=True) as holder:
        [key] = [r[0] for r in holder.execute("SELECT DISTINCT unnest(lanes) FROM etl_meta.run")]
        holder.execute("SELECT pg_advisory_lock(%s)", (lock_key(key),))
        busy = _cli(pg_dsn, "state", "reset", "--store", str(site), "--task", "ODS_PAYMENT", "--yes")
        assert busy.returncode == 6 and "in use by another session" in one_line_error(busy), busy.stderr
    done = _cli(pg_dsn, "state", "reset", "--store", str(site), "--task", "ODS_PAYMENT", "--yes")
    assert done.returncode == 0, done.stderr  # once the lane is free


def _on_a_terminal(args: list[str], answer: bytes, timeout: float = 60) -> tuple[int, str]:
    """Run ``args`` on a pseudo-terminal, answer ``answer`` to its question; (exit code, what it printed)."""
    import os
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command line, with the terminal as stdin/stdout/stderr
        os.execvp(PY[0], [*PY, *args])
    out, sent, end = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not select.select([fd], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not sent and b"Reset? [y/N]" in out:
                os.write(fd, answer)
                sent = True
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_reset_asks_on_a_terminal_and_a_no_changes_nothing(pg_dsn):
    from feiqiu_etl.db.schema import ensure_schemas

    with psycopg.connect(pg_dsn) as conn:
        ensure_schemas(conn)
        conn.execute("INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, window_end, "
                     "run_id) VALUES (%s, 'ODS_PAYMENT', 5, '2024-03-01 00:00+08', '2024-03-05 00:00+08', 'r1')",
                     (CONNECTOR.name,))
    args = ["state", "reset", "--store", "5", "--task", "ODS_PAYMENT", "--from", "2024-03-02", "--to", "2024-03-02",
            "--dsn", pg_dsn]
    before = _progress(pg_dsn, "ODS_PAYMENT")
    code, text = _on_a_terminal(args, b"n\n")
    assert code == 2 and "not confirmed: nothing reset" in text, text
    assert "forget the finished windows in [2024-03-02 00:00, 2024-03-03 00:00) (+08:00) (1 finished segment(s)) " \
           "of ODS_PAYMENT at store 5" in text.replace("\r\n", " ").replace("\n", " ")
    assert _progress(pg_dsn, "ODS_PAYMENT") == before
    code, text = _on_a_terminal(args, b"y\n")
    assert code == 0 and "reset #1 by " in text, text
    assert [(a.isoformat(), b.isoformat()) for a, b, _, _ in _progress(pg_dsn, "ODS_PAYMENT")] == [
        ("2024-03-01T00:00:00+08:00", "2024-03-02T00:00:00+08:00"),
        ("2024-03-03T00:00:00+08:00", "2024-03-05T00:00:00+08:00")]
