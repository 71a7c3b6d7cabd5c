"""Exceptions and signals the engine understands; everything else raised by a stage is an item-level failure.

A transport may attach plain attributes to the exceptions it raises; the lane and the pipeline read them
without knowing where they came from:

* ``lane_backoff`` (:class:`LaneBackoff`): the upstream demanded a wait (a retry hint, a ban);
* ``hold_lane_seconds`` (float): keep the lane closed that long after this attempt (a timed-out request
  may still be running at the server);
* ``transport_failure`` (bool): no response at all (connection refused, DNS, connect timeout) — feeds the
  lane's circuit breaker;
* ``counts_as_failure`` (bool, default True): False for a definitive "this item does not exist" answer,
  which is recorded but does not count towards ``max_consecutive_failures``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class Cancelled(Exception):
    """A wait (or a request in flight) was interrupted by the cancellation token."""


class AbortPipeline(Exception):
    """A failure that makes further requests pointless (e.g. an invalid token, upstream-api.md §2.1
    40101). The pipeline stops sending, drains what is in flight and returns status FAILED."""


class LaneTripped(AbortPipeline):
    """The lane's circuit breaker tripped (e.g. the upstream is unreachable); ``str()`` says why."""


BackoffKind = Literal["throttled", "banned", "hold"]


@dataclass(frozen=True)
class LaneBackoff:
    """A wait the upstream demanded, in seconds from the end of the rejected attempt.

    ``kind``: ``"throttled"`` — the request came too early or overlapped (the lane also raises the floor of
    the request's gap class); ``"banned"`` — the account is blocked for a while; ``"hold"`` — wait, nothing
    learnt (e.g. gateway throttling). ``detail`` is a short human text for logs (e.g. ``"code 42901"``).
    """

    seconds: float
    kind: BackoffKind = "hold"
    detail: str = ""
