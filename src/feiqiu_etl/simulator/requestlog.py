"""The simulator's request log: one frozen :class:`RequestLogEntry` per HTTP request, kept in arrival order.

What it is for: letting tests check exactly what a connector did (which endpoints, bodies, gaps, concurrency,
rejections) through ``Simulator.request_log()`` or ``GET /__sim/log``. What it must never do: record a token or
any other header.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

OUTCOMES = ("accepted", "rejected", "fault", "auth", "not_found")


@dataclass(frozen=True)
class RequestLogEntry:
    """One request as the simulator saw it.

    ``started``/``ended`` are ``time.monotonic()`` at arrival and when the response's body was handed to the
    kernel (the earliest the client can hold it; not when this thread got the CPU back after the write). ``code`` is
    the business code (``None`` for non-envelope answers). ``outcome`` is ``"accepted"`` (passed risk control and
    was processed, whatever its code), ``"rejected"`` (42901/42902 by risk control), ``"fault"`` (an injected
    fault, see ``faults``), ``"auth"`` (40101/40103) or ``"not_found"`` (unknown path or non-POST method: HTTP
    404/405). ``accepted`` tells whether the request held the token's lane, i.e. whether its completion started
    a new gap (true for accepted requests and for injected 5xx/50001/40401/stall faults). ``fault`` names the
    injected fault kind, if any.
    """

    seq: int
    path: str
    body: dict | None
    site_id: int | None
    started: float
    ended: float
    http_status: int
    code: int | None
    outcome: str
    record_count: int
    accepted: bool = False
    fault: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    """Thread-safe append-only list of entries (cleared on demand).

    A response reaches the client a moment before its entry is appended (the entry is appended after the
    write). So the server calls :meth:`writing` before it writes, and :meth:`snapshot` waits (briefly) until no
    response is half-way between "written" and "logged": whoever has read a response finds it in the log.
    """

    WAIT_FOR_WRITERS = 2.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._entries: list[RequestLogEntry] = []
        self._writing: set[int] = set()
        self._next_seq = 1

    def next_seq(self) -> int:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def writing(self, seq: int) -> None:
        """Request ``seq`` is about to write its response; snapshots wait for its entry."""
        with self._lock:
            self._writing.add(seq)

    def append(self, entry: RequestLogEntry) -> None:
        with self._lock:
            self._entries.append(entry)
            self._writing.discard(entry.seq)
            self._lock.notify_all()

    def snapshot(self) -> list[RequestLogEntry]:
        with self._lock:
            self._lock.wait_for(lambda: not self._writing, timeout=self.WAIT_FOR_WRITERS)
            return sorted(self._entries, key=lambda e: e.seq)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
