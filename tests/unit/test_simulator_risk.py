"""Risk control of the simulator (upstream-api.md §2.2) with a fake clock: no real waiting."""

from __future__ import annotations

import pytest

from feiqiu_etl.simulator.catalog import GapClass
from feiqiu_etl.simulator.config import RiskControlConfig
from feiqiu_etl.simulator.risk import RiskController, retry_after_seconds

STD, GB = GapClass.STANDARD, GapClass.GROUPBUY


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def risk(clock) -> RiskController:
    return RiskController(RiskControlConfig(), clock)


def served(risk: RiskController, clock: FakeClock, gap_class=STD, token="t") -> None:
    """One accepted request that completes immediately."""
    assert risk.admit(token, gap_class).accepted
    risk.complete(token)


def test_first_request_is_accepted(risk):
    assert risk.admit("t", STD).accepted


def test_concurrent_request_is_rejected_with_retry_after_g(risk, clock):
    assert risk.admit("t", STD).accepted
    decision = risk.admit("t", STD)
    assert (decision.accepted, decision.code, decision.retry_after) == (False, 42901, 3)
    decision = risk.admit("t", GB)
    assert (decision.code, decision.retry_after) == (42901, 8)


def test_concurrency_rejection_does_not_affect_in_flight_request(risk, clock):
    assert risk.admit("t", STD).accepted
    assert not risk.admit("t", STD).accepted
    clock.advance(1)
    risk.complete("t")
    assert risk.statistics("t").last_completion == 1001.0
    assert not risk.statistics("t").in_flight


def test_gap_is_measured_from_completion_not_from_start(risk, clock):
    assert risk.admit("t", STD).accepted
    clock.advance(10)  # long request
    risk.complete("t")
    clock.advance(2.9)
    assert risk.admit("t", STD).code == 42901
    clock.advance(0.1)
    assert risk.admit("t", STD).accepted


@pytest.mark.parametrize(("gap_class", "wait", "ok"), [(STD, 3.0, True), (GB, 3.0, False), (GB, 8.0, True)])
def test_gap_depends_on_the_new_requests_class(risk, clock, gap_class, wait, ok):
    served(risk, clock, GB)  # previous request was groupbuy: irrelevant, the new one decides
    clock.advance(wait)
    assert risk.admit("t", gap_class).accepted is ok


def test_gap_rejection_retry_after_is_rounded_up(risk, clock):
    served(risk, clock)
    clock.advance(0.5)
    assert risk.admit("t", STD).retry_after == 3  # 2.5 s left
    clock.advance(2.4)
    assert risk.admit("t", STD).retry_after == 1  # 0.1 s left


def test_rejected_requests_do_not_move_the_completion_time(risk, clock):
    served(risk, clock)
    clock.advance(1)
    assert not risk.admit("t", STD).accepted
    clock.advance(2)
    assert risk.admit("t", STD).accepted


def test_third_violation_within_window_bans(risk, clock):
    served(risk, clock)
    for _ in range(2):
        assert risk.admit("t", STD).code == 42901
    third = risk.admit("t", STD)
    assert third.code == 42901  # the violation itself; the ban applies from the next request
    clock.advance(10)
    banned = risk.admit("t", STD)
    assert (banned.code, banned.retry_after) == (42902, 290)


def test_violations_outside_the_rolling_window_do_not_count(risk, clock):
    served(risk, clock)
    assert risk.admit("t", STD).code == 42901
    assert risk.admit("t", STD).code == 42901
    clock.advance(61)
    served(risk, clock)
    assert risk.admit("t", STD).code == 42901  # only 1 violation in the last 60 s
    clock.advance(3)
    assert risk.admit("t", STD).accepted


def test_ban_rejections_neither_extend_nor_count(risk, clock):
    served(risk, clock)
    for _ in range(3):
        risk.admit("t", STD)
    for _ in range(10):
        clock.advance(29)
        assert risk.admit("t", STD).code == 42902
    clock.advance(10.01)  # 300.01 s after the ban started
    assert risk.admit("t", STD).accepted


def test_ban_expiry_clears_violation_history(risk, clock):
    served(risk, clock)
    for _ in range(3):
        risk.admit("t", STD)
    clock.advance(300)
    served(risk, clock)
    assert risk.statistics("t").violations == 0
    assert risk.admit("t", STD).code == 42901  # one fresh violation ...
    assert risk.admit("t", STD).code == 42901  # ... two ...
    clock.advance(3)
    assert risk.admit("t", STD).accepted  # ... no ban: the old three were forgotten


def test_tokens_are_independent(risk, clock):
    assert risk.admit("a", STD).accepted
    assert risk.admit("b", STD).accepted


def test_abandon_releases_lane_without_completion(risk, clock):
    served(risk, clock)
    clock.advance(3)
    assert risk.admit("t", STD).accepted
    risk.abandon("t")
    assert risk.statistics("t").last_completion == 1000.0
    assert risk.admit("t", STD).accepted


def test_disabled_risk_control_accepts_everything(clock):
    risk = RiskController(RiskControlConfig(enabled=False), clock)
    for _ in range(10):
        assert risk.admit("t", GB).accepted


def test_all_numbers_are_configurable(clock):
    config = RiskControlConfig(gap_standard=0.05, gap_groupbuy=0.2, violations_to_ban=2, violation_window=1.0,
                               ban_seconds=2.5)
    risk = RiskController(config, clock)
    served(risk, clock)
    assert risk.admit("t", GB).retry_after == 1  # ceil(0.2) >= 1
    assert risk.admit("t", STD).code == 42901
    banned = risk.admit("t", STD)
    assert (banned.code, banned.retry_after) == (42902, 3)
    clock.advance(2.5)
    assert risk.admit("t", STD).accepted


@pytest.mark.parametrize(("seconds", "expected"), [(0.0, 1), (0.01, 1), (1.0, 1), (1.0000001, 2), (2.5, 3), (8.0, 8)])
def test_retry_after_rounding(seconds, expected):
    assert retry_after_seconds(seconds) == expected
