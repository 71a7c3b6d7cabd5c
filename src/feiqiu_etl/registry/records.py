"""Reading the run records back: frozen records (:class:`RunRecord`, :class:`RunDetail`, :class:`LiveRun`) that
``runs``, ``show``, ``status``, the web page, Dagster and the alerts read, each with ``to_dict``/``from_dict``
(the row as a mapping: what ``--json`` prints after :func:`jsonable`); run ids and their prefixes; what was
last loaded per store and task. Reads only; every function commits its read. Writing them is :mod:`.runs`."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Mapping, TypeVar

import psycopg
from psycopg.rows import dict_row

from feiqiu_etl.formats import iso

R = TypeVar("R", bound="RunRecord")

RUN_ID_CHARACTERS = r"[A-Za-z0-9._:-]{1,128}"
"""What a run id (or a prefix of one) is made of: ``20261201T020003Z-1a2b3c4d`` (:func:`~.runs.new_run_id`);
anything else — a NUL byte, a control character, 129 characters or more — names no run and is refused before the
database is asked (``show``/``cancel``: one line, exit 2; the web API: 404)."""

_LIST_COLUMNS = ("run_id, status, command, started_at, finished_at, heartbeat_at, host, pid, stores, tasks, lanes, "
                 "rows_written, requests, rejections, errors, exit_code, error, cancel_requested_at, recorded_late_at")
# seconds as a float (``extract`` gives numeric, which JSON would carry as a string)
_DURATION = "extract(epoch FROM coalesce(finished_at, now()) - started_at)::float8 AS duration"


@dataclass(frozen=True)
class RunRecord:
    """One run as ``runs`` lists it: the listing columns of ``etl_meta.run`` (status: a
    :class:`~feiqiu_etl.common.status.Status` value; times: aware datetimes; ``stores``, ``tasks``, ``lanes``:
    lists) and ``duration`` (s, until now while it runs)."""

    run_id: str
    status: str | None = None
    command: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    host: str | None = None
    pid: int | None = None
    stores: list[int] | None = None
    tasks: list[str] | None = None
    lanes: list[str] | None = None
    rows_written: int | None = None
    requests: int | None = None
    rejections: int | None = None
    errors: int | None = None
    exit_code: int | None = None
    error: str | None = None
    cancel_requested_at: datetime | None = None
    recorded_late_at: datetime | None = None
    duration: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as the row it was read from (field order; a part that was not read is left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.name in _OPTIONAL_PARTS and getattr(self, f.name) is None)}

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record of a :meth:`to_dict` or a row (missing fields: their defaults; unknown ones: ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


_OPTIONAL_PARTS = ("alerts", "log")


@dataclass(frozen=True)
class RunDetail(RunRecord):
    """One run as ``show`` and the run page read it: the listing plus ``args`` (redacted), ``config``,
    ``summary`` (``RunResult.to_dict()``), ``live``, ``version``, ``cancel_requested_by``, ``pruned_at`` (when
    retention removed its log and request timeline, :mod:`.retention`) and, when read, ``log`` (entries in order)
    and ``alerts`` (added by the application layer, :func:`feiqiu_etl.app.reads.run_detail`)."""

    args: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    live: dict[str, Any] | None = None
    version: str | None = None
    cancel_requested_by: str | None = None
    pruned_at: datetime | None = None
    alerts: list[dict[str, Any]] | None = None
    log: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class LiveRun(RunRecord):
    """A run in progress as ``status`` reads it: the listing plus its ``live`` snapshot
    (``RunStatistics.to_dict()``) and ``heartbeat_age`` (s)."""

    live: dict[str, Any] | None = None
    heartbeat_age: float | None = None


def run_requests(conn: psycopg.Connection, run_id: str) -> list[dict[str, Any]]:
    """The lane attempts of a run in time order (for the timeline chart)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT lane, seq, site_id, task, request, gap_class, started_at, seconds, gap, wait_reason, outcome, "
            "detail FROM etl_meta.run_request WHERE run_id = %s ORDER BY started_at, lane, seq", (run_id,)).fetchall()
    conn.commit()
    return rows



