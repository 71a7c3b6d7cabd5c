"""The lane as a shared, self-protecting resource: floors per gap class, demanded waits binding the lane,
round-robin between tenants, the circuit breaker, aborting a request in flight, and the attempt records."""

import threading
import time

import pytest

from feiqiu_etl.pipeline import Cancelled, FakeClock, RateLimiter, RequestScheduler
from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.errors import LaneBackoff, LaneTripped


class Throttled(Exception):
    def __init__(self, seconds, kind="throttled"):
        super().__init__(f"{kind} {seconds}")
        self.lane_backoff = LaneBackoff(seconds, kind, "code 42901" if kind == "throttled" else "code 42902")


class Refused(Exception):
    transport_failure = True


def _timed(clock, log, duration=0.1, error=None):
    def fn():
        start = clock.monotonic()
        clock.advance(duration)
        log.append((start, clock.monotonic()))
        if error is not None:
            raise error
    return fn


def test_a_throttled_answer_raises_the_floor_of_its_class_for_the_rest_of_the_lane():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    fast = RateLimiter(0.5, 0.5)
    log: list = []
    lane.send(_timed(clock, log), fast, gap_class="standard")
    with pytest.raises(Throttled):  # sent 0.5 s after the previous end; the upstream demands 3 s more
        lane.send(_timed(clock, log, error=Throttled(3)), fast, gap_class="standard")
    for _ in range(3):
        lane.send(_timed(clock, log), fast, gap_class="standard")
    lane.send(_timed(clock, log), fast, gap_class="groupbuy")  # another class keeps its own gap
    gaps = [b[0] - a[1] for a, b in zip(log, log[1:])]
    assert gaps[0] == 0.5
    assert gaps[1] == pytest.approx(3.5)  # the hold after the rejection: the demanded wait, for any request
    assert gaps[2:4] == [pytest.approx(3.5)] * 2  # the class floor: 0.5 s sent + 3 s demanded
    assert gaps[4] == 0.5
    s = lane.statistics()
    assert s.floors == {"standard": pytest.approx(3.5)} and s.throttled == 1 and s.banned == 0


def test_a_wait_demanded_on_the_last_attempt_binds_the_next_request_whatever_its_task():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    log: list = []
    with pytest.raises(Throttled):
        lane.send(_timed(clock, log, error=Throttled(5, kind="hold")), RateLimiter(0, 0))
    lane.send(_timed(clock, log), RateLimiter(0, 0), gap_class="other")  # another task, no gap
    assert log[1][0] - log[0][1] == pytest.approx(5.0)
    assert lane.statistics().floors == {}  # a plain hold teaches no floor


def test_a_ban_holds_the_lane_and_is_counted_in_seconds():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    log: list = []
    with pytest.raises(Throttled):
        lane.send(_timed(clock, log, error=Throttled(287, kind="banned")), RateLimiter(1, 1))
    s = lane.statistics()
    assert (s.banned, s.banned_seconds) == (1, 287)
    lane.send(_timed(clock, log), RateLimiter(1, 1))
    assert log[1][0] - log[0][1] == pytest.approx(287)


def test_tenants_take_turns_on_the_lane():
    lane = RequestScheduler()
    limiter = RateLimiter(0, 0)
    order: list[str] = []
    gate = threading.Event()

    def tenant(name: str, n: int):
        for _ in range(n):
            lane.send(lambda: (order.append(name), time.sleep(0.002)), limiter, tenant=name)

    big = threading.Thread(target=tenant, args=("big", 30))
    small = [threading.Thread(target=tenant, args=(f"s{i}", 3)) for i in range(2)]
    lane.send(lambda: gate.wait(0.2), limiter, tenant="warmup")  # nothing runs until all are queued
    for t in [big, *small]:
        t.start()
    for t in [big, *small]:
        t.join(10)
    last_small = max(i for i, name in enumerate(order) if name != "big")
    assert last_small < 12, order  # 3 requests each, interleaved: done long before the big tenant's 30


def test_the_breaker_trips_after_consecutive_transport_failures_and_stops_every_tenant():
    clock = FakeClock()
    lane = RequestScheduler(clock, max_transport_failures=3)
    limiter = RateLimiter(0, 0)
    for _ in range(2):
        with pytest.raises(Refused):
            lane.send(_raiser(Refused("refused")), limiter)
    lane.send(lambda: None, limiter)  # a success resets the streak
    for _ in range(3):
        with pytest.raises(Refused):
            lane.send(_raiser(Refused("refused")), limiter)
    assert "upstream unreachable" in lane.tripped
    with pytest.raises(LaneTripped):
        lane.send(lambda: None, limiter, tenant="another store")
    assert lane.statistics().requests_sent == 6


def _raiser(exc):
    def fn():
        raise exc
    return fn


def test_a_cancel_aborts_the_request_in_flight_at_once():
    lane = RequestScheduler()
    token = CancellationToken()
    release = threading.Event()
    threading.Timer(0.1, token.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        lane.send(lambda: release.wait(5), RateLimiter(0, 0), token.event, abortable=True)
    assert time.monotonic() - started < 0.5
    release.set()
    assert lane.statistics().aborted_in_flight == 1


def test_attempt_records_carry_gap_drawn_and_waited_reason_and_outcome():
    clock = FakeClock()
    records = []
    lane = RequestScheduler(clock, observer=records.append)
    limiter = RateLimiter(2, 2)
    lane.send(_timed(clock, []), limiter, label="/a page 1", tenant=7, gap_class="standard")
    with pytest.raises(Throttled):
        lane.send(_timed(clock, [], error=Throttled(4)), limiter, label="/a page 2", tenant=7, gap_class="standard")
    lane.send(_timed(clock, []), limiter, label="/a page 2", tenant=7, gap_class="standard")
    assert [(r.seq, r.outcome, r.wait_reason) for r in records] == [(1, "ok", None), (2, "throttled", "gap"),
                                                                     (3, "ok", "floor")]  # 2 s drawn + 4 s demanded
    assert records[1].gap == pytest.approx(2.0) and records[2].label == "/a page 2" and records[2].tenant == 7
    assert [r.drawn for r in records] == pytest.approx([2.0] * 3)  # the gap drawn, beside the gap waited:
    assert records[2].gap == pytest.approx(6.0)  # the floor's 6 s


def test_a_rejection_of_a_request_that_honoured_the_floor_does_not_ratchet_it_up():
    clock = FakeClock()
    lane = RequestScheduler(clock)
    fast = RateLimiter(0.1, 0.1)
    lane.send(_timed(clock, []), fast, gap_class="standard")
    with pytest.raises(Throttled):
        lane.send(_timed(clock, [], error=Throttled(3)), fast, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(3.1)
    for _ in range(3):  # e.g. another process on the token: rejected although the floor was honoured
        with pytest.raises(Throttled):
            lane.send(_timed(clock, [], error=Throttled(3)), fast, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(3.1)
    assert lane.statistics().throttled == 4
