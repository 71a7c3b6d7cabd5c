"""Issue 30: a 42901 costs what it costs upstream, and stores complete one after another.

* the floor learnt from a rejection is the rejected gap plus a margin, for that class only, and decays back once
  requests succeed — or, when a gap as short was accepted among the class's last 20, the smallest such gap (the
  rejection contradicts the evidence), with a second rejection making the upstream's bound last; a retryAfter binds
  the next request only;
* a night at real scale (fake clock, the simulator's own risk control deciding) that meets one 42901 loses the
  rejected attempt and hardly more (at the deadline's narrowest gaps and at the default ones), and is never banned,
  not even when the upstream raises its minimum;
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


def _sent_at(lane, clock, gap: float, gap_class: str = "standard", error=None) -> float:
    """One request of ``gap_class`` whose drawn gap is ``gap``; returns the gap it was sent after (s)."""
    log: list = []
    before = clock.monotonic()
    if error is None:
        lane.send(_timed(clock, log), RateLimiter(gap, gap), gap_class=gap_class)
    else:
        with pytest.raises(Rejected):
            lane.send(_timed(clock, log, error=error), RateLimiter(gap, gap), gap_class=gap_class)
    return log[0][0] - before


def test_a_rejection_contradicted_by_a_shorter_accepted_gap_learns_the_smallest_accepted_one():
    clock = FakeClock()
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    for gap in (6.0, 5.0, 9.0):  # the first request of a lane has no gap
        _sent_at(lane, clock, gap)
    _sent_at(lane, clock, 4.0, "groupbuy")  # another class's gaps are no evidence for this one
    _sent_at(lane, clock, 7.0, error=Rejected(42901, 1))
    assert lane.floor("standard") == pytest.approx(5.0)  # accepted lately at 5 s, not 7 s + the margin
    assert lane.floor("groupbuy") == 0.0
    assert _sent_at(lane, clock, 0.5, "other") == pytest.approx(1.0)  # the retryAfter holds the next request ...
    assert _sent_at(lane, clock, 0.5, "other") == pytest.approx(0.5)  # ... and only that one
    gaps = [_sent_at(lane, clock, 3.3) for _ in range(FLOOR_DECAY_REQUESTS)]
    assert gaps == pytest.approx([5.0] * FLOOR_DECAY_REQUESTS)  # the accepted gap, not shrinking below it
    assert lane.floor("standard") == 0.0 and lane.statistics().floors == {}  # gone after 20 successes
    assert _sent_at(lane, clock, 3.3) == pytest.approx(3.3)


def test_a_second_rejection_after_a_contradicted_one_makes_the_upstreams_bound_last():
    clock = FakeClock()
    lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
    for gap in (6.0, 5.0):
        _sent_at(lane, clock, gap)
    _sent_at(lane, clock, 7.0, error=Rejected(42901, 1))
    assert lane.floor("standard") == pytest.approx(5.0)
    assert _sent_at(lane, clock, 3.3, error=Rejected(42901, 2)) == pytest.approx(5.0)  # at that floor: G is higher
    assert lane.floor("standard") == pytest.approx(5.0 + 2.0)  # the gap + retryAfter, the upstream's bound
    for _ in range(FLOOR_DECAY_REQUESTS + 5):
        assert _sent_at(lane, clock, 3.3) == pytest.approx(7.0)
    assert lane.floor("standard") == pytest.approx(7.0)  # lasting: no decay, and the evidence no longer counts
    _sent_at(lane, clock, 3.3, error=Rejected(42901, 1))  # rejected at the lasting floor: not ratcheted up
    assert lane.floor("standard") == pytest.approx(7.0)


def test_evidence_is_a_recent_accepted_gap_no_longer_than_the_rejected_one_and_never_below_the_documented_minimum():
    def floor_after(accepted: list[float], rejected: float) -> float:
        clock = FakeClock()
        lane = RequestScheduler(clock, documented=DOCUMENTED, floor_margin=0.3)
        for gap in [6.0, *accepted]:
            _sent_at(lane, clock, gap)
        _sent_at(lane, clock, rejected, error=Rejected(42901, 1))
        return lane.floor("standard")

    assert floor_after([9.0, 8.0], 7.0) == pytest.approx(7.3)  # every accepted gap longer: the rejected + margin
    assert floor_after([5.0] + [9.0] * FLOOR_DECAY_REQUESTS, 7.0) == pytest.approx(7.3)  # 5 s is 21 requests ago
    assert floor_after([5.0] + [9.0] * (FLOOR_DECAY_REQUESTS - 1), 7.0) == pytest.approx(5.0)  # ... 20 ago: counts
    assert floor_after([7.0], 7.0) == pytest.approx(7.0)  # the same gap accepted
    assert floor_after([2.0], 4.0) == pytest.approx(3.0)  # accepted below the minimum: the documented 3 s


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


def _night(requests: int, *, inject_at: tuple[int, ...] = (), pace: float | None = 0.0, seed: int = 1,
           raise_g_at: int | None = None) -> dict:
    """``requests`` standard requests at real scale on a fake clock, each decided by the simulator's risk control (G
    3 s; from request ``raise_g_at`` on 12 s: the upstream raised it), the gaps drawn from the default 5-20 s
    (``seed``) and narrowed by a pace of ``pace`` (0.0: the deadline's narrowest 3.3 s; None: no pace). The requests
    ``inject_at`` are answered 42901 (retryAfter 1 s) without reaching it, as the simulator's injected ``code42901``
    fault does. A rejected request is retried like the API client does (its first backoff 1 s, at least
    retryAfter). Returns the lane ``time``, the ``codes`` answered, the learnt ``floor`` at the end and the lane's
    ``records`` (its :class:`AttemptRecord` timeline)."""
    import random

    clock = FakeClock()
    risk = RiskController(RiskControlConfig(), clock=clock.monotonic)
    records: list = []
    lane = RequestScheduler(clock, pace=None if pace is None else Pace({"standard": 3.3}, pace), documented=DOCUMENTED,
                            floor_margin=0.3, observer=records.append)
    limiter = RateLimiter(5, 20, rng=random.Random(seed))
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
        if i == raise_g_at:
            risk.reconfigure(RiskControlConfig(gap_standard=12.0))
        wait = 0.0
        for attempt in range(5):
            try:
                lane.send(lambda first=attempt == 0: request(first and i in inject_at), limiter, min_wait=wait,
                          gap_class="standard")
                break
            except Rejected as exc:
                wait = max(1.0, exc.lane_backoff.seconds)
    return {"time": clock.monotonic() - start, "codes": codes, "floor": lane.floor("standard"), "records": records}


def _cost(records: list) -> tuple[float, float]:
    """What the first rejection in ``records`` cost, from the lane's own timeline (as ``bench_night`` computes it):
    the rejected attempt's gap and time, and the time floors and holds added to the gaps drawn of the
    ``FLOOR_DECAY_REQUESTS + 1`` accepted requests after it: ``(that total, that added part)``, in mean drawn gaps."""
    i = next(k for k, r in enumerate(records) if r.outcome == "throttled")
    after = [r for r in records[i + 1:] if r.outcome == "ok"][:FLOOR_DECAY_REQUESTS + 1]
    assert len(after) == FLOOR_DECAY_REQUESTS + 1
    drawn = [r.drawn for r in records if r.drawn is not None]
    mean = sum(drawn) / len(drawn)
    added = sum(max(0.0, r.gap - r.drawn) for r in after)
    rejected = records[i]
    return (rejected.gap + rejected.ended - rejected.started + added) / mean, added / mean


def test_a_night_at_real_scale_that_meets_one_42901_loses_at_most_one_gap_and_the_rejected_attempt():
    quiet = _night(2000)
    assert set(quiet["codes"]) == {0}
    night = _night(2000, inject_at=(700,))
    codes = night["codes"]
    assert codes.count(42901) == 1 and 42902 not in codes and codes.count(0) == 2000
    lost = night["time"] - quiet["time"]
    # the rejected request's 3.3 s gap and its 0.02 s: the gaps accepted before it were as short, so the floor holds
    # 3.3 s, which the pace waits anyway (the floor 3.6 s without that evidence: 1.96 gaps; the old rule, gap +
    # retryAfter for good: ~1300 s)
    assert 0 < lost <= 3.3 + 0.02 + 1e-6, lost
    assert night["floor"] == 0.0  # the floor decayed back
    cost, added = _cost(night["records"])
    assert cost == pytest.approx(lost / 3.3) and added == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_at_the_default_gaps_one_42901_costs_the_rejected_attempt_and_hardly_more(seed):
    night = _night(400, inject_at=(200,), pace=None, seed=seed)
    assert night["codes"].count(42901) == 1 and 42902 not in night["codes"] and night["floor"] == 0.0
    ok = [r for r in night["records"] if r.outcome == "ok" and r.gap is not None and r.wait_reason == "gap"]
    assert ok and all(r.gap == pytest.approx(r.drawn) for r in ok)  # a gap not raised is the one drawn
    cost, added = _cost(night["records"])
    # the floor is the smallest gap accepted among the last 20 (~5.7 s of 5-20 s), not the rejected one (up to 20 s)
    # + the margin, which pushed ~1/3 of the next 20 draws up to it: over 200 seeds 0.04 gaps added on average, 0.20
    # at the 95th percentile (without that evidence 3.9 on average, up to 12.8; seeds 1-3 here: 0.02, 0.08, 0.00)
    assert added <= 0.25, added
    assert cost <= 20.02 / 12.5 + 0.25, cost  # at most the widest gap, rejected, and its time (mean gap 12.5 s)


def test_when_the_upstream_raises_its_minimum_two_rejections_make_its_bound_last_and_it_never_bans():
    night = _night(400, pace=None, seed=4, raise_g_at=200)
    codes = night["codes"]
    assert codes.count(42901) == 2 and 42902 not in codes and codes.count(0) == 400
    assert night["floor"] >= 12.0  # the second rejection's gap + retryAfter: the upstream's G
    throttled = [r for r in night["records"] if r.outcome == "throttled"]
    assert all(r.gap >= 12.0 for r in night["records"][night["records"].index(throttled[-1]) + 1:])


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
