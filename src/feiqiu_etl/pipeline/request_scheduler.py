"""``RequestScheduler``: the one serial request lane of an upstream account (spec §2.2, Property 1).

Every request of every task of a flow goes through ``send()``. The lane guarantees:

* strictly one request at a time (a lock held from the gap wait until the response has fully arrived);
* the gap before a request is drawn from *that request's* limiter (its task's configuration) and is
  measured from the end of the previous response, across task boundaries too (ENGINE-NOTES);
* a retry hint (``min_wait``, e.g. ``Retry-After``) is a minimum: the wait is ``max(gap, min_wait)``;
* waits are cancellable: on cancel ``send`` raises ``Cancelled`` without sending;
* a request that failed with an exception carrying ``hold_lane_seconds`` (e.g. a client timeout: the
  server may still be working on it) keeps the lane closed that long after it ended, for whatever
  request comes next — a retry or another task's request.

It never retries by itself and knows nothing of HTTP.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from feiqiu_etl.pipeline.clock import SYSTEM_CLOCK, Clock
from feiqiu_etl.pipeline.errors import Cancelled
from feiqiu_etl.pipeline.rate_limiter import RateLimiter

T = TypeVar("T")


@dataclass(frozen=True)
class LaneStatistics:
    """Snapshot of the lane: requests sent, whether one is in flight, and the last gap waited (s)."""

    requests_sent: int
    in_flight: bool
    last_gap: float
    next_due_in: float
    cancelled_waits: int


class RequestScheduler:
    """The serial lane. One instance per upstream account per flow (no global state)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK):
        self._clock = clock
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._last_end: float | None = None
        self._sent = 0
        self._in_flight = False
        self._last_gap = 0.0
        self._due: float | None = None
        self._hold_until: float | None = None
        self._cancelled_waits = 0

    @property
    def clock(self) -> Clock:
        return self._clock

    def send(
        self,
        fn: Callable[[], T],
        limiter: RateLimiter,
        cancel_event: threading.Event | None = None,
        *,
        min_wait: float = 0.0,
    ) -> T:
        """Wait for the gap, then call ``fn()`` (the actual request) and record when it ended.

        The gap is ``max(limiter.draw(), min_wait)`` seconds after the previous response ended; the
        first request of a lane is not delayed unless ``min_wait`` > 0. Raises ``Cancelled`` if the
        token fires before sending; exceptions from ``fn`` propagate (the end time is still recorded).
        """
        with self._lock:
            if cancel_event is not None and cancel_event.is_set():
                raise Cancelled()
            gap = max(limiter.draw(), min_wait)
            with self._state:
                base = self._last_end if self._last_end is not None else None
                now = self._clock.monotonic()
                due = (base + gap) if base is not None else (now + min_wait)
                if self._hold_until is not None:
                    due = max(due, self._hold_until)
                self._due = due
                self._last_gap = gap
            remaining = due - now
            if remaining > 0 and self._clock.wait(cancel_event, remaining):
                with self._state:
                    self._cancelled_waits += 1
                    self._due = None
                raise Cancelled()
            if cancel_event is not None and cancel_event.is_set():
                raise Cancelled()
            with self._state:
                self._in_flight = True
                self._due = None
                self._sent += 1
            hold = 0.0
            try:
                return fn()
            except BaseException as exc:
                hold = float(getattr(exc, "hold_lane_seconds", 0.0) or 0.0)
                raise
            finally:
                with self._state:
                    self._last_end = self._clock.monotonic()
                    self._hold_until = self._last_end + hold if hold > 0 else None
                    self._in_flight = False

    def statistics(self) -> LaneStatistics:
        with self._state:
            due_in = max(0.0, self._due - self._clock.monotonic()) if self._due is not None else 0.0
            return LaneStatistics(self._sent, self._in_flight, self._last_gap, due_in, self._cancelled_waits)

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<RequestScheduler sent={s.requests_sent} in_flight={s.in_flight} next_due_in={s.next_due_in:.2f}s>"
