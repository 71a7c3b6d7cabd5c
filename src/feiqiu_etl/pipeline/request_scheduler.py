"""``RequestScheduler``: the one serial request lane of an upstream account (spec §2.2, Property 1).

Think of the lane as a single-track road shared by every task (and every store) of one account: one car at
a time, and a car may only start when the previous one has left and its own spacing has passed. Every
request of every pipeline using the lane goes through :meth:`RequestScheduler.send`, which guarantees:

* **strictly one request at a time** — the lane is held from the gap wait until the response has fully
  arrived (or the attempt failed);
* **the gap** before a request is drawn from *that request's* limiter (its task's configuration) and is
  measured from the end of the previous response, across task and store boundaries (ENGINE-NOTES); an
  attempt that never reached a server (``transport_failure``) owes no gap, only its retry backoff;
* **a pace** (optional, :class:`~feiqiu_etl.pipeline.pace.Pace`): to meet a deadline the drawn gap narrows toward
  its class's safe floor (never below it, never widened);
* **a floor per gap class** (e.g. "standard" and "groupbuy" endpoints, upstream-api.md §2.2): after the
  upstream said a request came too early (an exception with ``lane_backoff.kind == "throttled"``), later
  requests of *that class* wait at least a learnt floor, and the lane says so once per class (issue 30: a
  42901 costs what it costs upstream, a few gaps, not the night):

  - rejected at a gap ``g`` at or above the class's documented minimum (``documented``): the floor is
    ``g + floor_margin`` — the upstream's G is a little above ``g`` (or the rejection was a hiccup) — and it
    *decays*: every success of the class takes ``floor_margin / FLOOR_DECAY_REQUESTS`` off it, and after
    :data:`FLOOR_DECAY_REQUESTS` successes the floor is gone. Rejected again at or above that floor, the
    class's floor becomes the upstream's own bound, ``g + retryAfter``, for the rest of the lane;
  - rejected below the documented minimum (``--unsafe-gaps``): ``min(g + retryAfter, documented +
    floor_margin)`` for the rest of the lane (the upstream enforces what it documents);
  - a class without a documented minimum: ``g + retryAfter`` for the rest of the lane (all we know);
  - a request rejected although it honoured a lasting floor does not ratchet it up (another client of the
    token, or an upstream hiccup);
* **demanded waits bind the next request, not every later one**: an exception carrying ``lane_backoff`` (a
  ``Retry-After``, a risk-control ``retryAfter``, a ban) or ``hold_lane_seconds`` (a timeout: the server
  may still be working) keeps the lane closed that long after the failed attempt ended, for whatever
  request comes next — a retry or another task's request; the request after that owes its gap only;
* **sharing between tenants** (the stores of one account): when several pipelines wait for the lane it is
  granted round-robin by ``tenant``, so one big store cannot starve the others — or, once :meth:`rank` gave
  the tenants an order, to the first tenant in that order that has a request ready (stores then complete one
  after another, issue 30; the others fill the lane only while the leader has nothing to send). A request
  granted to a later tenant that, when its gap is over, finds an earlier tenant waiting gives the lane back,
  and its drawn gap with it (the earlier one waits no longer than that, for the same class: every gap runs from
  the last response, so nothing is lost);
* **a circuit breaker**: after ``max_transport_failures`` attempts in a row that raised an exception with
  ``transport_failure = True`` (connection refused, DNS, connect timeout) the lane *trips*: every later
  ``send`` raises :class:`LaneTripped` at once, so a dead upstream costs seconds, not one retry storm per task;
* **cancellation at every point**: waiting for the lane or for the gap, and — with ``abortable=True`` —
  the request in flight itself (its response is abandoned; nothing of it was received, so nothing is lost).

It never retries by itself and knows nothing of HTTP; time comes from the injectable ``Clock``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, TypeVar

from feiqiu_etl.errortext import one_line
from feiqiu_etl.pipeline.clock import SYSTEM_CLOCK, Clock, SystemClock
from feiqiu_etl.pipeline.errors import Cancelled, LaneBackoff, LaneTripped
from feiqiu_etl.pipeline.pace import Pace
from feiqiu_etl.pipeline.rate_limiter import RateLimiter

T = TypeVar("T")

FLOOR_DECAY_REQUESTS = 20
"""Successes of a class after which a floor learnt with a margin is gone (it shrinks linearly until then). 20
requests at a 3 s gap are a minute: a second rejection, if the upstream's G really is higher, lands outside the
60 s violation window of the first (upstream-api.md §2.2: three in 60 s ban the token)."""

WAIT_REASONS = ("gap", "floor", "retry-after", "banned", "timeout-hold", "lane", "paused")
"""Why the next request is not sent yet: its drawn gap, the class floor, an upstream retry hint, a ban,
a hold after a timed-out request, another tenant holding the lane, or the lane paused from outside (e.g.
while the database that stores the rows is away)."""


_GIVE_WAY = "give-way"
"""What :meth:`RequestScheduler._wait_gap` returns when it stopped early because an earlier store waits."""


@dataclass(frozen=True)
class SchedulerStatistics:
    """Snapshot of the lane (seconds are seconds; counts are attempts actually sent or answers seen).

    ``current``/``current_tenant`` describe the request in flight or waiting its gap (None when idle);
    ``next_due_in`` and ``wait_reason`` (one of :data:`WAIT_REASONS`) say when and why it goes out;
    ``floors`` are the per-class minimum gaps learnt from the upstream; ``busy_seconds`` is the time spent
    with a request in flight and ``waited_seconds`` the time spent in gaps (their sum per request is what
    an ETA needs).
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


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the lane saw it (for timelines): monotonic ``started``/``ended`` (s), the wait before it
    (``gap``, s, None for the first request) and why it waited, and ``outcome``: ``ok``, ``throttled``,
    ``banned``, ``hold`` (a retry hint), ``timeout``, ``unreachable``, ``aborted`` (cancelled in flight) or
    ``error``; ``detail`` is the error's one-line text."""

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


