"""Human-readable output with rich: the run summary, the live progress display, plans, run history.

Results and history are read as the dicts the CLI prints with ``--json`` (``RunResult.to_dict()``, registry
rows); the live status as the typed :class:`~feiqiu_etl.statistics.RunStatistics` — from the runner itself
(progress display) or read back from the registry (``status``, ``show``) — so the CLI, ``show`` and the
progress display agree. Tables fit 80 columns; long texts fold instead of being cut.
"""

from __future__ import annotations

import io
import os
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from feiqiu_etl import logs
from feiqiu_etl.formats import UPSTREAM_ZONE, duration, in_display_zone, reconcile_lines, utc_offset, when
from feiqiu_etl.statistics import LaneStatistics, RunStatistics
from feiqiu_etl.textsafe import escape, escape_tree
from feiqiu_etl.common.status import STYLES, Status

ERRORS_SHOWN = 3


class SafeConsole(Console):
    """A rich console that never interprets text from outside: no markup (``[/x]`` in a store name would
    raise, ``[bold]`` restyle), and every string it renders, table cells included, has its control characters
    escaped (:func:`feiqiu_etl.textsafe.escape`). The renderers below also escape what they put in ``Text``."""

    def __init__(self, **kwargs: Any):
        super().__init__(**{"markup": False, **kwargs})

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(escape(text), **kwargs)


def stdout_console() -> Console:
    """stdout console (:class:`SafeConsole`); when piped, wide enough that nothing is cut, unless ``COLUMNS``
    says how wide (``COLUMNS=80 feiqiu-etl runs | less``)."""
    probe = SafeConsole()
    return probe if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit() else SafeConsole(width=200)


def message_console(*, stderr: bool = False) -> Console:
    """The console of plain messages (:func:`say`): on a terminal, or when ``COLUMNS`` says how wide, it wraps
    at word boundaries within that width (a terminal would otherwise break the line mid-word); piped without
    ``COLUMNS`` it never wraps (one message, one line)."""
    probe = SafeConsole(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return probe
    return SafeConsole(stderr=stderr, soft_wrap=True)


def say(text: str, *, err: bool = False, style: str | None = None) -> None:
    """Print a plain message (not a table, not a log record, not an error line) to stdout, or stderr with
    ``err``: escaped for the terminal, wrapped between words (:func:`message_console`), never inside one."""
    console = message_console(stderr=err)
    message = Text(escape(text), style=style or "")
    if console.soft_wrap:
        console.print(message, highlight=False)
        return
    for line in message.wrap(console, console.width, overflow="fold"):
        line.rstrip()  # no space left at the end of a wrapped line
        console.print(line, highlight=False, soft_wrap=True)


def compact_table() -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))


def _status(status: str | None) -> Text:
    return Text(status or "-", style=STYLES.get(status or "", ""))


# ----------------------------------------------------------------------------------------------- run summary
def _short_sites(site_ids: set) -> dict:
    """``…4417``: the shortest tail (at least 4 digits) that tells the run's stores apart."""
    texts = {s: str(s) for s in site_ids}
    for n in range(4, max((len(t) for t in texts.values()), default=4) + 1):
        if len({t[-n:] for t in texts.values()}) == len(texts):
            return {s: ("…" + t[-n:]) if len(t) > n else t for s, t in texts.items()}
    return texts


_LEGEND = {"rows": "rows = list/detail records fetched", "new": "new/chg/same/del = inserted/updated/unchanged/"
           "soft-deleted", "fail": "fail = records fetched but not written",
           "details": "details = detail requests answered/failed/skipped", "rl": "rl = rate-limited answers"}


def fitted(rows: list[dict[str, Any]], columns: list[str], drops: tuple[str, ...], width: int, *,
            left: tuple[str, ...]) -> tuple[Table, list[str]]:
    """A table of ``rows`` (cells by column name) within ``width`` columns: the ``columns`` that fit, leaving
    out those named in ``drops`` one by one, in that order, until it fits (or none is left to drop). Cells are
    never cut; columns named in ``left`` are left-justified, the others right."""
    for drop in (None, *drops):
        columns = [c for c in columns if c != drop]
        table = compact_table()
        for col in columns:
            table.add_column(col, no_wrap=True, justify="left" if col in left else "right")
        for row in rows:
            table.add_row(*(row[c] for c in columns))
        if fits(table, width):
            break
    return table, columns


