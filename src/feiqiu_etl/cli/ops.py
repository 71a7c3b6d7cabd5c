"""``runs``, ``show``, ``status``, ``cancel`` and ``details``: the run registry and the owed-detail list from
any process (the running one publishes its status about once a second; cancel goes through the database:
a durable flag plus LISTEN/NOTIFY, so the run stops within a second)."""

from __future__ import annotations

import time

import click

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.cli.numeric import FloatRange, INT, IntRange
import psycopg

from feiqiu_etl.cli.options import common_options, dsn_option, echo_json, json_option, say, setup_logging, \
    warehouse
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl import registry
from feiqiu_etl.app.reads import run_detail
from feiqiu_etl.textsafe import escape
from feiqiu_etl.common.status import RECORDED, Status


def _resolve(conn: psycopg.Connection, run_id: str) -> str:
    if not run_id.strip():  # an empty prefix would match every run (cancel "" must not cancel the only one)
        raise UsageFailure("an empty run id: give a run id, a prefix of one, or 'last' (see feiqiu-etl runs)")
    problem = registry.run_id_problem(run_id)
    if problem:
        raise UsageFailure(problem)
    found = registry.matching_runs(conn, run_id, limit=6)
    if not found:
        raise UsageFailure(f"no run {run_id!r} (see feiqiu-etl runs)")
    if len(found) > 1:
        more = ", …" if len(found) > 5 else ""
        raise UsageFailure(f"run id prefix {run_id!r} is ambiguous: it matches {', '.join(found[:5])}{more}; "
                           "give more of the id")
    return found[0]


def _task_code(conn: psycopg.Connection, code: str) -> str:
    """``code`` upper-cased if it is a task of the connector or has owed details; else the one line of ``run``."""
    from feiqiu_etl.connector import ConnectorError, load_connector

    code = code.upper()
    owed = conn.execute("SELECT 1 FROM etl_meta.detail_pending WHERE task_code = %s LIMIT 1", (code,)).fetchone()
    conn.commit()
    if owed:
        return code
    try:
        return load_connector(None).task(code).code
    except KeyError as exc:
        raise UsageFailure(exc.args[0]) from None
    except ConnectorError as exc:
        raise UsageFailure(str(exc)) from None


@click.group(cls=SuggestingGroup, invoke_without_command=True)
@click.option("--limit", type=IntRange(1, 10000), default=20, show_default=True)
@click.option("--status", type=click.Choice([s.value for s in RECORDED], case_sensitive=False), help="only runs with this status")
@click.option("--site-id", "--store", "store", type=INT, metavar="SITE_ID",
              help="only runs that included this store (--store: the same)")
@dsn_option
@json_option
@common_options
@click.pass_context
def runs(ctx, limit, status, store, dsn, demo, as_json, verbose, log_format) -> None:
    """List runs, newest first: status, start, duration, stores, tasks, rows, requests, rejections, errors.
    ``runs prune`` removes old runs' logs and timelines."""
    if ctx.invoked_subcommand is not None:
        return
    setup_logging(verbose, log_format)
    with warehouse(dsn, demo) as conn:
        rows = registry.list_runs(conn, limit=limit, status=status, store=store)
    if as_json:
        echo_json(rows)
        return
    if not rows and (status or store is not None):  # "no runs recorded yet" would be wrong
        say(f"no {status.upper() + ' ' if status else ''}runs{f' of store {store}' if store is not None else ''}"
            " (feiqiu-etl runs lists them all)")
        return
    from feiqiu_etl.cli.views.runs import render_runs

    render_runs([r.to_dict() for r in rows])


@click.command()
@click.argument("run_id")
@dsn_option
@json_option
@common_options
def show(run_id, dsn, demo, as_json, verbose, log_format) -> None:
    """Everything about one run (RUN_ID, a unique prefix of it, or "last"): lanes, stores, tasks, windows,
    counts, every error, timings and the run's stored log."""
    setup_logging(verbose, log_format)
    with warehouse(dsn, demo) as conn:
        run = run_detail(conn, _resolve(conn, run_id))
    if as_json:
        echo_json(run)
        return
    from feiqiu_etl.cli.views.show import render_show

    render_show(run.to_dict())
    from feiqiu_etl.alerts.record import alert_lines

    for line in alert_lines(run.alerts or []):
        say(line)


@click.command()
@click.option("--watch", is_flag=True, help="refresh every second until no run is in progress (Ctrl-C stops)")
@dsn_option
@json_option
@common_options
def status(watch, dsn, demo, as_json, verbose, log_format) -> None:
    """What each running run is doing now: per lane the current request, the next request due and why, queue
    depths, rows and rows/s, requests done and estimated remaining, ETA."""
    setup_logging(verbose, log_format)
    with warehouse(dsn, demo) as conn:
        if as_json:
            echo_json(registry.running(conn))
            return
        from feiqiu_etl.cli.views.status import render_status

        if not watch:
            render_status([r.to_dict() for r in registry.running(conn)])
            return
        from rich.console import Group
        from rich.live import Live

        from feiqiu_etl.app.progress import recorded_live

        from feiqiu_etl.cli.views.console import SafeConsole

        from feiqiu_etl.cli.views.progress import progress_view

        watched: list[str] = []
        seen_any = False
        with Live(console=SafeConsole(), refresh_per_second=2) as live:
            try:
                while True:
                    current = registry.running(conn)
                    ids = {r.run_id for r in current}
                    for rid in [w for w in watched if w not in ids]:  # ended since the last look: say how
                        watched.remove(rid)
                        live.console.print(_ended(conn, rid))
                    watched += [r.run_id for r in current if r.run_id not in watched]
                    seen_any = seen_any or bool(current)
                    if not current:
                        break
                    shown = [recorded_live(r.live) for r in current]
                    live.update(Group(*[progress_view(s) for s in shown if s is not None]))
                    time.sleep(1)
            except KeyboardInterrupt:
                seen_any = False
            live.update(Group())
        if not seen_any:  # nothing was running (or Ctrl-C): the one-shot status
            render_status([r.to_dict() for r in registry.running(conn)])


