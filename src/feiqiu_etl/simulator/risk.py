"""Risk control (风控) of the simulated API, exactly as upstream-api.md §2.2 states it.

Think of each token as a single-lane road with a traffic warden. A request may drive onto the lane only when
nobody else is on it (rule 1, no concurrency) and when at least G seconds have passed since the previous accepted
car left it (rule 2, minimum gap, G chosen by the *new* request's endpoint class). Every refusal (``42901``) is a
violation; the N-th violation within a rolling window closes the lane for the ban period (rule 3, ``42902``).

Exact semantics:

* :meth:`RiskController.admit` is called when a request arrives. It returns a :class:`Decision`. An accepted
  request holds the lane until :meth:`RiskController.complete` is called, which the server does *after* the
  response body has been fully written; that instant is the completion time used by rule 2.
* A rejected request (42901/42902) never moves the completion time (rule 4).
* A concurrency rejection answers ``retryAfter = ceil(G)``; a gap rejection ``ceil(time left in the gap)``; a ban
  ``ceil(time left in the ban)``; always ``>= 1`` (rule 5).
* The violation that triggers the ban is itself answered ``42901`` (it *is* a violation, and §2.2 says each 42901
  is one); the ban applies from the next request on. ``42902`` answers during a ban do not count and do not extend
  it. The violation history is cleared when the ban ends.
* :meth:`RiskController.abandon` releases the lane without a completion (used when an injected ``42901`` fault
  pretends the request was rejected after all).

What it must never do: sleep, read the wall clock directly (the clock is injected), or know about HTTP.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from feiqiu_etl.simulator.catalog import GapClass
from feiqiu_etl.simulator.config import RiskControlConfig

CODE_TOO_FREQUENT = 42901
CODE_BANNED = 42902


def retry_after_seconds(seconds: float, unit: float = 1.0) -> int | float:
    """Whole seconds rounded up, at least 1 (upstream-api.md §2.2 rule 5); with a ``unit`` other than 1 s (a
    time-scaled simulator, :class:`RiskControlConfig`), whole units of ``unit`` seconds, at least one."""
    if unit == 1.0:
        return max(1, math.ceil(round(seconds, 9)))
    return round(max(1, math.ceil(round(seconds / unit, 9))) * unit, 9)


@dataclass(frozen=True)
class Decision:
    """Outcome of :meth:`RiskController.admit`: accepted, or rejected with ``code`` and ``retry_after``."""

    accepted: bool
    code: int = 0
    retry_after: int | float | None = None
    reason: str = ""


ACCEPT = Decision(True)


@dataclass
class _TokenState:
    in_flight: bool = False
    last_completion: float | None = None
    violations: deque[float] = field(default_factory=deque)
    banned_until: float | None = None


@dataclass(frozen=True)
class RiskStatistics:
    """Read-only snapshot of one token's risk state (for logs and tests)."""

    in_flight: bool
    last_completion: float | None
    violations: int
    banned_until: float | None


class RiskController:
    """Per-token risk control; thread-safe. See the module docstring for the exact rules."""

    def __init__(self, config: RiskControlConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _TokenState] = {}

    @property
    def config(self) -> RiskControlConfig:
        return self._config

    def reconfigure(self, config: RiskControlConfig) -> None:
        """Apply ``config`` from the next request on (the tokens' lanes, violations and bans are kept)."""
        with self._lock:
            self._config = config

    def gap_for(self, gap_class: GapClass) -> float:
        """G of upstream-api.md §2.2 rule 2 for an endpoint class."""
        return self._config.gap_groupbuy if gap_class is GapClass.GROUPBUY else self._config.gap_standard

    def admit(self, token: str, gap_class: GapClass) -> Decision:
        """Decide on a request of ``token`` to an endpoint of ``gap_class`` arriving now."""
        if not self._config.enabled:
            return ACCEPT
        with self._lock:
            now = self._clock()
            state = self._states.setdefault(token, _TokenState())
            ban = self._check_ban(state, now)
            if ban is not None:
                return ban
            gap = self.gap_for(gap_class)
            unit = self._config.retry_after_unit
            if state.in_flight:
                return self._violation(state, now, retry_after_seconds(gap, unit), "concurrent request")
            if state.last_completion is not None and now < state.last_completion + gap:
                wait = state.last_completion + gap - now
                return self._violation(state, now, retry_after_seconds(wait, unit), "minimum gap not reached")
            state.in_flight = True
            return ACCEPT

    def complete(self, token: str) -> None:
        """Mark the accepted request of ``token`` as fully answered; starts the next gap (rule 2)."""
        if not self._config.enabled:
            return
        with self._lock:
            state = self._states.setdefault(token, _TokenState())
            state.in_flight = False
            state.last_completion = self._clock()

    def abandon(self, token: str) -> None:
        """Release the lane of ``token`` without recording a completion."""
        if not self._config.enabled:
            return
        with self._lock:
            self._states.setdefault(token, _TokenState()).in_flight = False

    def statistics(self, token: str) -> RiskStatistics:
        with self._lock:
            state = self._states.get(token, _TokenState())
            return RiskStatistics(state.in_flight, state.last_completion, len(state.violations), state.banned_until)

    def _check_ban(self, state: _TokenState, now: float) -> Decision | None:
        if state.banned_until is None:
            return None
        if now < state.banned_until:
            left = retry_after_seconds(state.banned_until - now, self._config.retry_after_unit)
            return Decision(False, CODE_BANNED, left, "token banned")
        state.banned_until = None
        state.violations.clear()
        return None

    def _violation(self, state: _TokenState, now: float, retry_after: int, reason: str) -> Decision:
        window = self._config.violation_window
        while state.violations and state.violations[0] <= now - window:
            state.violations.popleft()
        state.violations.append(now)
        if len(state.violations) >= self._config.violations_to_ban:
            state.banned_until = now + self._config.ban_seconds
        return Decision(False, CODE_TOO_FREQUENT, retry_after, reason)
