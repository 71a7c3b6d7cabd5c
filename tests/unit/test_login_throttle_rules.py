"""Web tokens must be strong, and failed token checks are throttled per client address with a growing delay
and a lockout (issue 21, finding 6). A fake clock: no waiting."""

from __future__ import annotations

from feiqiu_etl.cli.web import MIN_TOKEN_LENGTH
from feiqiu_etl.web.security import MIN_TOKEN_CHARACTERS, LoginThrottle, Security, ThrottleRules, token_problem


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_weak_tokens_are_refused_and_strong_ones_pass():
    weak = {" " * 20: "not whitespace", "\t" * 30: "control", "\u3000" * 20: "not whitespace", "a" * 40: "repeated", "abc def ghi jkl": "16",
            "short": "16", " leading-space-token-0123": "begin or end", "trailing-token-012345 ": "begin or end",
            "token-with-\x1b-escape-0123": "control", "token-with-newline\n-0123": "control"}
    for token, why in weak.items():
        problem = token_problem(token)
        assert problem and why in problem and (not token.strip() or token.strip() not in problem), (token, problem)
    for token in ("0123456789abcdef", "correct horse battery staple", "a-long-enough-test-token-0123",
                  "ab" * 8, "令牌令牌令牌令牌令牌令牌令牌令牌-x"):
        assert token_problem(token) is None, token
    assert MIN_TOKEN_LENGTH == MIN_TOKEN_CHARACTERS == 16


def test_the_delay_grows_then_the_address_is_locked_out_and_forgotten_later():
    clock, rules = Clock(), ThrottleRules()
    throttle = LoginThrottle(rules, clock)
    waits = [throttle.failed("10.0.0.1") for _ in range(rules.lockout_after + 1)]
    assert waits == [0, 0, 1, 2, 4, 8, 16, 32, 60, 900, 900]  # free, free, then doubling to 60 s, then locked
    assert throttle.statistics().locked_addresses == 1
    assert throttle.wait("10.0.0.1") == 900 and throttle.wait("10.0.0.2") == 0  # per address
    clock.now += 899
    assert 0 < throttle.wait("10.0.0.1") <= 1
    clock.now += 1
    assert throttle.wait("10.0.0.1") == 0
    assert throttle.failed("10.0.0.1") == 900  # a failure right after a lockout locks again
    clock.now += 900 + rules.forget_after + 1  # 15 minutes without a failure: forgotten
    assert throttle.wait("10.0.0.1") == 0 and throttle.statistics().addresses == 0
    assert throttle.failed("10.0.0.1") == 0
    assert throttle.statistics().refused == 2  # the two early asks above


def test_a_correct_token_clears_the_address_and_the_table_is_bounded():
    clock = Clock()
    throttle = LoginThrottle(ThrottleRules(max_addresses=50), clock)
    for _ in range(5):
        throttle.failed("a")
    throttle.succeeded("a")
    assert throttle.wait("a") == 0
    for i in range(500):
        throttle.failed(f"10.1.{i // 256}.{i % 256}")
    assert throttle.statistics().addresses <= 50


def test_security_counts_login_failures_against_the_address_and_compares_in_constant_time():
    clock = Clock()
    sec = Security("a-long-enough-test-token-0123", throttle=LoginThrottle(ThrottleRules(), clock))
    for guess in ("x", "y", "z"):
        assert sec.login(guess, "10.0.0.9") is None
    assert sec.throttle.wait("10.0.0.9") == 1
    clock.now += 1
    assert sec.login("a-long-enough-test-token-0123", "10.0.0.9")  # the right token clears it
    assert sec.throttle.wait("10.0.0.9") == 0
    assert sec.token_matches("a-long-enough-test-token-0123") and not sec.token_matches("a-long-enough-test-token-012")
    assert sec._token != b"a-long-enough-test-token-0123"  # only an HMAC digest is kept


def test_a_global_cap_bounds_wrong_tokens_per_minute_over_all_addresses_and_the_right_token_passes():
    """Issue 28 item 4: at most ``global_per_minute`` wrong tokens a minute in total (a sliding minute), whatever
    the number of addresses; the right token is compared first and never refused."""
    from feiqiu_etl.web.security import Throttled

    clock = Clock()
    rules = ThrottleRules()
    security = Security("the-right-token-0123456789", "0.0.0.0", LoginThrottle(rules, clock))
    outcomes = []
    for i in range(200):  # 200 addresses, 2 guesses each: under the per-address free checks
        for _ in range(2):
            try:
                outcomes.append(security.login("wrong-token-0123456789", f"10.2.{i}.1"))
            except Throttled as exc:
                outcomes.append(exc.wait)
        clock.now += 0.01
    checked = [o for o in outcomes if o is None]
    assert rules.global_per_minute == 30 and len(checked) == 30 and len(outcomes) == 400
    assert all(0 < o <= 60 for o in outcomes if o is not None)
    stats = security.throttle.statistics()
    assert stats.globally_refused == 370 and stats.failures_last_minute == 30
    assert security.login("the-right-token-0123456789", "10.2.5.1") is not None  # during the attack
    clock.now += 60.0  # a minute after the first failures: the budget is back
    assert security.throttle.wait("10.9.9.9") == 0 and security.login("wrong-token-0123456789", "10.9.9.9") is None
