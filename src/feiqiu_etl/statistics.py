"""The typed status of a run: frozen snapshots that the run's owners build and everyone else reads.

* :class:`TaskStatistics` — one ODS task of one store, built by ``BaseOdsTask.statistics()`` from its
  ``UnifiedPipeline``'s statistics (and the ``WriteWorker``'s inside them) while it runs, from its result after;
* :class:`LaneStatistics` — one token's lane, built by ``LaneRunner.statistics()`` from its
  ``RequestScheduler``'s statistics and its running tasks' :class:`TaskStatistics`;
* :class:`RunStatistics` — the whole run, built by ``FlowRunner.statistics()`` from its lanes';
* :class:`LaneTotals` — what a lane reports when it ends (``LaneResult.statistics``; merged into each lane of
  ``run --json`` and of the run record's ``summary``).

Building a snapshot is a read: it changes nothing, so any number of readers (the progress display, the
heartbeat of :mod:`feiqiu_etl.registry.control`, ``status``, the web page, tests) see the same figures. A rate
(rows/s) comes from samples the owner records on its own clock (:class:`RateMeter`), never from the reads.

The same types are the JSON that leaves the process: :meth:`~_Json.to_dict` is what the registry stores as
``etl_meta.run.live`` (``status --json``, ``show --json``, ``GET /api/status``, ``/api/runs/ID``,
``web/static/live.js``); :meth:`~_Json.from_dict` reads it back (a field it lacks takes its default, as in a
record of an older version; a field it does not know is ignored); :meth:`~_Json.json_schema` describes it
(``GET /api/status/schema``). Units: seconds, rows, requests. This module imports nothing of the project.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from pydantic import TypeAdapter

__all__ = ["CurrentRequest", "LaneStatistics", "LaneTotals", "Queues", "RateMeter", "RunStatistics",
           "StoreProgress", "TaskStatistics"]

J = TypeVar("J", bound="_Json")

RATE_WINDOW = 15.0
"""Seconds of history behind a rows/s figure."""


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


class _Json:
    """JSON of a snapshot type (pydantic's :class:`~pydantic.TypeAdapter` of the dataclass)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists for tuples, only str/int/float/bool/None leaves), in field order."""
        return _adapter(type(self)).dump_python(self, mode="json")

    @classmethod
    def from_dict(cls: type[J], data: Mapping[str, Any]) -> J:
        """The snapshot of a :meth:`to_dict` (missing fields: their defaults; unknown ones: ignored). Raises
        ``ValueError`` (pydantic's ``ValidationError``) when a field has the wrong type or a required one is
        missing."""
        return _adapter(cls).validate_python(data)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of :meth:`to_dict`."""
        return _adapter(cls).json_schema()


@dataclass(frozen=True)
class Queues(_Json):
    """Items waiting inside a pipeline: ``frontier`` requests for the lane (next pages, details),
    ``processing`` responses for a worker, ``write`` row chunks for the writer."""

    frontier: int = 0
    processing: int = 0
    write: int = 0

    def __add__(self, other: "Queues") -> "Queues":
        return Queues(self.frontier + other.frontier, self.processing + other.processing, self.write + other.write)


@dataclass(frozen=True)
class TaskStatistics(_Json):
    """One ODS task of one store. ``state``: ``starting`` (reading what it owes, no request yet), ``running``
    (its pipeline runs), ``finished`` (its result is final). ``requests`` are logical requests done (retries
    not counted), ``requests_planned`` the plan's estimate, ``requests_remaining`` the larger of what the
    estimate leaves and what is known to be waiting (frontier, seeds not pulled yet, the one in flight);
    ``rows_written`` rows committed that changed the table (inserted + updated), ``rows_unchanged`` rows the
    writer found unchanged (issue 27: an unchanged rerun writes 0); ``elapsed_s`` seconds since its pipeline
    started."""

    task: str
    site_id: int
    state: str = "starting"
    requests: int = 0
    requests_planned: int = 0
    requests_remaining: int = 0
    fetched: int = 0
    rows_written: int = 0
    failures: int = 0
    rate_limited: int = 0
    queues: Queues = Queues()
    seeds_left: int | None = None
    batches_written: int = 0
    seconds_writing: float = 0.0
    elapsed_s: float = 0.0
    rows_unchanged: int = 0


@dataclass(frozen=True)
class CurrentRequest(_Json):
    """The lane's request now: the task and store it belongs to, the request (``/api/… page 3``), whether
    it is in flight (else it waits its gap)."""

    task: str | None = None
    site_id: int | None = None
    request: str | None = None
    in_flight: bool = False


@dataclass(frozen=True)
class StoreProgress(_Json):
    """One store of a lane: tasks finished of its tasks, the one running (None), why it was refused (None)."""

    site_id: int
    name: str | None = None
    tasks_done: int = 0
    tasks: int = 0
    task: str | None = None
    refused: str | None = None


@dataclass(frozen=True)
class LaneStatistics(_Json):
    """One token's lane, live. ``state``: ``waiting for lane`` (not started: its cross-process guard),
    ``running``, ``finished``. ``next_due_in`` seconds until the next request may go and ``wait_reason`` why
    (``gap``, ``floor``, ``retry-after``, ``banned``, ``timeout-hold``, ``lane``, ``paused``; None: it may go
    now); ``throttled``/``banned`` rejections (42901/42902) and ``banned_seconds``; ``floors`` the minimum gap
    per gap class learnt from the upstream (s); ``tripped`` why the lane stopped (None). ``rows_written`` rows inserted or updated, ``rows_unchanged``
    rows found unchanged; ``rows_per_s`` (rows processed: both) over
    the last :data:`RATE_WINDOW` seconds; ``eta_s`` the lane time the remaining requests need — each at its
    task's expected gap (narrowed by the pace) plus the seconds a request held the lane besides its gap so far
    — or the time to the deadline if that comes first (0 when finished). ``running`` are the tasks running now,
    one per store at most. With a deadline: ``deadline_in_s`` seconds until it, ``pace`` how far the gaps are
    narrowed (1 = as configured, 0 = the safe floors); both None without one; ``left_at_deadline`` the requests
    that will not fit before it at the current pace (the plan's rule: requests x expected gap; 0 when all fit).
    ``stalled_for``:
    seconds the running lane has not moved (no attempt ended, no task began or ended, no row written), once
    past ``run.stall_after``; None while it moves (the run control's watchdog logs it too)."""

    name: str
    key: str = ""
    state: str = "waiting for lane"
    current: CurrentRequest | None = None
    next_due_in: float = 0.0
    wait_reason: str | None = None
    requests_sent: int = 0
    throttled: int = 0
    banned: int = 0
    banned_seconds: float = 0.0
    floors: Mapping[str, float] = field(default_factory=dict)
    tripped: str | None = None
    queues: Queues = Queues()
    rows_written: int = 0
    rows_per_s: float = 0.0
    requests_remaining: int = 0
    tasks_done: int = 0
    tasks: int = 0
    eta_s: float = 0.0
    stores: tuple[StoreProgress, ...] = ()
    running: tuple[TaskStatistics, ...] = ()
    deadline_in_s: float | None = None
    pace: float | None = None
    stalled_for: float | None = None
    rows_unchanged: int = 0
    left_at_deadline: int | None = None


@dataclass(frozen=True)
class RunStatistics(_Json):
    """The whole run, live (what the heartbeat publishes about once a second). ``phase``: ``starting``,
    ``ods``, ``dwd``, ``finishing``; ``cancelling`` once a cancel was asked for. Totals are the lanes' sums;
    ``rows_per_s`` their sum, ``eta_s`` the slowest lane's, ``elapsed_s`` seconds since the run started.
    ``pool_waiting``: operations waiting for a pooled database connection now (contention, not an outage: issue
    28 item 9), the ``pool_wait_s`` of the longest of them, and ``pool_in_use`` of ``pool_size`` connections."""

    run_id: str
    phase: str = "starting"
    cancelling: bool = False
    tasks_done: int = 0
    tasks: int = 0
    lanes: tuple[LaneStatistics, ...] = ()
    elapsed_s: float = 0.0
    rows_written: int = 0
    rows_per_s: float = 0.0
    requests_sent: int = 0
    requests_remaining: int = 0
    eta_s: float = 0.0
    rows_unchanged: int = 0
    pool_waiting: int = 0
    pool_wait_s: float = 0.0
    pool_in_use: int = 0
    pool_size: int = 0


@dataclass(frozen=True)
class LaneTotals(_Json):
    """A lane's figures when it ended: requests sent (attempts), rejections and the seconds banned, learnt
    floors (s per gap class), seconds with a request in flight (``busy_seconds``) and waiting in gaps
    (``waited_seconds``), the lane's wall time (``seconds``) and requests abandoned by a cancel."""

    requests_sent: int = 0
    throttled: int = 0
    banned: int = 0
    banned_seconds: float = 0.0
    floors: Mapping[str, float] = field(default_factory=dict)
    busy_seconds: float = 0.0
    waited_seconds: float = 0.0
    seconds: float = 0.0
    aborted_in_flight: int = 0


@dataclass(frozen=True)
class _Sample:
    at: float
    total: int


class RateMeter:
    """A count per second (rows/s) over the last ``window`` seconds, from samples its owner records.

    The owner calls :meth:`record` on its own clock (the runner's loop, about twice a second); readers call
    :meth:`rate` with the count now, which reads the samples and changes nothing — so two readers never
    change each other's figure. The base of a rate is the newest sample at least ``window`` seconds old (the
    oldest one early in a run); below half a second of history the rate is 0. Thread-safe.
    """

    def __init__(self, window: float = RATE_WINDOW, every: float = 0.5):
        self._window = window
        self._every = every
        self._samples: deque[_Sample] = deque()
        self._lock = threading.Lock()

    def record(self, at: float, total: int) -> None:
        """Store ``total`` as the count at ``at`` (monotonic seconds); samples closer than ``every`` seconds to
        the last are skipped, those no rate needs any more are dropped."""
        with self._lock:
            if self._samples and at - self._samples[-1].at < self._every:
                return
            self._samples.append(_Sample(at, total))
            while len(self._samples) > 1 and at - self._samples[1].at >= self._window:
                self._samples.popleft()

    def rate(self, at: float, total: int) -> float:
        """Count per second between the base sample (see the class docstring) and ``total`` at ``at``."""
        with self._lock:
            base = None
            for sample in self._samples:
                if base is not None and at - sample.at < self._window:
                    break
                base = sample
        if base is None or at - base.at <= 0.5:
            return 0.0
        return max(0.0, (total - base.total) / (at - base.at))
