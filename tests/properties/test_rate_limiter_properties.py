"""Property 2 (spec §5): every gap the ``RateLimiter`` waits lies in ``[min_interval, max_interval]``.

Checked on a ``FakeClock`` (no sleeping): one drawn gap waited in full, and the gaps the serial lane
(``RequestScheduler``) actually leaves between the end of one response and the start of the next.
The spec allows ±0.5 s of scheduling noise for real clocks; on virtual time the bound is exact.
"""

from __future__ import annotations

import random
import threading

from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.pipeline import FakeClock, RateLimiter, RequestScheduler

EPS = 1e-9


def _waited_in_full(limiter: RateLimiter, clock: FakeClock, cancel_event: threading.Event) -> bool:
    """A gap as the lane waits it right after an answer (``RequestScheduler``: a cancel first, then one interval
    drawn from ``limiter`` on the clock, zero included); False when cancelled."""
    if cancel_event.is_set():
        return False
    return not clock.wait(cancel_event, limiter.draw())


@st.composite
def intervals(draw) -> tuple[float, float]:
    """Valid (min, max) pairs, including min == max, zero, sub-second and large gaps."""
    low = draw(st.one_of(st.sampled_from([0.0, 0.5, 5.0, 20.0]), st.floats(0.0, 120.0, allow_nan=False)))
    width = draw(st.one_of(st.sampled_from([0.0, 1e-6, 15.0]), st.floats(0.0, 60.0, allow_nan=False)))
    return low, low + width


# Feature: etl-unified-pipeline, Property 2: RateLimiter 间隔范围
@given(
    bounds=intervals(),
    seed=st.integers(0, 2**32 - 1),
    durations=st.lists(st.sampled_from([0.0, 0.05, 1.0, 30.0]), min_size=1, max_size=12),
)
def test_p2_every_gap_lies_within_min_and_max(bounds, seed, durations):
    low, high = bounds
    clock = FakeClock()
    limiter = RateLimiter(low, high, rng=random.Random(seed))

    # each drawn interval is waited in full and reported as last_interval
    for _ in durations:
        assert _waited_in_full(limiter, clock, threading.Event()) is True
        assert low - EPS <= limiter.last_interval <= high + EPS
    assert len(clock.waits) == len(durations)
    assert all(low - EPS <= w <= high + EPS for w in clock.waits), clock.waits
    assert limiter.statistics().draws == len(durations)
    cancelled = threading.Event()
    cancelled.set()
    assert _waited_in_full(limiter, clock, cancelled) is False and len(clock.waits) == len(durations)

    # through the lane: the gap from one response's end to the next request's start
    lane_clock = FakeClock()
    lane = RequestScheduler(lane_clock)
    lane_limiter = RateLimiter(low, high, rng=random.Random(seed))
    spans = []

    def request(duration: float):
        start = lane_clock.monotonic()
        lane_clock.advance(duration)
        spans.append((start, lane_clock.monotonic()))

    for d in durations:
        lane.send(lambda d=d: request(d), lane_limiter, threading.Event())
    for (_, prev_end), (start, _) in zip(spans, spans[1:]):
        assert low - EPS <= start - prev_end <= high + EPS
