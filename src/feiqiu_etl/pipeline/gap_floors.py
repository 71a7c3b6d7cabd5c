"""``GapFloors``: the minimum gap per gap class that a lane learns from the upstream's "too early" answers
(a 42901, upstream-api.md §2.2; issue 30: a 42901 costs what it costs upstream, a few gaps, not the night).

After the upstream said a request came too early (an exception with ``lane_backoff.kind == "throttled"``),
later requests of *that class* wait at least a learnt floor, and the lane says so once per class:

- rejected at a gap ``g`` at or above the class's documented minimum (``documented``): the floor is
  ``g + floor_margin`` — the upstream's G is a little above ``g`` (or the rejection was a hiccup) — and it
  *decays*: every success of the class takes ``floor_margin / FLOOR_DECAY_REQUESTS`` off it, and after
  :data:`FLOOR_DECAY_REQUESTS` successes the floor is gone. Rejected again at or above that floor, the
  class's floor becomes the upstream's own bound, ``g + retryAfter``, for the rest of the lane;
- rejected below the documented minimum (``--unsafe-gaps``): ``min(g + retryAfter, documented +
  floor_margin)`` for the rest of the lane (the upstream enforces what it documents);
- a class without a documented minimum: ``g + retryAfter`` for the rest of the lane (all we know);
- a request rejected although it honoured a lasting floor does not ratchet it up (another client of the
  token, or an upstream hiccup).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

FLOOR_DECAY_REQUESTS = 20
"""Successes of a class after which a floor learnt with a margin is gone (it shrinks linearly until then). 20
requests at a 3 s gap are a minute: a second rejection, if the upstream's G really is higher, lands outside the
60 s violation window of the first (upstream-api.md §2.2: three in 60 s ban the token)."""


@dataclass
class Floor:
    """A learnt floor of one gap class: ``seconds`` now; ``margin`` left to decay (0: it lasts) and by how much a
    success takes off it (``step``)."""

    seconds: float
    margin: float = 0.0
    step: float = 0.0
    successes: int = 0


class GapFloors:
    """The floors of one lane, by gap class (rules in the module docstring). ``documented`` is ``{gap class:
    s}`` (connector ``api.gap_classes``), ``margin`` (s, ``lane.safety_margin_seconds``, >= 0, else
    ``ValueError``); ``log`` receives the notices, naming the lane ``lane``. Not locked: the lane calls it with
    its own lock held."""

    def __init__(self, documented: Mapping[str, float] | None, margin: float, log: logging.Logger, lane: str):
        if margin < 0:
            raise ValueError(f"floor_margin must be >= 0 s, got {margin}")
        self._documented = dict(documented or {})
        self._margin = float(margin)
        self._log = log
        self.lane = lane
        self._floors: dict[str, Floor] = {}

    def seconds(self, gap_class: str | None) -> float:
        """The learnt minimum gap (s) of ``gap_class`` (0 when the upstream never complained)."""
        learnt = self._floors.get(gap_class or "")
        return learnt.seconds if learnt is not None else 0.0

    def snapshot(self) -> dict[str, float]:
        """``{gap class: floor s}`` of the classes with a floor now (rounded to the microsecond)."""
        return {c: round(f.seconds, 6) for c, f in self._floors.items()}

    def learn(self, gap_class: str, gap: float, demanded: float, detail: str) -> None:
        """A request of ``gap_class`` sent ``gap`` s after the last response was rejected as too early and the
        upstream demanded ``demanded`` s more: the class's floor (rules in the module docstring)."""
        old = self._floors.get(gap_class)
        documented = self._documented.get(gap_class)
        margin = self._margin
        if old is not None and old.margin == 0.0 and gap >= old.seconds - 1e-9:
            # Sent after a lasting floor and still rejected: not our spacing (another client of the token, or an
            # upstream hiccup). The demanded wait holds the lane; the floor does not ratchet up.
            return
        if old is not None and gap >= old.seconds - 1e-9:
            new = Floor(gap + demanded)  # twice in this class at or above a learnt floor: the upstream's bound
        elif documented is not None and gap >= documented - 1e-9 and margin > 0:
            new = Floor(gap + margin, margin, margin / FLOOR_DECAY_REQUESTS)
        elif documented is not None:
            new = Floor(min(gap + demanded, max(documented + margin, gap + margin)))
        else:
            new = Floor(gap + demanded)
        if old is not None and old.seconds >= new.seconds:
            return
        self._floors[gap_class] = new
        self._announce(gap_class, gap, detail, old, new)

    def _announce(self, gap_class: str, gap: float, detail: str, old: Floor | None, new: Floor) -> None:
        if old is not None:
            self._log.info("lane %s: floor of %s raised from %.2f s to %.2f s", self.lane, gap_class, old.seconds,
                           new.seconds)
            return
        said = f" ({detail})" if detail else ""
        if new.margin == 0.0:
            self._log.warning("lane %s: the upstream rejected a %s request sent %.2f s after the last response as "
                              "too early%s; every later %s request of this run waits at least %.1f s", self.lane,
                              gap_class, gap, said, gap_class, new.seconds)
        else:
            self._log.warning("lane %s: the upstream rejected a %s request sent %.2f s after the last response as "
                              "too early%s; the next %d %s requests wait at least %.2f s, less with each one "
                              "accepted", self.lane, gap_class, gap, said, FLOOR_DECAY_REQUESTS, gap_class,
                              new.seconds)

    def decay(self, gap_class: str | None) -> None:
        """A success of ``gap_class``: a floor learnt with a margin shrinks by its step, and is gone after
        :data:`FLOOR_DECAY_REQUESTS` successes."""
        learnt = self._floors.get(gap_class or "")
        if learnt is None or learnt.margin == 0.0:
            return
        learnt.successes += 1
        learnt.seconds -= learnt.step
        if learnt.successes >= FLOOR_DECAY_REQUESTS:
            del self._floors[gap_class or ""]
            self._log.info("lane %s: the floor of %s learnt from a rejection has decayed: %d requests in a row were "
                           "accepted", self.lane, gap_class, learnt.successes)
