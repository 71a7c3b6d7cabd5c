"""How wide the commands print, as real processes at ``COLUMNS=80`` (a fresh user's 80-column terminal): plain
messages wrap between words, never inside one; stored log records and error lines are never cut in two,
whatever the width; the tables of ``freshness``, ``state show`` and ``config show`` fit 80 columns without
cutting a task, table or key name or the age."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from clikit import cli
from test_ops_display import _env, conn  # noqa: F401 - the fixture and the environment without COLUMNS
from webkit import seed_run


def _words_whole(text: str, *words: str) -> None:
    """Every line fits 80 columns and each of ``words`` is on one line."""
    assert all(len(line) <= 80 for line in text.splitlines()), text
    for word in words:
        assert word in text, f"{word!r} cut in two:\n{text}"


def test_runs_prune_at_80_columns_wraps_between_words(conn, pg_dsn):
    old = datetime.now(timezone.utc) - timedelta(hours=1)
    seed_run(conn, "20261201T020005Z-000000a1", started_at=old,
             log=[{"ts": old, "level": "INFO", "message": "x", "lane": None, "site_id": None, "task": None}])
    proc = cli("runs", "prune", "--older-than", "2m", "--dsn", pg_dsn, env=_env(COLUMNS="80", DISPLAY_TIMEZONE="UTC"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    stamp = re.search(r"before (\S+ \S+ \S+):", " ".join(out.split()))
    assert stamp, out
    _words_whole(out, *stamp.group(1).split(), "untouched")
    assert len(out.splitlines()) >= 2, out  # it is longer than 80 columns: it did wrap
    piped = cli("runs", "prune", "--older-than", "2m", "--dsn", pg_dsn, env=_env(DISPLAY_TIMEZONE="UTC"))
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1, piped.stdout  # no COLUMNS: one line


LONG = ("lane default: stopping (no new requests; what was fetched is written) after the upstream said "
        "42902 three times in a row for store 8640015201004417 and the lane's ban budget ran out")


@pytest.mark.parametrize("columns", ["80", None])
def test_show_prints_every_stored_log_record_and_error_on_one_line(conn, pg_dsn, columns):
    now = datetime.now(timezone.utc)
    log = [{"ts": now, "level": "WARNING", "message": f"deleted={i} {LONG}", "lane": "default",
            "site_id": 8640015201004417, "task": "ODS_PAYMENT"} for i in range(7)]
    seed_run(conn, "20261201T020005Z-000000b1", status="FAILED", error=LONG, log=log)
    env = _env(DISPLAY_TIMEZONE="UTC") | ({"COLUMNS": columns} if columns else {})
    proc = cli("show", "last", "--dsn", pg_dsn, env=env)
    assert proc.returncode == 0, proc.stderr
    records = [line for line in proc.stdout.splitlines() if " WARNING " in line]
    assert len(records) == 7, proc.stdout
    assert all(line.endswith("ban budget ran out") for line in records), proc.stdout
    assert sum(1 for line in proc.stdout.splitlines() if line.startswith("error: ") and line.endswith("ran out")) == 1


def test_config_show_at_80_columns_keeps_every_key_whole(tmp_path):
    home = tmp_path / "a-long-home-folder-name-as-mktemp-and-a-deep-path-give-it" / "feiqiu"
    proc = cli("config", "show", env=_env(COLUMNS="80", FEIQIU_ETL_HOME=str(home)))
    assert proc.returncode == 0, proc.stderr
    assert all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout
    keys = {line.split()[0] for line in proc.stdout.splitlines()[2:] if line and not line.startswith(" ")}
    assert {"pipeline.ods_group_package.rate_min", "pipeline.max_consecutive_failures",
            "lane.max_transport_failures", "FEIQIU_ETL_HOME"} <= keys, proc.stdout


STATE_TASKS = ["ODS_MEMBER_BALANCE_CHANGE", "ODS_ASSISTANT_SERVICE", "ODS_ASSISTANT", "ODS_GROUP_VERIFICATION",
               "ODS_PAYMENT"]


def test_state_show_and_freshness_at_80_columns_keep_names_ranges_and_ages_whole(pg_dsn):
    from feiqiu_etl.simulator import Simulator
    from flowkit import ANCHOR, options, run_opts, sim_config

    with Simulator(sim_config(seed=31, days=3)) as sim:
        result = run_opts(options(sim, tasks=STATE_TASKS, window=False, now=ANCHOR, load_dwd=True,
                                  overrides={"window.initial_days": 3}), pg_dsn)
        assert result.status == "SUCCESS", result.to_dict().get("error")
        site = sim.config.site_ids[0]
    env = _env(COLUMNS="80", DISPLAY_TIMEZONE="UTC")
    state = cli("state", "show", "--dsn", pg_dsn, env=env)
    assert state.returncode == 0, state.stderr
    out = state.stdout
    assert all(len(line) <= 80 for line in out.splitlines()), out
    for task in STATE_TASKS:
        assert re.search(rf"^{task}\s", out, re.M), f"{task} cut:\n{out}"
    assert re.search(r"^ODS_PAYMENT\s+2024-03-01 → 2024-03-04\s", out, re.M), out  # a range on one line
    dwd = [w["table"] for w in json.loads(cli("state", "show", "--json", "--dsn", pg_dsn, env=env).stdout)["dwd"]]
    assert dwd and all(re.search(rf"^{re.escape(t)}\s", out, re.M) for t in dwd), out

    fresh = cli("freshness", "--dsn", pg_dsn, env=env)
    assert fresh.returncode == 0, fresh.stderr
    text = fresh.stdout
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "fresh until (UTC)" in text, text
    for task in STATE_TASKS:  # loaded up to 2024-03-04: hundreds of days old, whole
        row = next(line for line in text.splitlines() if f" {task} " in line)
        age = r" \d+ s " if task == "ODS_ASSISTANT" else r" \d{3,} d \d+ h "  # a snapshot is as old as the run
        assert re.search(age, row), row
        assert row.startswith(f"…{str(site)[-4:]} "), row


def test_progress_lines_without_a_terminal_carry_the_time_with_the_display_zones_offset(pg_dsn):
    from clikit import env_for, run_args
    from feiqiu_etl.simulator import Simulator
    from flowkit import sim_config

    with Simulator(sim_config(seed=32, days=2)) as sim:
        args = [a for a in run_args(sim, pg_dsn, "--tasks", "ODS_PAYMENT,ODS_ASSISTANT",
                                    "--set=progress.heartbeat_seconds=0.2", gaps=(0.3, 0.35))[3:]
                if a != "--no-progress"]
        proc = cli(*args, env=_env(**{k: v for k, v in env_for(sim.config.token).items() if k == "FEIQIU_API_TOKEN"},
                                   DISPLAY_TIMEZONE="Asia/Shanghai"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-800:]
    progress = [line for line in proc.stderr.splitlines() if "[1/2] " in line or "[2/2] " in line
                or "[progress] " in line]
    assert sum(1 for line in progress if "/2] " in line) == 2 and any("[progress] " in line for line in progress), \
        proc.stderr
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+08:00 \[(\d/2|progress)\] ")
    assert all(stamp.match(line) for line in progress), progress
