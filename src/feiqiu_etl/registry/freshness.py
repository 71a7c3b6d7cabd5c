"""The freshness rule: per store and task, how old the loaded data is, and whether that is *stale*.

One function, :func:`freshness_report`, answers ``feiqiu-etl freshness``, the web page ``/freshness``, its
``/api/freshness`` and the stale-data alert; they cannot disagree. A row is stale when its age (now minus
the end of the newest finished window segment, or the time of the last complete snapshot) is above the
threshold, or when a *scheduled* task never completed.

Which tasks are scheduled is a :class:`Schedule`: with a fleet file, each lane's stores and the lane's
``tasks:`` (all the connector's tasks when a lane names none); stores outside the fleet are not judged.
Without a fleet, every store seen in the warehouse is scheduled for every task of the connector. A task a
store is not scheduled for is never reported, so a lane that runs three tasks shows three rows per store
(issue 18: "36 of 126 older than 26 h" for tasks the fleet never runs). Reads only; no request is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import psycopg

from feiqiu_etl.registry import records

DEFAULT_STALE_HOURS = 26.0
"""Default threshold (h): a nightly run plus two hours of slack."""


@dataclass(frozen=True)
class Schedule:
    """Which tasks each store is scheduled for. ``by_store`` lists stores explicitly (a fleet); ``default``
    applies to every other store seen in the warehouse (None: other stores are not judged)."""

    by_store: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    default: tuple[str, ...] | None = None
    source: str = "connector"

    def tasks_of(self, site_id: int) -> tuple[str, ...]:
        """The task codes store ``site_id`` is scheduled for (empty: not judged)."""
        if site_id in self.by_store:
            return self.by_store[site_id]
        return self.default or ()

    def stores(self, seen: Iterable[int]) -> list[int]:
        """The stores to judge: those listed, plus the ``seen`` ones when there is a default."""
        out = set(self.by_store)
        if self.default is not None:
            out |= set(seen)
        return sorted(out)

    @classmethod
    def everything(cls, task_codes: Iterable[str]) -> "Schedule":
        """No fleet: every store seen, every task of the connector."""
        return cls(default=tuple(task_codes), source="connector")

    @classmethod
    def of_pairs(cls, pairs: Iterable[tuple[int, str]], source: str = "run") -> "Schedule":
        """Exactly these ``(site_id, task code)`` pairs (e.g. what one run planned)."""
        by: dict[int, list[str]] = {}
        for site, code in pairs:
            if code not in by.setdefault(int(site), []):
                by[int(site)].append(code)
        return cls(by_store={s: tuple(c) for s, c in by.items()}, source=source)


def freshness_rows(conn: psycopg.Connection, connector: str, schedule: Schedule,
                   stale_after_seconds: float) -> list[dict[str, Any]]:
    """Rows ``{site_id, task, kind, fresh_until, age_seconds, owed_details, max_attempts, stale}`` for every
    scheduled (store, task), ordered by store and task; see :func:`judge`."""
    return judge(records.last_loaded(conn, connector), schedule, stale_after_seconds)


def judge(rows: list[dict], schedule: Schedule, stale_after_seconds: float) -> list[dict]:
    """Pure: keep the rows of :func:`records.last_loaded` whose (store, task) is scheduled, add a row (``kind``
    None, age None) for every scheduled pair that never completed, and set ``stale``: age above
    ``stale_after_seconds`` (s), or never completed."""
    by_key = {(r["site_id"], r["task"]): dict(r) for r in rows}
    out = []
    for site in schedule.stores(r["site_id"] for r in rows):
        for code in schedule.tasks_of(site):
            row = by_key.get((site, code)) or {"site_id": site, "task": code, "kind": None, "fresh_until": None,
                                               "age_seconds": None, "owed_details": 0, "max_attempts": None}
            age = row.get("age_seconds")
            row["age_seconds"] = float(age) if age is not None else None
            row["stale"] = row["age_seconds"] is None or row["age_seconds"] > stale_after_seconds
            out.append(row)
    out.sort(key=lambda r: (r["site_id"], r["task"]))
    return out


def freshness_report(conn: psycopg.Connection, connector: str, schedule: Schedule, hours: float) -> dict[str, Any]:
    """What ``freshness --json`` prints and ``GET /api/freshness`` answers: ``{connector, stale_after_hours,
    schedule, rows, stale}`` (``stale``: how many rows are stale)."""
    rows = freshness_rows(conn, connector, schedule, hours * 3600.0)
    return {"connector": connector, "stale_after_hours": hours, "schedule": schedule.source, "rows": rows,
            "stale": sum(1 for r in rows if r["stale"])}