def fits(table: Table, width: int) -> bool:
    """Whether ``table`` prints within ``width`` columns without wrapping or cutting a cell."""
    return SafeConsole(width=1000, file=io.StringIO()).measure(table).maximum <= width


def _not_written(t: dict) -> int:
    """Records of a task fetched but not written: bad, in a failed batch, or still queued when it ended
    (``PipelineResult``: fetched = new + chg + same + this)."""
    return int(t.get("rows_failed", 0)) + int(t.get("rows_not_written", 0))


def _task_table(tasks: list[dict], lanes: list[dict], width: int) -> tuple[Table, str]:
    """The per-task table, fitted to ``width`` columns: columns that are zero for every task (del, fail, rl,
    details failed/skipped: the details fetched are in ``rows``) or do not apply (lane, site) are left out;
    if it is still too wide, ``rl``, ``details``, ``lane``, ``del`` and ``same`` go in that order (``feiqiu-etl
    show`` prints them all; ``fail`` is never dropped). Task names are never shortened: people copy them into ``--tasks``."""
    sites = _short_sites({t["site_id"] for t in tasks})
    lane_of = {store["site_id"]: lane["name"] for lane in lanes for store in lane.get("stores", [])}
    wanted = ["task", *(["lane"] if len({lane_of.get(t["site_id"]) for t in tasks}) > 1 else []),
              *(["site"] if len(sites) > 1 else []), "status", "req", "rows", "new", "chg", "same",
              *(["del"] if any(t["total_deleted"] for t in tasks) else []),
              *(["fail"] if any(_not_written(t) for t in tasks) else []),
              *(["details"] if any(t.get("detail_failure") or t.get("detail_skipped") for t in tasks) else []),
              *(["rl"] if any(t.get("rate_limited") for t in tasks) else []), "err", "s"]

    def cells(t: dict) -> dict[str, Any]:
        listed = t["total_fetched"] - t.get("detail_fetched", 0)
        return {"task": t["task"], "lane": lane_of.get(t["site_id"], "-"), "site": sites[t["site_id"]],
                "status": _status(t["status"]), "req": str(t["total_requests"]),
                "rows": f"{listed}/{t.get('detail_fetched', 0)}" if t.get("detail_table") else str(listed),
                "new": str(t["total_inserted"]), "chg": str(t["total_updated"]), "same": str(t["total_skipped"]),
                "del": str(t["total_deleted"]), "fail": str(_not_written(t)),
                "details": f"{t['detail_success']}/{t['detail_failure']}/{t['detail_skipped']}",
                "rl": str(t.get("rate_limited", 0)), "err": str(len(t["errors"])),
                "s": duration(t["timing"].get("total", 0))}

    # least missed first; `show` has them all; task names stay whole: people copy them into --tasks
    table, columns = fitted([cells(t) for t in tasks], wanted, ("rl", "details", "lane", "del", "same"), width,
                             left=("task", "lane", "site", "status"))
    shown = set(columns)
    legend = "; ".join(text for key, text in _LEGEND.items() if key in shown)
    if "same" not in shown:
        legend = legend.replace("new/chg/same/del", "new/chg/del").replace("unchanged/", "")
    if "del" not in shown:
        legend = legend.replace("/del", "").replace("/soft-deleted", "")
    if "lane" in wanted and "lane" not in shown:
        by_lane: dict[str, list[str]] = {}
        for site, name in lane_of.items():
            if site in sites:
                by_lane.setdefault(name, []).append(sites[site])
        legend += "; lanes: " + ", ".join(f"{n} = {' '.join(v)}" for n, v in by_lane.items())
    return table, legend


