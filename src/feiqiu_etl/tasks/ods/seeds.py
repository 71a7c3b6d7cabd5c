"""What one ODS task asks the upstream for, in order (spec §3.5): page 1 of its snapshot and of every window
segment (:func:`list_seeds`), the details owed by earlier runs whose parent is still live
(:func:`pending_details`), then — lazily, after every other seed — the periodic detail re-checks
(:func:`recheck_candidates`, handed out by :class:`Recheck` within the task's budget). :class:`Seeds` is the
sized iterable the pipeline takes. The two queries read ``etl_meta``; the rest is pure.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import psycopg
from psycopg import sql

from feiqiu_etl.connector.spec import OdsTaskSpec, split_table
from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.pipeline.models import PipelineRequest
from feiqiu_etl.tasks.ods.context import ApiConventions, PlannedTask
from feiqiu_etl.tasks.ods.writer import OdsWriter, detail_request


def pending_details(conn: psycopg.Connection, spec: OdsTaskSpec, connector: str,
                    site_id: int) -> list[PipelineRequest]:
    """Details owed by earlier runs whose parent is still live (others are forgotten), oldest entry first, as
    detail requests. Commits its read."""
    schema, name = split_table(spec.table)
    key = spec.keys[0]
    rows = conn.execute(
        sql.SQL(
            "SELECT p.record FROM etl_meta.detail_pending p JOIN {t} t ON t.site_id = p.site_id "
            "AND t.{k}::text = p.parent_key AND NOT t.is_deleted "
            "WHERE p.connector = %s AND p.task_code = %s AND p.site_id = %s ORDER BY p.updated_at"
        ).format(t=sql.Identifier(schema, name), k=sql.Identifier(key.column)),
        (connector, spec.code, site_id),
    ).fetchall()
    conn.commit()
    return [detail_request(spec, record) for (record,) in rows]


def recheck_candidates(conn: psycopg.Connection, spec: OdsTaskSpec, connector: str, site_id: int,
                       pending: list[PipelineRequest], budget: int) -> list[dict]:
    """List records of live parents whose details were checked longest ago (never first), at most twice the
    ``budget`` (some may be fetched anyway as new or changed parents; those are skipped), none of ``pending``.
    Commits its read."""
    schema, name = split_table(spec.table)
    key = spec.keys[0]
    owed = [r.context["parent_key"] for r in pending]
    rows = conn.execute(
        sql.SQL(
            "SELECT t.payload FROM {t} t LEFT JOIN etl_meta.detail_checked c ON c.connector = %s "
            "AND c.task_code = %s AND c.site_id = t.site_id AND c.parent_key = t.{k}::text "
            "WHERE t.site_id = %s AND NOT t.is_deleted AND NOT (t.{k}::text = ANY(%s)) "
            "ORDER BY c.checked_at NULLS FIRST, t.{k} LIMIT %s"
        ).format(t=sql.Identifier(schema, name), k=sql.Identifier(key.column)),
        (connector, spec.code, site_id, owed, 2 * budget),
    ).fetchall()
    conn.commit()
    return [r for (r,) in rows]


def list_seeds(task: PlannedTask, conv: ApiConventions) -> Iterator[PipelineRequest]:
    """Page 1 of the task's listings: the snapshot (phases ``all`` and ``recent``), then every window segment
    (scope ``("segment", code, site_id, start, end)``)."""
    spec, site_id = task.spec, task.site_id
    base = {conv.site_param: site_id, conv.page_param: conv.first_page, conv.limit_param: spec.page_size}
    if spec.is_snapshot and task.phase in ("all", "recent"):
        yield _list_request(spec, base, ("snapshot", spec.code, site_id))
    for w in task.windows:
        params = {**base, conv.start_param: fmt(w.start), conv.end_param: fmt(w.end)}
        yield _list_request(spec, params, ("segment", spec.code, site_id, w.start, w.end))


def _list_request(spec: OdsTaskSpec, params: dict, scope: tuple) -> PipelineRequest:
    return PipelineRequest(
        endpoint=spec.endpoint, params=params, page_size=spec.page_size,
        data_path=spec.data_path, list_key=spec.list_key, scope=scope, gap_class=spec.gap_class,
    )


class Recheck:
    """Detail re-checks of a task, handed out lazily after every other seed: a parent already requested
    in this run (new, changed or owed) is skipped, until the budget is used (``used`` counts them)."""

    def __init__(self, spec: OdsTaskSpec, records: Iterable[dict], writer: OdsWriter, site_id: int, budget: int):
        self._spec = spec
        self._records = list(records)
        self._requested = writer.requested_details
        self._in_flight = writer.in_flight
        self._site_id = site_id
        self.budget = budget
        self.used = 0

    def __iter__(self) -> Iterator[PipelineRequest]:
        for record in self._records:
            if self.used >= self.budget:
                return
            request = detail_request(self._spec, record)
            key = (self._site_id, request.context["parent_key"])
            if key in self._requested:
                continue
            self._requested.add(key)
            self._in_flight.add(key)
            request.context["recheck"] = True
            self.used += 1
            yield request


class Seeds:
    """The seeds of a task: its list requests and owed details, then the lazy re-checks. Sized (by the
    first part) so progress can show seeds left."""

    def __init__(self, seeds: list[PipelineRequest], recheck: Recheck):
        self._seeds = seeds
        self._recheck = recheck

    def __len__(self) -> int:
        return len(self._seeds)

    def __iter__(self) -> Iterator[PipelineRequest]:
        yield from self._seeds
        yield from self._recheck
