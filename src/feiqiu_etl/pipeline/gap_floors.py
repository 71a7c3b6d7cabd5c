"""``GapFloors``: the minimum gap per gap class that a lane learns from the upstream's "too early" answers
(a 42901, upstream-api.md §2.2; issue 30: a 42901 costs what it costs upstream, a few gaps, not the night).

After the upstream said a request came too early (an exception with ``lane_backoff.kind == "throttled"``),
later requests of *that class* wait at least a learnt floor, and the lane says so once per class. The lane also
remembers the gaps of the last :data:`FLOOR_DECAY_REQUESTS` accepted requests of each class (its *evidence*):

- rejected at a gap ``g`` at or above the class's documented minimum (``documented``), a gap ``<= g`` of that
  class accepted recently: the rejection contradicts the evidence (an upstream hiccup, or another client of the
  token), so the floor is the *smallest* recently accepted gap (never below ``documented``; it is ``<= g``). It
  is gone after :data:`FLOOR_DECAY_REQUESTS` successes of the class (the gap it holds was accepted: it does not
  shrink first);
- rejected at ``g >= documented`` without such evidence: the floor is ``g + floor_margin`` — the upstream's G
  is a little above ``g`` (or the rejection was a hiccup) — and it *decays*: every success of the class takes
  ``floor_margin / FLOOR_DECAY_REQUESTS`` off it, and after :data:`FLOOR_DECAY_REQUESTS` successes it is gone;
- rejected again at or above a decaying floor (of either kind, the evidence then no longer counts): the class's
  floor becomes the upstream's own bound, ``g + retryAfter``, for the rest of the lane. So at most two
  rejections of a class come before a lasting floor, and 20 successes at ``>= documented`` (3 s: a minute) lie
  between two first ones (the ban is 3 violations in 60 s);
- rejected below the documented minimum (``--unsafe-gaps``): ``min(g + retryAfter, documented +
  floor_margin)`` for the rest of the lane (the upstream enforces what it documents);
- a class without a documented minimum: ``g + retryAfter`` for the rest of the lane (all we know);
- a request rejected although it honoured a lasting floor does not ratchet it up (another client of the
  token, or an upstream hiccup).

The ``retryAfter`` itself is no floor: the lane holds it for the next request only (``RequestScheduler``).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Mapping

FLOOR_DECAY_REQUESTS = 20
"""Successes of a class after which a decaying floor is gone, and how many accepted gaps of a class the lane
remembers as evidence. 20 requests at a 3 s gap are a minute: a second rejection, if the upstream's G really is
higher, lands outside the 60 s violation window of the first (upstream-api.md §2.2: three in 60 s ban the token)."""


@dataclass
class Floor:
    """A learnt floor of one gap class: ``seconds`` now; whether it ``decays`` (gone after
    :data:`FLOOR_DECAY_REQUESTS` successes; False: it lasts), what a success takes off it (``step``, s) and the
    successes so far."""

    seconds: float
    decays: bool = False
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
        self._accepted: dict[str, deque[float]] = {}  # the last FLOOR_DECAY_REQUESTS accepted gaps of each class

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
        evidence = None
        if old is not None and not old.decays and gap >= old.seconds - 1e-9:
            # Sent after a lasting floor and still rejected: not our spacing (another client of the token, or an
            # upstream hiccup). The demanded wait holds the lane; the floor does not ratchet up.
            return
        if old is not None and gap >= old.seconds - 1e-9:
            new = Floor(gap + demanded)  # twice in this class at or above a learnt floor: the upstream's bound
        elif documented is not None and gap >= documented - 1e-9 and margin > 0:
            evidence = self._evidence(gap_class, gap)
            if evidence is not None:  # a gap <= g was accepted lately: the floor is the smallest one accepted
                new = Floor(max(documented, evidence), decays=True)
            else:
                new = Floor(gap + margin, decays=True, step=margin / FLOOR_DECAY_REQUESTS)
        elif documented is not None:
            new = Floor(min(gap + demanded, max(documented + margin, gap + margin)))
        else:
            new = Floor(gap + demanded)
        if old is not None and old.seconds >= new.seconds:
            return
        self._floors[gap_class] = new
        self._announce(gap_class, gap, detail, old, new, evidence)

    def _evidence(self, gap_class: str, gap: float) -> float | None:
        """The smallest of the class's recently accepted gaps if it is ``<= gap`` (s), else None."""
        seen = self._accepted.get(gap_class)
        smallest = min(seen) if seen else None
        return smallest if smallest is not None and smallest <= gap + 1e-9 else None

    def _announce(self, gap_class: str, gap: float, detail: str, old: Floor | None, new: Floor,
                  evidence: float | None) -> None:
        if old is not None:
            self._log.info("lane %s: floor of %s raised from %.2f s to %.2f s", self.lane, gap_class, old.seconds,
                           new.seconds)
            return
        said = f" ({detail})" if detail else ""
        head = (f"lane {self.lane}: the upstream rejected a {gap_class} request sent {gap:.2f} s after the last "
                f"response as too early{said}")
        if not new.decays:
            self._log.warning("%s; every later %s request of this run waits at least %.1f s", head, gap_class,
                              new.seconds)
        elif evidence is not None:
            self._log.warning("%s, though it accepted one sent %.2f s after within the last %d (an upstream hiccup "
                              "or another client of the token?); the next %d %s requests wait at least %.2f s, and "
                              "a second rejection among them makes the upstream's own bound last", head, evidence,
                              FLOOR_DECAY_REQUESTS, FLOOR_DECAY_REQUESTS, gap_class, new.seconds)
        else:
            self._log.warning("%s; the next %d %s requests wait at least %.2f s, less with each one accepted", head,
                              FLOOR_DECAY_REQUESTS, gap_class, new.seconds)

    def accepted(self, gap_class: str | None, gap: float | None) -> None:
        """A success of ``gap_class`` sent ``gap`` s after the last response (None: the lane's first request):
        remembered as evidence; a decaying floor shrinks by its step and is gone after
        :data:`FLOOR_DECAY_REQUESTS` successes."""
        key = gap_class or ""
        if gap is not None:
            self._accepted.setdefault(key, deque(maxlen=FLOOR_DECAY_REQUESTS)).append(gap)
        learnt = self._floors.get(key)
        if learnt is None or not learnt.decays:
            return
        learnt.successes += 1
        learnt.seconds -= learnt.step
        if learnt.successes >= FLOOR_DECAY_REQUESTS:
            del self._floors[key]
            self._log.info("lane %s: the floor of %s learnt from a rejection has decayed: %d requests in a row were "
                           "accepted", self.lane, gap_class, learnt.successes)
