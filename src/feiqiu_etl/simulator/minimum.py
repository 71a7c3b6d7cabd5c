"""Ground truth for "how many requests does this data need": the minimum a perfect connector sends, and what changed.

What it is for: comparing what a connector sent (the request log) with what the data needed, per store and task, over
a time range ``[start, end)`` between two states of the simulated data (``before``: what a connector that had loaded
everything up to ``start`` knows, empty for a first load; ``after``: the data at ``end``). The minimum is:

* **list pages** at ``limit`` (200, the API's maximum, upstream-api.md §1.3) — a windowed list read once over
  ``[start, end)`` in segments of at most 31 days (§1.2), a snapshot read once. A list ends at the first short page,
  so ``n`` records take ``n // limit + 1`` pages (an exact multiple needs one empty page more);
* plus **one detail per new or changed parent** (§5.1) in that scope, where a parent whose only change is in its
  volatile field (Q11: ``member.points`` …) needs none — unless a record its detail holds changed
  (``DETAIL_DUE_WHEN``: a member whose card is new, changed or deleted needs its detail, which holds the card's
  balance and ``lastUseTime``; issue 25 part 6). A deleted parent needs none either.

It is a lower bound, not a recipe: a change that keeps its window field (Q13) before ``start`` is not in the new
window, and a connector finds it only with a look-back, which the minimum does not count.

:func:`classify` is the diff both this and ``Dataset.advance_trading``'s summary use. What it must never do: read the
live data itself (callers pass the tables, under the dataset's lock), or mutate a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from feiqiu_etl.simulator.catalog import DETAIL_BY_PARENT, DETAIL_DUE_WHEN, LIST_ENDPOINTS, VOLATILE_FIELDS, ListEndpoint
from feiqiu_etl.simulator.params import MAX_LIMIT, MAX_WINDOW
from feiqiu_etl.simulator.state import Record
from feiqiu_etl.simulator.values import fmt_time

Table = Mapping[Any, Record]
"""One task's records of one store, by primary key."""


@dataclass(frozen=True)
class Changes:
    """How one task's records differ between two states (primary keys, sorted)."""

    inserted: tuple = ()
    updated: tuple = ()
    volatile_only: tuple = ()
    deleted: tuple = ()

    def counts(self) -> dict[str, int]:
        """``{"inserted", "updated", "volatile_only", "deleted"}`` → how many (``updated`` excludes volatile-only)."""
        return {name: len(getattr(self, name)) for name in ("inserted", "updated", "volatile_only", "deleted")}


def _without(record: Record, field: str | None) -> Record:
    return {k: v for k, v in record.items() if k != field} if field else record


def classify(task_code: str, before: Table, after: Table, keys=None) -> Changes:
    """The difference of ``after`` from ``before`` for the records ``keys`` of ``after`` (default: all of them;
    deletions are always over all of ``before``). A changed record is ``volatile_only`` when it equals its old self
    without the task's Q11 volatile field."""
    volatile = VOLATILE_FIELDS.get(task_code)
    inserted, updated, only = [], [], []
    for pk in sorted(after if keys is None else keys):
        old, new = before.get(pk), after[pk]
        if old is None:
            inserted.append(pk)
        elif old != new:
            (only if _without(old, volatile) == _without(new, volatile) else updated).append(pk)
    deleted = sorted(pk for pk in before if pk not in after)
    return Changes(tuple(inserted), tuple(updated), tuple(only), tuple(deleted))


@dataclass(frozen=True)
class TaskMinimum:
    """The minimum of one task over ``[start, end)``: ``rows`` list records in scope read in ``pages`` pages
    (``segments`` window segments, 1 for a snapshot), ``details`` new or changed parents, ``volatile_only`` parents
    changed only in volatile fields (no detail needed). ``requests`` = ``pages + details``."""

    task_code: str
    kind: str
    rows: int
    segments: int
    pages: int
    details: int
    volatile_only: int

    @property
    def requests(self) -> int:
        return self.pages + self.details