def list_runs(conn: psycopg.Connection, *, limit: int = 20, offset: int = 0, status: str | None = None,
              store: int | None = None) -> list[RunRecord]:
    """Runs newest first."""
    clause, params = _filters(status, store)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT {_LIST_COLUMNS}, {_DURATION} FROM etl_meta.run {clause} "
            "ORDER BY started_at DESC, run_id DESC LIMIT %s OFFSET %s",
            (*params, limit, offset)).fetchall()
    conn.commit()
    return [RunRecord.from_dict(r) for r in rows]


def count_runs(conn: psycopg.Connection, *, status: str | None = None, store: int | None = None) -> int:
    """How many runs :func:`list_runs` would page through."""
    clause, params = _filters(status, store)
    n = conn.execute(f"SELECT count(*) FROM etl_meta.run {clause}", params).fetchone()[0]
    conn.commit()
    return n


def _filters(status: str | None, store: int | None) -> tuple[str, list]:
    """``WHERE`` clause (fixed text) and parameters for the status/store filters."""
    where, params = [], []
    if status:
        where.append("status = %s")
        params.append(status.upper())
    if store is not None:
        where.append("%s = ANY(stores)")
        params.append(store)
    return (f"WHERE {' AND '.join(where)}" if where else ""), params


def get_run(conn: psycopg.Connection, run_id: str, *, with_log: bool = True) -> RunDetail | None:
    """One run (:class:`RunDetail`, without its ``alerts``), with its ``log`` when ``with_log``; None when there is
    no such run."""
    with conn.cursor(row_factory=dict_row) as cur:
        run = cur.execute(
            f"SELECT {_LIST_COLUMNS}, args, config, summary, live, version, cancel_requested_by, pruned_at, "
            f"{_DURATION} FROM etl_meta.run WHERE run_id = %s", (run_id,)).fetchone()
        if run is not None and with_log:
            run["log"] = cur.execute(
                "SELECT ts, level, lane, site_id, task, message FROM etl_meta.run_log WHERE run_id = %s "
                "ORDER BY seq", (run_id,)).fetchall()
    conn.commit()
    if run is None:
        return None
    if isinstance(run.get("args"), dict):
        run["args"] = redact_args(run["args"])  # records of older versions kept a URL's query secrets
    return RunDetail.from_dict(run)


def redact_args(params: dict[str, Any]) -> dict[str, Any]:
    """A command's parameters as they may be stored and shown: a secret-named one (the token, ``auth_token`` …:
    :func:`~feiqiu_etl.textsafe.is_secret_name`) never (``***``), a DSN without its password
    (:func:`~feiqiu_etl.db.connection.redact_dsn`), the API base and any other URL without its secrets
    (:func:`~feiqiu_etl.textsafe.redact_url`); tuples as lists. Idempotent."""
    from feiqiu_etl.db.connection import redact_dsn
    from feiqiu_etl.textsafe import is_secret_name, redact_url

    out: dict[str, Any] = {}
    for key, value in params.items():
        if is_secret_name(key):
            out[key] = "***" if value else None
        elif key == "dsn" and isinstance(value, str) and value:
            out[key] = redact_dsn(value)
        elif isinstance(value, str) and "://" in value:
            out[key] = redact_url(value)
        elif isinstance(value, tuple):
            out[key] = list(value)
        else:
            out[key] = value
    return out


