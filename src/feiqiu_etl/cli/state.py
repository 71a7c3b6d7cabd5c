"""``state show`` and ``state reset``: the bookkeeping each (store, task) resumes from — finished windows,
high-water marks, horizons, snapshot times, owed details, DWD watermarks — read, and forgotten on purpose so
the next run fetches again (never an ODS row deleted; :mod:`feiqiu_etl.registry.state`)."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from feiqiu_etl.cli.groups import SuggestingGroup
from feiqiu_etl.common import exitcodes
from feiqiu_etl.cli.options import common_options, dsn_option, echo_json, json_option, say, settings, \
    setup_logging, warehouse
from feiqiu_etl.registry import state as bookkeeping
from feiqiu_etl.app.errors import UsageFailure
from feiqiu_etl.formats import UPSTREAM_ZONE, when
from feiqiu_etl.textsafe import escape

if TYPE_CHECKING:
    from rich.console import Console

WINDOW_ZONE = f"window times are {UPSTREAM_ZONE} (+08:00), the upstream's zone"
MAX_RANGES = 4
"""Finished ranges shown per task in the table (``--json`` has all)."""


class StoreBusyFailure(click.ClickException):
    """A run holds the store's lane: one line, exit 6 (the lane-busy code), nothing reset."""

    exit_code = exitcodes.LANE_BUSY


def _connector(path: str | None):
    from feiqiu_etl.connector import ConnectorError, load_connector

    try:
        return load_connector(path)
    except ConnectorError as exc:
        raise UsageFailure(str(exc)) from None


def _spec(connector, code: str):
    try:
        return connector.task(code.strip().upper())
    except KeyError as exc:
        raise UsageFailure(exc.args[0]) from None


def _store(text: str | None, required: bool) -> int | None:
    if text is None:
        if required:
            raise UsageFailure("state reset needs --site-id SITE_ID and --task TASK_CODE")
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**53:
        raise UsageFailure(f"--site-id must be a positive integer below 2^53, got {text!r}")
    return int(text)


def _watermark_tables() -> tuple[tuple[str, str], ...]:
    """``(schema, table)`` of the DWD watermark tables (dimensions, facts), owned by the DWD loaders."""
    from feiqiu_etl.tasks.dwd.schema import WATERMARK_TABLE
    from feiqiu_etl.tasks.dwd.watermark import DIM_WATERMARK_TABLE

    return DIM_WATERMARK_TABLE, WATERMARK_TABLE


def _dwd_tables(connector, spec) -> tuple[str, ...]:
    """The DWD tables fed by ``spec``'s ODS tables (its list and detail table)."""
    from feiqiu_etl.connector.dwd_mapping import DwdMappingError, load_dwd_mapping

    path = connector.dwd_mapping_path()
    if path is None:
        raise UsageFailure(f"connector {connector.name} has no dwd_mapping: --dwd has no watermark to forget")
    try:
        mapping = load_dwd_mapping(path)
    except (DwdMappingError, ValueError) as exc:
        raise UsageFailure(str(exc)) from None
    sources = {spec.table} | ({spec.detail.target_table} if spec.detail else set())
    return tuple(sorted(t.target for t in mapping.tables if t.source in sources))


def _known_store(conn, connector, site_id: int) -> None:
    if site_id not in bookkeeping.known_stores(conn, connector.name):
        raise UsageFailure(f"no state recorded for store {site_id} (feiqiu-etl state show lists the stores)")


# --------------------------------------------------------------------------------------------------- show
@click.group(cls=SuggestingGroup)
def state() -> None:
    """The bookkeeping runs resume from: show it, or reset part of it so the next run fetches again."""


@state.command("show")
@click.option("--site-id", "--store", "store_text", metavar="SITE_ID", help="only this store (--store: the same)")
@click.option("--task", "task_code", help="only this task (e.g. ODS_PAYMENT)")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False), help="connector YAML (default: Feiqiu)")
@dsn_option
@json_option
@common_options
def show(store_text, task_code, connector_path, dsn, demo, as_json, verbose, log_format) -> None:
    """Per store and task: finished windows (and holes), high-water mark, horizon, last snapshot, owed
    details; the DWD watermarks; the latest resets. Window times are in the upstream's zone (+08:00)."""
    setup_logging(verbose, log_format)
    connector = _connector(connector_path)
    spec = _spec(connector, task_code) if task_code else None
    site_id = _store(store_text, required=False)
    dwd = _dwd_tables(connector, spec) if spec is not None and connector.dwd_mapping_path() else None
    with warehouse(dsn, demo) as conn:
        if site_id is not None:
            _known_store(conn, connector, site_id)
        data = bookkeeping.read_state(conn, connector.name, site_id=site_id, task=spec.code if spec else None,
                                      watermark_tables=_watermark_tables(), dwd_tables=dwd)
        from feiqiu_etl.tasks.ods.deletions import pending

        held = pending(conn, connector.name, site_id=site_id, task=spec.code if spec else None)
    kinds = {t.code: t.kind for t in connector.tasks}
    for entry in data["tasks"]:
        entry["kind"] = kinds.get(entry["task"], "unknown")
    data = {"connector": connector.name, "window_zone": UPSTREAM_ZONE, **data, "held_deletions": held}
    if as_json:
        echo_json(data)
        return
    _render(data)


