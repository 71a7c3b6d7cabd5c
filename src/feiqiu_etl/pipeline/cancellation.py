"""``CancellationToken`` (spec §3.2): a thread-safe, one-way cancel flag with an optional timeout.

Once cancelled it stays cancelled (Property 7). Waiters use ``token.event`` with ``Event.wait`` so they
wake within milliseconds. ``dispose()`` stops the timeout timer; it never un-cancels.
"""

from __future__ import annotations

import threading


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
        if timeout is not None and timeout > 0:
            self._timer = threading.Timer(timeout, self.cancel, kwargs={"reason": "timeout"})
            self._timer.daemon = True
            self._timer.start()

    def cancel(self, reason: str = "cancel") -> None:
        """Signal cancellation (idempotent; the first reason wins)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._event.set()

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
