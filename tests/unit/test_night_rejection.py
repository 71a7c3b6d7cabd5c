"""Issue 30: a 42901 costs what it costs upstream, and stores complete one after another.

* the floor learnt from a rejection is the rejected gap plus a margin, for that class only, and decays back once
  requests succeed; a retryAfter binds the next request only;
* a night at real scale (fake clock, the simulator's own risk control deciding) that meets one 42901 loses at most
  three gaps, and is never banned;
* ranked tenants: the lane goes to the first store with a request ready, so stores complete in order.
"""

import threading

import pytest

from feiqiu_etl.pipeline import FakeClock, RateLimiter, RequestScheduler
from feiqiu_etl.pipeline.errors import LaneBackoff
from feiqiu_etl.pipeline.pace import Pace
from feiqiu_etl.pipeline.request_scheduler import FLOOR_DECAY_REQUESTS
from feiqiu_etl.simulator.catalog import GapClass
from feiqiu_etl.simulator.config import RiskControlConfig
from feiqiu_etl.simulator.risk import Decision, RiskController

DOCUMENTED = {"standard": 3.0, "groupbuy": 8.0}  # upstream-api.md §2.2


class Rejected(Exception):
    def __init__(self, code, retry_after):
        super().__init__(f"code {code}")
        self.code = code
        kind = "throttled" if code == 42901 else "banned"
        self.lane_backoff = LaneBackoff(float(retry_after), kind, f"code {code}")


def _timed(clock, log, duration=0.05, error=None):
    def fn():
        start = clock.monotonic()
        clock.advance(duration)
        log.append((start, clock.monotonic()))
        if error is not None:
            raise error
    return fn


