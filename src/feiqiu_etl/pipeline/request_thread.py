"""``RequestThread``: the lane's helper thread for abortable requests (a cancel abandons the request in flight)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class RequestThread:
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
