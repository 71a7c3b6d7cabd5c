"""``CancellationToken`` (spec §3.2): a thread-safe, one-way cancel flag with an optional timeout.

Once cancelled it stays cancelled (Property 7). Waiters use ``token.event`` with ``Event.wait`` so they
wake within milliseconds. ``dispose()`` stops the timeout timer; it never un-cancels. A :meth:`child` token
(e.g. one lane's) is cancelled with its parent, with the parent's reason, and may also be cancelled alone — by
hand or by :meth:`cancel_after` (a lane's deadline) — without touching the parent.
"""

from __future__ import annotations

import threading

MAX_TIMER_SECONDS = 366 * 86400.0
"""The longest timer armed (s); callers refuse longer limits themselves (``--timeout`` at most 30 days)."""


class CancellationToken:
    """Cancel signal shared by the lane, the workers and the writer.

    ``timeout`` (seconds, > 0) cancels automatically with reason ``"timeout"``; ``None`` or ``<= 0``
    means no timeout (spec §3.2). ``reason`` tells who cancelled first ("cancel", "timeout", "signal").
    """

    def __init__(self, timeout: float | None = None):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._timer: threading.Timer | None = None
        self._children: list[CancellationToken] = []
        if timeout is not None and timeout > 0:
            self.cancel_after(timeout, "timeout")

    def cancel_after(self, seconds: float, reason: str) -> None:
        """Cancel with ``reason`` ``seconds`` from now (at once when ``seconds <= 0``); replaces an earlier timer."""
        self.dispose()
        if seconds <= 0:
            self.cancel(reason)
            return
        # capped at a year: a Timer of 1e14 s overflows the platform's time_t in its thread (a traceback before
        # the caller's own check refuses such a value: adversarial trial, `--timeout 99999999999h`)
        self._timer = threading.Timer(min(seconds, MAX_TIMER_SECONDS), self.cancel, kwargs={"reason": reason})
        self._timer.daemon = True
        self._timer.start()

    def child(self) -> "CancellationToken":
        """A token cancelled whenever this one is (at once if it already is), that can be cancelled alone."""
        child = CancellationToken()
        with self._lock:
            self._children.append(child)
            reason = self._reason
        if reason is not None:
            child.cancel(reason)
        return child

    def cancel(self, reason: str = "cancel") -> None:
        """Signal cancellation (idempotent; the first reason wins), to the children too."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            children = list(self._children)
        self._event.set()
        for child in children:
            child.cancel(reason)

    @property
    def is_cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def event(self) -> threading.Event:
        return self._event

    @property
    def reason(self) -> str | None:
        with self._lock:
            return self._reason

    def dispose(self) -> None:
        """Stop the timeout timer (if any). Does not change the cancelled state."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __repr__(self) -> str:
        return f"<CancellationToken cancelled={self.is_cancelled} reason={self.reason!r}>"
