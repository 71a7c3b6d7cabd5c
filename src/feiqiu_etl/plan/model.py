"""``RunPlan``: what one run will do — lanes → stores → tasks → windows — as frozen, I/O-free data.

A plan is built once per run from validated inputs and the warehouse's history (:mod:`.builder`), printed by
``feiqiu-etl plan`` and executed by :class:`feiqiu_etl.runner.flow_runner.FlowRunner`. Every setting in it is
already validated; nothing in it can fail later for a configuration reason. A token is held as a
:class:`Secret`: its ``repr``/``str`` and every ``to_dict`` show only a fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Mapping

from feiqiu_etl.api.retry import RetryPolicy
from feiqiu_etl.common.lanes import fingerprint, lane_key
from feiqiu_etl.connector.model import Connector
from feiqiu_etl.connector.spec import OdsTaskSpec
from feiqiu_etl.connector.windows import Window, fmt
from feiqiu_etl.db.connection import DbLimits
from feiqiu_etl.deadline import Deadline
from feiqiu_etl.estimates import Estimate
from feiqiu_etl.pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from feiqiu_etl.plan.fits import LaneFit


@dataclass(frozen=True)
class Secret:
    """A secret string (an API token). Shown only as ``***`` or by :meth:`fingerprint`."""

    value: str = field(repr=False)

    def fingerprint(self) -> str:
        """First 12 hex digits of SHA-256: stable, short, and useless for calling the API."""
        return fingerprint(self.value)

    def __str__(self) -> str:
        return "***"

    def __repr__(self) -> str:
        return f"Secret(fingerprint={self.fingerprint()})"


DEADLINE_ACTIVE_STORES = 2
"""Stores of a lane with a deadline that take turns at once: two keep the lane busy while one is between tasks
(its database steps), and stores finish one after another instead of eight at the same moment near the end."""


@dataclass(frozen=True)
class WindowSettings:
    """How windowed tasks choose their windows. ``explicit`` overrides the incremental plan; ``now`` is naive
    Asia/Shanghai local time (None = the time the plan is built)."""

    explicit: Window | None = None
    segment: timedelta = timedelta(days=31)
    lookback: timedelta = timedelta(hours=48)
    initial: timedelta = timedelta(days=7)
    now: datetime | None = None


@dataclass(frozen=True)
class TaskPlan:
    """One ODS task for one store: its spec, effective pipeline settings and window segments.

    ``horizon`` (incremental runs) is the earliest start planned, recorded before any request so that a
    segment that fails stays a hole for the next run. ``owed_details`` counts details still owed by earlier
    runs (fetched first). ``first_load`` is True when no earlier run of this task and store is known.
    ``recheck_budget`` is how many details checked longest ago this run re-fetches (``detail.recheck_share``,
    rounded down); ``recheck_credit`` the fraction of a re-check left over, carried to the next run.

    A lane with a deadline runs each task in ``parts`` (:data:`feiqiu_etl.plan.fit.PHASES`), each a ``TaskPlan`` of
    its own ``phase``: ``recent`` (the snapshot — on its first load without its details, deferred to the owed part —
    or the newest windows, ``windows[:recent_windows]`` of the whole task, with their details and the re-checks),
    ``owed`` (details owed by earlier runs and deferred by the recent part; no such part when none is owed) and
    ``history`` (one older window segment each, newest first). A task without parts runs whole (``phase`` ``all``).
    """

    spec: OdsTaskSpec
    site_id: int
    config: PipelineConfig
    windows: tuple[Window, ...] = ()
    horizon: datetime | None = None
    owed_details: int = 0
    estimate: Estimate = Estimate()
    first_load: bool = False
    recheck_budget: int = 0
    recheck_credit: float = 0.0
    phase: str = "all"
    recent_windows: int | None = None
    parts: tuple["TaskPlan", ...] = ()

    @property
    def code(self) -> str:
        return self.spec.code

    @property
    def defers_details(self) -> bool:
        """The recent part of a snapshot with details on its first load: its parents' details (every parent is new:
        thousands of requests) are recorded as owed, not fetched; the owed part fetches them after every store's
        recent data. On later nights the few changed parents' details come with the snapshot."""
        return self.phase == "recent" and self.spec.is_snapshot and self.spec.detail is not None and self.first_load

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        out = {"task": self.code, "site_id": self.site_id, "kind": self.spec.kind,
               "endpoint": self.spec.endpoint, "detail_endpoint": self.spec.detail_endpoint,
               "gap_class": self.spec.gap_class, "rate_min": self.config.rate_min, "rate_max": self.config.rate_max,
               "windows": [[fmt(w.start), fmt(w.end)] for w in self.windows], "owed_details": self.owed_details,
               "recheck_budget": self.recheck_budget,
               "estimate": {"list_requests": e.list_requests, "detail_requests": e.detail_requests,
                            "requests": e.requests, "seconds": round(e.seconds, 1), "basis": e.basis}}
        if self.parts:
            out["parts"] = [{"phase": p.phase, "windows": [[fmt(w.start), fmt(w.end)] for w in p.windows],
                             "requests": p.estimate.requests} for p in self.parts]
        return out