def render_summary(data: dict, console: Console | None = None, *, more_hint: bool = True) -> None:
    """Per-task counts (80 columns: rows = list/detail records fetched; new/chg/same/del = inserted/updated/
    unchanged/soft-deleted; rl = rate-limited answers), stores and lanes that stopped, the first errors of
    each task with "(N more)", and the DWD table."""
    console = console or stdout_console()
    data = escape_tree(data)
    tasks = data.get("tasks", [])
    line = Text.assemble(f"run {data['run_id']}: ", _status(data["status"]))
    error = data.get("error") or ""
    if data["status"] == Status.CANCELLED and error.startswith("cancelled (") and error.endswith(")"):
        error = error[len("cancelled ("):-1]  # "CANCELLED (signal)", not "CANCELLED (cancelled (signal))"
    if error:
        line.append(f" ({error})")
    console.print(line)
    if tasks:
        table, legend = _task_table(tasks, data.get("lanes", []), console.width)
        console.print(table)
        console.print(legend, style="dim")
    for lane in data.get("lanes", []):
        if lane.get("reason") and lane["reason"] not in error:  # the header said it already (a busy lane)
            console.print(Text(f"lane {lane['name']}: {lane['status']}: {lane['reason']}", style="red"), soft_wrap=True)
        if lane.get("deadline"):
            console.print(Text(deadline_line(lane["name"], lane["deadline"]),
                               style="blue" if lane["deadline"].get("reached") else "dim"), overflow="fold")
        for store in lane.get("stores", []):
            if store.get("reason") and not lane.get("reason"):
                console.print(Text(f"store {store['site_id']}: {store['status']}: {store['reason']}", style="red"),
                              soft_wrap=True)
    skipped = data.get("skipped_tasks", [])
    if skipped:
        reasons: dict[str, int] = {}
        for s in skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        for reason, n in reasons.items():
            console.print(Text(f"not run: {n} task(s): {reason}", style="yellow"), overflow="fold")
    for t in tasks:
        errors = t["errors"]
        for e in errors[:ERRORS_SHOWN]:
            console.print(Text(f"{t['task']}: {e.get('stage')}: {e.get('error')}{_params(e)}", style="red"), soft_wrap=True)
        if len(errors) > ERRORS_SHOWN and more_hint:  # `show` prints the others itself
            console.print(Text(f"{t['task']}: ({len(errors) - ERRORS_SHOWN} more; feiqiu-etl show {data['run_id']})",
                               style="red"))
        if (t.get("snapshot_note") or "").startswith("soft delete skipped"):
            console.print(Text(f"{t['task']}: {t['snapshot_note']}", style="yellow"))
        for d in t.get("schema_drift", []):  # tasks/ods/drift.py
            parts = [f"new field(s) {', '.join(d['new_fields'])}" if d["new_fields"] else "",
                     f"lost field(s) {', '.join(d['lost_fields'])}" if d["lost_fields"] else ""]
            console.print(Text(f"{t['task']}: schema drift in {d['table']}: {'; '.join(p for p in parts if p)} "
                               f"(first seen in run {d['first_seen_run']})", style="yellow"), overflow="fold")
        if t.get("details_given_up"):
            console.print(Text(f"{t['task']}: {len(t['details_given_up'])} owed detail(s) given up", style="yellow"))
    rechecks = [t["recheck"] for t in tasks if t.get("recheck")]
    if any(r["budget"] for r in rechecks):
        console.print(f"details re-checked (oldest first): {sum(r['used'] for r in rechecks)} of a budget of "
                      f"{sum(r['budget'] for r in rechecks)} (detail.recheck_share)", style="dim")
    dwd = data.get("dwd")
    if dwd:
        console.print(Text.assemble("DWD: ", _status(dwd.get("status"))))
        d = compact_table()
        d.add_column("table", no_wrap=True)
        for col in ("kind", "inserted", "updated", "closed", "s"):
            d.add_column(col, justify="right", no_wrap=True)
        d.add_column("error", overflow="fold")
        for t in dwd.get("tables", []):
            d.add_row(t["table"], t.get("kind", ""), str(t.get("inserted", 0)), str(t.get("updated", 0)),
                      str(t.get("closed", 0)), f"{t.get('seconds', 0):.2f}", str(t.get("error") or ""))
        console.print(d)
        for e in dwd.get("errors", []):
            if e.get("table") == "*":
                console.print(Text(f"DWD: {e['error']}", style="red"), soft_wrap=True)