@dataclass(frozen=True)
class RequestMinimum:
    """The minimum requests a perfect connector needs for one store over ``[start, end)`` (module docstring)."""

    site_id: int
    start: datetime
    end: datetime
    limit: int
    first_load: bool
    tasks: tuple[TaskMinimum, ...]

    @property
    def requests(self) -> int:
        return sum(t.requests for t in self.tasks)

    def task(self, task_code: str) -> TaskMinimum:
        return next(t for t in self.tasks if t.task_code == task_code)

    def to_json(self) -> dict[str, Any]:
        return {"siteId": self.site_id, "startTime": fmt_time(self.start), "endTime": fmt_time(self.end),
                "limit": self.limit, "firstLoad": self.first_load, "requests": self.requests,
                "tasks": [{**asdict(t), "requests": t.requests} for t in self.tasks]}


def pages(rows: int, limit: int = MAX_LIMIT) -> int:
    """Pages to read ``rows`` records: the list ends at the first page shorter than ``limit`` (§1.3)."""
    return rows // limit + 1


def segments(start: datetime, end: datetime) -> list[tuple[str, str]]:
    """``[start, end)`` as contiguous windows of at most 31 days (§1.2), as API time strings."""
    out, cursor = [], start
    while cursor < end:
        nxt = min(cursor + MAX_WINDOW, end)
        out.append((fmt_time(cursor), fmt_time(nxt)))
        cursor = nxt
    return out


def minimum_requests(site_id: int, before: Mapping[str, Table], after: Mapping[str, Table], start: datetime,
                     end: datetime, limit: int = MAX_LIMIT, first_load: bool = False) -> RequestMinimum:
    """The minimum over ``[start, end)`` from the task tables ``before`` (empty for a first load) and ``after``.

    Raises ``ValueError`` for ``end <= start`` or a ``limit`` outside 1..200.
    """
    if end <= start:
        raise ValueError("the range must end after it starts")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    out = []
    for endpoint in LIST_ENDPOINTS:
        table = after.get(endpoint.task_code, {})
        in_scope, n_pages, n_segments = _scope(endpoint, table, start, end, limit)
        details = volatile = 0
        if endpoint.task_code in DETAIL_BY_PARENT:
            changes = classify(endpoint.task_code, before.get(endpoint.task_code, {}), table, in_scope)
            due = set(changes.inserted) | set(changes.updated)
            only = set(changes.volatile_only)
            held = _parents_of_changed(endpoint.task_code, before, after) & set(in_scope)
            due |= held
            details, volatile = len(due), len(only - held)
        out.append(TaskMinimum(endpoint.task_code, endpoint.kind.value, len(in_scope), n_segments, n_pages, details,
                               volatile))
    return RequestMinimum(site_id, start, end, limit, first_load, tuple(out))


def _parents_of_changed(task_code: str, before: Mapping[str, Table], after: Mapping[str, Table]) -> set:
    """Keys of the ``task_code`` parents whose detail is due because a child record it holds is new, changed or
    deleted (``DETAIL_DUE_WHEN``)."""
    out: set = set()
    for child, field in DETAIL_DUE_WHEN.get(task_code, ()):
        old, new = before.get(child, {}), after.get(child, {})
        changes = classify(child, old, new)
        for pk in (*changes.inserted, *changes.updated, *changes.volatile_only):
            out.add(new[pk][field])
        for pk in changes.deleted:
            out.add(old[pk][field])
    return out


def _scope(endpoint: ListEndpoint, table: Table, start: datetime, end: datetime,
           limit: int) -> tuple[list, int, int]:
    """(keys in scope, pages, segments) of one task."""
    if not endpoint.windowed:
        return list(table), pages(len(table), limit), 1
    keys, total = [], 0
    windows = segments(start, end)
    for lo, hi in windows:
        mine = [pk for pk, r in table.items() if r[endpoint.window_field] and lo <= r[endpoint.window_field] < hi]
        keys.extend(mine)
        total += pages(len(mine), limit)
    return keys, total, len(windows)


__all__ = ["Changes", "RequestMinimum", "TaskMinimum", "classify", "minimum_requests", "pages", "segments"]

