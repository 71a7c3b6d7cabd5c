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
  upstream said a request came too early, later requests of *that class* wait at least a floor learnt from it
  (:mod:`~feiqiu_etl.pipeline.gap_floors` has the rules; issue 30);
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
import threading
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping, TypeVar

from feiqiu_etl.pipeline.clock import SYSTEM_CLOCK, Clock, SystemClock
from feiqiu_etl.pipeline.errors import Cancelled, LaneBackoff, LaneTripped
from feiqiu_etl.pipeline.gap_floors import FLOOR_DECAY_REQUESTS, GapFloors
from feiqiu_etl.pipeline.lane_queue import TenantQueue, Ticket
from feiqiu_etl.pipeline.lane_records import (WAIT_REASONS, AttemptRecord, SchedulerStatistics, attempt_detail,
                                              attempt_outcome)
from feiqiu_etl.pipeline.pace import Pace
from feiqiu_etl.pipeline.rate_limiter import RateLimiter
from feiqiu_etl.pipeline.request_thread import RequestThread

__all__ = ["FLOOR_DECAY_REQUESTS", "WAIT_REASONS", "AttemptRecord", "RequestScheduler", "SchedulerStatistics"]

T = TypeVar("T")

_GIVE_WAY = "give-way"
"""What :meth:`RequestScheduler._wait_gap` returns when it stopped early because an earlier store waits."""


@dataclass
class _Due:
    at: float
    reason: str


