"""``GET /metrics``: the run registry in the Prometheus text format, read when Prometheus scrapes.

Served by ``feiqiu-etl web`` behind the same access rules as every page (:mod:`.security`: with a token,
``Authorization: Bearer <token>``, which Prometheus sends with ``authorization: {credentials: …}`` in its scrape
config). :class:`RegistryCollector` is a prometheus-client custom collector: each scrape reads
``etl_meta`` once (:func:`read_snapshot`, every statement limited to ``timeout_s`` seconds, a pooled connection
waited for at most the pool's timeout) and turns the :class:`MetricsSnapshot` into metric families
(:func:`families`). Nothing is kept between scrapes, so any number of web processes agree.

Metrics (all prefixed ``feiqiu_etl_``; sums are over the finished runs the registry holds, so a
``runs prune --records`` lowers them, which Prometheus treats as a counter reset):

===================================  ========================================================================
``runs{status}``                     runs recorded, by status (every status of ``common.status.RECORDED``, 0 too)
``rows_written_total``               rows the runs changed (new, changed, soft-deleted)
``requests_total``                   API requests the runs sent
``rejections_total``                 429/42901/42902 answers the runs got
``errors_total``                     recorded errors of the runs
``lane_bans_total{lane}``            42902 bans the lane got; ``lane_banned_seconds_total{lane}`` their length
``lane_throttled_total{lane}``       42901/429 answers the lane got
``lane_busy_share{lane}``            share of the lane's wall time with a request in flight, in its newest
                                     finished run (``LaneTotals.busy_seconds / seconds``; 0..1)
``lane_busy_seconds_total{lane}``    the same over every run (with ``lane_seconds_total``: rate ratios)
``lane_refused_busy_total{lane}``    runs whose lane was held by another run of the same token (exit 6)
``freshness_age_seconds{site_id,task}``  age of the loaded data (registry.freshness, the one rule), where any
``freshness_stale{site_id,task}``    1 when stale or never loaded, for the scheduled (store, task) pairs
``last_success_timestamp_seconds``   when the newest SUCCESS run ended (absent: none yet)
``alerts_total{result}``             alert deliveries (one per reason, subject and target): sent, failed,
                                     sending
``listings_total{verdict}``          listings reconciled against their total (issue 25,
                                     ``etl_meta.listing_reconcile``), by verdict (every verdict, 0 too); pruned
                                     with the runs' logs (``run.retention_days``)
``listing_refetches_total``          listings fetched again from page 1 in the same run
===================================  ========================================================================
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager, Iterator

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from feiqiu_etl.common.status import RECORDED
from feiqiu_etl.registry.freshness import Schedule, freshness_report

PREFIX = "feiqiu_etl_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
DEFAULT_TIMEOUT = 5.0
"""Seconds each statement of a scrape may run."""


@dataclass(frozen=True)
class LaneFigures:
    """One lane (by name) over the finished runs: bans, throttles, busy and wall seconds, runs refused busy;
    ``last_share`` its busy share in its newest finished run (None: it never ran)."""

    bans: int = 0
    banned_seconds: float = 0.0
    throttled: int = 0
    busy_seconds: float = 0.0
    seconds: float = 0.0
    refused_busy: int = 0
    last_share: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape read (see the module docstring for the meaning of each figure)."""

    runs_by_status: dict[str, int] = field(default_factory=dict)
    rows_written: int = 0
    requests: int = 0
    rejections: int = 0
    errors: int = 0
    lanes: dict[str, LaneFigures] = field(default_factory=dict)
    freshness: tuple[dict, ...] = ()
    last_success: float | None = None
    alerts: dict[str, int] = field(default_factory=dict)
    listings: dict[str, int] = field(default_factory=dict)
    refetches: int = 0


_TOTALS = ("SELECT coalesce(sum(rows_written), 0), coalesce(sum(requests), 0), coalesce(sum(rejections), 0), "
           "coalesce(sum(errors), 0), extract(epoch FROM max(finished_at) FILTER (WHERE status = 'SUCCESS'))::float8 "
           "FROM etl_meta.run WHERE status <> 'RUNNING'")
