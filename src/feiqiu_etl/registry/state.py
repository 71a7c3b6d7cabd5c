"""The bookkeeping a run resumes from, read and forgotten on purpose (issue 18 item 7; Meltano's ``state
get/clear``, Airbyte's reset).

What a (store, task) remembers, all in ``etl_meta``: its finished window segments (``window_progress``), the
horizon where its incremental loading began (``window_horizon``), when its last complete snapshot ended
(``snapshot_done``) and the details still owed (``detail_pending``); per DWD table the watermark of its
incremental load (``dwd_dim_watermark`` for dimensions, ``dwd_watermark`` for facts; their names are given by
the caller, who owns the DWD loaders). :func:`read_state` reads it; :func:`reset_state` forgets part of it in
one transaction and records who did it in ``etl_meta.state_reset``.

A reset never deletes an ODS or DWD row. It forgets: the finished segments inside the range (a segment that
crosses an end of the range keeps its part outside), the horizon moves back to the range's start when that is
earlier (so the next incremental run sees the range as a hole and fetches it again), a snapshot task's last
snapshot, and with ``dwd`` the watermarks of the DWD tables the task feeds (the next DWD load compares every
key; a dimension's watermark covers all stores). Owed details stay owed (``feiqiu-etl details drop`` drops
them). The refetch then writes what it finds through the usual upserts: unchanged rows are counted unchanged.

A reset must not race a run of the same store: inside its transaction it takes, without waiting, the
advisory lock of every lane (token) that served the store (from the run registry: the lane guard's key,
:func:`feiqiu_etl.registry.lane_guard.lock_key`), so a run holding one makes it raise :class:`StoreBusy`
(exit 6), and a run starting meanwhile finds its lane busy; a RUNNING run that names the store is refused too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from feiqiu_etl.connector.windows import Window, from_aware, merge, subtract, to_aware
from feiqiu_etl.registry.runs import HOST, os_user
from feiqiu_etl.registry.lane_guard import lock_key

RESETS_SHOWN = 20
"""How many of the latest resets :func:`read_state` returns."""


class StoreBusy(Exception):
    """A run holds a lane of the store (or is running it): the reset was refused, nothing changed."""


@dataclass(frozen=True)
class ResetScope:
    """What to forget: ``task_code`` of ``site_id`` for ``connector``; ``start``/``end`` naive Asia/Shanghai
    bounds of ``[start, end)`` (None: open); ``windowed`` False for a snapshot task (no range then);
    ``dwd_tables``: the DWD tables whose watermarks go too (empty: none)."""

    connector: str
    site_id: int
    task_code: str
    windowed: bool = True
    start: datetime | None = None
    end: datetime | None = None
    dwd_tables: tuple[str, ...] = ()

    def overlaps(self, segment: Window) -> bool:
        return (self.start is None or segment.end > self.start) and (self.end is None or segment.start < self.end)

    def outside(self, segment: Window) -> list[Window]:
        """The parts of ``segment`` outside the range (kept finished)."""
        parts = []
        if self.start is not None and segment.start < self.start:
            parts.append(Window(segment.start, min(segment.end, self.start)))
        if self.end is not None and segment.end > self.end:
            parts.append(Window(max(segment.start, self.end), segment.end))
        return parts


@dataclass(frozen=True)
class ResetOutcome:
    """What a reset forgot: ``segments`` (finished segments removed or cut), ``kept`` (parts outside the range
    put back), ``horizon_before``/``horizon_after`` (naive Shanghai), ``snapshot`` (a snapshot time forgotten),
    ``dwd_watermarks`` (tables whose watermark went); ``reset_id`` and ``user`` of its record."""

    reset_id: int = 0
    user: str = ""
    segments: int = 0
    kept: int = 0
    horizon_before: datetime | None = None
    horizon_after: datetime | None = None
    snapshot: bool = False
    dwd_watermarks: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("horizon_before", "horizon_after"):
            out[key] = to_aware(out[key]).isoformat() if out[key] else None
        out["dwd_watermarks"] = list(self.dwd_watermarks)
        return out


# ---------------------------------------------------------------------------------------------------- reading
def known_stores(conn: psycopg.Connection, connector: str) -> set[int]:
    """Every store with bookkeeping of ``connector`` or named by a recorded run. Read-only."""
    rows = conn.execute(
        "SELECT site_id FROM etl_meta.window_progress WHERE connector = %(c)s "
        "UNION SELECT site_id FROM etl_meta.window_horizon WHERE connector = %(c)s "
        "UNION SELECT site_id FROM etl_meta.snapshot_done WHERE connector = %(c)s "
        "UNION SELECT site_id FROM etl_meta.detail_pending WHERE connector = %(c)s "
        "UNION SELECT unnest(stores) FROM etl_meta.run", {"c": connector}).fetchall()
    conn.commit()
    return {r[0] for r in rows if r[0] is not None}


def read_state(conn: psycopg.Connection, connector: str, *, site_id: int | None = None, task: str | None = None,
               watermark_tables: Sequence[tuple[str, str]] = (), dwd_tables: Iterable[str] | None = None
               ) -> dict[str, Any]:
    """The bookkeeping of ``connector``, optionally of one store and/or task. Returns ``{"tasks": [...],
    "dwd": [...], "resets": [...]}``: per (store, task) ``finished`` (merged ranges ``{start, end}``),
    ``segments`` (rows), ``holes`` (ranges missing between the horizon and the high-water
    mark), ``high_water``, ``horizon``, ``last_completed_at`` and ``snapshot_at`` (timestamptz) and
    ``owed_details``; per DWD table of ``watermark_tables`` (``(schema, table)`` of each watermark table,
    ``dwd_tables`` limiting which targets) its watermark; the latest resets. Window times (``finished``,
    ``holes``, ``high_water``, ``horizon``, a reset's range) are naive upstream wall-clock times (Asia/Shanghai:
    :func:`feiqiu_etl.formats.iso` and ``when`` print them with +08:00); the others are aware. Read-only."""
    params = {"c": connector, "s": site_id, "t": task}
    scope = "connector = %(c)s AND (%(s)s::bigint IS NULL OR site_id = %(s)s) AND (%(t)s::text IS NULL OR task_code = %(t)s)"
    tasks: dict[tuple[int, str], dict[str, Any]] = {}

    def entry(site: int, code: str) -> dict[str, Any]:
        return tasks.setdefault((site, code), {
            "site_id": site, "task": code, "finished": [], "segments": 0, "holes": [], "high_water": None,
            "horizon": None, "last_completed_at": None, "snapshot_at": None, "owed_details": 0})

    done: dict[tuple[int, str], list[Window]] = {}
    for site, code, a, b, at in conn.execute(
            f"SELECT site_id, task_code, window_start, window_end, completed_at FROM etl_meta.window_progress "
            f"WHERE {scope} ORDER BY site_id, task_code, window_start", params):
        e = entry(site, code)
        e["segments"] += 1
        e["last_completed_at"] = max(filter(None, (e["last_completed_at"], at)))
        done.setdefault((site, code), []).append(Window(from_aware(a), from_aware(b)))
    for site, code, h in conn.execute(
            f"SELECT site_id, task_code, horizon_start FROM etl_meta.window_horizon WHERE {scope}", params):
        entry(site, code)["horizon"] = from_aware(h)
    for site, code, at in conn.execute(
            f"SELECT site_id, task_code, completed_at FROM etl_meta.snapshot_done WHERE {scope}", params):
        entry(site, code)["snapshot_at"] = at
    for site, code, n in conn.execute(
            f"SELECT site_id, task_code, count(*) FROM etl_meta.detail_pending WHERE {scope} GROUP BY 1, 2", params):
        entry(site, code)["owed_details"] = n
    for key, segments in done.items():
        e = tasks[key]
        finished = merge(segments)
        e["finished"] = _ranges(finished)
        e["high_water"] = finished[-1].end
        first = e["horizon"] if e["horizon"] is not None else finished[0].start
        if first < finished[-1].end:
            e["holes"] = _ranges(subtract(Window(first, finished[-1].end), finished))
    _short_holes(conn, tasks, done, scope, params, entry)
    dwd = _dwd_watermarks(conn, watermark_tables, dwd_tables)
    resets = _resets(conn, scope, params)
    conn.commit()
    return {"tasks": [tasks[k] for k in sorted(tasks)], "dwd": sorted(dwd, key=lambda r: r["table"]),
            "resets": resets}


def _dwd_watermarks(conn: psycopg.Connection, watermark_tables: Sequence[tuple[str, str]],
                    dwd_tables: Iterable[str] | None) -> list[dict[str, Any]]:
    """The rows (``table``, ``watermark``, ``run_id``, ``updated_at``) of every watermark table that exists, for
    the DWD tables ``dwd_tables`` (None: all)."""
    wanted = None if dwd_tables is None else list(dwd_tables)
    dwd = []
    for kind, table in watermark_tables:
        if conn.execute("SELECT to_regclass(%s)", (f"{kind}.{table}",)).fetchone()[0] is None:
            continue  # no DWD load yet
        with conn.cursor(row_factory=dict_row) as cur:
            dwd += cur.execute(sql.SQL(
                "SELECT table_name AS table, watermark, run_id, updated_at FROM {} "
                "WHERE %(w)s::text[] IS NULL OR table_name = ANY(%(w)s) ORDER BY table_name").format(
                    sql.Identifier(kind, table)), {"w": wanted}).fetchall()
    return dwd


def _resets(conn: psycopg.Connection, scope: str, params: dict) -> list[dict[str, Any]]:
    """The latest :data:`RESETS_SHOWN` resets in ``scope``, newest first, their range in upstream wall-clock."""
    with conn.cursor(row_factory=dict_row) as cur:
        resets = cur.execute(
            f"SELECT id, reset_at, os_user, host, site_id, task_code AS task, range_start, range_end, dwd, forgot "
            f"FROM etl_meta.state_reset WHERE {scope} ORDER BY id DESC LIMIT {RESETS_SHOWN}", params).fetchall()
    for r in resets:  # window bounds: upstream wall-clock times, like every window time here
        for key in ("range_start", "range_end"):
            r[key] = from_aware(r[key]) if r[key] is not None else None
    return resets


def _short_holes(conn: psycopg.Connection, tasks: dict, done: dict, scope: str, params: dict, entry) -> None:
    """Windows whose latest listing was ``short`` (issue 25, ``etl_meta.listing_reconcile``) and that no
    checkpoint covers: holes with their ``reason`` (a hole between finished ranges gets the reason; one past the
    high-water mark is added). The next run fetches them again."""
    if conn.execute("SELECT to_regclass('etl_meta.listing_reconcile')").fetchone()[0] is None:
        return
    rows = conn.execute(
        f"SELECT DISTINCT ON (site_id, task_code, window_start, window_end) site_id, task_code, window_start, "
        f"window_end, verdict, reason, run_id FROM etl_meta.listing_reconcile WHERE {scope} AND kind = 'window' "
        f"ORDER BY site_id, task_code, window_start, window_end, id DESC", params).fetchall()
    for site, code, a, b, verdict, reason, run_id in rows:
        if verdict != "short":
            continue
        window = Window(from_aware(a), from_aware(b))
        missing = subtract(window, merge(done.get((site, code), [])))
        if not missing:
            continue  # a later run filled it
        e = entry(site, code)
        text = f"short: {reason} (run {run_id})"
        for gap in missing:
            hit = [h for h in e["holes"] if h["start"] < gap.end and gap.start < h["end"]]
            for h in hit:
                h["reason"] = text
            if not hit:
                e["holes"].append({"start": gap.start, "end": gap.end, "reason": text})
        e["holes"].sort(key=lambda h: h["start"])


def _ranges(windows: Iterable[Window]) -> list[dict[str, datetime]]:
    return [{"start": w.start, "end": w.end} for w in windows]


def segments_in(conn: psycopg.Connection, scope: ResetScope) -> int:
    """How many finished segments of ``scope``'s task and store overlap its range (what a reset would touch).
    Read-only."""
    n = sum(1 for w in _segments(conn, scope) if scope.overlaps(w))
    conn.commit()
    return n


def _segments(conn: psycopg.Connection, scope: ResetScope, *, lock: bool = False) -> list[Window]:
    rows = conn.execute(
        "SELECT window_start, window_end FROM etl_meta.window_progress WHERE connector = %s AND task_code = %s "
        "AND site_id = %s ORDER BY window_start" + (" FOR UPDATE" if lock else ""),
        (scope.connector, scope.task_code, scope.site_id)).fetchall()
    return [Window(from_aware(a), from_aware(b)) for a, b in rows]


# ---------------------------------------------------------------------------------------------------- the lane
_ARRAY = "CASE WHEN jsonb_typeof({0}) = 'array' THEN {0} ELSE '[]'::jsonb END"
"""A JSON value as an array to expand (an older or odd summary expands to nothing instead of failing)."""


def store_lane_keys(conn: psycopg.Connection, site_id: int) -> list[str]:
    """The lane keys (connector + token fingerprint) of every recorded run that served ``site_id``: from a
    finished run's summary the lanes that held the store, from a RUNNING run all its lanes."""
    rows = conn.execute(
        "SELECT l->>'key' FROM etl_meta.run r, jsonb_array_elements(" + _ARRAY.format("r.summary->'lanes'") + ") l "
        "WHERE %(s)s = ANY(r.stores) AND EXISTS (SELECT 1 FROM jsonb_array_elements(" + _ARRAY.format("l->'stores'")
        + ") st WHERE st->>'site_id' = %(s)s::text) "
        "UNION SELECT unnest(lanes) FROM etl_meta.run WHERE status = 'RUNNING' AND %(s)s = ANY(stores)",
        {"s": site_id}).fetchall()
    return sorted({r[0] for r in rows if r[0]})


