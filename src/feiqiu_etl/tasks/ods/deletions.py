"""The deletion guard (issue 25 part 4): no mass soft delete from one glitching answer.

A complete snapshot soft-deletes the live rows of its store it did not show (warehouse-model §2.3). Before it
does, :func:`guard_snapshot` compares what it would delete with the store's live rows of that table:

* the keys it would delete that an earlier complete snapshot already missed — *held back* then, recorded in
  ``etl_meta.deletion_hold`` — are **confirmed** and deleted now (two complete snapshots agree);
* the other keys are deleted at once, unless they are more than ``integrity.max_delete_share`` of the live rows
  **and** more than ``integrity.max_delete_rows`` rows: then they are **held back** (nothing of them deleted) and
  recorded, and the task ends PARTIAL naming the share and the rows (one alert, ``DELETIONS_HELD``);
* an **empty** snapshot (no row at all) of a table that has live rows is always held back, whatever the
  thresholds say, and it confirms nothing: two empty answers are more likely one glitch that lasts than a store
  that lost everything. Only a snapshot that holds rows confirms, or the operator (below).

A held-back key that a later complete snapshot shows again is no longer held (``withdrawn``). The operator
applies the held-back deletions of a store's task at once with ``feiqiu-etl state accept-deletions --site-id ID
--task CODE`` (:func:`accept`), recorded with the OS user and host like ``state reset``. DWD follows ODS: a held
row stays live, so no SCD2 version closes; a deletion applied later is stamped ``deleted_at`` then, so the next
DWD load sees it (its watermark reads ``deleted_at``) and closes those versions.

One hold row per store and task is ``held`` at a time; decided rows stay as history (``confirmed``,
``accepted``, ``withdrawn``). Keys are stored as JSON arrays of the key columns' values, in key order.
What it must never do: delete anything of a snapshot that is not complete (the caller decides that), or delete a
held key without a confirmation.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from feiqiu_etl.connector.spec import split_table

HOST = socket.gethostname()
HELD, CONFIRMED, ACCEPTED, WITHDRAWN = "held", "confirmed", "accepted", "withdrawn"


@dataclass(frozen=True)
class GuardRules:
    """``integrity.max_delete_share`` (0..1) and ``integrity.max_delete_rows`` (connector YAML, settings)."""

    max_share: float = 0.2
    max_rows: int = 5

    def too_many(self, rows: int, live: int) -> bool:
        """True when deleting ``rows`` of ``live`` live rows is more than both thresholds."""
        return live > 0 and rows > self.max_rows and rows / live > self.max_share


@dataclass
class GuardOutcome:
    """What the guard decided for one snapshot: ``deleted`` rows soft-deleted now (``confirmed`` of them held
    back earlier), ``held`` keys held back now (of ``live`` live rows; ``empty``: the snapshot had no row),
    ``withdrawn`` earlier held keys the snapshot showed again."""

    live: int = 0
    deleted: int = 0
    confirmed: int = 0
    held: int = 0
    withdrawn: int = 0
    empty: bool = False
    hold_id: int | None = None

    @property
    def share(self) -> float:
        return self.held / self.live if self.live else 0.0

    def describe(self, task: str, site_id: int, rules: GuardRules) -> str:
        """The one line the run reports for a hold (the task, the share and the rows)."""
        why = ("the snapshot answered no row at all" if self.empty else
               f"more than {rules.max_share:.0%} and more than {rules.max_rows} rows")
        return (f"deletions held back: {task} at store {site_id} would soft-delete {self.held} of {self.live} live "
                f"rows ({self.share:.1%}; {why}); nothing deleted until a later complete snapshot misses them again "
                f"or `feiqiu-etl state accept-deletions --site-id {site_id} --task {task}`")

    def to_dict(self) -> dict[str, Any]:
        return {"live": self.live, "deleted": self.deleted, "confirmed": self.confirmed, "held": self.held,
                "withdrawn": self.withdrawn, "empty": self.empty, "share": round(self.share, 4),
                "hold_id": self.hold_id}


@dataclass(frozen=True)
class _Table:
    schema: str
    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]

    @classmethod
    def of(cls, layout) -> "_Table":
        schema, name = split_table(layout.table)
        return cls(schema, name, tuple(k.column for k in layout.keys), tuple(k.sql_type for k in layout.keys))

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


def _live_keys(conn: psycopg.Connection, table: _Table, site_id: int) -> list[tuple]:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in table.columns)
    return [tuple(r) for r in conn.execute(
        sql.SQL("SELECT {c} FROM {t} WHERE site_id = %s AND NOT is_deleted").format(c=cols, t=table.ident),
        (site_id,)).fetchall()]


def _normal(key: Iterable[Any]) -> tuple:
    """A key as JSON gives it back (a list of numbers and texts) and as a tuple for comparison."""
    return tuple(key)


def _held_row(conn: psycopg.Connection, connector: str, task: str, site_id: int) -> tuple[int, set] | None:
    row = conn.execute(
        "SELECT id, keys FROM etl_meta.deletion_hold WHERE connector = %s AND task_code = %s AND site_id = %s "
        "AND status = 'held' FOR UPDATE", (connector, task, site_id)).fetchone()
    return (row[0], {_normal(k) for k in row[1]}) if row else None


def _soft_delete(conn: psycopg.Connection, table: _Table, site_id: int, keys: list[tuple], at: datetime) -> int:
    """``is_deleted = true`` for the live rows of ``keys`` (composite keys compared column by column)."""
    if not keys:
        return 0
    unnest = sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(t)) for t in table.types)
    alias = sql.SQL(", ").join(map(sql.Identifier, table.columns))
    match = sql.SQL(" AND ").join(sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c)) for c in table.columns)
    arrays = [[k[i] for k in keys] for i in range(len(table.columns))]
    with conn.cursor() as cur:
        cur.execute(sql.SQL(
            "WITH u AS (UPDATE {t} AS t SET is_deleted = true, deleted_at = %s WHERE t.site_id = %s "
            "AND NOT t.is_deleted AND EXISTS (SELECT 1 FROM unnest({unnest}) AS s({alias}) WHERE {match}) "
            "RETURNING 1) SELECT count(*) FROM u").format(t=table.ident, unnest=unnest, alias=alias, match=match),
            (at, site_id, *arrays))
        return cur.fetchone()[0]


def _decide(conn: psycopg.Connection, hold_id: int, status: str, applied: int, *, run_id: str | None,
            by: str | None = None) -> None:
    conn.execute("UPDATE etl_meta.deletion_hold SET status = %s, applied = %s, decided_at = now(), "
                 "decided_run = %s, decided_by = %s WHERE id = %s", (status, applied, run_id, by, hold_id))


@dataclass(frozen=True)
class Snapshot:
    """Which snapshot the guard judges: ``task`` of ``connector`` at ``site_id`` in run ``run_id``, the keys
    it showed (``seen``, converted like the key columns) and the time its deletions are stamped with."""

    connector: str
    task: str
    site_id: int
    run_id: str
    seen: frozenset
    deleted_at: datetime


def guard_snapshot(conn: psycopg.Connection, layout, snapshot: Snapshot, rules: GuardRules) -> GuardOutcome:
    """Soft-delete what a complete ``snapshot`` may delete and hold back the rest (module docstring). Runs in
    the caller's transaction (the writer's, with the snapshot's completion record)."""
    connector, task, site_id, run_id = snapshot.connector, snapshot.task, snapshot.site_id, snapshot.run_id
    seen, deleted_at = snapshot.seen, snapshot.deleted_at
    table = _Table.of(layout)
    seen_keys = {_normal(k) for k in seen}
    live = _live_keys(conn, table, site_id)
    missing = [k for k in live if k not in seen_keys]
    held = _held_row(conn, connector, task, site_id)
    earlier = held[1] if held else set()
    out = GuardOutcome(live=len(live), empty=not seen_keys)
    confirmed = [] if out.empty else [k for k in missing if k in earlier]
    new = [k for k in missing if k not in set(confirmed)]
    hold = bool(new) and (out.empty or rules.too_many(len(new), len(live)))
    out.confirmed = len(confirmed)
    out.deleted = _soft_delete(conn, table, site_id, confirmed + ([] if hold else new), deleted_at)
    out.withdrawn = len(earlier - set(missing))
    if held and hold and set(new) == earlier:  # the same keys held again (an empty answer again): keep the hold
        out.held, out.hold_id = len(new), held[0]
        return out
    if held:
        _decide(conn, held[0], CONFIRMED if confirmed else WITHDRAWN, len(confirmed), run_id=run_id)
    if hold:
        out.held = len(new)
        out.hold_id = conn.execute(
            "INSERT INTO etl_meta.deletion_hold (connector, site_id, task_code, keys, live_rows, empty_snapshot, "
            "run_id) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (connector, site_id, task, Jsonb([list(k) for k in sorted(new, key=str)]), len(live), out.empty,
             run_id)).fetchone()[0]
    return out


