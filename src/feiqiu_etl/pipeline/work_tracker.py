"""Exact termination for a pipeline whose stages feed work back upstream (spec 002; ENGINE-NOTES).

``WorkTracker`` keeps ONE counter of outstanding work for the whole graph, plus a counter per *scope*
(e.g. one window segment of one task). Rules every stage follows:

* ``add()`` *before* an item becomes visible anywhere (a request in the frontier, a response in the
  processing queue, rows in the write queue);
* ``done()`` *after* having added every child it emitted, exactly once, in ``finally`` — also on errors,
  filtered-out items and cancellation drops (pass ``failed=True`` then).

The run is over exactly when the counter is zero: waiters use a ``threading.Condition`` notified under
the same lock that changes the counter. No polling, no ``qsize()``, no idle threshold.

When a scope's count reaches zero, ``done()`` returns a :class:`ScopeCompletion` and, atomically,
counts it as one more outstanding item: the caller hands it to the writer, which reports it and calls
``done()`` for it. A scope therefore completes only after its last row is committed.

``Frontier`` is the unbounded queue of requests waiting for the lane; it shares the tracker's lock so
that "a request is waiting" and "nothing is outstanding" are decided atomically.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Hashable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ScopeCompletion:
    """A scope with no outstanding work left. ``ok`` is False if any of its items failed or was dropped."""

    scope: Hashable
    ok: bool


@dataclass(frozen=True)
class TrackerStatistics:
    outstanding: int
    open_scopes: int
    added: int
    completed: int


class WorkTracker:
    """The outstanding-work counter (see module docstring). Thread-safe."""

    def __init__(self) -> None:
        self.condition = threading.Condition(threading.Lock())
        self._outstanding = 0
        self._scopes: dict[Hashable, int] = {}
        self._failed: set[Hashable] = set()
        self._added = 0
        self._completed = 0

    def add(self, n: int = 1, scope: Hashable | None = None) -> None:
        """Count ``n`` new items (optionally in ``scope``) before they become visible."""
        if n <= 0:
            return
        with self.condition:
            self._outstanding += n
            self._added += n
            if scope is not None:
                self._scopes[scope] = self._scopes.get(scope, 0) + n

    def done(self, n: int = 1, scope: Hashable | None = None, *, failed: bool = False) -> ScopeCompletion | None:
        """Finish ``n`` items. Returns a completion (already counted as outstanding) when ``scope`` empties.

        Raises ``RuntimeError`` if more items are finished than were added (a bookkeeping bug).
        """
        if n <= 0:
            if failed and scope is not None:
                self.mark_failed(scope)
            return None
        with self.condition:
            if n > self._outstanding:
                raise RuntimeError(f"work tracker underflow: done({n}) with {self._outstanding} outstanding")
            completion = None
            if scope is not None:
                if failed:
                    self._failed.add(scope)
                left = self._scopes.get(scope, 0) - n
                if left < 0:
                    raise RuntimeError(f"work tracker underflow in scope {scope!r}")
                if left == 0:
                    del self._scopes[scope]
                    completion = ScopeCompletion(scope, scope not in self._failed)
                    self._failed.discard(scope)
                    self._outstanding += 1
                    self._added += 1
                else:
                    self._scopes[scope] = left
            self._outstanding -= n
            self._completed += n
            self.condition.notify_all()
            return completion

    def mark_failed(self, scope: Hashable) -> None:
        """Record that an item of ``scope`` failed, without finishing anything."""
        with self.condition:
            if scope in self._scopes:
                self._failed.add(scope)

    @property
    def outstanding(self) -> int:
        with self.condition:
            return self._outstanding

    def statistics(self) -> TrackerStatistics:
        with self.condition:
            return TrackerStatistics(self._outstanding, len(self._scopes), self._added, self._completed)


class Frontier(Generic[T]):
    """Unbounded FIFO of requests awaiting the lane, guarded by the tracker's condition."""

    def __init__(self, tracker: WorkTracker):
        self._tracker = tracker
        self._items: deque[T] = deque()

    def push(self, item: T, scope: Hashable | None = None) -> None:
        """Count ``item`` as outstanding, then make it visible to the lane."""
        self._tracker.add(1, scope)
        with self._tracker.condition:
            self._items.append(item)
            self._tracker.condition.notify_all()

    def next_or_idle(self, *, has_source: bool) -> tuple[T | None, bool]:
        """Block until an item is waiting, or the source may be pulled, or nothing is outstanding.

        Returns ``(item, False)`` for a waiting item, ``(None, True)`` when the caller should pull the
        next seed from its source, ``(None, False)`` when all work is finished.

        With ``has_source`` the open source is the caller's one outstanding item, and the next seed is
        due only when nothing else is outstanding: a seed's whole tree (pages, details, their rows) is
        finished before the next seed starts, as in the serial loop. Pulling as soon as the frontier is
        momentarily empty (a worker still parsing the response that yields the next page) interleaves
        seeds, changes which content is written last, and mixes scopes in write batches.
        """
        cond = self._tracker.condition
        with cond:
            while True:
                if self._items:
                    return self._items.popleft(), False
                if has_source and self._tracker._outstanding <= 1:  # noqa: SLF001 - only the source left
                    return None, True
                if self._tracker._outstanding == 0:  # noqa: SLF001 - same lock, by design
                    return None, False
                cond.wait()

    def __len__(self) -> int:
        with self._tracker.condition:
            return len(self._items)
