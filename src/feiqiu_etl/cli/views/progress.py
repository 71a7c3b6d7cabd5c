"""The live progress display on a terminal: a header and three lines per lane, redrawn twice a second from
``runner.statistics()`` (:mod:`feiqiu_etl.app.progress` polls it; without a terminal it prints plain lines)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Group
from rich.live import Live
from rich.text import Text

from feiqiu_etl import logs
from feiqiu_etl.app.progress import every, progress_lines
from feiqiu_etl.cli.views.console import SafeConsole
from feiqiu_etl.formats import duration
from feiqiu_etl.statistics import LaneStatistics, RunStatistics
from feiqiu_etl.textsafe import escape_tree


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
    if run.pool_waiting:  # contention, not an outage (issue 28 item 9)
        head.append(f" · {run.pool_waiting} waiting for a database connection ({run.pool_in_use}/{run.pool_size} "
                    f"in use, longest {duration(run.pool_wait_s)})", style="yellow")
    head.no_wrap, head.overflow = True, "ellipsis"
    lines: list[Text] = [head]
    for lane in run.lanes:
        lines.extend(lane_lines(lane))
    return Group(*lines)


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
                with every(0.5, lambda: live.update(progress_view(runner.statistics()))):
                    yield
            finally:
                logs.attach_console(None)
        return
    with progress_lines(runner, lambda line: logs.progress_line(line, console), heartbeat):
        yield