def test_the_floor_is_the_rejected_gap_plus_the_margin_for_its_class_only_and_decays():
    clock = FakeClock()
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    limiter = RateLimiter(3.3, 3.3)
    log: list = []
    lane.send(_timed(clock, log), limiter, gap_class="standard")
    with pytest.raises(Rejected):  # sent 3.3 s after the last response, the upstream wants 1 s more (whole seconds)
        lane.send(_timed(clock, log, error=Rejected(42901, 1)), limiter, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(3.6)  # 3.3 s + the margin, not 3.3 + 1 s
    assert lane.floor("groupbuy") == 0.0
    lane.send(_timed(clock, log), RateLimiter(0.5, 0.5), gap_class="other")  # the hold binds the next request
    assert log[2][0] - log[1][1] == pytest.approx(1.0)
    lane.send(_timed(clock, log), RateLimiter(0.5, 0.5), gap_class="other")  # ... and only that one
    assert log[3][0] - log[2][1] == pytest.approx(0.5)
    gaps = []
    for _ in range(FLOOR_DECAY_REQUESTS):
        before = clock.monotonic()
        lane.send(_timed(clock, log), limiter, gap_class="standard")
        gaps.append(log[-1][0] - before)
    assert gaps[0] == pytest.approx(3.6) and gaps == sorted(gaps, reverse=True)  # shrinking toward the gap drawn
    assert all(g >= 3.3 - 1e-9 for g in gaps)
    assert lane.statistics().floors == {} and lane.floor("standard") == 0.0  # decayed back
    assert sum(gaps) - 3.3 * len(gaps) <= 0.3 * (FLOOR_DECAY_REQUESTS + 1) / 2 + 1e-6  # half a margin a request


def test_rejected_again_at_the_learnt_floor_the_upstreams_bound_lasts_and_does_not_ratchet_further():
    clock = FakeClock()
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    limiter = RateLimiter(3.3, 3.3)
    lane.send(_timed(clock, []), limiter, gap_class="standard")
    with pytest.raises(Rejected):
        lane.send(_timed(clock, [], error=Rejected(42901, 1)), limiter, gap_class="standard")
    with pytest.raises(Rejected):  # sent at the learnt 3.6 s and still too early: G really is higher
        lane.send(_timed(clock, [], error=Rejected(42901, 1)), limiter, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(3.6 + 1.0)
    for _ in range(FLOOR_DECAY_REQUESTS + 5):
        lane.send(_timed(clock, []), limiter, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(4.6)  # lasting: no decay
    with pytest.raises(Rejected):
        lane.send(_timed(clock, [], error=Rejected(42901, 1)), limiter, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(4.6)


def test_below_the_documented_minimum_the_floor_is_the_documented_one_within_the_upstreams_bound():
    clock = FakeClock()
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    fast = RateLimiter(0.1, 0.1)  # --unsafe-gaps
    lane.send(_timed(clock, []), fast, gap_class="standard")
    with pytest.raises(Rejected):
        lane.send(_timed(clock, [], error=Rejected(42901, 3)), fast, gap_class="standard")
    assert lane.floor("standard") == pytest.approx(3.1)  # min(0.1 + 3 demanded, 3 documented + 0.3)
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    lane.send(_timed(clock, []), fast, gap_class="groupbuy")
    with pytest.raises(Rejected):
        lane.send(_timed(clock, [], error=Rejected(42901, 1)), fast, gap_class="groupbuy")
    assert lane.floor("groupbuy") == pytest.approx(1.1)  # the upstream said: at most 1 s more


def _night(requests: int, *, inject_at: int | None) -> tuple[float, list[int], float]:
    """``requests`` standard requests at the narrowest deadline pace (3.3 s), at real scale on a fake clock, each
    decided by the simulator's risk control (G 3 s); the request ``inject_at`` is answered 42901 (retryAfter 1 s)
    without reaching it, as the simulator's injected ``code42901`` fault does. A rejected request is retried like
    the API client does (its first backoff 1 s, at least retryAfter). Returns the lane time, the codes answered
    and the learnt floor at the end."""
    clock = FakeClock()
    risk = RiskController(RiskControlConfig(), clock=clock.monotonic)
    lane = RequestScheduler(clock, pace=Pace({"standard": 3.3}, 0.0), documented=DOCUMENTED, floor_margin=0.3)
    limiter = RateLimiter(5, 20)
    codes: list[int] = []

    def request(inject: bool = False):
        decision = risk.admit("t", GapClass.STANDARD)
        if decision.accepted and inject:
            risk.abandon("t")
            decision = Decision(False, 42901, 1, "injected")
        if not decision.accepted:
            codes.append(decision.code)
            clock.advance(0.02)
            raise Rejected(decision.code, decision.retry_after)
        clock.advance(0.08)  # the response
        risk.complete("t")
        codes.append(0)

    start = clock.monotonic()
    for i in range(requests):
        wait = 0.0
        for attempt in range(5):
            try:
                lane.send(lambda first=attempt == 0: request(first and i == inject_at), limiter, min_wait=wait,
                          gap_class="standard")
                break
            except Rejected as exc:
                wait = max(1.0, exc.lane_backoff.seconds)
    return clock.monotonic() - start, codes, lane.floor("standard")


def test_a_night_at_real_scale_that_meets_one_42901_loses_at_most_three_gaps():
    quiet, codes, _ = _night(2000, inject_at=None)
    assert set(codes) == {0}
    night, codes, floor = _night(2000, inject_at=700)
    assert codes.count(42901) == 1 and 42902 not in codes and codes.count(0) == 2000
    lost = night - quiet
    assert 0 < lost <= 3 * 3.3, lost  # at most three gaps (the old rule, gap + retryAfter for good: ~1300 s)
    assert floor == 0.0  # the floor decayed back


def test_ranked_tenants_complete_one_after_another():
    lane = RequestScheduler()  # real time: the stores are threads, as in a lane
    lane.rank(["a", "b", "c"])
    limiter = RateLimiter(0.005, 0.005)
    order: list[str] = []
    go = threading.Barrier(3)

    def store(name: str):
        go.wait(5)
        for _ in range(15):
            lane.send(lambda: order.append(name), limiter, tenant=name)

    threads = [threading.Thread(target=store, args=(n,)) for n in "cba"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(order) == 45
    finished = {n: max(i for i, m in enumerate(order) if m == n) for n in "abc"}
    assert finished["a"] < finished["b"] < finished["c"], order
    assert finished["a"] <= 20, order  # the first store is done after about its own 15 requests, not 45


def test_the_lane_completes_the_stalest_store_first():
    from datetime import datetime, timedelta

    from feiqiu_etl.connector.model import load_connector
    from feiqiu_etl.connector.windows import Window
    from feiqiu_etl.plan import PlanHistory, RunOptions, TaskHistory, build_plan, prepare

    now, sites = datetime(2024, 3, 8, 2, 0, 0), [11, 12, 13]
    inputs = prepare(RunOptions(api_base="http://127.0.0.1:9", token="tok", site_ids=sites, task_codes=[],
                                overrides={}, environ={}))

    def done(hw):
        return TaskHistory(done=(Window(hw - timedelta(days=7), hw),), horizon=hw - timedelta(days=7),
                           runs=({"task": "x", "first_load": False},))

    yesterday, cut = now - timedelta(days=1), now - timedelta(days=2)  # store 13 was cut by last night's deadline
    history = PlanHistory({(t.code, s): done(cut if s == 13 else yesterday) for t in load_connector().tasks
                           for s in sites})
    lane = build_plan(inputs, history, now=now).lanes[0]
    assert [s.site_id for s in lane.stores] == sites  # the results keep the fleet's order
    assert lane.store_staleness == {13: 0, 11: 1, 12: 1}
    assert [s.site_id for s in lane.ordered_stores()] == [13, 11, 12]
    assert lane.store_key(13, 10_000) < lane.store_key(12, 10) < lane.store_key(11, 11)  # stalest, then least left
    history = PlanHistory({(t.code, s): done(yesterday) for t in load_connector().tasks for s in (11, 13)})
    ordered = build_plan(inputs, history, now=now).lanes[0].ordered_stores()
    assert [s.site_id for s in ordered] == [12, 11, 13]  # never loaded: first


def test_a_later_store_waiting_its_gap_gives_way_at_once_to_an_earlier_one():
    import time

    lane = RequestScheduler()
    lane.rank(["leader", "later"])
    sent: dict[str, float] = {}
    lane.send(lambda: None, RateLimiter(0, 0), tenant="leader")
    ended = time.monotonic()
    later = threading.Thread(target=lambda: lane.send(lambda: sent.setdefault("later", time.monotonic()),
                                                      RateLimiter(3, 3), tenant="later"))
    later.start()  # granted the free lane; its gap is 3 s
    deadline = time.monotonic() + 5
    while lane.statistics().current_tenant != "later" and time.monotonic() < deadline:
        time.sleep(0.005)
    lane.send(lambda: sent.setdefault("leader", time.monotonic()), RateLimiter(0.3, 0.3), tenant="leader")
    later.join(10)
    assert sent["leader"] - ended == pytest.approx(0.3, abs=0.25)  # its own gap, not after the later store's 3 s
    assert sent["later"] > sent["leader"]
