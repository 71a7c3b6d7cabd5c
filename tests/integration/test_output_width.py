"""How wide the commands print, as real processes at ``COLUMNS=80`` (a fresh user's 80-column terminal): plain
messages wrap between words, never inside one; stored log records and error lines are never cut in two,
whatever the width; the tables of ``freshness``, ``state show`` and ``config show`` fit 80 columns without
cutting a task, table or key name or the age."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone

import pytest

from clikit import cli
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.schema import ensure_schemas
from webkit import seed_run


@pytest.fixture
def conn(pg_dsn):
    with connect(pg_dsn) as c:
        ensure_schemas(c)
        yield c


def _env(**more: str) -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("DISPLAY_TIMEZONE", "COLUMNS")} | more


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
