import threading
import time

import pytest

from feiqiu_etl.pipeline import Cancelled, FakeClock, RateLimiter, RequestScheduler
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.clock import SYSTEM_CLOCK


def _sent_after_gap(limiter: RateLimiter, cancel_event: threading.Event | None = None, clock=SYSTEM_CLOCK) -> bool:
    """One gap of ``limiter`` as the lane waits it (``RequestScheduler.send``): right after an answer, the next
    request goes out after the drawn gap. True when it was sent, False when cancelled before or during the gap."""
    lane = RequestScheduler(clock)
    lane.send(lambda: None, RateLimiter(0, 0))  # the first request of a lane is not delayed
    try:
        lane.send(lambda: None, limiter, cancel_event)
    except Cancelled:
        return False
    return True


def test_wait_returns_within_50_ms_of_a_cancel_real_clock():
    limiter = RateLimiter(10.0, 10.0)
    token = CancellationToken()
    cancelled_at: list[float] = []

    def cancel():
        cancelled_at.append(time.monotonic())
        token.cancel()

    threading.Timer(0.05, cancel).start()
    assert _sent_after_gap(limiter, token.event) is False
    assert time.monotonic() - cancelled_at[0] < 0.05


def test_bounds_and_validation():
    clock = FakeClock()
    assert _sent_after_gap(RateLimiter(2.0, 2.0), clock=clock) is True and clock.waits == [2.0]
    with pytest.raises(ValueError):
        RateLimiter(3.0, 2.0)
    pre = CancellationToken()
    pre.cancel()
    assert _sent_after_gap(RateLimiter(1, 2), pre.event, clock) is False


def test_lane_gap_follows_the_next_request_and_spans_task_boundaries():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    standard, groupbuy = RateLimiter(3, 3), RateLimiter(8, 8)
    ends = []

    def call(duration):
        def fn():
            start = clock.monotonic()
            clock.advance(duration)
            ends.append((start, clock.monotonic()))
        return fn

    lane.send(call(0.5), standard)           # task A, first request of the lane: no wait
    lane.send(call(0.5), groupbuy)           # task B: its own (8 s) gap, measured from A's response end
    lane.send(call(0.5), standard)           # back to A: 3 s
    lane.send(call(0.5), standard, min_wait=6.0)  # a Retry-After hint is a minimum
    gaps = [b[0] - a[1] for a, b in zip(ends, ends[1:])]
    assert gaps == [8.0, 3.0, 6.0]


def test_cancel_during_lane_wait_raises_and_sends_nothing():
    lane = RequestScheduler()
    limiter = RateLimiter(5, 5)
    token = CancellationToken()
    lane.send(lambda: None, limiter, token.event)
    threading.Timer(0.02, token.cancel).start()
    sent = []
    with pytest.raises(Cancelled):
        lane.send(lambda: sent.append(1), limiter, token.event)
    assert sent == [] and lane.statistics().requests_sent == 1


def test_a_timed_out_request_holds_the_lane_for_the_next_request_of_any_task():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    limiter = RateLimiter(1, 1)

    class Timeout(Exception):
        hold_lane_seconds = 60.0

    def timed_out():
        clock.advance(30)
        raise Timeout()

    with pytest.raises(Timeout):
        lane.send(timed_out, limiter)
    ended = clock.monotonic()
    starts = []
    lane.send(lambda: starts.append(clock.monotonic()), RateLimiter(0, 0))  # another task, no gap
    lane.send(lambda: starts.append(clock.monotonic()), limiter)
    assert starts[0] - ended >= 60.0  # held, although that task's own gap is 0
    assert starts[1] - starts[0] == 1.0  # the hold applies once


class _LateClock(FakeClock):
    """A busy machine: every wait ends ``late`` seconds after it was due."""

    def __init__(self, late: float):
        super().__init__()
        self.late = late

    def wait(self, event, timeout):
        cancelled = super().wait(event, timeout)
        if timeout > 0:
            self.advance(self.late)
        return cancelled


def test_the_lane_counts_the_time_it_woke_after_a_request_was_due():
    clock = _LateClock(0.004)
    lane = RequestScheduler(clock)
    for _ in range(4):
        lane.send(lambda: clock.advance(0.002), RateLimiter(0.033, 0.033))
    s = lane.statistics()
    # three gaps of 33 ms, each ended 4 ms late: the waits hold the lateness, and late_seconds says how much of it
    assert s.waited_seconds == pytest.approx(3 * 0.037)
    assert s.late_seconds == pytest.approx(3 * 0.004)