class RequestScheduler:
    """The serial lane of one upstream account (see the module docstring). No global state.

    ``name`` labels statistics and log lines; ``max_transport_failures`` (None = never) arms the circuit
    breaker; ``logger`` receives the once-per-class floor notices and the trip; ``pace`` narrows the drawn gaps
    toward safe floors (None: never); ``documented`` (``{gap class: s}``, connector ``api.gap_classes``) and
    ``floor_margin`` (s, ``lane.safety_margin_seconds``) shape the floors learnt from a 42901
    (:mod:`~feiqiu_etl.pipeline.gap_floors`). Raises ``ValueError`` for a negative ``floor_margin`` or a
    ``max_transport_failures`` below 1.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, *, name: str = "lane",
                 max_transport_failures: int | None = None, logger: logging.Logger | None = None,
                 observer: Callable[[AttemptRecord], None] | None = None, pace: Pace | None = None,
                 documented: Mapping[str, float] | None = None, floor_margin: float = 0.3):
        self._log = logger or logging.getLogger("feiqiu_etl.lane")
        self._floors = GapFloors(documented, floor_margin, self._log, name)
        self._drawn: tuple[str | None, float] | None = None    # the gap class and gap of the request granted
        self._handoff: tuple[str | None, float] | None = None  # ... left by a request that gave the lane back
        if max_transport_failures is not None and max_transport_failures < 1:
            raise ValueError(f"max_transport_failures must be >= 1, got {max_transport_failures}")
        self.name = name
        self._observer = observer
        self._pace = pace
        self._clock = clock
        self._max_transport = max_transport_failures
        self._cond = threading.Condition(threading.Lock())
        self._tickets = TenantQueue()
        self._last_end: float | None = None          # end of the last response received (gaps run from it)
        self._last_attempt_end: float | None = None  # end of the last attempt, reached a server or not
        self._hold: _Due | None = None
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
        self._io: RequestThread | None = None
        self._busy_seconds = 0.0
        self._waited_seconds = 0.0
        self._late_seconds = 0.0

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
            return self._floors.seconds(gap_class)

    def rank(self, tenants: Iterable[Hashable | None]) -> None:
        """Grant the lane to the first of ``tenants`` (in this order) that has a request waiting, instead of
        round-robin; tenants not listed come after them, round-robin."""
        with self._cond:
            self._tickets.rank(tenants)

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

    def _acquire(self, tenant: Hashable | None, cancel_event: threading.Event | None) -> Ticket:
        ticket = Ticket(tenant)
        with self._cond:
            if self._tripped:
                raise LaneTripped(self._tripped)
            self._tickets.join(ticket)
            self._grant()
            if not ticket.granted and self._tickets.ranked:
                self._cond.notify_all()  # a later store waiting for its gap gives way at once
            self._await_grant(ticket, cancel_event)
        return ticket

    def _await_grant(self, ticket: Ticket, cancel_event: threading.Event | None) -> None:
        """Wait (lock held) until ``ticket`` is granted, noticing a cancel or a trip within 0.1 s."""
        while not ticket.granted:  # another tenant holds the lane
            if cancel_event is not None and cancel_event.is_set():
                self._tickets.leave(ticket)
                self._cancelled_waits += 1
                raise Cancelled()
            if self._tripped:
                self._tickets.leave(ticket)
                raise LaneTripped(self._tripped)
            self._cond.wait(0.1)

    def _yield_to_earlier(self, ticket: Ticket, cancel_event: threading.Event | None) -> bool:
        """With ranked tenants: when a tenant earlier than ``ticket``'s waits, give it the lane and wait for the
        lane again (True); else False (send now)."""
        with self._cond:
            if not self._tickets.ranked or not self._tickets.earlier_waits(ticket.tenant):
                return False
            self._handoff = self._drawn
            self._current = None
            self._current_tenant = None
            self._due = None
            self._tickets.give_back(ticket)
            self._grant()
            self._await_grant(ticket, cancel_event)
            return True

    def _grant(self) -> None:
        """Give the free lane to the next waiting ticket (:meth:`TenantQueue.grant`) and wake the waiters."""
        if self._tickets.grant():
            self._cond.notify_all()

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            self._tickets.release()
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
            due, now = self._due_at(drawn, min_wait, gap_class)
            self._current = label
            self._current_tenant = tenant
        remaining = due.at - now
        if remaining > 0:
            if self._tickets.ranked and isinstance(self._clock, SystemClock):
                cancelled, earlier = self._wait_ranked(cancel_event, due.at, tenant)
                if earlier and not cancelled:  # an earlier store is waiting: send() hands it the lane at once
                    with self._cond:
                        self._waited_seconds += max(0.0, self._clock.monotonic() - now)
                    return _GIVE_WAY
            else:
                cancelled = self._clock.wait(cancel_event, remaining)
            with self._cond:
                woke = self._clock.monotonic()
                self._waited_seconds += max(0.0, woke - now)
                if not cancelled:
                    self._late_seconds += max(0.0, woke - due.at)
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

    def _due_at(self, drawn: float, min_wait: float, gap_class: str | None) -> tuple[_Due, float]:
        """When (monotonic s) and why the request with the ``drawn`` gap goes out, and now (lock held)."""
        if self._handoff is not None:
            # a later store drew a gap and gave the lane back to this (earlier) one: it does not wait longer
            # than that store would have (else every hand-over would cost the longer of two random gaps)
            handed_class, handed = self._handoff
            self._handoff = None
            if handed_class == gap_class:
                drawn = min(drawn, handed)
        self._drawn = (gap_class, drawn)
        floor = self._floors.seconds(gap_class)
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
        return due, now

    def _wait_ranked(self, cancel_event: threading.Event | None, at: float,
                     tenant: Hashable | None) -> tuple[bool, bool]:
        """Wait (real time) until ``at``, a cancel, or an earlier-ranked tenant queueing for the lane — whichever
        comes first, within 50 ms for a cancel; returns ``(cancelled, an earlier tenant waits)``. So a hand-over to
        the leader happens during the gap, not after it (no extra thread switch between the gap and the request)."""
        with self._cond:
            while True:
                if cancel_event is not None and cancel_event.is_set():
                    return True, False
                if self._tickets.earlier_waits(tenant):
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
            drawn = self._drawn[1] if self._drawn is not None else None
        error: BaseException | None = None
        try:
            if abortable and cancel_event is not None:
                if self._io is None:
                    self._io = RequestThread(self.name)
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
                                            attempt_outcome(error), attempt_detail(error), drawn))

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
                self._floors.accepted(gap_class, gap_at_send)
            return
        hold = float(getattr(error, "hold_lane_seconds", 0.0) or 0.0)
        if hold > 0:
            self._hold = _Due(end + hold, "timeout-hold")
        backoff: LaneBackoff | None = getattr(error, "lane_backoff", None)
        if backoff is not None and backoff.seconds > 0:
            self._note_backoff(backoff, end, gap_class, gap_at_send)
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

    def _note_backoff(self, backoff: LaneBackoff, end: float, gap_class: str | None,
                      gap_at_send: float | None) -> None:
        """A demanded wait (lock held): it holds the lane for the next request; a "too early" teaches a floor."""
        reason = "banned" if backoff.kind == "banned" else "retry-after"
        if self._hold is None or end + backoff.seconds > self._hold.at:
            self._hold = _Due(end + backoff.seconds, reason)
        if backoff.kind == "banned":
            self._banned += 1
            self._banned_seconds += backoff.seconds
        else:
            self._throttled += 1
        if backoff.kind == "throttled" and gap_class is not None:
            self._floors.learn(gap_class, gap_at_send or 0.0, backoff.seconds, backoff.detail)

    # ------------------------------------------------------------------------------------------- observe
    def statistics(self) -> SchedulerStatistics:
        with self._cond:
            now = self._clock.monotonic()
            due = self._due
            due_in = max(0.0, due.at - now) if due is not None else 0.0
            reason = due.reason if due is not None and (due_in > 0 or due.reason == "paused") else None
            if reason is None and not self._in_flight and self._tickets.waiting:
                reason = "lane"
            return SchedulerStatistics(
                name=self.name, requests_sent=self._sent, in_flight=self._in_flight, current=self._current,
                current_tenant=self._current_tenant, last_gap=self._last_gap, next_due_in=due_in,
                wait_reason=reason, waiting_tenants=self._tickets.tenants_waiting(),
                throttled=self._throttled, banned=self._banned, banned_seconds=self._banned_seconds,
                floors=self._floors.snapshot(),
                consecutive_transport_failures=self._transport_streak,
                tripped=self._tripped, cancelled_waits=self._cancelled_waits, aborted_in_flight=self._aborted,
                busy_seconds=self._busy_seconds, waited_seconds=self._waited_seconds, late_seconds=self._late_seconds,
            )

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"<RequestScheduler {self.name} sent={s.requests_sent} in_flight={s.in_flight} "
                f"next_due_in={s.next_due_in:.2f}s reason={s.wait_reason}>")