def hold_store(conn: psycopg.Connection, site_id: int, action: str = "reset") -> None:
    """Inside the caller's transaction: take every lane lock of ``site_id`` until it ends (``pg_try_advisory_
    xact_lock``, never waiting) and make sure no run of the store is RUNNING. Raises :class:`StoreBusy` naming
    the run and what did not happen (``action``: ``reset``, or ``accepted`` for ``state accept-deletions``)."""
    verb, noun = ("accepted", "an acceptance of deletions") if action == "accepted" else ("reset", "a reset")
    for key in store_lane_keys(conn, site_id):
        if not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock_key(key),)).fetchone()[0]:
            holder = conn.execute("SELECT run_id FROM etl_meta.run WHERE status = 'RUNNING' AND %s = ANY(lanes) "
                                  "ORDER BY started_at DESC LIMIT 1", (key,)).fetchone()
            who = f"run {holder[0]}" if holder else "another session"
            raise StoreBusy(f"store {site_id}: its lane {key} is in use by {who}; {noun} must not race a run, "
                            f"nothing was {verb} (try again when it has ended)")
    running = conn.execute("SELECT run_id FROM etl_meta.run WHERE status = 'RUNNING' AND %s = ANY(stores) "
                           "ORDER BY started_at DESC LIMIT 1", (site_id,)).fetchone()
    if running:
        raise StoreBusy(f"store {site_id} is being loaded by run {running[0]}; {noun} must not race a run, "
                        f"nothing was {verb} (try again when it has ended)")