_LANES = """
WITH l AS (
    SELECT r.started_at, r.run_id, e.value AS lane
    FROM etl_meta.run r
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(r.summary->'lanes') = 'array'
                                                 THEN r.summary->'lanes' ELSE '[]'::jsonb END) e
    WHERE r.status <> 'RUNNING' AND e.value->>'name' IS NOT NULL)
SELECT lane->>'name',
       coalesce(sum((lane->>'banned')::bigint), 0),
       coalesce(sum((lane->>'banned_seconds')::float8), 0),
       coalesce(sum((lane->>'throttled')::bigint), 0),
       coalesce(sum((lane->>'busy_seconds')::float8), 0),
       coalesce(sum((lane->>'seconds')::float8), 0),
       count(*) FILTER (WHERE (lane->>'busy')::boolean),
       (array_agg(CASE WHEN (lane->>'seconds')::float8 > 0
                       THEN (lane->>'busy_seconds')::float8 / (lane->>'seconds')::float8 END
                  ORDER BY started_at DESC, run_id DESC)
            FILTER (WHERE (lane->>'seconds')::float8 > 0))[1]
FROM l GROUP BY 1 ORDER BY 1
"""
_LISTINGS = ("SELECT verdict, count(*), coalesce(sum(listings - 1), 0) FROM etl_meta.listing_reconcile "
             "GROUP BY 1")
_ALERTS = ("SELECT CASE WHEN ok THEN 'sent' WHEN NOT ok THEN 'failed' ELSE 'sending' END, count(*) "
           "FROM etl_meta.alert GROUP BY 1")


def read_snapshot(conn: psycopg.Connection, *, connector: str, schedule: Schedule, stale_hours: float,
                  timeout_s: float = DEFAULT_TIMEOUT) -> MetricsSnapshot:
    """Read every figure from ``etl_meta`` on ``conn``; each statement is limited to ``timeout_s`` seconds (the
    session's ``statement_timeout``, restored afterwards). Raises psycopg errors (a statement over its limit:
    ``QueryCanceled``)."""
    with _statement_timeout(conn, timeout_s):
        by_status = {s: 0 for s in RECORDED}
        for status, n in conn.execute("SELECT status, count(*) FROM etl_meta.run GROUP BY 1").fetchall():
            by_status[status] = n
        rows, requests, rejections, errors, last_success = conn.execute(_TOTALS).fetchone()
        lanes = {r[0]: LaneFigures(bans=int(r[1]), banned_seconds=float(r[2]), throttled=int(r[3]),
                                   busy_seconds=float(r[4]), seconds=float(r[5]), refused_busy=int(r[6]),
                                   last_share=None if r[7] is None else float(r[7]))
                 for r in conn.execute(_LANES).fetchall()}
        alerts = {"sent": 0, "failed": 0, "sending": 0}
        alerts.update({k: n for k, n in conn.execute(_ALERTS).fetchall()})
        from feiqiu_etl.tasks.ods.reconcile import VERDICTS

        listings = dict.fromkeys(VERDICTS, 0)
        refetches = 0
        for verdict, n, again in conn.execute(_LISTINGS).fetchall():
            listings[verdict] = n
            refetches += int(again)
        conn.commit()
        fresh = freshness_report(conn, connector, schedule, stale_hours)["rows"]
    return MetricsSnapshot(runs_by_status=by_status, rows_written=int(rows), requests=int(requests),
                           rejections=int(rejections), errors=int(errors), lanes=lanes, freshness=tuple(fresh),
                           last_success=last_success, alerts=alerts, listings=listings, refetches=refetches)


@contextlib.contextmanager
def _statement_timeout(conn: psycopg.Connection, seconds: float) -> Iterator[None]:
    conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{max(1, int(seconds * 1000))}ms",))
    conn.commit()
    try:
        yield
    finally:
        conn.rollback()
        conn.execute("RESET statement_timeout")
        conn.commit()