# ------------------------------------------------------------------------------------------- the operator
@dataclass
class Accepted:
    """What ``state accept-deletions`` did: the hold it applied (None: none was held), its keys, the rows it
    soft-deleted (a key already gone or back is not counted), who did it."""

    hold_id: int | None
    keys: int = 0
    deleted: int = 0
    user: str = ""
    held_at: datetime | None = None
    run_id: str | None = None
    empty: bool = False
    live_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"hold_id": self.hold_id, "keys": self.keys, "deleted": self.deleted, "user": self.user,
                "held_at": self.held_at.isoformat() if self.held_at else None, "held_by_run": self.run_id,
                "empty_snapshot": self.empty, "live_rows": self.live_rows}


def pending(conn: psycopg.Connection, connector: str, *, site_id: int | None = None,
            task: str | None = None) -> list[dict[str, Any]]:
    """The deletions held back now (``state show``): ``{id, site_id, task, keys, live_rows, empty, held_at,
    run_id}`` per store and task. Read-only."""
    if conn.execute("SELECT to_regclass('etl_meta.deletion_hold')").fetchone()[0] is None:
        return []
    rows = conn.execute(
        "SELECT id, site_id, task_code, jsonb_array_length(keys), live_rows, empty_snapshot, held_at, run_id "
        "FROM etl_meta.deletion_hold WHERE status = 'held' AND connector = %s AND (%s::bigint IS NULL OR "
        "site_id = %s) AND (%s::text IS NULL OR task_code = %s) ORDER BY site_id, task_code",
        (connector, site_id, site_id, task, task)).fetchall()
    conn.commit()
    return [{"id": r[0], "site_id": r[1], "task": r[2], "keys": r[3], "live_rows": r[4], "empty": r[5],
             "held_at": r[6], "run_id": r[7]} for r in rows]