def _day(value: datetime | None) -> str:
    """A window time (naive, the upstream's zone, which the table's title gives): the date alone at midnight."""
    if value is None:
        return "-"
    return f"{value:%Y-%m-%d}" if (value.hour, value.minute, value.second) == (0, 0, 0) else f"{value:%Y-%m-%d %H:%M}"


def _ranges(items: list[dict[str, datetime]]):
    """One line per range, as a rich ``Text`` (a plain string's line breaks would be escaped by the safe
    console; these lines hold only dates)."""
    from rich.text import Text

    shown = [f"{_day(w['start'])} → {_day(w['end'])}{' (short)' if w.get('reason') else ''}"
             for w in items[:MAX_RANGES]]
    if len(items) > MAX_RANGES:
        shown.append(f"… {len(items) - MAX_RANGES} more (--json)")
    return Text("\n".join(shown) or "-")


def _render(data: dict[str, Any]) -> None:
    """One table per store, then the DWD watermarks and the latest resets, fitted to the terminal like ``runs``
    (:func:`feiqiu_etl.cli.views.console.fitted`): task and table names are never cut; a window range stays on one line;
    the high-water mark is the end of the last finished range; ``horizon`` is a windowed task's horizon (the window
    zone), ``snapshot`` a snapshot task's last snapshot (the display zone, named in its header): one zone per
    column; ``holes`` only when some task has one. When a store's table is still
    too wide, each task is a block of lines instead: the task and its first finished range, the other ranges and
    holes under it, then its horizon, snapshot and owed details."""
    from feiqiu_etl.cli.views.console import header_zone, stdout_console

    console = stdout_console()
    for h in data.get("held_deletions") or []:  # issue 25: soft deletions the deletion guard held back
        say(f"deletions held back for store {h['site_id']} {h['task']}: {h['keys']} of {h['live_rows']} live row(s)"
            f"{' (an empty snapshot)' if h['empty'] else ''} since run {h['run_id']}; applied when a later complete "
            f"snapshot misses them again, or by `feiqiu-etl state accept-deletions --site-id {h['site_id']} "
            f"--task {h['task']}`")
    if not data["tasks"] and not data["dwd"]:
        console.print("no state recorded yet (a run records it)")
        return
    # one zone per column (issue 27): a windowed task's horizon is a window time (the upstream's zone, as the title
    # says), a snapshot task's last snapshot an instant in the display zone, named in its header
    zone = header_zone(t["snapshot_at"] for t in data["tasks"] if t["kind"] != "windowed")
    for site in sorted({t["site_id"] for t in data["tasks"]}):
        _render_store(console, site, [t for t in data["tasks"] if t["site_id"] == site], zone)
    for t in data["tasks"]:  # why a hole is one (issue 25: a listing that stayed short)
        for h in t["holes"]:
            if h.get("reason"):
                say(f"hole {_day(h['start'])} → {_day(h['end'])} of store {t['site_id']} {t['task']}: {h['reason']}")
    if data["dwd"]:
        _render_watermarks(console, data["dwd"])
    for r in data["resets"][:5]:
        span = f"{_day(r['range_start'])} → {_day(r['range_end'])}" if r["range_start"] or r["range_end"] else "all"
        say(f"reset #{r['id']} at {when(r['reset_at'])} by {r['os_user']}@{r['host']}: store {r['site_id']} "
            f"{r['task']} ({span}){' + DWD watermarks' if r['dwd'] else ''}")