# ---------------------------------------------------------------------------------------------------- reset
def reset_state(conn: psycopg.Connection, scope: ResetScope, *, watermark_tables: Sequence[tuple[str, str]] = (),
                timeout: float = 30.0) -> ResetOutcome:
    """Forget ``scope`` (module docstring) in one transaction bounded by ``timeout`` seconds (statement and
    lock timeout), and record it in ``etl_meta.state_reset``. ``watermark_tables``: ``(schema, table)`` of the
    DWD watermark tables. Raises :class:`StoreBusy` (nothing changed) while a run holds the store's lane."""
    ms = int(timeout * 1000)
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(ms)))
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(ms)))
        hold_store(conn, scope.site_id)
        key = (scope.connector, scope.task_code, scope.site_id)
        removed = kept = 0
        for segment in _segments(conn, scope, lock=True):
            if not scope.overlaps(segment):
                continue
            run_id, completed = conn.execute(
                "DELETE FROM etl_meta.window_progress WHERE connector = %s AND task_code = %s AND site_id = %s "
                "AND window_start = %s AND window_end = %s RETURNING run_id, completed_at",
                (*key, to_aware(segment.start), to_aware(segment.end))).fetchone()
            removed += 1
            for part in scope.outside(segment):  # still finished: the run that finished it, when it did
                kept += conn.execute(
                    "INSERT INTO etl_meta.window_progress (connector, task_code, site_id, window_start, window_end, "
                    "run_id, completed_at) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (*key, to_aware(part.start), to_aware(part.end), run_id, completed)).rowcount
        row = conn.execute("SELECT horizon_start FROM etl_meta.window_horizon WHERE connector = %s AND task_code = %s "
                           "AND site_id = %s FOR UPDATE", key).fetchone()
        before = from_aware(row[0]) if row else None
        after = before
        if scope.windowed and scope.start is not None and (before is None or scope.start < before):
            after = scope.start
            conn.execute("INSERT INTO etl_meta.window_horizon (connector, task_code, site_id, horizon_start) "
                         "VALUES (%s, %s, %s, %s) ON CONFLICT (connector, task_code, site_id) DO UPDATE "
                         "SET horizon_start = EXCLUDED.horizon_start", (*key, to_aware(after)))
        snapshot = bool(conn.execute("DELETE FROM etl_meta.snapshot_done WHERE connector = %s AND task_code = %s "
                                     "AND site_id = %s", key).rowcount)
        forgotten: list[str] = []
        for schema, table in watermark_tables if scope.dwd_tables else ():
            if conn.execute("SELECT to_regclass(%s)", (f"{schema}.{table}",)).fetchone()[0] is None:
                continue
            forgotten += [r[0] for r in conn.execute(sql.SQL(
                "DELETE FROM {} WHERE table_name = ANY(%s) RETURNING table_name").format(
                    sql.Identifier(schema, table)), (list(scope.dwd_tables),)).fetchall()]
        user = os_user()
        outcome = ResetOutcome(user=user, segments=removed, kept=kept, horizon_before=before, horizon_after=after,
                               snapshot=snapshot, dwd_watermarks=tuple(sorted(forgotten)))
        reset_id = conn.execute(
            "INSERT INTO etl_meta.state_reset (os_user, host, connector, site_id, task_code, range_start, range_end, "
            "dwd, forgot) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (user, HOST, scope.connector, scope.site_id, scope.task_code,
             to_aware(scope.start) if scope.start else None, to_aware(scope.end) if scope.end else None,
             bool(scope.dwd_tables), Jsonb(outcome.to_dict()))).fetchone()[0]
    return ResetOutcome(**{**outcome.__dict__, "reset_id": reset_id})