@dataclass(frozen=True)
class StorePlan:
    site_id: int
    name: str | None = None

    def label(self) -> str:
        return f"{self.site_id} ({self.name})" if self.name else str(self.site_id)


@dataclass(frozen=True)
class LanePlan:
    """One token's lane: its stores and their tasks, strictly serial at the upstream (Property 1).

    ``key`` identifies the lane across processes (connector name + token fingerprint, never the token):
    the runner holds a PostgreSQL advisory lock derived from it for the whole run.

    ``deadline`` (None: none) is when the lane stops sending requests, ``deadline_at`` that instant (aware) for
    this run; ``safe_gaps`` the narrowest gap per class it may narrow to (s, :func:`feiqiu_etl.plan.fit.safe_gaps`);
    ``request_seconds`` how long a request holds the lane besides its gap (s, from history); ``fit`` what fits
    before the deadline (:class:`~feiqiu_etl.plan.fits.LaneFit`, None without a deadline).
    """

    name: str
    token: Secret
    token_source: str
    api_base: str
    stores: tuple[StorePlan, ...]
    tasks: tuple[TaskPlan, ...]
    connector: str
    timeout: float
    connect_timeout: float
    retry: RetryPolicy
    max_transport_failures: int
    max_active_stores: int
    deadline: Deadline | None = None
    deadline_at: datetime | None = None
    safe_gaps: Mapping[str, float] = field(default_factory=dict)
    request_seconds: float = 0.1
    fit: "LaneFit | None" = None
    documented_gaps: Mapping[str, float] = field(default_factory=dict)
    """The connector's documented minimum gap per class (s, ``api.gap_classes``): what a 42901 is measured against."""
    floor_margin: float = 0.3
    """``lane.safety_margin_seconds``: what a floor learnt from a 42901 adds to the rejected gap (s)."""
    store_staleness: Mapping[int, int] = field(default_factory=dict)
    """Per site id, how stale its data is as a rank (0: the stalest; stores with the same horizon share a rank;
    :func:`~feiqiu_etl.plan.builder.stalest_first`). The lane completes its stores stalest first, and among equally
    stale ones the one with the least work left first (issue 30: the most whole stores at any cut-off, and a store a
    deadline cut last night is the first one whole tonight)."""

    def store_key(self, site_id: int, requests_left: int) -> tuple[int, int, int]:
        """Where a store stands in the lane's order: (staleness rank, requests left, its place in the fleet)."""
        place = next((i for i, s in enumerate(self.stores) if s.site_id == site_id), len(self.stores))
        return self.store_staleness.get(site_id, len(self.stores)), requests_left, place

    def ordered_stores(self) -> tuple[StorePlan, ...]:
        """``stores`` in the lane's order at the start (:meth:`store_key` with the planned requests)."""
        planned: dict[int, int] = {}
        for t in self.tasks:
            planned[t.site_id] = planned.get(t.site_id, 0) + t.estimate.requests
        return tuple(sorted(self.stores, key=lambda s: self.store_key(s.site_id, planned.get(s.site_id, 0))))

    @property
    def key(self) -> str:
        return lane_key(self.connector, self.token.value)

    @property
    def active_stores(self) -> int:
        """How many stores take turns at once: ``max_active_stores``, at most :data:`DEADLINE_ACTIVE_STORES` with a
        deadline (stores then finish one after another: a cut leaves the fewest of them unfinished)."""
        if self.deadline is None:
            return self.max_active_stores
        return min(self.max_active_stores, DEADLINE_ACTIVE_STORES)

    @property
    def phased(self) -> bool:
        """True when the lane runs its tasks in parts: recent data first, then owed details, then history."""
        return any(t.parts for t in self.tasks)

    def tasks_of(self, site_id: int) -> tuple[TaskPlan, ...]:
        return tuple(t for t in self.tasks if t.site_id == site_id)

    def schedule(self, site_id: int) -> tuple[tuple[str, TaskPlan], ...]:
        """What the store runs, in order, as ``(phase, task or part)``: its tasks whole (phase ``all``), or in a
        phased lane every recent part, then every owed part, then the history parts by age (the newest segment
        of every task, then the next older, …)."""
        tasks = self.tasks_of(site_id)
        if not self.phased:
            return tuple(("all", t) for t in tasks)
        out = [(phase, p) for phase in ("recent", "owed") for t in tasks for p in t.parts if p.phase == phase]
        history = [[p for p in t.parts if p.phase == "history"] for t in tasks]
        for k in range(max(map(len, history), default=0)):
            out.extend(("history", h[k]) for h in history if k < len(h))
        return tuple(out)

    @property
    def estimate_requests(self) -> int:
        return sum(t.estimate.requests for t in self.tasks)

    @property
    def estimate_seconds(self) -> float:
        return sum(t.estimate.seconds for t in self.tasks)

    @property
    def unmeasured_stores(self) -> tuple[int, ...]:
        """Stores some task of which is estimated from the contract's lower bound (no history, no size measured)."""
        return tuple(dict.fromkeys(t.site_id for t in self.tasks if t.estimate.basis == "contract"))

    def estimate_note(self) -> str | None:
        """One line when some store is estimated from the contract's lower bound: what the estimate is and how
        to measure (issue 27); None otherwise."""
        return contract_note(self.unmeasured_stores)

    def to_dict(self) -> dict[str, Any]:
        from feiqiu_etl.textsafe import redact_url

        return {"name": self.name, "estimate_note": self.estimate_note(), "key": self.key, "token_env": self.token_source,
                "api_base": redact_url(self.api_base),
                "stores": [{"site_id": s.site_id, "name": s.name} for s in self.stores],
                "tasks": [t.to_dict() for t in self.tasks],
                "estimate": {"requests": self.estimate_requests, "seconds": round(self.estimate_seconds, 1)},
                "deadline": None if self.deadline is None else {
                    "text": self.deadline.text, "at": self.deadline_at.isoformat() if self.deadline_at else None,
                    "fit": self.fit.to_dict() if self.fit is not None else None,
                    "summary": self.fit.lines(self.name, self.until()) if self.fit is not None else []}}

    def until(self) -> str:
        """The deadline as a person reads it: ``06:00 (06:00:00 +08:00)``, ``45m (21:14:07 +08:00)``."""
        from feiqiu_etl.deadline import named

        if self.deadline is None or self.deadline_at is None:
            return "-"
        return named(self.deadline.text, self.deadline_at)


