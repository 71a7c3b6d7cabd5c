"""Gaps narrowed to meet a deadline (issue 20 item 3), with a fake clock: a narrowed gap is never below its class's
safe floor (the documented minimum plus the margin) nor below a floor the upstream taught the lane (a 42901 in
this run, or a learnt floor of earlier runs, which the plan folds into the safe floor); nothing is narrowed when
the pace is 1; a gap already below the floor is never widened."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.pipeline import FakeClock, RateLimiter, RequestScheduler
from feiqiu_etl.pipeline.errors import LaneBackoff
from feiqiu_etl.pipeline.pace import Pace
from feiqiu_etl.plan.fit import safe_gaps

DOCUMENTED = {"standard": 3.0, "groupbuy": 8.0}


class Throttled(Exception):
    def __init__(self, seconds: float):
        super().__init__("42901")
        self.lane_backoff = LaneBackoff(seconds, "throttled", "code 42901")


def _gaps(lane: RequestScheduler, clock: FakeClock, limiter: RateLimiter, n: int, gap_class: str = "standard",
          fail: set[int] = frozenset()) -> list[float]:
    """Send ``n`` requests (those whose index is in ``fail`` answer 42901 after 1 s of retry hint); the gaps between
    one response's end and the next request's start, as the upstream measures them."""
    ends, starts = [], []

    def call(i: int):
        def fn():
            starts.append(clock.monotonic())
            clock.advance(0.05)
            ends.append(clock.monotonic())
            if i in fail:
                raise Throttled(1.0)
        return fn

    for i in range(n):
        try:
            lane.send(call(i), limiter, gap_class=gap_class)
        except Throttled:
            pass
    return [b - a for a, b in zip(ends, starts[1:])]


def test_the_safe_floor_is_the_documented_minimum_plus_the_margin_or_a_learnt_floor():
    assert safe_gaps(DOCUMENTED, share=0.1, seconds=0.3) == {"standard": 3.3, "groupbuy": 8.8}
    assert safe_gaps({"standard": 1.0}, share=0.1, seconds=0.3) == {"standard": 1.3}  # the seconds win
    assert safe_gaps(DOCUMENTED, share=0.1, seconds=0.3, learnt={"groupbuy": 9.5, "other": 2.0}) == \
        {"standard": 3.3, "groupbuy": 9.5}


@pytest.mark.parametrize("factor", [0.0, 0.25, 0.5, 1.0])
def test_a_narrowed_gap_stays_random_within_the_narrower_range_and_never_below_the_floor(factor):
    clock = FakeClock()
    safe = safe_gaps(DOCUMENTED, share=0.1, seconds=0.3)
    lane = RequestScheduler(clock, pace=Pace(safe, factor))
    limiter = RateLimiter(5, 20, rng=random.Random(7))
    gaps = _gaps(lane, clock, limiter, 400)
    low, high = 3.3 + factor * (5 - 3.3), 3.3 + factor * (20 - 3.3)
    assert min(gaps) >= low - 1e-9 and max(gaps) <= high + 1e-9
    assert min(gaps) >= 3.3 - 1e-9
    if factor > 0:  # still random: the draws spread over the narrower range
        assert max(gaps) - min(gaps) > 0.8 * (high - low)
    else:
        assert max(gaps) == pytest.approx(3.3)


def test_pace_one_changes_nothing_and_a_class_without_a_floor_is_never_narrowed():
    clock, other = FakeClock(), FakeClock()
    plain = RequestScheduler(other)
    paced = RequestScheduler(clock, pace=Pace({"standard": 3.3}, 1.0))
    a = _gaps(paced, clock, RateLimiter(5, 20, rng=random.Random(3)), 50)
    b = _gaps(plain, other, RateLimiter(5, 20, rng=random.Random(3)), 50)
    assert a == b
    clock = FakeClock()
    lane = RequestScheduler(clock, pace=Pace({"standard": 3.3}, 0.0))
    gaps = _gaps(lane, clock, RateLimiter(5, 6), 20, gap_class="groupbuy")
    assert min(gaps) >= 5 - 1e-9


def test_a_gap_below_its_floor_is_never_widened():
    clock = FakeClock()
    lane = RequestScheduler(clock, pace=Pace({"standard": 3.3}, 0.0))
    gaps = _gaps(lane, clock, RateLimiter(0.1, 0.2), 30)  # --unsafe-gaps against a simulator
    assert max(gaps) <= 0.2 + 1e-9


def test_a_42901_in_this_run_raises_the_floor_above_the_narrowed_gap():
    clock = FakeClock()
    lane = RequestScheduler(clock, pace=Pace({"standard": 3.3}, 0.0))
    gaps = _gaps(lane, clock, RateLimiter(5, 20), 40, fail={10})
    learnt = lane.floor("standard")
    assert learnt == pytest.approx(3.3 + 1.0)  # the gap it had plus the wait the upstream demanded
    assert gaps[:10] == pytest.approx([3.3] * 10)
    assert min(gaps[11:]) >= learnt - 1e-9  # never below the floor the upstream taught the lane


@given(floor=st.floats(0.5, 30), share=st.floats(0, 1), seconds=st.floats(0, 5), factor=st.floats(0, 1),
       low=st.floats(0, 40), spread=st.floats(0, 40), learnt=st.none() | st.floats(0, 60), seed=st.integers(0, 99))
def test_never_below_floor_plus_margin_or_a_learnt_floor(floor, share, seconds, factor, low, spread, learnt, seed):
    safe = safe_gaps({"standard": floor}, share=share, seconds=seconds,
                     learnt={"standard": learnt} if learnt is not None else {})
    bound = max(floor * (1 + share), floor + seconds, learnt or 0.0)
    assert safe["standard"] == pytest.approx(bound)
    clock = FakeClock()
    lane = RequestScheduler(clock, pace=Pace(safe, factor))
    gaps = _gaps(lane, clock, RateLimiter(low, low + spread, rng=random.Random(seed)), 12)
    # a configured gap at or above the bound is narrowed no lower than the bound; one below it stays as it was
    assert min(gaps) >= min(bound, low) - 1e-6
    assert max(gaps) <= max(low + spread, bound) + 1e-6
