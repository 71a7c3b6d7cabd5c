"""A store's measured size: page 1's ``total`` of every list, as ``feiqiu-etl check`` saw it (issue 27).

``etl_meta.store_size`` keeps one row per connector, store and task: the ``total`` and, for a windowed list, the
window it counted (so a plan can turn it into records per day). A plan without history of a task uses it
(:func:`feiqiu_etl.estimates.plan_estimate`, basis ``check``) instead of the contract's lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

import psycopg

from feiqiu_etl.connector.windows import SHANGHAI, from_aware, parse_local


@dataclass(frozen=True)
class MeasuredSize:
    """Page 1's ``total`` of a task for a store, over ``window`` (naive Asia/Shanghai start and end; None for a
    snapshot), measured at ``measured_at``."""

    total: int
    window_start: datetime | None = None
    window_end: datetime | None = None
    measured_at: datetime | None = None

    @property
    def days(self) -> float | None:
        """Days of the window counted (None for a snapshot)."""
        if self.window_start is None or self.window_end is None:
            return None
        return (self.window_end - self.window_start).total_seconds() / 86400.0


def record_sizes(conn: psycopg.Connection, connector: str, lanes: Iterable) -> int:
    """Upsert the ``total`` of every task of a check that answered with one (``lanes``: the check's
    :class:`~feiqiu_etl.runner.check.LaneCheck` list). Returns the rows written; commits."""
    rows = []
    for lane in lanes:
        for store in lane.stores:
            for task in store.tasks:
                if task.total is None:
                    continue
                start, end = task.window or (None, None)
                rows.append((connector, store.site_id, task.task, task.total,
                             parse_local(start).replace(tzinfo=SHANGHAI) if start else None,
                             parse_local(end).replace(tzinfo=SHANGHAI) if end else None))
    if not rows:
        return 0
    with conn.transaction():
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO etl_meta.store_size (connector, site_id, task_code, total, window_start, window_end, "
                "measured_at) VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (connector, site_id, task_code) "
                "DO UPDATE SET total = EXCLUDED.total, window_start = EXCLUDED.window_start, "
                "window_end = EXCLUDED.window_end, measured_at = EXCLUDED.measured_at", rows)
    return len(rows)


def read_sizes(conn: psycopg.Connection, connector: str, sites: Iterable[int]) -> dict[tuple[str, int], MeasuredSize]:
    """``{(task code, site id): MeasuredSize}`` of ``sites``. Read-only; an older warehouse without the table
    reads as none."""
    sites = sorted(set(sites))
    exists = conn.execute("SELECT to_regclass('etl_meta.store_size') IS NOT NULL").fetchone()[0]
    if not exists or not sites:
        conn.commit()
        return {}
    out = {(task, site): MeasuredSize(int(total), from_aware(a) if a else None, from_aware(b) if b else None, at)
           for task, site, total, a, b, at in conn.execute(
               "SELECT task_code, site_id, total, window_start, window_end, measured_at FROM etl_meta.store_size "
               "WHERE connector = %s AND site_id = ANY(%s)", (connector, sites))}
    conn.commit()
    return out
