"""The task's side of listing reconciliation (issue 25, :mod:`feiqiu_etl.tasks.ods.reconcile`): before the
first request, the rows each window segment is expected to hold, read from the warehouse
(:func:`task_reconciler`); when a listing ends, its row of ``etl_meta.listing_reconcile`` with its ODS outcome
(:func:`record_listing`). The verdicts themselves are the :class:`~feiqiu_etl.tasks.ods.reconcile.Reconciler`'s.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.tasks.ods import reconcile
from feiqiu_etl.tasks.ods.context import PlannedTask, TaskContext
from feiqiu_etl.tasks.ods.reconcile import Reconciler
from feiqiu_etl.tasks.ods.writer import OdsWriter


def task_reconciler(conn: psycopg.Connection, task: PlannedTask, ctx: TaskContext) -> Reconciler:
    """The task's :class:`Reconciler` with the rows expected per window segment, for the unexpected-zero
    verdict (tasks/ods/reconcile.py): the trailing median, or more where the warehouse already holds more
    live rows inside the window, or — no history at all — the contract's lower bound per day over the
    window; and the segments an earlier run already found zero (a second zero is believed). Nothing for a
    snapshot or with ``integrity.zero_floor`` 0. A few queries (committed), no request."""
    spec, rules, site_id = task.spec, ctx.integrity, task.site_id
    if spec.kind != "windowed" or not spec.window_column or rules.zero_floor <= 0 or not task.windows:
        return Reconciler(rules, spec.page_size)
    scopes = [("segment", spec.code, site_id, w.start, w.end) for w in task.windows]
    expected = reconcile.trailing_expectations(conn, spec.table, spec.window_column, site_id, scopes,
                                               rules.zero_weeks)
    reconciler = Reconciler(rules, spec.page_size, expected,
                            reconcile.zeros_before(conn, ctx.conventions.connector, spec.code, site_id,
                                                   ctx.run_id, scopes))
    for scope, held in reconcile.held_rows(conn, spec.table, spec.window_column, site_id, scopes).items():
        if held > reconciler.expected.get(scope, 0):
            reconciler.expected[scope] = float(held)
            reconciler.basis[scope] = "the warehouse already holds"
    first_load = not conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE site_id = %s)").format(
        sql.Identifier(*spec.table.split(".", 1))), (site_id,)).fetchone()[0]
    conn.commit()
    if first_load and spec.expected_daily_rows:
        for scope in scopes:
            if scope not in reconciler.expected:
                days = (scope[4] - scope[3]).total_seconds() / 86400
                reconciler.expected[scope] = round(spec.expected_daily_rows[0] * days, 1)
                reconciler.basis[scope] = "the contract's lower bound over the window is"
    return reconciler


def record_listing(writer: OdsWriter, ctx: TaskContext, site_id: int, scope: tuple, reconciler: Reconciler,
                   deleted: int, logger: logging.Logger) -> None:
    """The listing's row of ``etl_meta.listing_reconcile`` (issue 25), with its ODS outcome (the writer's
    ``scope_counts`` of ``scope``, taken, and ``deleted`` rows soft-deleted), in one transaction of the
    writer's connection (as the writer's task and store ``site_id``); an alerted verdict is logged as a
    warning. ``scope`` is ``("segment", code, site_id, start, end)`` or ``("snapshot", code, site_id)``."""
    outcome = reconciler.outcome(scope)
    outcome.ods_inserted, outcome.ods_updated, outcome.ods_unchanged = writer.scope_counts.pop(scope, (0, 0, 0))
    outcome.ods_soft_deleted = deleted
    with writer.conn.transaction():
        reconcile.record(writer.conn, run_id=ctx.run_id, connector=ctx.conventions.connector,
                         task_code=writer.spec.code, site_id=site_id, outcome=outcome)
    reconciler.recorded.append(outcome)
    if outcome.verdict in reconcile.ALERTED:
        logger.warning("listing %s: %s (%s)", outcome.verdict, outcome.reason,
                       "snapshot" if scope[0] == "snapshot" else f"{fmt(scope[3])} - {fmt(scope[4])}")
    elif outcome.verdict == reconcile.REFETCHED:
        logger.info("listing fetched again and now exact: %s", outcome.reason)
