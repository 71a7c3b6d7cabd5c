"""The retry policy of a request (``api.retry_attempts``, ``api.retry_backoff``) as tenacity's wait strategy.
Its own module, without the HTTP client: the plan holds one (:class:`~feiqiu_etl.plan.model.RunPlan`), and a
command that only reads a plan's settings does not load httpx."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenacity import RetryCallState, wait_exponential
from tenacity.wait import wait_base


@dataclass(frozen=True)
class RetryPolicy:
    """Retry settings (``api.retry_attempts``, ``api.retry_backoff``): ``attempts`` in total; before attempt
    n+1 the longer of the backoff ``base * 2**(n-1)`` s (capped at ``max_backoff``) and the server's hint,
    plus up to ``jitter`` × that wait on top (:meth:`wait`)."""

    attempts: int = 3
    base: float = 1.0
    max_backoff: float = 60.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")

    def wait(self, rng: random.Random) -> wait_base:
        """The wait before a retry as a tenacity wait strategy, composed of tenacity's exponential backoff and
        the hint of the failure (``Retry-After``/``retryAfter``: a minimum, never less), jittered by ``rng``."""
        backoff = wait_exponential(multiplier=self.base, max=self.max_backoff)
        return _Jittered(_Longest(backoff, _RetryAfter()), self.jitter, rng)


class _RetryAfter(wait_base):
    """The server's hint on the failed attempt (``retry_after`` of the error), s; 0 without one."""

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return getattr(exc, "retry_after", None) or 0.0


class _Longest(wait_base):
    """The longest of several waits (tenacity's ``+`` adds them; a hint is a minimum, not an addition)."""

    def __init__(self, *waits: wait_base):
        self.waits = waits

    def __call__(self, retry_state: RetryCallState) -> float:
        return max(w(retry_state) for w in self.waits)


class _Jittered(wait_base):
    """A wait plus up to ``share`` of it on top, drawn from ``rng`` (tenacity's jitters are absolute)."""

    def __init__(self, wait: wait_base, share: float, rng: random.Random):
        self.wait, self.share, self.rng = wait, share, rng

    def __call__(self, retry_state: RetryCallState) -> float:
        seconds = self.wait(retry_state)
        return seconds + self.rng.uniform(0, self.share * seconds)