def _ended(conn: psycopg.Connection, run_id: str) -> str:
    """``run X ended CANCELLED (exit 5)`` (and its one-line error) for ``status --watch``."""
    run = registry.get_run(conn, run_id, with_log=False)
    if run is None:
        return f"run {run_id} ended ? (exit -)"
    error = f": {run.error}" if run.error else ""
    return f"run {run_id} ended {run.status} (exit {'-' if run.exit_code is None else run.exit_code}){error}"


@click.command()
@click.argument("run_id")
@click.option("--wait", "wait_s", type=FloatRange(0, 3600), default=30, show_default=True,
              help="wait up to this long for the run to end and print its final status (0 = do not wait)")
@dsn_option
@json_option
@common_options
def cancel(run_id, wait_s, dsn, demo, as_json, verbose, log_format) -> None:
    """Cancel a running run from any process: it stops sending at once, writes what was fetched and ends
    CANCELLED (exit 5 of the run); a rerun completes it. Exit 0 when cancelled, 2 when it was not running."""
    setup_logging(verbose, log_format)
    with warehouse(dsn, demo) as conn:
        rid = _resolve(conn, run_id)
        asked = time.monotonic()
        before = registry.request_cancel(conn, rid)
        if before != Status.RUNNING:
            raise UsageFailure(f"run {rid} is not running (status {before})")
        final = Status.RUNNING
        while wait_s and time.monotonic() - asked < wait_s:
            run = registry.get_run(conn, rid, with_log=False)
            final = run.status if run else "?"
            if final != Status.RUNNING:
                break
            time.sleep(0.05)
        took = time.monotonic() - asked
    if as_json:
        echo_json({"run_id": rid, "requested": True, "status": final, "seconds": round(took, 3)})
    elif final == Status.RUNNING:
        say(f"cancel requested for run {rid}; it is still finishing (see feiqiu-etl status)")
    else:
        say(f"run {rid}: {final} ({took:.2f} s after the cancel)")


@click.group(cls=SuggestingGroup, invoke_without_command=True)
@click.option("--task", "task_code", help="only this task (e.g. ODS_SETTLEMENT)")
@click.option("--site-id", type=INT, metavar="SITE_ID", help="only this store")
@dsn_option
@json_option
@common_options
@click.pass_context
def details(ctx, task_code, site_id, dsn, demo, as_json, verbose, log_format) -> None:
    """Details still owed by earlier runs (fetched first by the next run), with attempts and last error."""
    if ctx.invoked_subcommand is not None:
        return
    setup_logging(verbose, log_format)
    with warehouse(dsn, demo) as conn:
        from psycopg.rows import dict_row

        with conn.cursor(row_factory=dict_row) as cur:
            code = _task_code(conn, task_code) if task_code else None
            rows = cur.execute(
                "SELECT connector, task_code, site_id, parent_key, attempts, last_error, updated_at "
                "FROM etl_meta.detail_pending WHERE (%(t)s::text IS NULL OR task_code = %(t)s) "
                "AND (%(s)s::bigint IS NULL OR site_id = %(s)s) ORDER BY task_code, site_id, updated_at",
                {"t": code, "s": site_id}).fetchall()
    if as_json:
        echo_json(rows)
        return
    from feiqiu_etl.cli.views.details import render_details

    render_details(rows)


@details.command("drop")
@click.argument("task_code")
@click.argument("parents", nargs=-1)
@click.option("--site-id", type=INT, metavar="SITE_ID", help="only this store")
@click.option("--all", "drop_all", is_flag=True, help="drop every owed detail of the task (no PARENT given)")
@dsn_option
@common_options
def details_drop(task_code, parents, site_id, drop_all, dsn, demo, verbose, log_format) -> None:
    """Drop owed details of TASK_CODE on purpose: the given PARENT keys, or all of them with --all."""
    setup_logging(verbose, log_format)
    if not parents and not drop_all:
        raise UsageFailure("name the parent keys to drop, or pass --all")
    with warehouse(dsn, demo) as conn:
        code = _task_code(conn, task_code)
        scope = "task_code = %s AND (%s::bigint IS NULL OR site_id = %s)"
        owed = {r[0] for r in conn.execute(f"SELECT parent_key FROM etl_meta.detail_pending WHERE {scope} "
                                           "AND parent_key = ANY(%s)", (code, site_id, site_id, list(parents)))}
        missing = sorted(set(parents) - owed)
        if missing:  # refused before anything is dropped, like any bad argument
            conn.rollback()
            shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            raise UsageFailure(f"not owed by {code}{f' at store {site_id}' if site_id else ''}: {shown}; nothing "
                               "dropped (feiqiu-etl details lists the owed ones)")
        n = conn.execute(f"DELETE FROM etl_meta.detail_pending WHERE {scope} AND (%s OR parent_key = ANY(%s))",
                         (code, site_id, site_id, drop_all, list(parents))).rowcount
        conn.commit()
    say(f"dropped {n} owed detail(s) of {code}")
