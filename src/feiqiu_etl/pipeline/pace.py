"""``Pace``: how far a lane narrows its random gaps to meet a deadline, never below a safe floor.

Think of the configured gap (5–20 s by default) as the speed a lane drives at when it has all night, and of the
*safe floor* of each gap class as the speed limit: the upstream's documented minimum plus a safety margin, or a
floor the upstream taught this account with a 42901 — whichever is higher. A lane that would not reach its
deadline at its own speed drives faster, but never above the limit. ``factor`` says how far: 1.0 keeps every
drawn gap as it is, 0.0 narrows each to its class's safe floor, and in between a drawn gap ``g`` above the floor
``s`` becomes ``s + factor × (g − s)`` — still random, uniform over a narrower range that ends at the floor. A gap
at or below its floor (``--unsafe-gaps`` against a simulator) is never widened, and a class without a safe floor
is never narrowed.

Who chooses ``factor`` is the lane's owner (it knows the deadline and the work left); :class:`Pace` only applies it,
in :meth:`RequestScheduler._wait_gap <feiqiu_etl.pipeline.request_scheduler.RequestScheduler.send>`, before the
floors the lane learns during the run (which it must respect too). Nothing here learns by probing: a floor only
rises when the upstream says so (ENGINE-NOTES, "The night"). Thread-safe; no clock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class PaceStatistics:
    """``factor`` (1 = the configured gaps, 0 = the safe floors), the safe floor of each class (s), and how
    many gaps were narrowed so far."""

    factor: float
    safe: Mapping[str, float] = field(default_factory=dict)
    narrowed: int = 0


class Pace:
    """Narrows drawn gaps toward ``safe`` (``{gap class: seconds}``) by :attr:`factor` (module docstring).
    Raises ``ValueError`` for a negative floor."""

    def __init__(self, safe: Mapping[str, float], factor: float = 1.0):
        if any(v < 0 for v in safe.values()):
            raise ValueError(f"safe floors must be >= 0 s, got {dict(safe)}")
        self._safe = dict(safe)
        self._lock = threading.Lock()
        self._factor = 1.0
        self._narrowed = 0
        self.set(factor)

    @property
    def factor(self) -> float:
        with self._lock:
            return self._factor

    def safe(self, gap_class: str | None) -> float | None:
        """The safe floor of ``gap_class`` (s), None when the class has none (it is never narrowed)."""
        return self._safe.get(gap_class or "")

    def set(self, factor: float) -> None:
        """Narrow from now on by ``factor``, clipped to [0, 1]."""
        with self._lock:
            self._factor = min(1.0, max(0.0, float(factor)))

    def gap(self, drawn: float, gap_class: str | None) -> float:
        """The gap to wait instead of ``drawn`` (s): ``s + factor × (drawn − s)`` when ``drawn`` is above the
        class's safe floor ``s``, else ``drawn``."""
        safe = self._safe.get(gap_class or "")
        with self._lock:
            if safe is None or drawn <= safe or self._factor >= 1.0:
                return drawn
            self._narrowed += 1
            return safe + self._factor * (drawn - safe)

    def statistics(self) -> PaceStatistics:
        with self._lock:
            return PaceStatistics(self._factor, dict(self._safe), self._narrowed)

    def __repr__(self) -> str:
        return f"<Pace factor={self.factor:.2f} safe={self._safe}>"
