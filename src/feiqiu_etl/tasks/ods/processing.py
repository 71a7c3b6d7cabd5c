"""``process_fn`` for ODS tasks: locate the list in a response, validate and key every record, hash it,
and decide the next page (upstream-api.md §1.3–§1.5). Runs on processing workers: pure CPU, no I/O.

End of data is the first short page; ``page × limit >= total`` alone never stops paging. With a
:class:`~feiqiu_etl.tasks.ods.reconcile.Reconciler` paging follows ``total`` (issue 25): a short page ends a
listing only when the distinct keys reach the total, a listing that ends short (or over) is fetched again from
page 1 within the task's budget, and one still short is a processing error (its scope fails: no checkpoint,
no soft delete). Guards: a page cap (``max_pages``) and a repeated-page check ("loop detected in pagination").
A bad record is a record-level processing failure; the rest of the page continues.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from feiqiu_etl.pipeline.models import PipelineRequest, ProcessOutput, ResponseItem
from feiqiu_etl.tasks.ods.drift import FieldTracker
from feiqiu_etl.tasks.ods.hashing import canonical_row_counted, hash_text
from feiqiu_etl.tasks.ods.reconcile import BLOCKING, END, MORE, REFETCH, Reconciler
from feiqiu_etl.tasks.ods.rows import DetailDone, OdsRow, TableLayout
from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import SHANGHAI, parse_local, to_aware


class ResponseShapeError(ValueError):
    """The list (or its total) is not where the spec says (data_path/list_key)."""


def locate_list(payload: Any, data_path: tuple[str, ...], list_key: str) -> tuple[list, Any]:
    """Walk ``data_path`` from the envelope root and return ``(list, total)``.

    Raises :class:`ResponseShapeError` naming the path when a node or the list is missing or not a list.
    """
    node = payload
    walked: list[str] = []
    for key in data_path:
        walked.append(key)
        if not isinstance(node, dict) or key not in node or not isinstance(node[key], dict):
            raise ResponseShapeError(f"no object at {'.'.join(walked)}")
        node = node[key]
    items = node.get(list_key)
    if not isinstance(items, list):
        raise ResponseShapeError(f"no list at {'.'.join(walked + [list_key])}")
    return items, node.get("total")


@dataclass
class SnapshotState:
    """What one snapshot listing has shown so far (thread-safe); decides whether it is provably complete
    (upstream-api.md §1.5: every page ok, last page short; we also require a stable ``total`` and as
    many distinct keys as that total)."""

    totals: set = field(default_factory=set)
    keys: set = field(default_factory=set)
    short_page_seen: bool = False
    problems: list[str] = field(default_factory=list)
    attempt: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def page(self, total: Any, keys: list[tuple], short: bool, attempt: int = 1) -> None:
        with self._lock:
            if attempt < self.attempt:
                return  # a late page of a listing fetched again since: the new listing alone counts
            self.totals.add(total)
            self.keys.update(keys)
            self.short_page_seen = self.short_page_seen or short

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def restart(self, attempt: int) -> None:
        """The snapshot is fetched again from page 1 (issue 25): only listing ``attempt`` counts from now on
        (problems already seen stay)."""
        with self._lock:
            self.attempt = attempt
            self.totals, self.keys, self.short_page_seen = set(), set(), False

    def incomplete_reason(self) -> str | None:
        """None if complete, else why the soft delete must be skipped."""
        with self._lock:
            if self.problems:
                return self.problems[0]
            if not self.short_page_seen:
                return "the last page was never short"
            if len(self.totals) != 1:
                return f"total moved while paging ({sorted(str(t) for t in self.totals)})"
            total = next(iter(self.totals))
            if not isinstance(total, int) or total != len(self.keys):
                return f"{len(self.keys)} distinct keys seen but total is {total}"
            return None


@dataclass
class PageTotals:
    """Page 1's ``total`` of every listing of a task (thread-safe), for the live estimate
    (:func:`feiqiu_etl.estimates.live_estimate`): a listing needs exactly ``total // limit + 1`` pages."""

    _seen: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def first_page(self, scope: Any, total: Any, limit: int | None) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total < 0 or not limit:
            return
        with self._lock:
            self._seen.setdefault(scope, (total // limit + 1, total))

    def progress(self) -> tuple[int, int, int]:
        """``(listings seen, pages they need, records they hold)``."""
        with self._lock:
            values = list(self._seen.values())
        return len(values), sum(p for p, _ in values), sum(t for _, t in values)


@dataclass
class OdsProcessor:
    """Builds rows and follow-ups for one task and one site. Call it as ``process_fn``."""

    spec: OdsTaskSpec
    site_id: int
    layouts: dict[str, TableLayout]
    max_pages: int
    page_param: str = "page"
    site_field: str = "siteId"
    snapshot: SnapshotState | None = None
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    fields: FieldTracker | None = None  # schema drift: the field names of every page's records
    totals: PageTotals | None = None  # page 1's total of every listing (live estimate)
    reconciler: Reconciler | None = None  # issue 25: paging follows total, refetch, verdicts
    first_page: int = 1  # the page a refetch starts from
    nul_removed: int = 0  # NUL characters removed from upstream text (PostgreSQL cannot store them): issue 28
    _nul_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_nul(self, count: int) -> None:
        """Count ``count`` NUL characters removed from a record (thread-safe: the pipeline's workers share it)."""
        with self._nul_lock:
            self.nul_removed += count

    def __call__(self, item: ResponseItem) -> ProcessOutput:
        if item.request.is_detail:
            return self._detail(item)
        return self._list(item)

    # ----------------------------------------------------------------- list pages
    def _list(self, item: ResponseItem) -> ProcessOutput:
        req = item.request
        try:
            records, total = locate_list(item.payload, self.spec.data_path, self.spec.list_key)
        except ResponseShapeError:
            if self.snapshot is not None:
                self.snapshot.problem("a page had no list")
            raise
        if self.totals is not None and "seen_pages" not in req.context:  # page 1 of its listing
            self.totals.first_page(req.scope, total, req.page_size)
        fetched_at = self.clock()
        layout = self.layouts[self.spec.table]
        out = ProcessOutput(fetched=len(records))
        short = len(records) < (req.page_size or 0)
        # The next page goes to the lane before this page's rows are processed (the lane need not wait for
        # them), when the engine offers ``item.emit`` and the page has a digest (orjson takes it).
        digest = page_digest(records)
        decision = self._reconcile(req, records, total, short, layout)
        nxt: PipelineRequest | str | None = None
        if digest is not None:
            nxt = self._next_page(req, records, short, digest, decision)
            emit = getattr(item, "emit", None)
            if isinstance(nxt, PipelineRequest) and emit is not None:
                emit(nxt)
                nxt = None
        keys, signature = self._page_rows(req, records, layout, fetched_at, out)
        if self.fields is not None:
            self.fields.page(layout.table, records)
        if out.errors and self.snapshot is not None:
            self.snapshot.problem("a record could not be processed")
        attempt = req.context.get("attempt", 1)
        if self.snapshot is not None:
            self.snapshot.page(total, keys, short, attempt)
        if digest is None:
            nxt = self._next_page(req, records, short, hash_text("\n".join(signature)), decision)
        self._after_page(req, out, nxt, decision, attempt)
        return out

    def _page_rows(self, req: PipelineRequest, records: list, layout: TableLayout, fetched_at: datetime,
                   out: ProcessOutput) -> tuple[list[tuple], list[str]]:
        """The page's rows into ``out.rows`` (a bad record into ``out.errors``, counted as ``out.rejected``);
        returns the good rows' keys and the page's signature (a content hash or an error text per record)."""
        keys: list[tuple] = []
        signature: list[str] = []
        wants_detail = self.spec.detail is not None
        for index, record in enumerate(records):
            try:
                row = self._row(record, layout, fetched_at, req.scope, window_field=self.spec.window_field)
            except (ValueError, RecursionError) as exc:
                error = _record_error(req, index, record, exc)
                out.errors.append(error)
                signature.append(error["error"])
                continue
            row.wants_detail = wants_detail
            keys.append(row.keys)
            signature.append(row.content_hash)
            out.rows.append(row)
        out.rejected = len(out.errors)  # bad records (a pagination error below is no record)
        return keys, signature

    def _after_page(self, req: PipelineRequest, out: ProcessOutput, nxt: PipelineRequest | str | None,
                    decision: str | None, attempt: int) -> None:
        """What follows the page, into ``out``: listing ``attempt + 1`` from page 1 (REFETCH), the next page
        ``nxt``, or an error text (``nxt`` a string, or a blocking verdict at the listing's END) that also
        marks the snapshot incomplete."""
        if decision == REFETCH:  # after this page's snapshot bookkeeping: the new listing starts clean
            if self.snapshot is not None:
                self.snapshot.restart(attempt + 1)
            out.follow_ups.append(self._refetch(req, attempt + 1))
        elif decision == END and self.reconciler is not None:
            verdict, reason = self.reconciler.verdict(req.scope)
            if verdict in BLOCKING:
                nxt = f"listing {verdict}: {reason}"
        if isinstance(nxt, str):
            out.errors.append({"error": nxt, "params": dict(req.params)})
            if self.snapshot is not None:
                self.snapshot.problem(nxt)
        elif nxt is not None:
            out.follow_ups.append(nxt)

    def _reconcile(self, req: PipelineRequest, records: list, total: Any, short: bool,
                   layout: TableLayout) -> str | None:
        """The reconciler's decision for this page (None without one): MORE, END or REFETCH."""
        if self.reconciler is None or not isinstance(req.scope, tuple):
            return None
        keys = []
        for record in records:  # the keys only (cheap): the decision goes out before the rows are built
            if isinstance(record, dict):
                try:
                    keys.append(tuple([k.convert(record.get(k.field)) for k in layout.keys]))
                except (ValueError, TypeError):
                    continue  # a bad record: its error comes with the rows
        page = int(req.params.get(self.page_param, 1))
        return self.reconciler.page(req.scope, req.context.get("attempt", 1), page, total, keys, len(records),
                                    short)

    def _refetch(self, req: PipelineRequest, attempt: int) -> PipelineRequest:
        """Page 1 of ``req``'s listing again, as listing number ``attempt`` (a fresh repeated-page memory)."""
        params = dict(req.params)
        params[self.page_param] = self.first_page
        context = {k: v for k, v in req.context.items() if k != "seen_pages"}
        return replace(req, params=params, context={**context, "attempt": attempt, "seen_pages": {}})

    def _next_page(self, req: PipelineRequest, records: list, short: bool, digest: str,
                   decision: str | None = None) -> PipelineRequest | str | None:
        """The next page's request, None at the end of data (first short page; with a reconciler: its
        decision), or an error text for a page that repeats an earlier page of the same listing or exceeds the
        page cap (singer-sdk style)."""
        if decision in (END, REFETCH) or (decision is None and (short or not records)):
            return None
        page = int(req.params.get(self.page_param, 1))
        seen: dict[str, int] = req.context.get("seen_pages") or {}
        if digest in seen:
            return f"loop detected in pagination: page {page} repeats page {seen[digest]}"
        if page >= self.max_pages:
            return f"page cap reached ({self.max_pages} pages); listing stopped"
        seen[digest] = page  # shared by the pages of one listing, which are processed one at a time
        params = dict(req.params)
        params[self.page_param] = page + 1
        return replace(req, params=params, context={**req.context, "seen_pages": seen})

    # ----------------------------------------------------------------- details
    def _detail(self, item: ResponseItem) -> ProcessOutput:
        d = self.spec.detail
        assert d is not None
        req = item.request
        items, _ = locate_list(item.payload, d.data_path, d.list_key)
        fetched_at = self.clock()
        layout = self.layouts[d.target_table]
        parent_value = req.context["parent_value"]
        out = ProcessOutput(fetched=len(items))
        seen: list[tuple] = []
        for index, record in enumerate(items):
            if isinstance(record, dict) and record.get(d.parent.field) in (None, ""):
                record = {**record, d.parent.field: req.detail_id}
            try:
                row = self._row(record, layout, fetched_at, req.scope)
                if d.parent.convert(row.record.get(d.parent.field)) != parent_value:
                    raise ValueError(f"{d.parent.field} {row.record.get(d.parent.field)!r} is not the requested "
                                     f"parent {parent_value!r}")
            except (ValueError, RecursionError) as exc:
                out.errors.append(_record_error(req, index, record, exc))
                continue
            seen.append(row.keys)
            out.rows.append(row)
        if self.fields is not None:
            self.fields.page(layout.table, items)
        if not out.errors:
            out.rows.append(DetailDone(d.target_table, self.spec.code, self.site_id, parent_value,
                                       req.context["parent_key"], seen, fetched_at, req.scope))
        return out

    # ----------------------------------------------------------------- one record
    def _row(self, record: Any, layout: TableLayout, fetched_at: datetime, scope: Any,
             window_field: str | None = None) -> OdsRow:
        if not isinstance(record, dict):
            raise ValueError(f"record is not an object: {type(record).__name__}")
        record, text, digest, removed = canonical_row_counted(record)
        if removed:
            self.note_nul(removed)
        keys = tuple([k.convert(record.get(k.field)) for k in layout.keys])
        extra = tuple([k.convert(record.get(k.field)) for k in layout.extra]) if layout.extra else ()
        site = record.get(self.site_field, self.site_id)
        if isinstance(site, bool) or (site != self.site_id and str(site) != str(self.site_id)):
            raise ValueError(f"{self.site_field} {site!r} is not the requested store {self.site_id}")
        site_id = self.site_id
        window = None
        if window_field:
            raw = record.get(window_field)
            if raw not in (None, ""):
                if not isinstance(raw, str):
                    raise ValueError(f"{window_field} is not a time string: {raw!r}")
                window = parse_window_time(raw)
        return OdsRow(
            table=layout.table, site_id=site_id, keys=keys, extra=extra, window=window, payload=text,
            content_hash=digest, fetched_at=fetched_at, record=record, scope=scope,
        )


def page_digest(records: list) -> str | None:
    """SHA-256 of a page's records as orjson writes them (keys sorted): equal pages, equal digests. None when
    orjson refuses them (e.g. integers beyond 64 bits); the page is then signed by its rows' content hashes."""
    try:
        return hashlib.sha256(orjson.dumps(records, option=orjson.OPT_SORT_KEYS)).hexdigest()
    except TypeError:
        return None


def parse_window_time(raw: str) -> datetime:
    """``"YYYY-MM-DD HH:MM:SS"`` (Shanghai local) as an aware datetime. The exact 19-character form is read by
    ``datetime.fromisoformat`` (C, a tenth of ``strptime``'s cost); anything else, and anything it refuses,
    goes through ``parse_local`` (same result, same ``ValueError``)."""
    if len(raw) == 19 and raw[10] == " " and raw[4] == "-" and raw[7] == "-" and raw[13] == ":" and raw[16] == ":" \
            and raw.isascii():
        try:
            return datetime.fromisoformat(raw).replace(tzinfo=SHANGHAI)
        except ValueError:
            pass  # e.g. February 30: parse_local gives the error text
    return to_aware(parse_local(raw))


def _record_error(req: PipelineRequest, index: int, record: Any, exc: BaseException) -> dict:
    reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
    return {"error": f"record {index}: {reason}", "params": dict(req.params), "record": _preview(record)}


def _preview(record: Any, limit: int = 300) -> str:
    """A short, always printable excerpt of a record for error reports."""
    try:
        return json.dumps(record, ensure_ascii=True, allow_nan=True, default=repr)[:limit]
    except (ValueError, RecursionError):
        return f"<{type(record).__name__} that cannot be shown>"