def _render_store(console: Console, site: int, tasks: list[dict[str, Any]], zone: str | None) -> None:
    """Store ``site``'s table of ``tasks`` (snapshot times in ``zone``, None: each with its offset), or one block
    of lines per task when the table is too wide for the terminal."""
    from feiqiu_etl.cli.views.console import fits, fitted

    snap = f"snapshot ({zone})" if zone else "snapshot"
    rows = [{"task": t["task"], "finished": _ranges(t["finished"]), "holes": _ranges(t["holes"]),
             "horizon": _day(t["horizon"]) if t["kind"] == "windowed" else "-",
             snap: "-" if t["kind"] == "windowed" else when(t["snapshot_at"], seconds=False, offset=zone is None),
             "owed": str(t["owed_details"])} for t in tasks]
    columns = ["task", "finished", *(["holes"] if any(t["holes"] for t in tasks) else []), "horizon", snap, "owed"]
    table, _ = fitted(rows, columns, (), console.width, left=("task", "finished", "holes", "horizon", snap))
    console.print(f"store {site} ({WINDOW_ZONE})", style="bold")
    if fits(table, console.width):
        console.print(table)
        return
    for row in rows:  # too wide: one block per task, every value whole, the first finished range beside it
        finished = row["finished"].plain.splitlines() or ["-"]
        console.print(f"{row['task']}  {finished[0]}")
        for line in finished[1:]:
            console.print(f"  {'':<9} {line}")
        if "holes" in columns:
            for n, line in enumerate(row["holes"].plain.splitlines()):
                console.print(f"  {'holes' if n == 0 else '':<9} {line}")
        console.print(f"  horizon {row['horizon']}  {snap} {row[snap]}  owed {row['owed']}")


def _render_watermarks(console: Console, dwd: list[dict[str, Any]]) -> None:
    """The DWD watermarks table (times in one zone when they share it, named in the header)."""
    from feiqiu_etl.cli.views.console import fitted, header_zone

    zone = header_zone([*(w["watermark"] for w in dwd), *(w.get("updated_at") for w in dwd)])
    stamp = lambda v: when(v, seconds=False, offset=zone is None)  # noqa: E731
    cols = [f"watermark ({zone})" if zone else "watermark", "run", "updated"]
    rows = [{"table": w["table"], cols[0]: stamp(w["watermark"]), "run": w.get("run_id") or "-",
             "updated": stamp(w.get("updated_at"))} for w in dwd]
    table, _ = fitted(rows, ["table", *cols], ("updated", "run"), console.width, left=("table", *cols))
    console.print("DWD watermarks (rows changed after them load next)", style="bold")
    console.print(table)


# --------------------------------------------------------------------------------------------------- reset
@state.command("reset")
@click.option("--site-id", "--store", "store_text", metavar="SITE_ID", help="the store (required; --store: the same)")
@click.option("--task", "task_code", help="the task (required), e.g. ODS_PAYMENT")
@click.option("--from", "first", metavar="DATE", help="first day to forget, YYYY-MM-DD (Asia/Shanghai; default: all)")
@click.option("--to", "last", metavar="DATE", help="last day to forget, included (default: all)")
@click.option("--dwd", is_flag=True, help="also forget the watermarks of the DWD tables the task feeds")
@click.option("--yes", is_flag=True, help="do not ask (for scripts); without it a terminal is needed to confirm")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False), help="connector YAML (default: Feiqiu)")
@dsn_option
@json_option
@common_options
def reset(store_text, task_code, first, last, dwd, yes, connector_path, dsn, demo, as_json, verbose,
          log_format) -> None:
    """Forget what a store's task has finished (in --from/--to, or all), so the next run fetches it again.
    Never deletes ODS or DWD rows; recorded with the OS user in etl_meta.state_reset. Exit 6 while a run
    holds the store's lane, 2 for bad input (nothing changed then)."""
    from feiqiu_etl.connector.windows import day_range

    setup_logging(verbose, log_format)
    site_id = _store(store_text, required=True)
    if task_code is None:
        raise UsageFailure("state reset needs --site-id SITE_ID and --task TASK_CODE")
    connector = _connector(connector_path)
    spec = _spec(connector, task_code)
    try:
        start, end = day_range(first, last)
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None
    windowed = spec.kind == "windowed"
    if not windowed and (first or last):
        raise UsageFailure(f"{spec.code} is a snapshot task: it has no windows to pick with --from/--to; reset it "
                           "whole")
    scope = bookkeeping.ResetScope(connector.name, site_id, spec.code, windowed, start, end,
                                   _dwd_tables(connector, spec) if dwd else ())
    if not yes and not sys.stdin.isatty():
        raise UsageFailure("state reset asks for confirmation: run it on a terminal, or pass --yes (scripts)")
    timeout = settings({"db_dsn": dsn}).state.reset_timeout
    with warehouse(dsn, demo) as conn:
        _known_store(conn, connector, site_id)
        _check_free(conn, site_id)
        if not yes:
            say(_describe(scope, bookkeeping.segments_in(conn, scope)), err=True)
            if not click.confirm("Reset?", default=False, err=True):
                raise UsageFailure("not confirmed: nothing reset")
        try:
            outcome = bookkeeping.reset_state(conn, scope, watermark_tables=_watermark_tables(), timeout=timeout)
        except bookkeeping.StoreBusy as exc:
            raise StoreBusyFailure(str(exc)) from None
    if as_json:
        echo_json({"store": site_id, "task": spec.code, "from": first, "to": last, **outcome.to_dict()})
        return
    say(_done(scope, outcome))


