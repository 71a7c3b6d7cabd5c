"""``RateLimiter`` (spec §3.3): draws a random gap in ``[min_interval, max_interval]`` seconds.

The limiter only chooses gaps; the ``RequestScheduler`` waits them out, from the end of the previous response,
on its injectable ``Clock`` (one ``Event.wait`` instead of the spec's 0.5 s polling slices: a cancel ends the
wait within milliseconds).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from feiqiu_etl.pipeline.config import Gap


@dataclass(frozen=True)
class RateLimiterStatistics:
    min_interval: float
    max_interval: float
    last_interval: float
    draws: int


class RateLimiter:
    """Random-interval limiter over a :class:`Gap` (``min_interval``/``max_interval`` s, or ``gap``). Raises
    ``ValueError`` if ``min_interval > max_interval`` or either < 0."""

    def __init__(
        self,
        min_interval: float = 5.0,
        max_interval: float = 20.0,
        *,
        rng: random.Random | None = None,
        gap: Gap | None = None,
    ):
        self.gap = gap or Gap(float(min_interval), float(max_interval))
        self._min, self._max = self.gap.min, self.gap.max
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._last_interval = 0.0
        self._draws = 0

    @property
    def min_interval(self) -> float:
        return self._min

    @property
    def max_interval(self) -> float:
        return self._max

    def draw(self) -> float:
        """Return the next gap in seconds, uniform in ``[min_interval, max_interval]``."""
        with self._lock:
            interval = self.gap.draw(self._rng)
            self._last_interval = interval
            self._draws += 1
            return interval

    @property
    def last_interval(self) -> float:
        return self._last_interval

    def statistics(self) -> RateLimiterStatistics:
        with self._lock:
            return RateLimiterStatistics(self._min, self._max, self._last_interval, self._draws)

    def __repr__(self) -> str:
        return f"<RateLimiter [{self._min:g}, {self._max:g}] s last={self._last_interval:.3f}>"
