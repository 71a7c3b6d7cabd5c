"""Time as an injectable dependency, so that rate-limit and timeout tests never really wait.

``SystemClock`` uses ``time.monotonic`` and ``Event.wait``. ``FakeClock`` keeps virtual time: a wait
advances it instantly (or returns at once when the event is already set). Never use wall-clock time
(``time.time``) for intervals.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale."""

    def wait(self, event: threading.Event | None, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``event``; True if the event is set (cancelled)."""


class SystemClock:
    """Real time: ``time.monotonic()``; waits return within milliseconds of ``event.set()``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event | None, timeout: float) -> bool:
        if timeout <= 0:
            return bool(event and event.is_set())
        if event is None:
            time.sleep(timeout)
            return False
        return event.wait(timeout)


class FakeClock:
    """Virtual time for tests. ``wait`` advances ``now`` by ``timeout`` unless the event is set.

    ``waits`` records every requested wait (seconds), so tests can assert drawn gaps without sleeping.
    Thread-safe.
    """

    def __init__(self, start: float = 1000.0):
        self._now = start
        self._lock = threading.Lock()
        self.waits: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def wait(self, event: threading.Event | None, timeout: float) -> bool:
        if event is not None and event.is_set():
            return True
        with self._lock:
            self.waits.append(timeout)
            if timeout > 0:
                self._now += timeout
        return bool(event and event.is_set())


SYSTEM_CLOCK = SystemClock()
