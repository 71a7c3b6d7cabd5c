"""Reconciliation of every listing against its ``total`` (issue 25 parts 1, 2, 3 and 5).

A *listing* is one window segment or one snapshot of one task and store, paged from page 1. The upstream is
trusted with no single answer: every listing is compared with the ``total`` its pages reported.

Paging follows ``total`` (:meth:`Reconciler.page`): a page shorter than the limit ends a listing only when the
distinct keys seen reach the (largest) ``total`` — or when the next page would start past it (``page × limit
>= total``: nothing more to ask for). Where ``total`` is null or missing, the short page ends it as before. An
empty page always ends it. The page cap and the repeated-page check stay where they were
(:class:`~feiqiu_etl.tasks.ods.processing.OdsProcessor`).

When a listing ends, it gets a verdict:

=================== =====================================================================================
``ok``              distinct keys = total, pages within what the total implies (``total // limit + 1``)
``refetched``       the first listing was not ``ok``; the listing was fetched again from page 1 in the same
                    run and that one is ``ok``
``short``           fewer distinct keys than the total, also after the refetch (or with no budget left):
                    a processing error of the run (it ends PARTIAL), the window is not checkpointed (a hole
                    ``state show`` names, fetched again by the next run), a snapshot deletes nothing
``over``            more distinct keys than the total, or more pages than it implies: alerted, not blocked
``unexpected_zero`` a window answered 0 rows where at least ``integrity.zero_floor`` are expected: the
                    trailing median of its days (same store, task and weekday, ``zero_weeks`` weeks back;
                    for a window of no whole day, as a nightly one, of the same clock window those weeks
                    back), or the live rows the warehouse already holds inside it (records listed there
                    before), or — with no history at all (a first load) — the contract's lower bound of
                    rows per day over the window. Fetched once more and alerted; the run is not blocked
                    (stores close on holidays) but the window is not checkpointed either: the next run
                    asks again, and a zero that a later run answers too is believed (``ok``) — one glitch
                    never loses a window for good
``incomplete``      the listing never ended (a request failed, the run stopped): the run's errors say why
=================== =====================================================================================

The refetch is budgeted: at most ``integrity.refetch_listings`` extra listings per task and run (connector
YAML ``integrity:``, overridable in the settings). A listing that is ``ok`` the first time costs nothing more.
Thread-safe: pages are reported from processing workers, outcomes read on the writer thread.

What it must never do: ask for a request itself (it only decides), or call a snapshot "trustworthy" merely
because its keys match a total of 0 (:func:`snapshot_trust`, for the deletion guard).
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Hashable, Iterable

import psycopg
from psycopg import sql

OK, REFETCHED, SHORT, OVER, UNEXPECTED_ZERO, INCOMPLETE = (
    "ok", "refetched", "short", "over", "unexpected_zero", "incomplete")
VERDICTS = (OK, REFETCHED, SHORT, OVER, UNEXPECTED_ZERO, INCOMPLETE)
ALERTED = frozenset({SHORT, OVER, UNEXPECTED_ZERO})
"""Verdicts an alert rule raises (``alerts.rules``)."""
BLOCKING = frozenset({SHORT})
"""Verdicts that fail the listing: the run ends PARTIAL and the window stays a hole."""

MORE, END, REFETCH = "more", "end", "refetch"


@dataclass(frozen=True)
class IntegrityRules:
    """``integrity.*`` of the connector YAML (and settings): refetch budget per task and run, the zero floor
    (rows a day must usually have for 0 rows to be unexpected) and how many weeks the trailing median reads."""

    refetch_listings: int = 2
    zero_floor: int = 20
    zero_weeks: int = 4
    max_delete_share: float = 0.2
    max_delete_rows: int = 5


@dataclass
class _Attempt:
    totals: list = field(default_factory=list)  # distinct int totals, in the order the pages reported them
    first_total: Any = None
    pages: int = 0
    rows: int = 0
    keys: set = field(default_factory=set)

    @property
    def total(self) -> int | None:
        return max(self.totals) if self.totals else None


@dataclass
class ListingOutcome:
    """One listing's record (a row of ``etl_meta.listing_reconcile``): ``kind`` ``snapshot``/``window``, the
    window (naive Shanghai, None for a snapshot), page 1's total and every other total reported, pages, rows
    received and distinct keys (all listings of it together; ``listings`` 2 after a refetch), the rows expected
    for the day(s) (trailing median, None if unknown), the ODS outcome and the verdict with its reason."""

    kind: str
    window_start: datetime | None = None
    window_end: datetime | None = None
    first_total: int | None = None
    totals_moved: list = field(default_factory=list)
    pages: int = 0
    rows_received: int = 0
    distinct_keys: int = 0
    listings: int = 1
    expected_rows: float | None = None
    ods_inserted: int = 0
    ods_updated: int = 0
    ods_unchanged: int = 0
    ods_soft_deleted: int = 0
    verdict: str = INCOMPLETE
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "window": [_fmt(self.window_start), _fmt(self.window_end)]
                if self.window_start else None, "first_total": self.first_total, "totals_moved": self.totals_moved,
                "pages": self.pages, "rows": self.rows_received, "distinct_keys": self.distinct_keys,
                "listings": self.listings, "expected_rows": self.expected_rows,
                "ods": {"inserted": self.ods_inserted, "updated": self.ods_updated,
                        "unchanged": self.ods_unchanged, "soft_deleted": self.ods_soft_deleted},
                "verdict": self.verdict, "reason": self.reason}


def _fmt(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else None


def judge(attempt: _Attempt, limit: int | None, expected: float | None, floor: int,
          second_opinion: str | None = None, basis: str = "the trailing median is") -> tuple[str, str | None]:
    """The verdict of one listing as fetched (no refetch considered) and why: ``(verdict, reason)``.
    ``second_opinion``: an earlier run that already answered 0 for this window — a zero twice, from runs at
    different times, is believed (a store closed for a holiday)."""
    total, distinct = attempt.total, len(attempt.keys)
    if attempt.rows == 0 and expected is not None and expected >= floor:
        if second_opinion is not None:
            return OK, f"0 rows, as run {second_opinion} answered for this window: believed"
        return UNEXPECTED_ZERO, f"0 rows where {basis} {expected:g} (floor {floor})"
    if total is None:
        return OK, None  # no total to reconcile with: the short page ended it (as before issue 25)
    moved = f" (totals reported: {', '.join(map(str, attempt.totals))})" if len(attempt.totals) > 1 else ""
    if distinct < total:
        return SHORT, f"{distinct} distinct keys of total {total}{moved}"
    implied = total // limit + 1 if limit else None
    if distinct > total:
        return OVER, f"{distinct} distinct keys but total is {total}{moved}"
    if implied is not None and attempt.pages > implied:
        return OVER, f"{attempt.pages} pages where total {total} implies at most {implied}"
    return OK, None


class Reconciler:
    """The listings of one task and store in one run (module docstring). ``limit`` is the page size,
    ``expected`` the trailing median of rows per window scope (see :func:`trailing_expectations`)."""

    def __init__(self, rules: IntegrityRules, limit: int | None, expected: dict | None = None,
                 zero_before: dict | None = None):
        self.rules = rules
        self.limit = limit
        self.expected = dict(expected or {})
        self.zero_before = dict(zero_before or {})
        """Per window scope, the run that already judged a window overlapping it ``unexpected_zero``."""
        self.basis: dict = {}
        """Per window scope, what its expectation is, when not the trailing median (reason texts)."""
        self.refetches = 0
        self.recorded: list[ListingOutcome] = []
        """The outcomes recorded so far (``etl_meta.listing_reconcile`` rows of this task), in order."""
        self._attempts: dict[Hashable, list[_Attempt]] = {}
        self._final: dict[Hashable, tuple[str, str | None]] = {}
        self._distinct: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def page(self, scope: Hashable, attempt: int, page: int, total: Any, keys: Iterable[tuple], rows: int,
             short: bool) -> str:
        """Record one page of ``scope``'s listing number ``attempt`` (1, then 2 after a refetch) and decide:
        :data:`MORE` (ask the next page), :data:`END` (the listing is done; its verdict is final) or
        :data:`REFETCH` (fetch the listing again from page 1, as listing ``attempt + 1``)."""
        with self._lock:
            attempts = self._attempts.setdefault(scope, [])
            while len(attempts) < attempt:
                attempts.append(_Attempt())
            current = attempts[attempt - 1]
            if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
                if current.pages == 0:
                    current.first_total = total
                if total not in current.totals:
                    current.totals.append(total)
            current.pages += 1
            current.rows += rows
            current.keys.update(keys)
            if rows and not short:
                return MORE
            total_now = current.total
            if rows and total_now is not None and len(current.keys) < total_now and self.limit \
                    and page * self.limit < total_now:
                return MORE  # short, but the total says records are still to come
            expected, floor = self.expected.get(scope), self.rules.zero_floor
            # an earlier run's zero for this window is a second opinion only once this run asked twice too
            # (or may not ask again): a glitch has to strike three listings in two runs to be believed
            last_try = attempt > 1 or self.refetches >= self.rules.refetch_listings
            verdict, reason = judge(current, self.limit, expected, floor,
                                    self.zero_before.get(scope) if last_try else None,
                                    self.basis.get(scope, "the trailing median is"))
            if verdict != OK and attempt == 1 and self.refetches < self.rules.refetch_listings:
                self.refetches += 1
                return REFETCH
            if verdict == OK and attempt > 1 and reason is None:  # a believed zero keeps its reason: ok
                first = judge(attempts[0], self.limit, expected, floor, None,
                              self.basis.get(scope, "the trailing median is"))[1]
                verdict, reason = REFETCHED, f"listing 1: {first}"
            elif verdict != OK and attempt == 1 and self.refetches >= self.rules.refetch_listings:
                reason = f"{reason}; no refetch left ({self.rules.refetch_listings} per task and run)"
            elif verdict != OK:
                reason = f"{reason}, also after a refetch"
            self._final[scope] = (verdict, reason)
            self._distinct[scope] = len(set().union(*(a.keys for a in attempts)))
            for a in attempts:  # a long first load holds no key set per finished listing
                a.keys = set()
            return END

    def verdict(self, scope: Hashable) -> tuple[str, str | None]:
        """``(verdict, reason)`` of a listing; :data:`INCOMPLETE` if it never ended."""
        with self._lock:
            return self._final.get(scope, (INCOMPLETE, "the listing did not end (see the run's errors)"))

    def outcome(self, scope: Hashable) -> ListingOutcome:
        """The record of ``scope`` as far as the pages go (the ODS counts are the caller's)."""
        kind = "snapshot" if scope[0] == "snapshot" else "window"
        start, end = (scope[3], scope[4]) if kind == "window" else (None, None)
        verdict, reason = self.verdict(scope)
        with self._lock:
            attempts = list(self._attempts.get(scope, []))
        first = attempts[0].first_total if attempts else None
        moved = sorted({t for a in attempts for t in a.totals} - ({first} if first is not None else set()))
        with self._lock:
            distinct = self._distinct.get(scope)
            if distinct is None:
                distinct = len(set().union(*(a.keys for a in attempts))) if attempts else 0
        return ListingOutcome(kind, start, end, first, moved, sum(a.pages for a in attempts),
                              sum(a.rows for a in attempts), distinct, max(1, len(attempts)),
                              self.expected.get(scope), verdict=verdict, reason=reason)


def snapshot_trust(outcome: ListingOutcome, live_rows: int | None = None) -> str | None:
    """Why a snapshot listing must not drive a soft delete, or None when it may: hook of the deletion guard
    (issue 25 part 4). Not trustworthy: a verdict other than ``ok``/``refetched``; a snapshot that answered
    total 0 with no rows while the store holds live rows (``live_rows``; unknown counts as holding some) — the
    glitch that once soft-deleted every member: 0 keys "match" ``total: 0``, so reconciliation alone says ok."""
    if outcome.verdict not in (OK, REFETCHED):
        return f"snapshot verdict {outcome.verdict}: {outcome.reason}"
    if outcome.distinct_keys == 0 and (live_rows is None or live_rows > 0):
        held = "live rows" if live_rows is None else f"{live_rows} live row(s)"
        return f"the snapshot answered total {outcome.first_total} and no rows while the store holds {held}"
    return None


# ----------------------------------------------------------------------------------------- trailing medians
def full_days(start: datetime, end: datetime) -> list[datetime]:
    """Midnights of the days that ``[start, end)`` covers whole (naive times)."""
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    if day < start:
        day += timedelta(days=1)
    days = []
    while day + timedelta(days=1) <= end:
        days.append(day)
        day += timedelta(days=1)
    return days


def expected_rows(days: list[datetime], counts: dict, first_day: datetime | None, weeks: int) -> float | None:
    """The largest trailing median among ``days``: per day the median of the rows of the same weekday
    ``1..weeks`` weeks before (``counts``: midnight -> rows; days before ``first_day``, the store's first row,
    are not counted as zeros). None without two samples for any day."""
    best = None
    for day in days:
        samples = [counts.get(day - timedelta(weeks=k), 0) for k in range(1, weeks + 1)
                   if first_day is not None and day - timedelta(weeks=k) >= first_day]
        if len(samples) >= 2:
            median = float(statistics.median(samples))
            best = median if best is None else max(best, median)
    return best


def shifted_median(counts: dict[int, int], first_ok: dict[int, bool], weeks: int) -> float | None:
    """The median of a window's rows ``k`` weeks back (``counts``: k -> rows; ``first_ok``: whether the store
    had its first row by then, else that week does not count as a zero), ``k`` = 1..``weeks``. None without two
    samples."""
    samples = [counts.get(k, 0) for k in range(1, weeks + 1) if first_ok.get(k)]
    return float(statistics.median(samples)) if len(samples) >= 2 else None


def trailing_expectations(conn: psycopg.Connection, table: str, column: str, site_id: int,
                          scopes: list[tuple], weeks: int) -> dict:
    """Per window scope (``("segment", code, site, start, end)``, naive Shanghai) the rows expected, from the
    ODS table's own rows (no request): for a scope that covers whole days, :func:`expected_rows` of those days;
    for one that covers none (a nightly window from yesterday's high-water mark to now, 24 h that straddle two
    midnights), the median of the rows of the same clock window 1..``weeks`` weeks back (:func:`shifted_median`),
    so a night that answers 0 where that window usually has rows is judged too."""
    wanted = {scope: full_days(scope[3], scope[4]) for scope in scopes}
    out = _shifted_expectations(conn, table, column, site_id, [s for s, ds in wanted.items() if not ds], weeks)
    days = [d for ds in wanted.values() for d in ds]
    if not days:
        return out
    schema, name = table.split(".", 1)
    low, high = min(days) - timedelta(weeks=weeks), max(days)
    rows = conn.execute(sql.SQL(
        "SELECT (t.{c} AT TIME ZONE 'Asia/Shanghai')::date, count(*) FROM {t} t WHERE t.site_id = %s "
        "AND t.{c} >= (%s::timestamp AT TIME ZONE 'Asia/Shanghai') AND t.{c} < (%s::timestamp AT TIME ZONE "
        "'Asia/Shanghai') GROUP BY 1").format(t=sql.Identifier(schema, name), c=sql.Identifier(column)),
        (site_id, low, high)).fetchall()
    first = conn.execute(sql.SQL("SELECT (min(t.{c}) AT TIME ZONE 'Asia/Shanghai')::date FROM {t} t "
                                 "WHERE t.site_id = %s").format(t=sql.Identifier(schema, name),
                                                                c=sql.Identifier(column)), (site_id,)).fetchone()[0]
    conn.commit()
    counts = {datetime(d.year, d.month, d.day): n for d, n in rows}
    first_day = datetime(first.year, first.month, first.day) if first is not None else None
    for scope, ds in wanted.items():
        if not ds:
            continue
        value = expected_rows(ds, counts, first_day, weeks)
        if value is not None:
            out[scope] = value
    return out


def _shifted_expectations(conn: psycopg.Connection, table: str, column: str, site_id: int, scopes: list[tuple],
                          weeks: int) -> dict:
    """:func:`shifted_median` of each scope (one query per scope, bounded by the table's index on the window
    column); scopes without two weeks of history are left out."""
    if not scopes:
        return {}
    schema, name = table.split(".", 1)
    t, c = sql.Identifier(schema, name), sql.Identifier(column)
    first = conn.execute(sql.SQL("SELECT min(t.{c}) AT TIME ZONE 'Asia/Shanghai' FROM {t} t WHERE t.site_id = %s")
                         .format(t=t, c=c), (site_id,)).fetchone()[0]
    out = {}
    if first is not None:
        query = sql.SQL(
            "SELECT k, (SELECT count(*) FROM {t} t WHERE t.site_id = %s "
            "AND t.{c} >= ((%s::timestamp - make_interval(weeks => k)) AT TIME ZONE 'Asia/Shanghai') "
            "AND t.{c} < ((%s::timestamp - make_interval(weeks => k)) AT TIME ZONE 'Asia/Shanghai')) "
            "FROM generate_series(1, %s) AS k").format(t=t, c=c)
        for scope in scopes:
            start, end = scope[3], scope[4]
            counts = dict(conn.execute(query, (site_id, start, end, weeks)).fetchall())
            first_ok = {k: start - timedelta(weeks=k) >= first.replace(hour=0, minute=0, second=0, microsecond=0)
                        for k in range(1, weeks + 1)}
            value = shifted_median(counts, first_ok, weeks)
            if value is not None:
                out[scope] = value
    conn.commit()
    return out


def held_rows(conn: psycopg.Connection, table: str, column: str, site_id: int, scopes: list[tuple]) -> dict:
    """Per window scope the live rows the ODS table already holds inside it (records listed there before: a
    window that now answers 0 contradicts them). One query per scope; scopes holding none are left out."""
    schema, name = table.split(".", 1)
    query = sql.SQL("SELECT count(*) FROM {t} t WHERE t.site_id = %s AND NOT t.is_deleted "
                    "AND t.{c} >= (%s::timestamp AT TIME ZONE 'Asia/Shanghai') "
                    "AND t.{c} < (%s::timestamp AT TIME ZONE 'Asia/Shanghai')").format(
        t=sql.Identifier(schema, name), c=sql.Identifier(column))
    out = {}
    for scope in scopes:
        n = conn.execute(query, (site_id, scope[3], scope[4])).fetchone()[0]
        if n:
            out[scope] = n
    conn.commit()
    return out


def zeros_before(conn: psycopg.Connection, connector: str, task_code: str, site_id: int, run_id: str,
                 scopes: list[tuple]) -> dict:
    """Per window scope the latest other run whose listing of a window overlapping it was ``unexpected_zero``
    (``etl_meta.listing_reconcile``): this run's answer is the second opinion."""
    out = {}
    for scope in scopes:
        row = conn.execute(
            "SELECT run_id FROM etl_meta.listing_reconcile WHERE connector = %s AND task_code = %s AND site_id = %s "
            "AND run_id <> %s AND verdict = %s AND window_start < (%s::timestamp AT TIME ZONE 'Asia/Shanghai') "
            "AND window_end > (%s::timestamp AT TIME ZONE 'Asia/Shanghai') ORDER BY recorded_at DESC LIMIT 1",
            (connector, task_code, site_id, run_id, UNEXPECTED_ZERO, scope[4], scope[3])).fetchone()
        if row:
            out[scope] = row[0]
    conn.commit()
    return out


# ----------------------------------------------------------------------------------------- the record
def record(conn: psycopg.Connection, *, run_id: str, connector: str, task_code: str, site_id: int,
           outcome: ListingOutcome) -> None:
    """Insert one row into ``etl_meta.listing_reconcile`` (warehouse-model.md §4; the caller commits)."""
    from feiqiu_etl.connector.windows import to_aware

    conn.execute(
        "INSERT INTO etl_meta.listing_reconcile (run_id, connector, site_id, task_code, kind, window_start, "
        "window_end, first_total, totals_moved, pages, rows_received, distinct_keys, listings, expected_rows, "
        "ods_inserted, ods_updated, ods_unchanged, ods_soft_deleted, verdict, reason) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (run_id, connector, site_id, task_code, outcome.kind,
         to_aware(outcome.window_start) if outcome.window_start else None,
         to_aware(outcome.window_end) if outcome.window_end else None, outcome.first_total,
         outcome.totals_moved, outcome.pages, outcome.rows_received, outcome.distinct_keys, outcome.listings,
         outcome.expected_rows, outcome.ods_inserted, outcome.ods_updated, outcome.ods_unchanged,
         outcome.ods_soft_deleted, outcome.verdict, outcome.reason))


def summary(outcomes: list[ListingOutcome], refetches: int, budget: int) -> dict:
    """What a task's result carries (``TaskRun.reconcile``): verdict counts, the refetches used of the budget
    and every listing that was not ``ok`` the first time."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    return {"verdicts": counts, "refetches": refetches, "budget": budget,
            "listings": [o.to_dict() for o in outcomes if o.verdict != OK]}
