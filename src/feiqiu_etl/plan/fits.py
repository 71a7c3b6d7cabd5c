"""What the deadline fit of a lane found (:mod:`.fit` computes it, :class:`~feiqiu_etl.plan.model.LanePlan`
carries it): frozen values with ``to_dict``, no computation. Apart from :mod:`.fit` so that the plan model and
the fit need not import each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class StoreFit:
    """One store of a lane: requests per phase, lane seconds of its work at the configured and at the narrowest
    safe gaps (its own share, as if it ran alone), when its work would end (s after the lane starts, at the
    lane's pace, taking turns with the other stores), and what is left for the next night (text, one item each)."""

    site_id: int
    name: str | None
    requests: Mapping[str, int]
    seconds: float
    seconds_narrowest: float
    done_at: float
    left: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.left

    def to_dict(self) -> dict[str, Any]:
        return {"site_id": self.site_id, "name": self.name, "requests": dict(self.requests),
                "seconds": round(self.seconds, 1), "seconds_narrowest": round(self.seconds_narrowest, 1),
                "done_at_s": round(self.done_at, 1), "fits": self.fits, "left": list(self.left)}


@dataclass(frozen=True)
class LaneFit:
    """A lane against its deadline (module docstring): ``available`` s from the plan's start to the deadline;
    ``requests`` planned; ``seconds`` at the configured gaps and ``seconds_narrowest`` at the safe floors ``safe``
    (s per class); ``pace`` the factor that meets the deadline; ``overhead`` the seconds a request holds the lane
    besides its gap; per store its :class:`StoreFit`."""

    available: float
    requests: int
    seconds: float
    seconds_narrowest: float
    pace: float
    overhead: float
    safe: Mapping[str, float] = field(default_factory=dict)
    stores: tuple[StoreFit, ...] = ()

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stores)

    @property
    def narrowed(self) -> bool:
        return self.pace < 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"available_s": round(self.available, 1), "requests": self.requests, "seconds": round(self.seconds, 1),
                "seconds_narrowest": round(self.seconds_narrowest, 1), "pace": round(self.pace, 3),
                "narrowed": self.narrowed, "fits": self.fits, "safe_gaps": dict(self.safe),
                "request_overhead_s": round(self.overhead, 3), "stores": [s.to_dict() for s in self.stores]}

    def lines(self, lane: str, until: str) -> list[str]:
        """What a person reads at the start and in ``plan``: the lane's totals, the decision, each store."""
        safe = ", ".join(f"{c} {g:g} s" for c, g in sorted(self.safe.items()))
        head = (f"lane {lane}: {self.requests:,} requests planned: {_hours(self.seconds)} at the configured gaps, "
                f"{_hours(self.seconds_narrowest)} at the narrowest safe gaps ({safe}); {_hours(self.available)} "
                f"until the deadline {until}")
        if self.narrowed and self.pace > 0:
            head += f": narrowing the gaps toward the safe floors (pace {self.pace:.2f}) to fit"
        elif self.narrowed:
            head += ": narrowing the gaps to the safe floors, and still not everything fits"
        elif self.seconds <= self.available:
            head += ": it fits, the gaps stay as configured"
        else:
            head += ": not everything fits (the gaps cannot narrow: none is above its safe floor)"
        out = [head]
        for s in self.stores:
            what = "fits" if s.fits else "left for the next night: " + "; ".join(s.left)
            out.append(f"  store {s.site_id}{f' ({s.name})' if s.name else ''}: "
                       f"{sum(s.requests.values()):,} requests ({_phases(s.requests)}), {_hours(s.seconds)} at the "
                       f"configured gaps, {_hours(s.seconds_narrowest)} at the narrowest; ends at ~"
                       f"{_hours(s.done_at)}; {what}")
        return out


def _phases(requests: Mapping[str, int]) -> str:
    return ", ".join(f"{p} {n:,}" for p, n in requests.items())


def _hours(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
