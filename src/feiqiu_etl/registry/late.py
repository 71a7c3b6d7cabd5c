"""Run records the database did not take: kept in a file, written by the next command that reaches that database.

A run whose database stops answering (frozen, gone) ends all the same — FAILED, exit 7, its ``--json`` printed —
but it cannot write its record. So it keeps the record (:class:`LateRecord`: the start and the end, as
``registry.start_run``/``finish_run`` would have written them) in ``<home>/late-records/<run id>.json`` (mode
0600, in a 0700 folder). Every command that opens a database sweeps its runs first
(:func:`feiqiu_etl.alerts.sweep_and_alert`); before that sweep, :func:`record_late` writes the records
kept for *that* database (the one the run used: host, port and database name as the server reported them
when it last answered) and removes their files. The record then says when it was written
(``etl_meta.run.recorded_late_at``), and ``runs``/``show`` say that it was recorded late.

A record kept for a database that never comes back stays in its file; files older than :data:`KEEP_DAYS` are
removed. Nothing here raises into a run or a command: a record that cannot be kept is one logged line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import psycopg
from psycopg.types.json import Jsonb

from feiqiu_etl.errortext import one_line

log = logging.getLogger("feiqiu_etl.registry")

FOLDER = "late-records"
KEEP_DAYS = 30


def database_identity(conn: psycopg.Connection) -> str:
    """``host:port/dbname`` of ``conn`` as libpq reports them (a Unix socket's folder for a local server)."""
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname}"


@dataclass(frozen=True)
class LateRecord:
    """A run's record as it would have been written: the start (``command``, ``args``, ``config``, the lanes'
    keys, stores, tasks, ``started_at``, ``host``, ``pid``, ``process_started``, ``version``) and the end
    (``status``, ``exit_code``, ``summary``, ``error``, ``totals``, ``finished_at``); ``database`` is the
    :func:`database_identity` it belongs to. Times are ISO 8601 with their offset."""

    run_id: str
    database: str
    command: str
    started_at: str
    finished_at: str
    status: str
    exit_code: int
    error: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    lanes: tuple[str, ...] = ()
    stores: tuple[int, ...] = ()
    tasks: tuple[str, ...] = ()
    summary: Mapping[str, Any] | None = None
    totals: Mapping[str, int] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    process_started: float | None = None
    version: str = ""


def folder(home: Path | None = None) -> Path:
    """``<home>/late-records`` (home: ``$FEIQIU_ETL_HOME`` or the default home folder)."""
    if home is None:
        from feiqiu_etl.db.embedded import etl_home

        home = etl_home()
    return Path(home) / FOLDER


def keep(record: LateRecord, home: Path | None = None) -> Path | None:
    """Write ``record`` to its file (atomically, mode 0600); the path, or None (logged) when it cannot be kept."""
    where = folder(home)
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = where / f"{record.run_id}.json"
        tmp = where / f".{record.run_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(record), f, default=str)
        os.replace(tmp, path)
        return path
    except OSError as exc:
        log.error("could not keep the record of run %s for later either (%s): it will show as INTERRUPTED",
                  record.run_id, exc.strerror or exc)
        return None


def waiting(home: Path | None = None) -> list[LateRecord]:
    """The records kept and not written yet (unreadable files are skipped; old ones removed)."""
    where = folder(home)
    out = []
    try:
        paths = sorted(where.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            if time.time() - path.stat().st_mtime > KEEP_DAYS * 86400:
                path.unlink()
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            for key in ("lanes", "stores", "tasks"):
                data[key] = tuple(data.get(key) or ())
            out.append(LateRecord(**data))
        except (OSError, ValueError, TypeError):
            continue
    return out


def record_late(conn: psycopg.Connection, home: Path | None = None) -> list[str]:
    """Write the records kept for the database of ``conn`` (start and end, in one transaction each; a run
    another process marked INTERRUPTED meanwhile is finished too) and remove their files. Returns the run ids
    written. Never raises for a record (it stays in its file). When there is one, commits first."""
    records = [r for r in waiting(home) if r.database == database_identity(conn)]
    if not records:
        return []
    conn.commit()  # what the caller did before stays done whatever happens to a record
    written = []
    for r in records:
        try:
            conn.execute(
                "INSERT INTO etl_meta.run (run_id, started_at, status, command, args, config, host, pid, "
                "process_started, version, heartbeat_at, lanes, stores, tasks) VALUES (%s, %s, 'RUNNING', %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                (r.run_id, datetime.fromisoformat(r.started_at), r.command, Jsonb(dict(r.args)),
                 Jsonb(dict(r.config)), r.host, r.pid, r.process_started, r.version,
                 datetime.fromisoformat(r.started_at), list(r.lanes), list(r.stores), list(r.tasks)))
            from feiqiu_etl.registry.runs import finish_run

            finish_run(conn, r.run_id, status=r.status, exit_code=r.exit_code,  # commits both
                       summary=dict(r.summary) if r.summary is not None else None, error=r.error, totals=r.totals,
                       late_end=datetime.fromisoformat(r.finished_at))
        except psycopg.Error as exc:
            conn.rollback()
            log.warning("could not write the late record of run %s yet: %s", r.run_id, one_line(exc, with_type=False))
            continue
        written.append(r.run_id)
        try:
            (folder(home) / f"{r.run_id}.json").unlink()
        except OSError:
            pass
        log.warning("run %s: its record, kept since the database did not answer when it ended (%s), is written now",
                    r.run_id, r.finished_at)
    return written