def families(s: MetricsSnapshot) -> list[Metric]:
    """The metric families of a snapshot (pure)."""
    out: list[Metric] = []
    runs = GaugeMetricFamily(PREFIX + "runs", "Runs recorded in the registry, by status", labels=["status"])
    for status, n in sorted(s.runs_by_status.items()):
        runs.add_metric([status], n)
    out.append(runs)
    for name, value, text in (("rows_written", s.rows_written, "Rows the finished runs changed"),
                              ("requests", s.requests, "API requests the finished runs sent"),
                              ("rejections", s.rejections, "429/42901/42902 answers the finished runs got"),
                              ("errors", s.errors, "Errors the finished runs recorded")):
        out.append(CounterMetricFamily(PREFIX + name, text, value=value))
    lane_families = {
        "bans": CounterMetricFamily(PREFIX + "lane_bans", "42902 bans the lane got", labels=["lane"]),
        "banned_seconds": CounterMetricFamily(PREFIX + "lane_banned_seconds", "Seconds the lane was banned",
                                              labels=["lane"]),
        "throttled": CounterMetricFamily(PREFIX + "lane_throttled", "42901/429 answers the lane got",
                                         labels=["lane"]),
        "busy_seconds": CounterMetricFamily(PREFIX + "lane_busy_seconds", "Seconds the lane had a request in flight",
                                            labels=["lane"]),
        "seconds": CounterMetricFamily(PREFIX + "lane_seconds", "Wall seconds the lane ran", labels=["lane"]),
        "refused_busy": CounterMetricFamily(PREFIX + "lane_refused_busy",
                                            "Runs whose lane was held by another run of the same token",
                                            labels=["lane"]),
    }
    share = GaugeMetricFamily(PREFIX + "lane_busy_share", "Share of the lane's wall time with a request in flight, "
                                                          "in its newest finished run (0..1)", labels=["lane"])
    for lane, figures in sorted(s.lanes.items()):
        for attribute, family in lane_families.items():
            family.add_metric([lane], getattr(figures, attribute))
        if figures.last_share is not None:
            share.add_metric([lane], figures.last_share)
    out += [*lane_families.values(), share]
    age = GaugeMetricFamily(PREFIX + "freshness_age_seconds", "Age of the loaded data of a scheduled store and "
                                                               "task (registry.freshness)", labels=["site_id", "task"])
    stale = GaugeMetricFamily(PREFIX + "freshness_stale", "1 when a scheduled store and task is stale or never "
                                                           "loaded", labels=["site_id", "task"])
    for row in s.freshness:
        labels = [str(row["site_id"]), str(row["task"])]
        if row.get("age_seconds") is not None and math.isfinite(row["age_seconds"]):
            age.add_metric(labels, row["age_seconds"])
        stale.add_metric(labels, 1 if row["stale"] else 0)
    out += [age, stale]
    if s.last_success is not None:
        out.append(GaugeMetricFamily(PREFIX + "last_success_timestamp_seconds",
                                     "When the newest SUCCESS run ended (s since the epoch)", value=s.last_success))
    alerts = CounterMetricFamily(PREFIX + "alerts", "Alert deliveries (one per reason, subject and target)",
                                 labels=["result"])
    for result, n in sorted(s.alerts.items()):
        alerts.add_metric([result], n)
    out.append(alerts)
    listings = CounterMetricFamily(PREFIX + "listings", "Listings reconciled against their total, by verdict",
                                   labels=["verdict"])
    for verdict, n in sorted(s.listings.items()):
        listings.add_metric([verdict], n)
    out += [listings, CounterMetricFamily(PREFIX + "listing_refetches", "Listings fetched again from page 1 in the "
                                                                         "same run", value=s.refetches)]
    return out


@dataclass(frozen=True)
class CollectorStatistics:
    """Scrapes served, scrapes that failed (the database: 503), and the seconds the last read took."""

    scrapes: int = 0
    failed: int = 0
    last_read_s: float | None = None


class RegistryCollector(Collector):
    """The custom collector: ``connection()`` lends a database connection (the web page's pool); ``read`` turns
    it into a :class:`MetricsSnapshot` (e.g. :func:`read_snapshot` with the server's settings). Thread-safe
    (Starlette serves each scrape from its thread pool)."""

    def __init__(self, connection: Callable[[], ContextManager[psycopg.Connection]],
                 read: Callable[[psycopg.Connection], MetricsSnapshot]):
        self._connection = connection
        self._read = read
        self._lock = threading.Lock()
        self._stats = CollectorStatistics()

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        try:
            with self._connection() as conn:
                snapshot = self._read(conn)
        except Exception:
            with self._lock:
                self._stats = replace(self._stats, failed=self._stats.failed + 1)
            raise
        with self._lock:
            self._stats = replace(self._stats, scrapes=self._stats.scrapes + 1,
                                  last_read_s=round(time.monotonic() - began, 4))
        yield from families(snapshot)

    def statistics(self) -> CollectorStatistics:
        with self._lock:
            return self._stats


class MetricsEndpoint:
    """What ``/metrics`` serves for the web server's ``settings`` (connector, schedule, stale hours), from
    connections lent by ``connection``: a :class:`CollectorRegistry` holding only a :class:`RegistryCollector`."""

    def __init__(self, connection: Callable[[], ContextManager[psycopg.Connection]], settings,
                 timeout_s: float = DEFAULT_TIMEOUT):
        schedule = settings.schedule or Schedule.everything(settings.task_codes)
        self.collector = RegistryCollector(connection, lambda conn: read_snapshot(
            conn, connector=settings.connector, schedule=schedule, stale_hours=settings.stale_hours,
            timeout_s=timeout_s))
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self.collector)

    def render(self) -> bytes:
        """The exposition, read now. Raises psycopg (and pool) errors."""
        return generate_latest(self._registry)

    def statistics(self) -> CollectorStatistics:
        return self.collector.statistics()