def accept(conn: psycopg.Connection, layout, *, connector: str, task: str, site_id: int, user: str,
           hold_store: Callable[[psycopg.Connection, int], None], timeout: float = 30.0) -> Accepted:
    """Apply the deletions held back for ``task`` at ``site_id`` now, in one transaction bounded by ``timeout``
    seconds, after ``hold_store(conn, site_id)`` made sure no run holds the store's lane (the CLI passes
    :func:`feiqiu_etl.registry.state.hold_store`, which raises ``StoreBusy``: nothing changed); the hold is
    marked ``accepted`` by ``user@host``."""
    ms = int(timeout * 1000)
    table = _Table.of(layout)
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(ms)))
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(ms)))
        hold_store(conn, site_id)
        row = conn.execute(
            "SELECT id, keys, held_at, run_id, empty_snapshot, live_rows FROM etl_meta.deletion_hold "
            "WHERE connector = %s AND task_code = %s AND site_id = %s AND status = 'held' FOR UPDATE",
            (connector, task, site_id)).fetchone()
        if row is None:
            return Accepted(None, user=user)
        keys = [_normal(k) for k in row[1]]
        deleted = _soft_delete(conn, table, site_id, keys, conn.execute("SELECT now()").fetchone()[0])
        _decide(conn, row[0], ACCEPTED, deleted, run_id=None, by=f"{user}@{HOST}")
    return Accepted(row[0], len(keys), deleted, user, row[2], row[3], row[4], row[5])


__all__ = ["Accepted", "GuardOutcome", "GuardRules", "Snapshot", "accept", "guard_snapshot", "pending"]