@dataclass
class _Waiting:
    tenant: Hashable | None
    granted: bool = False


@dataclass
class _Floor:
    """A learnt floor of one gap class: ``seconds`` now; ``margin`` left to decay (0: it lasts) and by how much a
    success takes off it (``step``)."""

    seconds: float
    margin: float = 0.0
    step: float = 0.0
    successes: int = 0


@dataclass
class _Due:
    at: float
    reason: str


class RequestScheduler:
    """The serial lane of one upstream account (see the module docstring). No global state.

    ``name`` labels statistics and log lines; ``max_transport_failures`` (None = never) arms the circuit
    breaker; ``logger`` receives the once-per-class floor notices and the trip; ``pace`` narrows the drawn gaps
    toward safe floors (None: never); ``documented`` (``{gap class: s}``, connector ``api.gap_classes``) and
    ``floor_margin`` (s, ``lane.safety_margin_seconds``) shape the floors learnt from a 42901 (module docstring).
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, *, name: str = "lane",
                 max_transport_failures: int | None = None, logger: logging.Logger | None = None,
                 observer: Callable[[AttemptRecord], None] | None = None, pace: Pace | None = None,
                 documented: Mapping[str, float] | None = None, floor_margin: float = 0.3):
        if floor_margin < 0:
            raise ValueError(f"floor_margin must be >= 0 s, got {floor_margin}")
        self._documented = dict(documented or {})
        self._floor_margin = float(floor_margin)
        self._rank: dict[Hashable | None, int] = {}
        self._drawn: tuple[str | None, float] | None = None    # the gap class and gap of the request granted
        self._handoff: tuple[str | None, float] | None = None  # ... left by a request that gave the lane back
        if max_transport_failures is not None and max_transport_failures < 1:
            raise ValueError(f"max_transport_failures must be >= 1, got {max_transport_failures}")
        self.name = name
        self._observer = observer
        self._pace = pace
        self._clock = clock
        self._log = logger or logging.getLogger("feiqiu_etl.lane")
        self._max_transport = max_transport_failures
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Waiting] = deque()
        self._order: deque[Hashable | None] = deque()   # round-robin order of tenants seen
        self._busy = False
        self._last_end: float | None = None          # end of the last response received (gaps run from it)
        self._last_attempt_end: float | None = None  # end of the last attempt, reached a server or not
        self._hold: _Due | None = None
        self._floors: dict[str, _Floor] = {}
        self._sent = 0
        self._in_flight = False
        self._current: str | None = None
        self._current_tenant: Hashable | None = None
        self._last_gap = 0.0
        self._due: _Due | None = None
        self._throttled = 0
        self._banned = 0
        self._banned_seconds = 0.0
        self._transport_streak = 0
        self._tripped: str | None = None
        self._cancelled_waits = 0
        self._aborted = 0
        self._paused: str | None = None
        self._io: _RequestThread | None = None
        self._busy_seconds = 0.0
        self._waited_seconds = 0.0

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def tripped(self) -> str | None:
        """The reason the circuit breaker tripped, or None."""
        with self._cond:
            return self._tripped

    def floor(self, gap_class: str | None) -> float:
        """The learnt minimum gap (s) of ``gap_class`` (0 when the upstream never complained)."""
        with self._cond:
            learnt = self._floors.get(gap_class or "")
            return learnt.seconds if learnt is not None else 0.0

    def rank(self, tenants: Iterable[Hashable | None]) -> None:
        """Grant the lane to the first of ``tenants`` (in this order) that has a request waiting, instead of
        round-robin; tenants not listed come after them, round-robin."""
        with self._cond:
            self._rank = {t: i for i, t in enumerate(tenants)}

    def pause(self, reason: str) -> None:
        """Send nothing until :meth:`resume` (a request already in flight finishes; cancel still works)."""
        with self._cond:
            if self._paused is None:
                self._log.warning("lane %s paused: %s", self.name, reason)
            self._paused = reason

    def resume(self) -> None:
        with self._cond:
            if self._paused is not None:
                self._log.warning("lane %s resumed", self.name)
            self._paused = None
            self._cond.notify_all()

    def trip(self, reason: str) -> None:
        """Trip the circuit breaker by hand (idempotent; the first reason wins)."""
        with self._cond:
            if self._tripped is None:
                self._tripped = reason
                self._log.error("lane %s stopped: %s", self.name, reason)
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------------- send
    def send(
        self,
        fn: Callable[[], T],
        limiter: RateLimiter,
        cancel_event: threading.Event | None = None,
        *,
        min_wait: float = 0.0,
        gap_class: str | None = None,
        tenant: Hashable | None = None,
        label: str | None = None,
        abortable: bool = False,
    ) -> T:
        """Wait for the lane and the gap, then call ``fn()`` (the actual request) and record when it ended.

        The gap is ``max(limiter.draw(), floor(gap_class), min_wait)`` seconds after the previous response
        ended (the draw narrowed by the lane's pace, if any), and never before a hold left by an earlier attempt; the first request of a lane is not
        delayed unless ``min_wait`` > 0. ``label`` (e.g. ``"/api/x page 3"``) shows in statistics.

        Raises ``Cancelled`` if ``cancel_event`` fires before sending — or, with ``abortable``, while the
        request is in flight (``fn`` then runs on a helper thread whose result is abandoned) — and
        :class:`LaneTripped` when the circuit breaker has tripped. Exceptions from ``fn`` propagate after
        the lane has taken note of their ``lane_backoff``/``hold_lane_seconds``/``transport_failure``.
        """
        ticket = self._acquire(tenant, cancel_event)
        try:
            while True:  # a later store gives the lane to an earlier one that waits, and waits its turn again
                reason = self._wait_gap(limiter, cancel_event, min_wait, gap_class, tenant, label)
                if not self._yield_to_earlier(ticket, cancel_event) and reason != _GIVE_WAY:
                    break
            return self._call(fn, cancel_event, gap_class, abortable, label, tenant, reason)
        finally:
            self._release(ticket)

    def _acquire(self, tenant: Hashable | None, cancel_event: threading.Event | None) -> _Waiting:
        ticket = _Waiting(tenant)
        with self._cond:
            if self._tripped:
                raise LaneTripped(self._tripped)
            if tenant not in self._order:
                self._order.append(tenant)
            self._queue.append(ticket)
            self._grant()
            if not ticket.granted and self._rank:
                self._cond.notify_all()  # a later store waiting for its gap gives way at once
            self._await_grant(ticket, cancel_event)
        return ticket

    def _await_grant(self, ticket: _Waiting, cancel_event: threading.Event | None) -> None:
        """Wait (lock held) until ``ticket`` is granted, noticing a cancel or a trip within 0.1 s."""
        while not ticket.granted:  # another tenant holds the lane
            if cancel_event is not None and cancel_event.is_set():
                self._queue.remove(ticket)
                self._cancelled_waits += 1
                raise Cancelled()
            if self._tripped:
                self._queue.remove(ticket)
                raise LaneTripped(self._tripped)
            self._cond.wait(0.1)

    def _yield_to_earlier(self, ticket: _Waiting, cancel_event: threading.Event | None) -> bool:
        """With ranked tenants: when a tenant earlier than ``ticket``'s waits, give it the lane and wait for the
        lane again (True); else False (send now)."""
        with self._cond:
            if not self._rank or not self._queue:
                return False
            mine = self._rank_of(ticket.tenant)
            if min(self._rank_of(t.tenant) for t in self._queue) >= mine:
                return False
            ticket.granted = False
            self._handoff = self._drawn
            self._busy = False
            self._current = None
            self._current_tenant = None
            self._due = None
            self._queue.appendleft(ticket)
            self._grant()
            self._await_grant(ticket, cancel_event)
            return True

    def _rank_of(self, tenant: Hashable | None) -> int:
        return self._rank.get(tenant, len(self._rank))

    def _grant(self) -> None:
        """Give the free lane to the first waiting ticket of the next tenant in round-robin order."""
        if self._busy or not self._queue:
            return
        if self._rank:
            best = min(self._rank_of(t.tenant) for t in self._queue)
            if best < len(self._rank):
                ticket = next(t for t in self._queue if self._rank_of(t.tenant) == best)
                self._queue.remove(ticket)
                ticket.granted = True
                self._busy = True
                self._cond.notify_all()
                return
        for _ in range(len(self._order)):
            tenant = self._order[0]
            self._order.rotate(-1)
            for ticket in self._queue:
                if ticket.tenant == tenant:
                    self._queue.remove(ticket)
                    ticket.granted = True
                    self._busy = True
                    self._cond.notify_all()
                    return

    def _release(self, ticket: _Waiting) -> None:
        with self._cond:
            self._busy = False
            self._current = None
            self._current_tenant = None
            self._due = None
            self._grant()
            self._cond.notify_all()

    def _wait_gap(self, limiter: RateLimiter, cancel_event: threading.Event | None, min_wait: float,
                  gap_class: str | None, tenant: Hashable | None, label: str | None) -> str | None:
        """Wait until the request is due; returns why it waited (a :data:`WAIT_REASONS` entry, None if not)."""
        if cancel_event is not None and cancel_event.is_set():
            with self._cond:
                self._cancelled_waits += 1
            raise Cancelled()
        drawn = limiter.draw()
        if self._pace is not None:
            drawn = self._pace.gap(drawn, gap_class)
        with self._cond:
            if self._handoff is not None:
                # a later store drew a gap and gave the lane back to this (earlier) one: it does not wait longer
                # than that store would have (else every hand-over would cost the longer of two random gaps)
                handed_class, handed = self._handoff
                self._handoff = None
                if handed_class == gap_class:
                    drawn = min(drawn, handed)
            self._drawn = (gap_class, drawn)
            learnt = self._floors.get(gap_class or "")
            floor = learnt.seconds if learnt is not None else 0.0
            now = self._clock.monotonic()
            gap, reason = drawn, "gap"
            if floor > gap:
                gap, reason = floor, "floor"
            # The gap runs from the last response the upstream sent; a retry hint from the end of the last
            # attempt (the same instant, unless that attempt never reached a server).
            due = _Due(self._last_end + gap if self._last_end is not None else now, reason)
            retry_from = self._last_attempt_end if self._last_attempt_end is not None else now
            if min_wait > 0 and retry_from + min_wait > due.at:
                due = _Due(retry_from + min_wait, "retry-after")
            if self._hold is not None and self._hold.at > due.at:
                due = self._hold
            self._due = due
            self._last_gap = max(gap, min_wait)
            self._current = label
            self._current_tenant = tenant
        remaining = due.at - now
        if remaining > 0:
            if self._rank and isinstance(self._clock, SystemClock):
                cancelled, earlier = self._wait_ranked(cancel_event, due.at, tenant)
                if earlier and not cancelled:  # an earlier store is waiting: send() hands it the lane at once
                    with self._cond:
                        self._waited_seconds += max(0.0, self._clock.monotonic() - now)
                    return _GIVE_WAY
            else:
                cancelled = self._clock.wait(cancel_event, remaining)
            with self._cond:
                self._waited_seconds += max(0.0, self._clock.monotonic() - now)
                if cancelled:
                    self._cancelled_waits += 1
            if cancelled:
                raise Cancelled()
        paused = self._wait_unpaused(cancel_event)
        if cancel_event is not None and cancel_event.is_set():
            with self._cond:
                self._cancelled_waits += 1
            raise Cancelled()
        return "paused" if paused else (due.reason if remaining > 0 else None)

    def _wait_ranked(self, cancel_event: threading.Event | None, at: float,
                     tenant: Hashable | None) -> tuple[bool, bool]:
        """Wait (real time) until ``at``, a cancel, or an earlier-ranked tenant queueing for the lane — whichever
        comes first, within 50 ms for a cancel; returns ``(cancelled, an earlier tenant waits)``. So a hand-over to
        the leader happens during the gap, not after it (no extra thread switch between the gap and the request)."""
        mine = self._rank_of(tenant)
        with self._cond:
            while True:
                if cancel_event is not None and cancel_event.is_set():
                    return True, False
                if any(self._rank_of(t.tenant) < mine for t in self._queue):
                    return False, True
                left = at - self._clock.monotonic()
                if left <= 0:
                    return False, False
                self._cond.wait(min(left, 0.05))

    def _wait_unpaused(self, cancel_event: threading.Event | None) -> bool:
        """Hold the granted request while the lane is paused; True if it had to wait."""
        waited = False
        with self._cond:
            while self._paused is not None and self._tripped is None:
                waited = True
                self._due = _Due(self._clock.monotonic(), "paused")
                if cancel_event is not None and cancel_event.is_set():
                    break
                self._cond.wait(0.1)
            if self._tripped is not None:
                raise LaneTripped(self._tripped)
        return waited

    def _call(self, fn: Callable[[], T], cancel_event: threading.Event | None, gap_class: str | None,
              abortable: bool, label: str | None = None, tenant: Hashable | None = None,
              reason: str | None = None) -> T:
        with self._cond:
            self._in_flight = True
            self._due = None
            self._sent += 1
            started = self._clock.monotonic()
            gap_at_send = started - self._last_end if self._last_end is not None else None
        error: BaseException | None = None
        try:
            if abortable and cancel_event is not None:
                if self._io is None:
                    self._io = _RequestThread(self.name)
                done, value = self._io.call(fn, cancel_event)
                if not done:
                    self._io = None
                    self._on_abort()
                    raise Cancelled()
                return value
            return fn()
        except BaseException as exc:
            error = exc
            raise
        finally:
            with self._cond:
                end = self._clock.monotonic()
                self._busy_seconds += end - started
                self._last_attempt_end = end
                if not getattr(error, "transport_failure", False):  # never reached a server: no gap owed
                    self._last_end = end
                self._hold = None
                self._in_flight = False
                self._note_outcome(error, end, gap_class, gap_at_send)
                seq = self._sent
            if self._observer is not None:
                self._observe(AttemptRecord(seq, started, end, label, tenant, gap_class, gap_at_send, reason,
                                            _outcome(error), _detail(error)))

    def _observe(self, record: AttemptRecord) -> None:
        try:
            self._observer(record)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - an observer must never break the lane
            self._log.debug("lane observer failed", exc_info=True)

    def _on_abort(self) -> None:
        with self._cond:
            self._aborted += 1

    def _note_outcome(self, error: BaseException | None, end: float, gap_class: str | None,
                      gap_at_send: float | None) -> None:
        """Holds, floors and the breaker after one attempt (called with the lock held)."""
        if error is None or isinstance(error, Cancelled):
            self._transport_streak = 0
            if error is None:
                self._decay_floor(gap_class)
            return
        hold = float(getattr(error, "hold_lane_seconds", 0.0) or 0.0)
        if hold > 0:
            self._hold = _Due(end + hold, "timeout-hold")
        backoff: LaneBackoff | None = getattr(error, "lane_backoff", None)
        if backoff is not None and backoff.seconds > 0:
            reason = "banned" if backoff.kind == "banned" else "retry-after"
            if self._hold is None or end + backoff.seconds > self._hold.at:
                self._hold = _Due(end + backoff.seconds, reason)
            if backoff.kind == "banned":
                self._banned += 1
                self._banned_seconds += backoff.seconds
            else:
                self._throttled += 1
            if backoff.kind == "throttled" and gap_class is not None:
                self._learn_floor(gap_class, gap_at_send or 0.0, backoff.seconds, backoff.detail)
        if getattr(error, "transport_failure", False):
            self._transport_streak += 1
            if self._max_transport is not None and self._transport_streak >= self._max_transport \
                    and self._tripped is None:
                self._tripped = f"upstream unreachable: {self._transport_streak} transport failures in a row " \
                                f"(last: {error})"
                self._log.error("lane %s stopped: %s", self.name, self._tripped)
                self._cond.notify_all()
        else:
            self._transport_streak = 0

    def _learn_floor(self, gap_class: str, gap: float, demanded: float, detail: str) -> None:
        """A request of ``gap_class`` sent ``gap`` s after the last response was rejected as too early and the
        upstream demanded ``demanded`` s more: the class's floor (rules in the module docstring)."""
        old = self._floors.get(gap_class)
        documented = self._documented.get(gap_class)
        margin = self._floor_margin
        if old is not None and old.margin == 0.0 and gap >= old.seconds - 1e-9:
            # Sent after a lasting floor and still rejected: not our spacing (another client of the token, or an
            # upstream hiccup). The demanded wait holds the lane; the floor does not ratchet up.
            return
        if old is not None and gap >= old.seconds - 1e-9:
            new = _Floor(gap + demanded)  # twice in this class at or above a learnt floor: the upstream's bound
        elif documented is not None and gap >= documented - 1e-9 and margin > 0:
            new = _Floor(gap + margin, margin, margin / FLOOR_DECAY_REQUESTS)
        elif documented is not None:
            new = _Floor(min(gap + demanded, max(documented + margin, gap + margin)))
        else:
            new = _Floor(gap + demanded)
        if old is not None and old.seconds >= new.seconds:
            return
        self._floors[gap_class] = new
        if old is None:
            said = f" ({detail})" if detail else ""
            if new.margin == 0.0:
                self._log.warning("lane %s: the upstream rejected a %s request sent %.2f s after the last response as "
                                  "too early%s; every later %s request of this run waits at least %.1f s", self.name,
                                  gap_class, gap, said, gap_class, new.seconds)
            else:
                self._log.warning("lane %s: the upstream rejected a %s request sent %.2f s after the last response as "
                                  "too early%s; the next %d %s requests wait at least %.2f s, less with each one "
                                  "accepted", self.name, gap_class, gap, said, FLOOR_DECAY_REQUESTS, gap_class,
                                  new.seconds)
        else:
            self._log.info("lane %s: floor of %s raised from %.2f s to %.2f s", self.name, gap_class, old.seconds,
                           new.seconds)

    def _decay_floor(self, gap_class: str | None) -> None:
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
                           "accepted", self.name, gap_class, learnt.successes)

    # ------------------------------------------------------------------------------------------- observe
    def statistics(self) -> SchedulerStatistics:
        with self._cond:
            now = self._clock.monotonic()
            due = self._due
            due_in = max(0.0, due.at - now) if due is not None else 0.0
            reason = due.reason if due is not None and (due_in > 0 or due.reason == "paused") else None
            if reason is None and not self._in_flight and self._queue:
                reason = "lane"
            return SchedulerStatistics(
                name=self.name, requests_sent=self._sent, in_flight=self._in_flight, current=self._current,
                current_tenant=self._current_tenant, last_gap=self._last_gap, next_due_in=due_in,
                wait_reason=reason, waiting_tenants=len({t.tenant for t in self._queue}),
                throttled=self._throttled, banned=self._banned, banned_seconds=self._banned_seconds,
                floors={c: round(f.seconds, 6) for c, f in self._floors.items()},
                consecutive_transport_failures=self._transport_streak,
                tripped=self._tripped, cancelled_waits=self._cancelled_waits, aborted_in_flight=self._aborted,
                busy_seconds=self._busy_seconds, waited_seconds=self._waited_seconds,
            )

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"<RequestScheduler {self.name} sent={s.requests_sent} in_flight={s.in_flight} "
                f"next_due_in={s.next_due_in:.2f}s reason={s.wait_reason}>")


def _outcome(error: BaseException | None) -> str:
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


def _detail(error: BaseException | None) -> str | None:
    if error is None or isinstance(error, Cancelled):
        return None
    return one_line(error, 200)


class _RequestThread:
    """The lane's long-lived helper thread for abortable requests: the lane thread hands it one request at a
    time and waits, noticing a cancel within ~50 ms. An abandoned request keeps its thread busy until it
    ends on its own; the lane then takes a new helper (the old one exits after that request)."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=f"{name}-request", daemon=True).start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def call(self, fn: Callable[[], T], cancel_event: threading.Event) -> tuple[bool, Any]:
        """``(True, value)``, re-raise ``fn``'s error, or ``(False, None)`` when cancelled while it ran."""
        finished = threading.Event()
        outcome: dict[str, Any] = {}

        def job() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = exc
            finally:
                finished.set()

        self._jobs.put(job)
        while not finished.wait(0.05):
            if cancel_event.is_set():
                self._jobs.put(None)  # this helper stops after the abandoned request
                return False, None
        if "error" in outcome:
            raise outcome["error"]
        return True, outcome["value"]
