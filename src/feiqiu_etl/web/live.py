"""``LiveFeed``: ONE database poller behind every open Live page (server-sent events).

A running run publishes its live snapshot and heartbeat to ``etl_meta.run`` about once a second
(:mod:`feiqiu_etl.registry.control`). While at least one page listens, the feed reads the running and just
finished runs every ``interval`` seconds (default 0.25, in a worker thread: psycopg is blocking) and hands the
JSON text to every listener when anything but the clock changed — a new heartbeat, a new status, a cancel
request. So a change at the lane is on the page within heartbeat interval + ``interval`` + render time, and
ten open pages cost the database what one does. Every ``sweep_every`` seconds it also marks runs whose
process vanished ``INTERRUPTED`` (``registry.sweep_interrupted``), so that no dead run stays "running" on
the page. With no listener left it stops polling.

It never raises into a page: a failed read is counted, published as ``{"error": ...}`` and retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool

from feiqiu_etl.web.queries import jsonable

log = logging.getLogger("feiqiu_etl.web")

KEEPALIVE = 15.0
"""Seconds between SSE comments when nothing changes (keeps proxies from closing the stream)."""


@dataclass(frozen=True)
class FeedStatistics:
    listeners: int
    polls: int
    changes: int
    failed_polls: int
    sweeps: int
    last_poll_ms: float | None
    polling: bool


def change_key(data: dict) -> str:
    """What must differ for a payload to be sent again: runs, statuses, heartbeats, cancel flags, snapshots
    (not the clock, the heartbeat age or the running duration, which change on every read)."""
    running = [(r.get("run_id"), r.get("status"), r.get("heartbeat_at"), r.get("cancel_requested_at"),
                r.get("live")) for r in data.get("running", [])]
    finished = [(r.get("run_id"), r.get("status")) for r in data.get("finished", [])]
    return json.dumps(jsonable([running, finished, data.get("error")]), sort_keys=True, default=str)


class LiveFeed:
    """See module docstring. ``read()`` returns the status payload (blocking); ``sweep()`` marks vanished
    runs; both run in worker threads."""

    def __init__(self, read: Callable[[], dict], *, sweep: Callable[[], object] | None = None,
                 interval: float = 0.25, sweep_every: float = 5.0):
        self._read = read
        self._sweep = sweep
        self._interval = interval
        self._sweep_every = sweep_every
        self._version = 0
        self._payload: str | None = None
        self._key: str | None = None
        self._listeners = 0
        self._task: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None
        self._closed = False
        self._polls = self._changes = self._failed = self._sweeps = 0
        self._last_ms: float | None = None

    def statistics(self) -> FeedStatistics:
        return FeedStatistics(listeners=self._listeners, polls=self._polls, changes=self._changes,
                              failed_polls=self._failed, sweeps=self._sweeps, last_poll_ms=self._last_ms,
                              polling=self._task is not None and not self._task.done())

    def close(self) -> None:
        """Stop: every listener ends within ``interval`` seconds (called on server shutdown)."""
        self._closed = True

    async def listen(self) -> AsyncIterator[str | None]:
        """The current payload at once, then each new one; None every :data:`KEEPALIVE` seconds without
        change. Ends when the feed is closed."""
        self._listeners += 1
        self._ensure_polling()
        seen, quiet_since = -1, time.monotonic()
        try:
            while not self._closed:
                changed = self._changed  # captured before the check: a change after it sets this event
                assert changed is not None
                if self._version != seen and self._payload is not None:
                    seen, quiet_since = self._version, time.monotonic()
                    yield self._payload
                    continue
                try:
                    await asyncio.wait_for(changed.wait(), timeout=max(self._interval, 0.5))
                except asyncio.TimeoutError:
                    if time.monotonic() - quiet_since >= KEEPALIVE:
                        quiet_since = time.monotonic()
                        yield None
        finally:
            self._listeners -= 1

    def _ensure_polling(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll(), name="live-feed")

    async def _poll(self) -> None:
        last_sweep = 0.0
        while not self._closed and self._listeners > 0:
            started = time.monotonic()
            if self._sweep is not None and started - last_sweep >= self._sweep_every:
                last_sweep = started
                try:
                    await run_in_threadpool(self._sweep)
                    self._sweeps += 1
                except Exception as exc:  # noqa: BLE001 - the next poll reports a dead database
                    log.debug("sweep failed: %s", exc.__class__.__name__)
            try:
                data = await run_in_threadpool(self._read)
            except Exception as exc:  # noqa: BLE001 - shown on the page, retried
                self._failed += 1
                data = {"error": f"cannot read the run registry ({exc.__class__.__name__}); retrying"}
            self._polls += 1
            self._last_ms = round((time.monotonic() - started) * 1000, 2)
            key = change_key(data)
            if key != self._key:
                self._key = key
                self._payload = json.dumps(jsonable(data), ensure_ascii=False)
                self._version += 1
                self._changes += 1
                self._publish()
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - started)))
        self._payload = self._key = None  # a later listener waits for a fresh read, never sees stale data
        self._publish()

    def _publish(self) -> None:
        """Wake every listener waiting now; later waits use a fresh event."""
        changed, self._changed = self._changed, asyncio.Event()
        if changed is not None:
            changed.set()