@dataclass(frozen=True)
class DwdPlan:
    """The DWD load after ODS: ``tables`` None = all; ``full`` forces a full compare of every dimension."""

    tables: tuple[str, ...] | None
    parallel_workers: int
    full: bool = False


@dataclass(frozen=True)
class RunPlan:
    """A whole run. ``lanes`` run concurrently, each strictly serial; then ``dwd`` (if any).

    ``now`` is the plan's time (naive Asia/Shanghai); ``started`` the wall-clock moment it was built (aware: the
    start a deadline counts from); ``timeout`` (s) cancels the run; ``wait_for_lane``
    (s, None = do not wait) is how long a lane held by another process is waited for; ``retention_days`` how long
    the registry keeps a run's log and timeline (``run.retention_days``; 0 = forever); ``settings`` is the
    effective configuration with its sources (secrets never included).
    """

    connector: Connector
    lanes: tuple[LanePlan, ...]
    load_ods: bool
    dwd: DwdPlan | None
    now: datetime
    incremental: bool
    timeout: float | None = None
    wait_for_lane: float | None = None
    unsafe_gaps: bool = False
    detail_max_attempts: int = 5
    integrity: Mapping[str, Any] = field(default_factory=dict)  # integrity.* (issue 25); {}: the defaults
    db: DbLimits = DbLimits()
    stall_after: float = 900.0
    retention_days: float = 90.0
    settings: dict[str, Any] = field(default_factory=dict, compare=False)
    started: datetime | None = None

    @property
    def stores(self) -> tuple[int, ...]:
        return tuple(s.site_id for lane in self.lanes for s in lane.stores)

    @property
    def task_codes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for lane in self.lanes:
            for t in lane.tasks:
                seen.setdefault(t.code, None)
        return tuple(seen)

    @property
    def task_count(self) -> int:
        return sum(len(lane.tasks) for lane in self.lanes) if self.load_ods else 0

    def to_dict(self) -> dict[str, Any]:
        return {"connector": self.connector.name, "now": fmt(self.now), "incremental": self.incremental,
                "load_ods": self.load_ods, "unsafe_gaps": self.unsafe_gaps,
                "lanes": [lane.to_dict() for lane in self.lanes],
                "dwd": None if self.dwd is None else {"tables": list(self.dwd.tables) if self.dwd.tables else "all",
                                                       "parallel_workers": self.dwd.parallel_workers,
                                                       "full": self.dwd.full},
                "estimate_note": contract_note(tuple(s for lane in self.lanes for s in lane.unmeasured_stores)),
                "estimate": {"requests": sum(lane.estimate_requests for lane in self.lanes),
                             "lane_seconds_max": round(max((lane.estimate_seconds for lane in self.lanes),
                                                           default=0.0), 1)}}


def contract_note(stores: tuple[int, ...]) -> str | None:
    """The line that says an estimate of ``stores`` is the contract's lower bound and how to measure them."""
    if not stores:
        return None
    which = ", ".join(map(str, stores[:3])) + (f" and {len(stores) - 3} more" if len(stores) > 3 else "")
    return (f"estimate: store(s) {which} have no history and no measured size: planned at the contract's lower "
            f"bound (upstream-api.md §4.1), which can be far off; measure them with `feiqiu-etl check`")
