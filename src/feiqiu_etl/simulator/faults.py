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

What it must never do: sleep or write responses itself (the server does), or match a request of another path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

GATEWAY_KINDS = frozenset({"http429"})
HTTP_KINDS = frozenset({"http429", "http500", "http502", "http503", "http504"})
BUSINESS_KINDS = frozenset({"code50001", "code42901", "code40401"})
BODY_KINDS = frozenset({"truncated", "non_utf8"})
FAULT_KINDS = HTTP_KINDS | BUSINESS_KINDS | BODY_KINDS | {"stall"}


@dataclass
class Fault:
    """One injected fault; ``remaining`` counts down as requests consume it."""

    kind: str
    path: str | None
    remaining: int
    retry_after: int = 1
    stall_seconds: float = 5.0

    def matches(self, path: str) -> bool:
        return self.path is None or self.path == path

    @property
    def http_status(self) -> int:
        return int(self.kind[4:]) if self.kind in HTTP_KINDS else 200


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
    ) -> None:
        """Queue ``kind`` for the next ``count`` requests to ``path`` (``None`` = any path)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if count < 1:
            raise ValueError("count must be >= 1")
        with self._lock:
            self._pending.append(Fault(kind, path, count, retry_after, stall_seconds))

    def take_gateway(self, path: str) -> Fault | None:
        """Consume a gateway fault (``http429``) for a request to ``path`` arriving now, if one is pending."""
        return self._take(path, gateway=True)

    def take_service(self, path: str) -> Fault | None:
        """Consume a service-side fault for an accepted request to ``path``, if one is pending."""
        return self._take(path, gateway=False)

    def pending(self) -> list[Fault]:
        with self._lock:
            return [Fault(f.kind, f.path, f.remaining, f.retry_after, f.stall_seconds) for f in self._pending]

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def _take(self, path: str, gateway: bool) -> Fault | None:
        with self._lock:
            for fault in self._pending:
                if fault.matches(path) and (fault.kind in GATEWAY_KINDS) == gateway:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._pending.remove(fault)
                    return Fault(fault.kind, fault.path, 1, fault.retry_after, fault.stall_seconds)
        return None