def deadline_line(lane: str, deadline: dict) -> str:
    """``lane north: deadline 06:00 reached, ~120 requests left for the next run (gaps narrowed, pace 0.00)``."""
    pace = deadline.get("pace", 1.0)
    narrowed = f" (gaps narrowed, pace {pace:.2f})" if pace is not None and pace < 1 else ""
    if deadline.get("reached"):
        left = deadline.get("left_requests")
        what = f"~{left:,} requests left" if isinstance(left, int) else "the rest left"
        return f"lane {lane}: deadline {deadline.get('text')} reached, {what} for the next run{narrowed}"
    return f"lane {lane}: finished before its deadline {deadline.get('text')}{narrowed}"


def render_rows(columns: list[str], rows: list[tuple], console: Console | None = None) -> None:
    console = console or stdout_console()
    columns, rows = escape_tree(list(columns)), escape_tree(rows)
    table = compact_table()
    for col in columns:
        table.add_column(col, overflow="fold")
    console.print(f"{len(rows)} row(s)")
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    console.print(table)


def render_tasks(connector: str, rows: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    rows = escape_tree(rows)
    console.print(f"connector {connector}: {len(rows)} tasks")
    table = compact_table()
    table.add_column("task", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for col in ("endpoint", "table", "detail table"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["task"], r["kind"], r["endpoint"], r["table"], r["detail_table"] or "")
    console.print(table)


# ----------------------------------------------------------------------------------------------- live display
def lane_lines(lane: LaneStatistics) -> list[Text]:
    """Three lines per lane (80 columns): the request now; why the next one waits, rows and ETA; counts."""
    cur = lane.current
    if lane.state == "finished":
        now = "finished"
    elif cur is not None:
        request = cur.request or ""
        head, sep, ident = request.rpartition(" id ")
        if sep and len(ident) > 8:
            request = f"{head} id …{ident[-7:]}"
        now = f"{cur.task} @{str(cur.site_id)[-4:]} {request}"
    else:
        now = lane.state
    if lane.tripped:
        wait, style = f"stopped: {lane.tripped}", "red"
    elif lane.wait_reason == "banned":
        wait, style = f"banned by upstream: waiting {lane.next_due_in:.0f} s (42902)", "red"
    elif lane.wait_reason:
        wait, style = f"next in {lane.next_due_in:.1f} s ({lane.wait_reason})", ""
    elif cur is not None and cur.in_flight:
        wait, style = "request in flight", ""
    elif lane.state == "finished":
        wait, style = "done", ""
    else:
        wait, style = "working", ""
    first = Text(f"{lane.name}: ", style="bold")
    first.append(now)
    second = Text("  ")
    if lane.stalled_for is not None:  # the run control's watchdog: no progress for longer than run.stall_after
        second.append(f"stalled: no progress for {duration(lane.stalled_for)} · ", style="red")
    second.append(wait, style=style)
    if lane.state == "finished":
        second.append(f" · {lane.rows_written:,} rows")
    else:
        second.append(f" · {lane.rows_written:,} rows {lane.rows_per_s:.0f}/s · ETA {duration(lane.eta_s)}")
        if lane.deadline_in_s is not None:
            narrowed = f", pace {lane.pace:.2f}" if lane.pace is not None and lane.pace < 1 else ""
            second.append(f" · deadline in {duration(lane.deadline_in_s)}{narrowed}")
    q = lane.queues
    rejected = lane.throttled + lane.banned
    third = Text(f"  tasks {lane.tasks_done}/{lane.tasks} · req {lane.requests_sent} ({rejected} rejected) · "
                 f"left ~{lane.requests_remaining} · queued {q.frontier} req/{q.processing} proc/{q.write} write",
                 style="dim")
    for line in (first, second, third):
        line.no_wrap = True
        line.overflow = "ellipsis"
    return [first, second, third]


def progress_view(run: RunStatistics) -> Group:
    """The whole live display: a header line and three lines per lane (every text escaped for the terminal)."""
    run = RunStatistics.from_dict(escape_tree(run.to_dict()))
    head = Text(f"run {run.run_id} · {run.phase} · {run.tasks_done}/{run.tasks} tasks · {run.rows_written:,} rows "
                f"· ETA {duration(run.eta_s)}", style="bold")
    if run.cancelling:
        head.append(" · cancelling", style="magenta")
    head.no_wrap, head.overflow = True, "ellipsis"
    lines: list[Text] = [head]
    for lane in run.lanes:
        lines.extend(lane_lines(lane))
    return Group(*lines)


def recorded_live(live: Any) -> RunStatistics | None:
    """The live status a registry row holds (``etl_meta.run.live``) as :class:`RunStatistics`; None when there is
    none or it is not one (``{"error": …}`` from a snapshot that failed)."""
    if not isinstance(live, dict):
        return None
    try:
        return RunStatistics.from_dict(live)
    except ValueError:
        return None


def heartbeat_line(run: RunStatistics) -> str:
    """One plain line of life for logs without a terminal (cron): progress, the current request, ETA."""
    parts = []
    for lane in run.lanes:
        cur = lane.current
        what = f"{cur.task} {cur.request or ''}".strip() if cur is not None else lane.state
        parts.append(f"{lane.name}: {what}; {lane.requests_sent} req, {lane.rows_written} rows")
    return (f"[progress] run {run.run_id}: {run.phase}, {run.tasks_done}/{run.tasks} tasks, {run.rows_written} rows "
            f"({run.rows_per_s:.0f}/s), ETA {duration(run.eta_s)}; " + " | ".join(parts))


def task_line(index: int, total: int, run) -> str:
    """One plain line per finished task, for logs (cron, pipes)."""
    r = run.result
    return (f"[{index}/{total}] {run.task_code} site {run.site_id}: {r.status}, {r.total_requests} "
            f"request{'' if r.total_requests == 1 else 's'}"
            f"{f' ({r.rate_limited} rate-limited)' if r.rate_limited else ''}, {r.total_inserted} new, "
            f"{r.total_updated} changed, {r.total_skipped} unchanged, {r.total_deleted} deleted, "
            f"{len(r.errors)} errors, {r.timing.get('total', 0):.1f} s")


@contextmanager
def _every(seconds: float, fn: Callable[[], None]) -> Iterator[None]:
    """Call ``fn`` every ``seconds`` on a helper thread while the body runs, and once more at the end."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a display problem must never stop the run
                pass

    thread = threading.Thread(target=loop, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(1)
        try:
            fn()
        except Exception:  # noqa: BLE001
            pass


@contextmanager
def live_progress(runner, enabled: bool, heartbeat: float = 30.0) -> Iterator[None]:
    """While the body runs: on a terminal, a live display on stderr (log lines print above it); otherwise one
    line per finished task plus a heartbeat line every ``heartbeat`` seconds (0 = none), so that logs of long
    unattended runs show life."""
    console = SafeConsole(stderr=True)
    if not enabled:
        yield
        return
    if console.is_terminal:
        with Live(progress_view(runner.statistics()), console=console, transient=True, refresh_per_second=4,
                  redirect_stderr=False) as live:
            logs.attach_console(console)
            try:
                with _every(0.5, lambda: live.update(progress_view(runner.statistics()))):
                    yield
            finally:
                logs.attach_console(None)
        return
    with progress_lines(runner, lambda line: logs.progress_line(line, console), heartbeat):
        yield


@contextmanager
def progress_lines(runner, emit: Callable[[str], None], heartbeat: float = 30.0) -> Iterator[None]:
    """While the body runs, ``emit`` a line per finished task as it finishes (:func:`task_line`) and a
    :func:`heartbeat_line` every ``heartbeat`` seconds (0 = none), from a helper thread (twice a second, and
    once more at the end). What the CLI prints without a terminal and a Dagster step writes into its event
    log. The lines are plain text; ``emit`` escapes them for where they go."""
    printed = 0
    last_beat = time.monotonic()

    def report() -> None:
        nonlocal printed, last_beat
        finished = runner.finished_tasks()
        total = runner.plan.task_count
        for run in finished[printed:]:
            printed += 1
            emit(task_line(printed, total, run))
        if heartbeat > 0 and time.monotonic() - last_beat >= heartbeat:
            last_beat = time.monotonic()
            emit(heartbeat_line(runner.statistics()))

    with _every(0.5, report):
        yield


# ----------------------------------------------------------------------------------------------- plan, history
def render_plan(plan: dict, console: Console | None = None) -> None:
    """The plan: per lane its stores and tasks with windows and estimates."""
    console = console or stdout_console()
    plan = escape_tree(plan)
    e = plan["estimate"]
    console.print(f"plan: connector {plan['connector']}, {'incremental' if plan['incremental'] else 'explicit window'}"
                  f" as of {plan['now']} ({UPSTREAM_ZONE}, the upstream's time); {len(plan['lanes'])} lane(s), ~{e['requests']} requests, "
                  f"slowest lane ~{duration(e['lane_seconds_max'])}")
    for lane in plan["lanes"]:
        console.print(Text(f"lane {lane['name']} ({lane['key']}, token from ${lane['token_env']}): "
                           f"{len(lane['stores'])} store(s), ~{lane['estimate']['requests']} requests, "
                           f"~{duration(lane['estimate']['seconds'])} at its gaps", style="bold"))
        sites = _short_sites({task["site_id"] for task in lane["tasks"]})
        names = {st.get("site_id"): st.get("name") for st in lane["stores"] if isinstance(st, dict)}
        if any(names.values()):
            console.print("  stores: " + ", ".join(f"{sites.get(k, k)} {v}" for k, v in names.items() if v),
                          overflow="fold")
        t = compact_table()
        for col in ("store", "task", "kind", "windows", "gap s", "req", "basis"):
            t.add_column(col, no_wrap=col != "windows", overflow="fold")
        for task in lane["tasks"]:
            windows = task["windows"]
            w = "-" if not windows else (f"{min(a for a, _ in windows)[:16]} … {max(b for _, b in windows)[:16]} "
                                         f"({len(windows)} seg)")
            est = task["estimate"]
            req = f"{est['list_requests']}+{est['detail_requests']}" if task["detail_endpoint"] else str(est["requests"])
            t.add_row(sites[task["site_id"]], task["task"], task["kind"][:4], w,
                      f"{task['rate_min']:g}-{task['rate_max']:g}", req, est["basis"])
        console.print(t)
        deadline = lane.get("deadline")
        for line in (deadline or {}).get("summary") or []:
            console.print(Text(line, style="yellow" if deadline["fit"] and not deadline["fit"]["fits"] else ""),
                          overflow="fold")
    if plan.get("dwd"):
        d = plan["dwd"]
        console.print(f"then DWD: tables {d['tables']}, {d['parallel_workers']} in parallel"
                      f"{', full compare' if d['full'] else ''}")


def header_zone(values: Iterable[Any]) -> str | None:
    """The one UTC offset of these times in the display zone, for a column header (``UTC`` for +00:00), so the
    cells leave it out; None when they have several (each cell then carries its own). Other values are
    ignored; with no time at all, the display zone's offset now (not ``UTC`` whatever the zone)."""
    offsets = {utc_offset(in_display_zone(v)) for v in values if isinstance(v, datetime)}
    if not offsets:
        offsets = {utc_offset(in_display_zone(datetime.now(timezone.utc)))}
    return "UTC" if offsets <= {"+00:00"} else offsets.pop() if len(offsets) == 1 else None


def render_freshness(report: dict, console: Console | None = None) -> None:
    """``freshness``: per store and task how far its data goes and how old it is (``registry/freshness.py``
    rows), fitted to the terminal like :func:`render_runs`: task names and ages are never cut; stores show by
    their shortest distinct tail, times without seconds and with the zone in the header; ``kind`` goes if it is
    still too wide (``--json`` has it all)."""
    from feiqiu_etl.web.format import age

    console = console or stdout_console()
    report = escape_tree(report)
    rows = report["rows"]
    if not rows:
        console.print(f"connector {report['connector']}: nothing scheduled has been loaded yet")
        return
    fresh = [_aware(r.get("fresh_until")) for r in rows]
    zone = header_zone(fresh)
    until = f"fresh until ({zone})" if zone else "fresh until"
    sites = _short_sites({r["site_id"] for r in rows})
    cells = [{"store": sites[r["site_id"]], "task": r["task"], "kind": r["kind"] or "never loaded",
              until: when(f, seconds=False, offset=zone is None),
              "age": Text(age(r["age_seconds"]), style="red" if r["stale"] else "green"),
              "owed": str(r["owed_details"] or 0)} for r, f in zip(rows, fresh)]
    table, _ = fitted(cells, ["store", "task", "kind", until, "age", "owed"], ("kind",), console.width,
                       left=("store", "task", "kind", until))
    console.print(table)
    line = f"{report['stale']} of {len(rows)} older than {report['stale_after_hours']:g} h or never loaded"
    console.print(Text(line, style="red" if report["stale"] else "green"))


def _aware(value: Any) -> Any:
    """An ISO 8601 text read as a datetime (JSON-shaped rows); anything else as it is."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def render_runs(rows: list[dict], console: Console | None = None) -> None:
    """Runs newest first, start times in the display zone (its offset in the header). Fitted to the terminal:
    run ids and statuses are never cut, and a non-zero rejection or error count is never hidden — an all-zero
    ``rej`` or ``err`` column goes first, then ``tasks``, ``stores``, the seconds of the start time and ``took``
    (``--json`` and a pipe have them all)."""
    console = console or stdout_console()
    rows = escape_tree(rows)
    sites = _short_sites({s for r in rows for s in (r.get("stores") or [])})
    zone = header_zone(r.get("started_at") for r in rows)
    started = f"started ({zone})" if zone else "started"

    def cells(r: dict, seconds: bool) -> dict[str, Any]:
        stores = r.get("stores") or []
        status = _status(r["status"])
        if r.get("recorded_late_at"):
            status.append("*")
        return {"run": r["run_id"], "status": status,
                started: when(r.get("started_at"), seconds=seconds, offset=zone is None, year=False),
                "took": duration(r.get("duration")),
                "stores": sites.get(stores[0], str(stores[0])) if len(stores) == 1 else str(len(stores)),
                "tasks": str(len(r.get("tasks") or [])), "rows": _n(r.get("rows_written")),
                "req": _n(r.get("requests")), "rej": _n(r.get("rejections")), "err": _n(r.get("errors"))}

    columns = ["run", "status", started, "took", "stores", "tasks", "rows", "req", "rej", "err"]
    empty = tuple(c for c, key in (("rej", "rejections"), ("err", "errors")) if not any(r.get(key) for r in rows))
    left = ("run", "status", started, "took", "stores", "tasks")
    for seconds in (True, False):  # the start's seconds go before `took` does
        drops = (*empty, "tasks", "stores", *(() if seconds else ("took",)))
        t, shown = fitted([cells(r, seconds) for r in rows], columns, drops, console.width, left=left)
        if "took" in shown:
            break
    console.print(t)
    if not rows:
        console.print("no runs recorded yet", style="dim")
    if any(r.get("recorded_late_at") for r in rows):
        console.print("* recorded late: the database did not answer when the run ended; a later command wrote its "
                      "record (feiqiu-etl show RUN_ID)", style="dim")


def _params(error: dict) -> str:
    """`` [memberId=…]``: the request parameters of an error (which parent a detail failure was about)."""
    params = error.get("params")
    return (" [" + ", ".join(f"{k}={v}" for k, v in params.items()) + "]") if params else ""


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def render_show(run: dict, console: Console | None = None) -> None:
    """Everything about one run: the record, per lane/store/task results, every error, and its stored log."""
    console = console or stdout_console()
    run = escape_tree(run)
    console.print(Text.assemble(f"run {run['run_id']}: ", _status(run["status"]),
                                f"  exit {run['exit_code'] if run.get('exit_code') is not None else '-'}"))
    console.print(f"command: {run.get('command') or '-'}  host {run.get('host')} pid {run.get('pid')}  "
                  f"version {run.get('version') or '-'}")
    console.print(f"started {_ts(run.get('started_at'))}, finished {_ts(run.get('finished_at'))}, took "
                  f"{duration(run.get('duration'))}")
    if run.get("error"):
        console.print(Text(f"error: {run['error']}", style="red"), soft_wrap=True)
    if run.get("cancel_requested_at"):
        console.print(f"cancel requested {_ts(run['cancel_requested_at'])} by {run.get('cancel_requested_by')}")
    if run.get("recorded_late_at"):
        console.print(f"recorded late, at {_ts(run['recorded_late_at'])}: the database did not answer when the run "
                      "ended; the run kept its record and a later command wrote it", style="yellow")
    args = run.get("args") or {}
    if args:
        console.print("arguments: " + " ".join(f"{k}={v}" for k, v in args.items() if v not in (None, "", [], False)),
                      overflow="fold", style="dim")
    summary = run.get("summary")
    if summary:
        for lane in summary.get("lanes", []):
            console.print(Text.assemble(f"lane {lane['name']} ({lane['key']}): ", _status(lane["status"]),
                                        f"  {lane.get('requests_sent', 0)} requests, {lane.get('throttled', 0)} "
                                        f"throttled, {lane.get('banned', 0)} banned ({lane.get('banned_seconds', 0)} s)"
                                        f", {duration(lane.get('seconds'))}"))
            if lane.get("deadline"):
                console.print("  " + deadline_line(lane["name"], lane["deadline"]), overflow="fold")
            for store in lane.get("stores", []):
                name = f" ({store['name']})" if store.get("name") else ""
                console.print(Text.assemble(f"  store {store['site_id']}{name}: ", _status(store["status"]),
                                            f"  {store['tasks_done']}/{store['tasks']} tasks, {store['rows']} rows"
                                            + (f"  — {store['reason']}" if store.get("reason") else "")))
        render_summary(summary, console, more_hint=False)
        for t in summary.get("tasks", []):
            if t.get("windows"):
                w = t["windows"]
                console.print(f"{t['task']} {t['site_id']}: windows {w[0][0]} … {w[-1][1]} ({UPSTREAM_ZONE}, the "
                              f"upstream's time; {len(w)} segment(s))", style="dim")
            for e in t["errors"][ERRORS_SHOWN:]:
                console.print(Text(f"{t['task']}: {e.get('stage')}: {e.get('error')}{_params(e)}", style="red"), soft_wrap=True)
        render_reconcile(summary.get("tasks", []), console)
    live = recorded_live(run.get("live"))
    if live is not None:
        console.print(progress_view(live))
    if run.get("pruned_at"):
        console.print(f"timeline pruned on {_ts(run['pruned_at'])}: its stored log and request timeline were removed "
                      "(run.retention_days, feiqiu-etl runs prune)", style="yellow")
    log = run.get("log") or []
    if log:
        console.print(f"log ({len(log)} lines):", style="bold")
        for e in log:
            context = " ".join(str(e[k]) for k in ("lane", "site_id", "task") if e.get(k) is not None)
            console.print(Text(f"{_ts(e['ts'])} {e['level']:<7} {('[' + context + '] ') if context else ''}"
                               f"{e['message']}", style="red" if e["level"] in ("ERROR", "CRITICAL") else
                               "yellow" if e["level"] == "WARNING" else ""), soft_wrap=True)


RECONCILE_STYLE = {"ok": "green", "refetched": "cyan", "short": "red", "over": "yellow", "unexpected_zero": "yellow",
                   "incomplete": "dim"}


def render_reconcile(tasks: list[dict], console: Console | None = None) -> None:
    """Print :func:`reconcile_lines` (escaped: the reasons quote upstream totals only, but stay safe)."""
    console = console or stdout_console()
    for text, verdict in reconcile_lines(escape_tree(tasks)):
        console.print(Text(text, style=RECONCILE_STYLE.get(verdict, "bold")), soft_wrap=True)


def render_status(runs: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    runs = escape_tree(runs)
    if not runs:
        console.print("no run is in progress")
        return
    for r in runs:
        live = recorded_live(r.get("live"))
        console.print(Text.assemble(f"run {r['run_id']} ", _status(Status.RUNNING),
                                    f" for {duration(r.get('duration'))} on {r.get('host')} pid {r.get('pid')}, "
                                    f"heartbeat {r.get('heartbeat_age') or 0:.0f} s ago"))
        if live is not None:
            console.print(progress_view(live))


def render_details(rows: list[dict], console: Console | None = None) -> None:
    console = console or stdout_console()
    rows = escape_tree(rows)
    t = compact_table()
    for col in ("task", "site", "parent", "attempts", "last error", "since"):
        t.add_column(col, overflow="fold", no_wrap=col not in ("last error",))
    for r in rows:
        t.add_row(r["task_code"], str(r["site_id"]), r["parent_key"], str(r["attempts"]), r.get("last_error") or "",
                  _ts(r.get("updated_at")))
    console.print(f"{len(rows)} owed detail(s)")
    if rows:
        console.print(t)


def _ts(value: Any) -> str:
    """A time in the display zone with its offset (:func:`feiqiu_etl.formats.when`)."""
    return when(value)
