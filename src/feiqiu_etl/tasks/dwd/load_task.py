"""``DwdLoadTask``: run a DWD load (dimensions first, then facts), tables in parallel (spec §3.7).

Within each group the tables run on a ``ThreadPoolExecutor(max_workers=parallel_workers)``; every table uses
its own connection (``feiqiu_etl.db.connection.connect``) and its own transaction, so a failing table rolls
back alone and is reported while the others complete (spec Property 11). The summary lists every selected
table once, in mapping order, so ``succeeded + failed == total`` (Property 14), and a serial run gives the
same tables and counts as a parallel one (Property 16).

This module never shares a connection between threads and never lets one table's error escape ``load()``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from feiqiu_etl.common.status import Status
from feiqiu_etl.db.connection import connect
from feiqiu_etl.db.health import DatabaseHealth
from feiqiu_etl.errortext import one_line
from feiqiu_etl.tasks.dwd.facts import load_fact
from feiqiu_etl.connector.dwd_mapping import DwdMapping, DwdTable
from feiqiu_etl.tasks.dwd.quarantine import QuarantinedRow, held
from feiqiu_etl.tasks.dwd.scd2 import merge_dim_scd2
from feiqiu_etl.tasks.dwd.staging import LoadCounts

CANCELLED_BEFORE_START = "cancelled before start"


@dataclass(frozen=True)
class DwdTableResult:
    """Outcome of one table: ``table`` (bare name, e.g. ``"dim_member"``), ``kind`` (``"dimension"``/``"fact"``),
    rows ``inserted``/``updated``/``closed`` (all 0 when it failed), wall ``seconds``, ``error`` (one line,
    None on success), and ``quarantined``: source rows of this table held in ``etl_meta.dwd_quarantine``
    after the load (rows that cannot be loaded; the rest of the table loaded), with the first ones in
    ``quarantine`` (:class:`~feiqiu_etl.tasks.dwd.quarantine.QuarantinedRow`)."""

    table: str
    kind: str
    inserted: int = 0
    updated: int = 0
    closed: int = 0
    seconds: float = 0.0
    error: str | None = None
    quarantined: int = 0
    quarantine: tuple[QuarantinedRow, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "kind": self.kind, "inserted": self.inserted, "updated": self.updated,
                "closed": self.closed, "seconds": round(self.seconds, 3), "error": self.error,
                "quarantined": self.quarantined, "quarantine": [q.to_dict() for q in self.quarantine]}


@dataclass(frozen=True)
class DwdSummary:
    """Result of one :meth:`DwdLoadTask.load`: the run's ``now`` and one :class:`DwdTableResult` per table."""

    now: datetime
    tables: tuple[DwdTableResult, ...] = field(default=())

    @property
    def total(self) -> int:
        return len(self.tables)

    @property
    def succeeded(self) -> int:
        return sum(1 for t in self.tables if t.ok)

    @property
    def failed(self) -> int:
        return self.total - self.succeeded

    @property
    def quarantined(self) -> int:
        """Source rows held in quarantine, over all tables."""
        return sum(t.quarantined for t in self.tables)

    @property
    def errors(self) -> list[dict[str, str]]:
        """``[{"table": name, "error": message}]`` for every failed table, in mapping order."""
        return [{"table": t.table, "error": t.error} for t in self.tables if t.error is not None]

    @property
    def status(self) -> Status:
        """``CANCELLED`` when a table was not started because of a cancel; else ``SUCCESS`` when nothing
        failed and nothing is quarantined, ``FAILED`` when every table failed, else ``PARTIAL`` (quarantined
        rows are items that failed while the rest loaded: docs/reference/exit-codes.md, exit code 3)."""
        if any(t.error == CANCELLED_BEFORE_START for t in self.tables):
            return Status.CANCELLED
        if self.failed == 0:
            return Status.PARTIAL if self.quarantined else Status.SUCCESS
        return Status.FAILED if self.succeeded == 0 else Status.PARTIAL

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"now", "tables": [...], "succeeded", "failed", "errors": [...], "quarantined"}``."""
        return {"now": self.now.isoformat(), "tables": [t.to_dict() for t in self.tables],
                "succeeded": self.succeeded, "failed": self.failed, "errors": self.errors,
                "quarantined": self.quarantined}


@dataclass(frozen=True)
class DwdLoadContext:
    """What a DWD load takes from the run around it: its ``logger`` (default: this module's), the
    ``cancel_event`` that stops starting tables, and the run's :class:`DatabaseHealth` (with it, a lost
    connection retries the table once the database is back; without it, a table's first error is its failure)."""

    logger: logging.Logger | None = None
    cancel_event: threading.Event | None = None
    health: DatabaseHealth | None = None


class DwdLoadTask:
    """Load the DWD tables of ``mapping`` from the ODS tables of the database at ``dsn``, within ``context``
    (:class:`DwdLoadContext`).

    Dimensions merge incrementally (only ODS rows changed since their
    watermark) unless ``full`` (``--dwd-full``: compare everything, as the first merge of a dimension does). ``parallel_workers`` (>= 1) bounds the threads per group; ``run_id`` is written to every row; ``now``
    (timezone-aware) fixes the SCD2 timestamp of every :meth:`load`, else each ``load()`` takes the current
    time once. The DWD tables must exist (:func:`~feiqiu_etl.tasks.dwd.schema.ensure_dwd_tables`).
    Raises ``ValueError`` for a bad ``parallel_workers``, an empty ``run_id`` or a naive ``now``.
    """

    def __init__(self, dsn: str, mapping: DwdMapping, *, parallel_workers: int = 4, run_id: str,
                 now: datetime | None = None, full: bool = False, context: DwdLoadContext = DwdLoadContext()):
        if parallel_workers < 1:
            raise ValueError(f"parallel_workers must be >= 1, got {parallel_workers}")
        if not run_id:
            raise ValueError("run_id must not be empty")
        if now is not None and now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        self.dsn = dsn
        self.mapping = mapping
        self.parallel_workers = parallel_workers
        self.run_id = run_id
        self.log = context.logger or logging.getLogger(__name__)
        self.now = now
        self.cancel_event = context.cancel_event
        self.health = context.health
        self.full = full

    def load(self, only_tables: list[str] | None = None, serial: bool = False) -> DwdSummary:
        """Merge the dimensions, then load the facts; return the :class:`DwdSummary`.

        ``only_tables`` restricts the run to those names (bare or ``dwd.``-qualified); unknown names raise
        ``ValueError`` listing the known ones. ``serial=True`` runs one table at a time in this thread.
        Table failures never raise: they are in the summary's ``errors``.
        """
        selected = self.mapping.select(only_tables)
        now = self.now or datetime.now(timezone.utc)
        results: dict[str, DwdTableResult] = {}
        for group in ([t for t in selected if t.is_dimension], [t for t in selected if not t.is_dimension]):
            for result in self._run_group(group, now, serial):
                results[result.table] = result
        summary = DwdSummary(now=now, tables=tuple(results[t.name] for t in selected))
        self.log.info("DWD load %s: %d succeeded, %d failed (now %s)", summary.status, summary.succeeded,
                      summary.failed, now.isoformat())
        return summary

    def _run_group(self, group: list[DwdTable], now: datetime, serial: bool) -> list[DwdTableResult]:
        if serial or len(group) <= 1 or self.parallel_workers == 1:
            return [self._run_table(t, now) for t in group]
        workers = min(self.parallel_workers, len(group))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dwd") as pool:
            return list(pool.map(lambda t: self._run_table(t, now), group))

    def _load_one(self, table: DwdTable, now: datetime) -> tuple[LoadCounts, int, list[QuarantinedRow]]:
        def load(conn) -> tuple[LoadCounts, int, list[QuarantinedRow]]:
            if table.is_dimension:
                counts = merge_dim_scd2(conn, table, now=now, run_id=self.run_id, incremental=not self.full)
            else:
                counts = load_fact(conn, table, run_id=self.run_id)
            held_count, held_rows = held(conn, table)
            conn.commit()
            return counts, held_count, held_rows

        if self.health is not None:  # one transaction per table: after a lost connection, the table again
            with self.health.slot() as slot:
                return slot.run(load)
        with connect(self.dsn) as conn:
            return load(conn)

    def _run_table(self, table: DwdTable, now: datetime) -> DwdTableResult:
        """Load one table on its own connection; never raises (errors become the result's ``error``).
        A table not yet started when ``cancel_event`` is set is skipped (a started one finishes: it is one
        transaction)."""
        if self.cancel_event is not None and self.cancel_event.is_set():
            return DwdTableResult(table.name, table.kind, error=CANCELLED_BEFORE_START)
        start = time.perf_counter()
        try:
            counts, quarantined, rows = self._load_one(table, now)
        except Exception as exc:  # one table's failure must not stop the others (Property 11)
            seconds = time.perf_counter() - start
            self.log.error("DWD %s failed after %.2fs: %s", table.target, seconds, one_line(exc))
            self.log.debug("DWD %s traceback", table.target, exc_info=True)
            return DwdTableResult(table.name, table.kind, seconds=seconds, error=one_line(exc))
        seconds = time.perf_counter() - start
        self.log.info("DWD %s: inserted %d, updated %d, closed %d in %.2fs", table.target, counts.inserted,
                      counts.updated, counts.closed, seconds)
        if quarantined:
            self.log.warning("DWD %s: %d source row(s) in quarantine (etl_meta.dwd_quarantine), e.g. %s",
                             table.target, quarantined, rows[0].describe())
        return DwdTableResult(table.name, table.kind, counts.inserted, counts.updated, counts.closed, seconds,
                              quarantined=quarantined, quarantine=tuple(rows))
