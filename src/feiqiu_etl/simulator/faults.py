"""Fault injection for the simulator: the next ``count`` matching requests get a chosen failure.

What it is for: letting tests provoke every failure of upstream-api.md §2.1/§2.3 on demand — gateway faults
(HTTP 429 with ``Retry-After``, 500/502/503/504 with HTML or empty bodies), business codes 50001/42901/40401 and
stalls (a response delayed by ``stall_seconds`` to exercise client timeouts).

Where a fault strikes (documented so tests can predict the risk-control state):

* ``http429`` is the gateway throttling *before* the service: consumed by the first matching request, whatever
  its token; the service never sees it, so it moves no risk-control clock.
* every other kind is consumed only by a matching request that passed authentication and risk control. The
  service then processes it as an accepted request (its completion starts the next gap, as §2.3 warns for 5xx),
  except ``code42901``, which pretends risk control refused it: the lane is released without a completion and no
  violation is counted.
* ``stall`` sleeps ``stall_seconds`` and then answers normally (if the client is still there).
* ``truncated`` answers HTTP 200 with the first half of the real body (its ``Content-Length`` says so): a
  cut JSON document; ``non_utf8`` answers HTTP 200 with the real body plus bytes that are not UTF-8. Both are
  accepted requests for risk control.
* **data faults** (issue 25: an upstream that answers ``code 0`` with wrong data) strike list requests only
  (never a detail, whatever ``path`` says) and are accepted requests for risk control:

  - ``short_page``: the page misses one record (its last), ``total`` unchanged;
  - ``total_zero``: the list answers ``code 0``, ``total 0`` and no rows (a gateway or back-office glitch; on
    a snapshot it looks like a store that holds nothing); ``empty_page`` is the same answer under the name a
    paging test reads better;
  - ``total_moves``: the page's records are right but its ``total`` is one more than the truth (a total that
    moves between the pages of one listing);
  - ``zero_day``: like ``total_zero``, but only for windowed lists and, with ``day`` (``"YYYY-MM-DD"``), only
    for a request whose ``startTime`` falls on that day: a day that answers zero.

  A data fault with a large ``count`` repeats on every matching request (a fault that does not go away);
  with ``page`` it strikes only that page of a listing (e.g. an empty page 2 after a full page 1).

What it must never do: sleep or write responses itself (the server does), or match a request of another path.
"""

from __future__ import annotations

import datetime as _dt
import re
import threading
from dataclasses import dataclass

from feiqiu_etl.simulator.catalog import DETAIL_BY_PATH, LIST_BY_PATH

SERVED_PATHS = frozenset(LIST_BY_PATH) | frozenset(DETAIL_BY_PATH)
"""The API paths a fault may name (the simulator's list and detail endpoints)."""

GATEWAY_KINDS = frozenset({"http429"})
HTTP_KINDS = frozenset({"http429", "http500", "http502", "http503", "http504"})
BUSINESS_KINDS = frozenset({"code50001", "code42901", "code40401"})
BODY_KINDS = frozenset({"truncated", "non_utf8"})
DATA_KINDS = frozenset({"short_page", "total_zero", "empty_page", "total_moves", "zero_day"})
EMPTY_KINDS = frozenset({"total_zero", "empty_page", "zero_day"})
"""Data faults whose answer is ``code 0, total 0`` and no rows."""
FAULT_KINDS = HTTP_KINDS | BUSINESS_KINDS | BODY_KINDS | DATA_KINDS | {"stall"}


@dataclass
class Fault:
    """One injected fault; ``remaining`` counts down as requests consume it."""

    kind: str
    path: str | None
    remaining: int
    retry_after: int = 1
    stall_seconds: float = 5.0
    day: str | None = None
    page: int | None = None

    def matches(self, path: str, listing: "ListingRequest | None" = None) -> bool:
        if self.path is not None and self.path != path:
            return False
        if self.kind not in DATA_KINDS:
            return True
        if listing is None:
            return False  # data faults strike list requests only
        if self.page is not None and listing.page != self.page:
            return False
        if self.kind == "zero_day":
            return listing.windowed and (self.day is None or (listing.start or "")[:10] == self.day)
        return True

    @property
    def http_status(self) -> int:
        return int(self.kind[4:]) if self.kind in HTTP_KINDS else 200

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "count": self.remaining, "day": self.day, "page": self.page}


@dataclass(frozen=True)
class ListingRequest:
    """What a data fault needs to know of a list request: windowed or not, and its ``startTime``."""

    windowed: bool
    start: str | None = None
    page: int | None = None


def _is_day(value: object) -> bool:
    """``value`` is a real calendar day written ``YYYY-MM-DD`` (``2024-02-30`` is not)."""
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return False
    try:
        _dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


class FaultInjector:
    """Thread-safe FIFO of pending faults."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []

    def inject(
        self,
        path: str | None = None,
        kind: str = "http500",
        count: int = 1,
        retry_after: int = 1,
        stall_seconds: float = 5.0,
        day: str | None = None,
        page: int | None = None,
    ) -> None:
        """Queue ``kind`` for the next ``count`` requests to ``path`` (``None`` = any path); ``day``
        (``"YYYY-MM-DD"``) only for ``zero_day``. Raises ``ValueError`` for an unknown kind, a count below 1 or a
        ``day`` on another kind; ``page`` (a list page number) only for data faults."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError("count must be an integer >= 1")
        if day is not None and (kind != "zero_day" or not _is_day(day)):
            raise ValueError("day (YYYY-MM-DD) belongs to the zero_day fault only" if kind != "zero_day"
                             else f"day: expected a date YYYY-MM-DD, got {str(day)[:40]!r}")
        if path is not None and path not in SERVED_PATHS:
            raise ValueError(f"unknown path {str(path)[:80]!r}: the simulator serves the list and detail endpoints "
                             "of upstream-api.md §4 (e.g. /api/settlement/list), or none for any path")
        if page is not None and (kind not in DATA_KINDS or isinstance(page, bool) or not isinstance(page, int)
                                 or page < 1):
            raise ValueError("page (an integer >= 1) belongs to the data faults only")
        with self._lock:
            self._pending.append(Fault(kind, path, count, retry_after, stall_seconds, day, page))

    def take_gateway(self, path: str) -> Fault | None:
        """Consume a gateway fault (``http429``) for a request to ``path`` arriving now, if one is pending."""
        return self._take(path, gateway=True)

    def take_service(self, path: str, listing: ListingRequest | None = None) -> Fault | None:
        """Consume a service-side fault for an accepted request to ``path``, if one is pending (``listing``: the
        request is a list request; only then may a data fault strike)."""
        return self._take(path, gateway=False, listing=listing)

    def pending(self) -> list[Fault]:
        with self._lock:
            return [Fault(f.kind, f.path, f.remaining, f.retry_after, f.stall_seconds, f.day, f.page)
                    for f in self._pending]

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def _take(self, path: str, gateway: bool, listing: ListingRequest | None = None) -> Fault | None:
        with self._lock:
            for fault in self._pending:
                if fault.matches(path, listing) and (fault.kind in GATEWAY_KINDS) == gateway:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._pending.remove(fault)
                    return Fault(fault.kind, fault.path, 1, fault.retry_after, fault.stall_seconds, fault.day,
                                 fault.page)
        return None
