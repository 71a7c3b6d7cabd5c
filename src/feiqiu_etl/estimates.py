"""How many requests a task will send: before the run (:func:`plan_estimate`) and while it runs
(:func:`live_estimate`). Lane time is requests × gap, so these numbers are what a plan and an ETA are made of.

Before a run, in this order (ENGINE-NOTES "The night"):

1. **the last runs of the same task and store** (``basis="history"``): list rows per day of window (windowed) or
   pages (snapshot); details per list row as the runs so far asked for them, applied to the rows of the window
   that was never loaded (windowed) or, for a snapshot, as the last run that was not a first load did (a first
   load fetches a detail for every parent, a night only for the new and changed ones);
2. without history, **the size ``feiqiu-etl check`` measured** (``basis="check"``, ``etl_meta.store_size``): page
   1's ``total`` of the list — the records of a snapshot, or of the window it counted (records per day for the
   windows to load); on a first load one detail per row;
3. else **the contract's documented volumes** (``basis="contract"``, upstream-api.md §4.1 "Volume",
   the connector's ``expected_rows`` / ``expected_daily_rows``): the lower bound of the range, the size of a
   store the contract promises at least; on a first load every parent is new, so one detail per row;
4. else one page per window segment or snapshot, details unknown (``basis="catalog"``).

Details still owed by earlier runs come on top. While a task runs, page 1 of each window (or of the snapshot)
tells its ``total``: the list needs exactly ``total // limit + 1`` pages (it ends at the first short page,
upstream-api.md §1.3), and its rows the details to expect (:func:`live_estimate`).

Pure: no I/O, no clock. Below both the plan (which estimates) and the tasks (which re-estimate while they
run): neither imports the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Mapping, Sequence

from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import Window, parse_local, subtract
from feiqiu_etl.pipeline.config import PipelineConfig

DAY_SECONDS = 86400.0


@dataclass(frozen=True)
class Estimate:
    """Expected requests of a task (list pages + details, re-checks included) and lane seconds; ``basis``
    says where it came from (``"history"``: the last runs of this task and store; ``"contract"``: the
    documented volumes, upstream-api.md §4.1; ``"check"``: the size ``feiqiu-etl check`` measured; ``"catalog"``: one page per window segment or snapshot, details
    unknown; ``"live"``: re-estimated from the first pages of a running task). ``rows``: list records
    expected. See this module."""

    list_requests: int = 0
    detail_requests: int = 0
    seconds: float = 0.0
    basis: str = "catalog"
    rows: int = 0

    @property
    def requests(self) -> int:
        return self.list_requests + self.detail_requests


def pages_for(rows: float, limit: int) -> int:
    """Pages a list of ``rows`` records takes at ``limit`` per page: it ends at the first page shorter than
    ``limit`` (upstream-api.md §1.3), so an exact multiple needs one empty page more."""
    return int(max(0.0, rows) // limit) + 1


def plan_estimate(spec: OdsTaskSpec, cfg: PipelineConfig, windows: Sequence[Window], runs: Sequence[Mapping[str, Any]],
                  owed: int, request_seconds: float, done: Sequence[Window] = (), measured: Any = None) -> Estimate:
    """Requests and lane seconds of one task (see the module docstring). ``runs`` are the task entries of
    the last finished runs of this task and store, newest first (``TaskRun.to_dict()``); ``done`` its finished
    window segments (their rows were fetched: no new parents there); ``owed`` the details still owed;
    ``request_seconds`` how long a request holds the lane besides its gap; ``measured`` the store's measured size
    (:class:`~feiqiu_etl.registry.sizes.MeasuredSize`) or None."""
    owed = owed if spec.detail else 0
    segments = len(windows) if spec.kind == "windowed" else 1
    if runs:
        pages, rows, details = _from_history(spec, windows, done, runs)
        basis = "history"
    elif measured is not None and (spec.kind != "windowed" or measured.days):
        pages, rows, details = _from_measured(spec, windows, measured)
        basis = "check"
    elif spec.expected_rows or spec.expected_daily_rows:
        pages, rows, details = _from_contract(spec, windows)
        basis = "contract"
    else:
        pages, rows, details, basis = segments, 0, 0, "catalog"
    details = details + owed if spec.detail else 0
    return Estimate(pages, details, (pages + details) * (cfg.gap.mean + request_seconds), basis, rows=rows)


def _from_contract(spec: OdsTaskSpec, windows: Sequence[Window]) -> tuple[int, int, int]:
    """Pages, rows and (first-load) details at the lower bound of the documented volume."""
    if spec.kind == "windowed":
        per_day = spec.expected_daily_rows[0] if spec.expected_daily_rows else 0
        per_window = [per_day * w.length.total_seconds() / DAY_SECONDS for w in windows]
        pages = sum(pages_for(r, spec.page_size) for r in per_window)
        rows = round(sum(per_window))
    else:
        rows = spec.expected_rows[0] if spec.expected_rows else 0
        pages = pages_for(rows, spec.page_size)
    return pages, rows, rows if spec.detail else 0


def _from_measured(spec: OdsTaskSpec, windows: Sequence[Window], measured: Any) -> tuple[int, int, int]:
    """Pages, rows and (first-load) details from the measured ``total`` (a windowed list's per day of the window
    it counted, spread over ``windows``)."""
    if spec.kind == "windowed":
        per_day = measured.total / measured.days
        per_window = [per_day * w.length.total_seconds() / DAY_SECONDS for w in windows]
        pages = sum(pages_for(r, spec.page_size) for r in per_window)
        rows = round(sum(per_window))
    else:
        rows = measured.total
        pages = pages_for(rows, spec.page_size)
    return pages, rows, rows if spec.detail else 0


def _from_history(spec: OdsTaskSpec, windows: Sequence[Window], done: Sequence[Window],
                  runs: Sequence[Mapping[str, Any]]) -> tuple[int, int, int]:
    last = runs[0]
    detail_sent = _detail_requests(last)
    list_requests = max(1, int(last.get("total_requests", 0)) - detail_sent)
    list_rows = _list_rows(last)
    if spec.kind == "windowed":
        days = _days(last.get("windows") or [])
        per_day = list_rows / days if days > 0 else 0.0
        per_window = [per_day * w.length.total_seconds() / DAY_SECONDS for w in windows]
        pages = sum(pages_for(r, spec.page_size) for r in per_window)
        rows = round(sum(per_window))
    else:
        pages, rows = list_requests, list_rows
    if spec.detail is None:
        return pages, rows, 0
    if spec.kind == "windowed":
        # a window's rows are new where it was not loaded before: one detail each (or as many per row as
        # the runs so far asked for, reopened records included); re-read rows were fetched already
        fresh = sum((w.length - _covered(w, done)).total_seconds() for w in windows) / DAY_SECONDS
        per_row = max((_new_details(r) / _list_rows(r) for r in runs if _list_rows(r) > 0), default=0.0)
        return pages, rows, round(per_row * per_day * fresh)
    # a snapshot: every parent is known after its first load; a night asks for the changed ones
    steady = next((r for r in runs if not r.get("first_load", False) and _list_rows(r) > 0), None)
    per_row = _new_details(steady) / _list_rows(steady) if steady is not None else 0.0
    return pages, rows, round(per_row * rows)


def _covered(window: Window, done: Sequence[Window]) -> timedelta:
    """How much of ``window`` the finished segments ``done`` cover."""
    return window.length - sum((gap.length for gap in subtract(window, list(done))), timedelta(0))


def _list_rows(entry: Mapping[str, Any]) -> int:
    return int(entry.get("total_fetched", 0)) - int(entry.get("detail_fetched", 0))


def _detail_requests(entry: Mapping[str, Any]) -> int:
    return int(entry.get("detail_success", 0)) + int(entry.get("detail_failure", 0))


def _new_details(entry: Mapping[str, Any]) -> int:
    """Detail requests of a run for new or changed parents: without the owed ones and the re-checks."""
    recheck = entry.get("recheck") or {}
    return max(0, _detail_requests(entry) - int(entry.get("owed_details", 0)) - int(recheck.get("used", 0)))


def _days(windows: list) -> float:
    total = 0.0
    for start, end in windows:
        try:
            total += (parse_local(end) - parse_local(start)).total_seconds() / DAY_SECONDS
        except (TypeError, ValueError):
            continue
    return total


@dataclass(frozen=True)
class ListProgress:
    """What a running task has learnt about its lists (``OdsProcessor.progress()`` plus the writer's counts).

    ``scopes_seen`` of the planned ``scopes`` (window segments, or 1 snapshot) answered their first page; those
    need ``pages_needed`` pages for ``rows_expected`` records in all. ``parents_written`` list rows of a task
    with details reached the writer, for which ``new_details`` detail requests were created (new or changed
    parents); ``owed`` and ``rechecks`` are the other details of the run."""

    scopes: int
    scopes_seen: int = 0
    pages_needed: int = 0
    rows_expected: int = 0
    parents_written: int = 0
    new_details: int = 0
    owed: int = 0
    rechecks: int = 0


def live_estimate(planned: Estimate, progress: ListProgress, *, has_detail: bool) -> Estimate:
    """The task's requests re-estimated from what its first pages said (module docstring): exact pages for
    every list whose page 1 answered, the plan's share for the others; details per row as observed so far
    (every row of a first load is new), else as planned. ``seconds`` scales with the requests."""
    unseen = max(0, progress.scopes - progress.scopes_seen)
    share = unseen / progress.scopes if progress.scopes else 0.0
    pages = progress.pages_needed + round(planned.list_requests * share)
    if not has_detail:
        details = 0
    else:
        rows = progress.rows_expected + round(planned.rows * share)
        if progress.parents_written > 0:
            new = math.ceil(progress.new_details / progress.parents_written * rows)
        else:
            new = max(0, planned.detail_requests - progress.owed - progress.rechecks)
        details = max(new, progress.new_details) + progress.owed + progress.rechecks
    per_request = planned.seconds / planned.requests if planned.requests else 0.0
    return replace(planned, list_requests=pages, detail_requests=details, seconds=(pages + details) * per_request,
                   rows=progress.rows_expected + round(planned.rows * share), basis="live")
