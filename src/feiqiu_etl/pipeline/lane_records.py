"""What the request lane reports: the :class:`SchedulerStatistics` snapshot, one :class:`AttemptRecord` per
attempt (for timelines), and the vocabulary of its wait reasons and attempt outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from feiqiu_etl.errortext import one_line
from feiqiu_etl.pipeline.errors import Cancelled

WAIT_REASONS = ("gap", "floor", "retry-after", "banned", "timeout-hold", "lane", "paused")
"""Why the next request is not sent yet: its drawn gap, the class floor, an upstream retry hint, a ban,
a hold after a timed-out request, another tenant holding the lane, or the lane paused from outside (e.g.
while the database that stores the rows is away)."""


@dataclass(frozen=True)
class SchedulerStatistics:
    """Snapshot of the lane (seconds are seconds; counts are attempts actually sent or answers seen).

    ``current``/``current_tenant`` describe the request in flight or waiting its gap (None when idle);
    ``next_due_in`` and ``wait_reason`` (one of :data:`WAIT_REASONS`) say when and why it goes out;
    ``floors`` are the per-class minimum gaps learnt from the upstream; ``busy_seconds`` is the time spent
    with a request in flight and ``waited_seconds`` the time spent in gaps (their sum per request is what
    an ETA needs); ``late_seconds`` the part of ``waited_seconds`` after the requests were due (the machine woke
    the lane late: what a planned gap does not include).
    """

    name: str
    requests_sent: int
    in_flight: bool
    current: str | None
    current_tenant: Hashable | None
    last_gap: float
    next_due_in: float
    wait_reason: str | None
    waiting_tenants: int
    throttled: int
    banned: int
    banned_seconds: float
    floors: dict[str, float]
    consecutive_transport_failures: int
    tripped: str | None
    cancelled_waits: int
    aborted_in_flight: int
    busy_seconds: float
    waited_seconds: float
    late_seconds: float = 0.0


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the lane saw it (for timelines): monotonic ``started``/``ended`` (s), the wait before it
    (``gap``, s, None for the first request) and why it waited, and ``outcome``: ``ok``, ``throttled``,
    ``banned``, ``hold`` (a retry hint), ``timeout``, ``unreachable``, ``aborted`` (cancelled in flight) or
    ``error``; ``detail`` is the error's one-line text; ``drawn`` (s) the gap the lane drew for it (the limiter's
    draw, narrowed by the pace): ``gap - drawn`` is what floors, holds and a late wake-up added."""

    seq: int
    started: float
    ended: float
    label: str | None
    tenant: Hashable | None
    gap_class: str | None
    gap: float | None
    wait_reason: str | None
    outcome: str
    detail: str | None = None
    drawn: float | None = None


def attempt_outcome(error: BaseException | None) -> str:
    """The :attr:`AttemptRecord.outcome` of an attempt that raised ``error`` (None: it succeeded)."""
    if error is None:
        return "ok"
    if isinstance(error, Cancelled):
        return "aborted"
    backoff = getattr(error, "lane_backoff", None)
    if backoff is not None:
        return {"throttled": "throttled", "banned": "banned"}.get(backoff.kind, "hold")
    if getattr(error, "transport_failure", False):
        return "unreachable"
    if getattr(error, "hold_lane_seconds", 0):
        return "timeout"
    return "error"


def attempt_detail(error: BaseException | None) -> str | None:
    """The :attr:`AttemptRecord.detail`: ``error``'s text on one line (at most 200 characters), None when the
    attempt succeeded or was cancelled."""
    if error is None or isinstance(error, Cancelled):
        return None
    return one_line(error, 200)
