"""What fits before a lane's deadline — said before the run starts (issue 20 item 3). Pure: no I/O, no clock.

Lane time is requests × (gap + the time a request holds the lane), so a lane's night is a sum over its planned work.
:func:`fit_lane` takes a :class:`~feiqiu_etl.plan.model.LanePlan` whose tasks are split into parts (recent data,
owed details, history segments: :mod:`feiqiu_etl.plan.builder`) and the seconds left until the deadline, and says:

* the requests and lane seconds at the **configured** gaps and at the **narrowest safe** gaps (each gap class's
  documented minimum plus the safety margin, or a floor the upstream taught this token, :func:`safe_gaps`);
* the **pace** that meets the deadline (:func:`pace_for`): 1 when everything fits at the configured gaps (nothing
  changes), 0 when even the narrowest safe gaps are not enough, in between the least narrowing that fits;
* per store, when its work would end at that pace and **what is left for the next night**: the lane runs every
  store's recent data first, then the owed details, then history newest to oldest; inside a phase up to
  ``active_stores`` (two) stores take turns request by request (modelled as sharing the lane equally), so what is
  cut first is the oldest history of the stores that come last.

The same :func:`pace_for` is what the running lane recomputes from the work it has left (``runner/lane.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from feiqiu_etl.connector.windows import fmt
from feiqiu_etl.pipeline.config import Gap

from feiqiu_etl.plan.fits import LaneFit, StoreFit

if TYPE_CHECKING:
    from feiqiu_etl.plan.model import LanePlan, TaskPlan

PHASES = ("recent", "owed", "history")
"""The order in which a lane with a deadline runs its work: every store's newest windows and snapshots, then the
details owed (by earlier runs, and the snapshots' details deferred by the first phase), then older history."""


def safe_gaps(documented: Mapping[str, float], *, share: float, seconds: float,
              learnt: Mapping[str, float] | None = None) -> dict[str, float]:
    """The narrowest safe gap per class (s): ``max(minimum × (1 + share), minimum + seconds)`` over the documented
    ``minimum`` of each class (connector ``api.gap_classes``), raised to a floor ``learnt`` from a 42901 (this run's
    or the last runs' of the token). Classes the connector does not document are not narrowed (not listed)."""
    out = {c: round(max(g * (1 + share), g + seconds), 6) for c, g in documented.items()}
    for c, floor in (learnt or {}).items():
        if c in out and floor > out[c]:
            out[c] = round(float(floor), 6)
    return out


@dataclass(frozen=True)
class Work:
    """One part of a task of a store as the fit sees it: its ``requests``, its task's configured ``gap`` and the
    safe floor of its class (``safe``, s; None: never narrowed), the phase and what it is (for the text)."""

    site_id: int
    task: str
    phase: str
    requests: int
    gap: Gap
    safe: float | None
    windows: tuple[tuple[str, str], ...] = ()

    def seconds(self, factor: float, overhead: float) -> float:
        return self.requests * (self.gap.mean_toward(self.safe, factor) + overhead)


def lane_seconds(work: Iterable[Work], factor: float, overhead: float) -> float:
    """Lane seconds of ``work`` at ``factor`` with ``overhead`` seconds per request besides its gap."""
    return sum(w.seconds(factor, overhead) for w in work)


def pace_for(work: Sequence[Work], available: float, overhead: float) -> float:
    """The largest factor in [0, 1] at which ``work`` fits in ``available`` seconds (lane time is linear in the
    factor, so this is exact for the estimates given): 1 when it fits at the configured gaps — or when narrowing
    would not shorten it (gaps already at or below their floors) — 0 when it does not fit even at the narrowest
    safe gaps."""
    wide, narrow = lane_seconds(work, 1.0, overhead), lane_seconds(work, 0.0, overhead)
    if wide <= available or wide - narrow < 1e-9:
        return 1.0
    if narrow >= available:
        return 0.0
    return (available - narrow) / (wide - narrow)


def work_of(lane: "LanePlan") -> list[Work]:
    """The lane's work in the order it runs (:meth:`LanePlan.schedule`), each part with its estimate."""
    out = []
    for store in lane.stores:
        for phase, part in lane.schedule(store.site_id):
            out.append(_work(part, phase, lane.safe_gaps))
    return out


def _work(part: "TaskPlan", phase: str, safe: Mapping[str, float]) -> Work:
    return Work(part.site_id, part.code, phase, part.estimate.requests, part.config.gap, safe.get(part.spec.gap_class),
                tuple((fmt(w.start), fmt(w.end)) for w in part.windows))


def fit_lane(lane: "LanePlan", available: float) -> LaneFit:
    """The lane against ``available`` seconds (module docstring)."""
    work = work_of(lane)
    overhead = lane.request_seconds
    factor = pace_for(work, available, overhead)
    finish = _finish_times(lane, work, factor, overhead)
    stores = []
    for store in lane.stores:
        mine = [(w, finish[id(w)]) for w in work if w.site_id == store.site_id]
        requests: dict[str, int] = {}
        for w, _ in mine:
            requests[w.phase] = requests.get(w.phase, 0) + w.requests
        requests = {p: n for p, n in requests.items() if n} or {"all": 0}
        left = tuple(_describe(w) for w, end in mine if end > available + 1e-6 and w.requests > 0)
        stores.append(StoreFit(store.site_id, store.name, requests, lane_seconds((w for w, _ in mine), 1.0, overhead),
                               lane_seconds((w for w, _ in mine), 0.0, overhead),
                               max((end for _, end in mine), default=0.0), _summarise(left)))
    return LaneFit(available, sum(w.requests for w in work), lane_seconds(work, 1.0, overhead),
                   lane_seconds(work, 0.0, overhead), factor, overhead, dict(lane.safe_gaps), tuple(stores))


def _finish_times(lane: "LanePlan", work: list[Work], factor: float, overhead: float) -> dict[int, float]:
    """When each part ends (s after the lane starts): phase after phase, the stores of a phase taking equal turns,
    at most ``active_stores`` at once, each store's parts one after another."""
    finish: dict[int, float] = {}
    t = 0.0
    phases = PHASES if lane.phased else ("all",)
    for phase in phases:
        queues = [[w for w in work if w.site_id == s.site_id and (w.phase == phase or not lane.phased)]
                  for s in lane.stores]
        t = _share(queues, lane.active_stores, t, factor, overhead, finish)
    return finish


def _share(queues: list[list[Work]], slots: int, t: float, factor: float, overhead: float,
           finish: dict[int, float]) -> float:
    """Processor sharing: the active stores (at most ``slots``) split the lane equally; when one's part ends the
    store goes on with its next, and a store with nothing left makes room for a waiting one. Returns the end."""
    waiting = deque(q for q in queues if q)
    active: list[list] = []  # [remaining seconds of the current part, its parts left]

    def admit() -> None:
        while waiting and len(active) < max(1, slots):
            parts = deque(waiting.popleft())
            active.append([parts[0].seconds(factor, overhead), parts])

    admit()
    while active:
        step = min(a[0] for a in active) * len(active)
        t += step
        for a in active:
            a[0] -= step / len(active)
        for a in list(active):
            while a[0] <= 1e-9:
                finish[id(a[1].popleft())] = t
                if not a[1]:
                    active.remove(a)
                    break
                a[0] += a[1][0].seconds(factor, overhead)
        admit()
    return t


def _describe(w: Work) -> str:
    if w.phase == "history" and w.windows:
        return f"history {w.windows[-1][0][:10]}..{w.windows[0][1][:10]} of {w.task}"
    if w.phase == "owed":
        return f"{w.requests} detail(s) of {w.task}"
    return f"recent data of {w.task}"


def _summarise(items: tuple[str, ...]) -> tuple[str, ...]:
    """Group the parts left by kind: every recent task named, history as one span per store."""
    recent = [i[len("recent data of "):] for i in items if i.startswith("recent data of ")]
    owed = [i for i in items if " detail(s) of " in i]
    history = [i for i in items if i.startswith("history ")]
    out = []
    if recent:
        out.append("recent data of " + ", ".join(recent))
    out.extend(owed)
    if history:
        spans = [h.split(" ")[1].split("..") for h in history]
        tasks = sorted({h.rsplit(" of ", 1)[1] for h in history})
        out.append(f"history {min(s[0] for s in spans)}..{max(s[1] for s in spans)} ({len(history)} segment(s) of "
                   f"{', '.join(tasks)})")
    return tuple(out)
