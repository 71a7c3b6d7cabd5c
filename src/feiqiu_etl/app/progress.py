"""Observing a run while it runs, without a terminal: a helper thread polls the runner (:func:`every`),
:func:`progress_lines` emits one plain line per finished task and a heartbeat line; :func:`recorded_live` reads a
recorded live snapshot back as :class:`~feiqiu_etl.statistics.RunStatistics`. Plain text only (the CLI's rich
display is :mod:`feiqiu_etl.cli.views.progress`); what a Dagster step writes into its event log."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from feiqiu_etl.formats import duration
from feiqiu_etl.statistics import RunStatistics


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
def every(seconds: float, fn: Callable[[], None]) -> Iterator[None]:
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

    with every(0.5, report):
        yield