def _check_free(conn, site_id: int) -> None:
    """Refuse at once (before asking) while a run holds the store's lane; the reset checks again."""
    try:
        with conn.transaction():
            bookkeeping.hold_store(conn, site_id)
    except bookkeeping.StoreBusy as exc:
        raise StoreBusyFailure(str(exc)) from None


def _span(scope: bookkeeping.ResetScope) -> str:
    if not scope.windowed:
        return "its last snapshot"
    if scope.start is None and scope.end is None:
        return "every finished window"
    start = f"{scope.start:%Y-%m-%d %H:%M}" if scope.start else "the beginning"
    end = f"{scope.end:%Y-%m-%d %H:%M}" if scope.end else "the high-water mark"
    return f"the finished windows in [{start}, {end}) (+08:00)"


def _describe(scope: bookkeeping.ResetScope, segments: int) -> str:
    dwd = f" and the DWD watermarks of {', '.join(scope.dwd_tables)}" if scope.dwd_tables else ""
    touched = f" ({segments} finished segment(s))" if scope.windowed else ""
    return escape(f"forget {_span(scope)}{touched} of {scope.task_code} at store {scope.site_id}{dwd}; ODS and DWD "
                  "rows stay, the next run fetches it again")


def _done(scope: bookkeeping.ResetScope, outcome: bookkeeping.ResetOutcome) -> str:
    parts = []
    if scope.windowed:
        parts.append(f"{outcome.segments} finished segment(s) forgotten ({outcome.kept} part(s) outside the range "
                     "kept)")
        if outcome.horizon_after != outcome.horizon_before:
            parts.append(f"horizon moved to {outcome.horizon_after:%Y-%m-%d %H:%M} (+08:00)")
    else:
        parts.append("last snapshot forgotten" if outcome.snapshot else "no snapshot was recorded")
    if scope.dwd_tables:
        parts.append(f"DWD watermarks forgotten: {', '.join(outcome.dwd_watermarks) or 'none recorded'}")
    return (f"reset #{outcome.reset_id} by {outcome.user}: {scope.task_code} at store {scope.site_id}: "
            f"{'; '.join(parts)}; the next run fetches it again")


# --------------------------------------------------------------------------------------------------- accept
@state.command("accept-deletions")
@click.option("--site-id", "--store", "store_text", metavar="SITE_ID", help="the store (required; --store: the same)")
@click.option("--task", "task_code", help="the snapshot task (required), e.g. ODS_GOODS")
@click.option("--connector", "connector_path", type=click.Path(dir_okay=False), help="connector YAML (default: Feiqiu)")
@dsn_option
@json_option
@common_options
def accept_deletions(store_text, task_code, connector_path, dsn, demo, as_json, verbose, log_format) -> None:
    """Apply at once the soft deletions the deletion guard held back for a store's snapshot task (issue 25:
    a snapshot that would remove more than integrity.max_delete_share and integrity.max_delete_rows of the
    live rows, or an empty one). Recorded with the OS user in etl_meta.deletion_hold; the next DWD load closes
    those versions. Exit 6 while a run holds the store's lane, 2 for bad input (nothing changed then)."""
    from feiqiu_etl.tasks.ods import deletions
    from feiqiu_etl.tasks.ods.rows import layouts_for

    setup_logging(verbose, log_format)
    site_id = _store(store_text, required=True)
    if task_code is None:
        raise UsageFailure("state accept-deletions needs --site-id SITE_ID and --task TASK_CODE")
    connector = _connector(connector_path)
    spec = _spec(connector, task_code)
    if spec.is_snapshot is False:
        raise UsageFailure(f"{spec.code} is a windowed task: only a snapshot deletes, nothing is ever held back")
    timeout = settings({"db_dsn": dsn}).state.reset_timeout
    with warehouse(dsn, demo) as conn:
        _known_store(conn, connector, site_id)
        try:
            done = deletions.accept(conn, layouts_for(spec)[spec.table], connector=connector.name, task=spec.code,
                                    site_id=site_id, user=bookkeeping.os_user(),
                                    hold_store=lambda c, site: bookkeeping.hold_store(c, site, "accepted"),
                                    timeout=timeout)
        except bookkeeping.StoreBusy as exc:
            raise StoreBusyFailure(str(exc)) from None
    if as_json:
        echo_json({"store": site_id, "task": spec.code, **done.to_dict()})
        return
    if done.hold_id is None:
        say(f"no deletions are held back for {spec.code} at store {site_id}: nothing to accept")
        return
    say(f"deletions accepted (hold #{done.hold_id}, held by run {done.run_id}) by {done.user}: {spec.code} at store "
        f"{site_id}: {done.deleted} of {done.keys} held row(s) soft-deleted now (the others were gone or back "
        "already); the next DWD load closes their versions")