def running(conn: psycopg.Connection) -> list[LiveRun]:
    """Runs in progress with their live snapshot and heartbeat age (s), oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT {_LIST_COLUMNS}, live, extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age, "
            "extract(epoch FROM now() - started_at)::float8 AS duration "
            "FROM etl_meta.run WHERE status = 'RUNNING' ORDER BY started_at").fetchall()
    conn.commit()
    return [LiveRun.from_dict(r) for r in rows]


def run_id_problem(text: str) -> str | None:
    """None when ``text`` may be a run id or a prefix of one (:data:`RUN_ID_CHARACTERS`, or ``last``), else a
    one-line reason that shows it escaped and shortened."""
    if re.fullmatch(RUN_ID_CHARACTERS, text):
        return None
    shown = repr(text[:40]) + ("…" if len(text) > 40 else "")
    return (f"not a run id: {shown} (run ids are letters, digits and . _ : - only, at most 128 of them; "
            "see feiqiu-etl runs)")


def resolve_run_id(conn: psycopg.Connection, prefix: str) -> str | None:
    """The run id that equals ``prefix`` or uniquely starts with it; ``"last"`` is the newest run. None when
    there is no such run or the prefix is ambiguous (:func:`matching_runs` tells which)."""
    found = matching_runs(conn, prefix, limit=2)
    return found[0] if len(found) == 1 else None


def matching_runs(conn: psycopg.Connection, prefix: str, limit: int = 6) -> list[str]:
    """Up to ``limit`` run ids for ``prefix``: ``[id]`` if one equals it (or ``prefix`` is ``"last"``: the
    newest run), else those that start with it, newest first (several: the prefix is ambiguous)."""
    if prefix == "last":
        rows = conn.execute("SELECT run_id FROM etl_meta.run ORDER BY started_at DESC LIMIT 1").fetchall()
        conn.commit()
        return [r[0] for r in rows]
    rows = conn.execute("SELECT run_id FROM etl_meta.run WHERE run_id = %s OR run_id LIKE %s "
                        "ORDER BY run_id = %s DESC, started_at DESC, run_id DESC LIMIT %s",
                        (prefix, prefix.replace("%", r"\%").replace("_", r"\_") + "%", prefix, limit)).fetchall()
    conn.commit()
    ids = [r[0] for r in rows]
    return ids[:1] if ids and ids[0] == prefix else ids


def jsonable(value: Any) -> Any:
    """``value`` (records as their :meth:`~RunRecord.to_dict`) with datetimes as ISO 8601 strings with their offset in the display zone
    (:func:`feiqiu_etl.formats.iso`), ``Decimal`` as float and ``timedelta`` as seconds: what
    ``runs``/``show``/``status --json`` print and the web API answers, so both agree."""
    if isinstance(value, RunRecord):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return iso(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def last_loaded(conn: psycopg.Connection, connector: str) -> list[dict[str, Any]]:
    """Per store and task: end of the newest finished window segment (windowed) or time of the last
    complete snapshot, and the details still owed."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "WITH w AS (SELECT task_code, site_id, max(window_end) AS fresh_until, max(completed_at) AS at "
            "           FROM etl_meta.window_progress WHERE connector = %(c)s GROUP BY 1, 2), "
            "s AS (SELECT task_code, site_id, completed_at AS fresh_until, completed_at AS at "
            "      FROM etl_meta.snapshot_done WHERE connector = %(c)s), "
            "o AS (SELECT task_code, site_id, count(*) AS owed, max(attempts) AS max_attempts "
            "      FROM etl_meta.detail_pending WHERE connector = %(c)s GROUP BY 1, 2), "
            "k AS (SELECT task_code, site_id FROM w UNION SELECT task_code, site_id FROM s "
            "      UNION SELECT task_code, site_id FROM o) "
            "SELECT k.site_id, k.task_code AS task, CASE WHEN w.task_code IS NOT NULL THEN 'windowed' "
            "       WHEN s.task_code IS NOT NULL THEN 'snapshot' END AS kind, "
            "       coalesce(w.fresh_until, s.fresh_until) AS fresh_until, "
            "       extract(epoch FROM now() - coalesce(w.fresh_until, s.fresh_until)) AS age_seconds, "
            "       coalesce(o.owed, 0) AS owed_details, o.max_attempts "
            "FROM k LEFT JOIN w USING (task_code, site_id) LEFT JOIN s USING (task_code, site_id) "
            "LEFT JOIN o USING (task_code, site_id) ORDER BY k.site_id, k.task_code", {"c": connector}).fetchall()
    conn.commit()
    return rows

