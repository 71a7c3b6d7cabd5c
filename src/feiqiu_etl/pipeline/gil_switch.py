"""A shorter GIL switch interval while a pipeline runs (the lane driver is latency-bound)."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

GIL_SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits, during a run (Python's default is 0.005). The lane
driver is latency-bound: after every response it waited up to 5 ms for the GIL behind a processing worker; at
gap 0 that was most of a page's time (bench_vs_peers: re-run 5.5 s -> 3.7 s for 100k rows, and less CPU)."""

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.005


@contextlib.contextmanager
def short_gil_switch() -> Iterator[None]:
    """Lower ``sys.setswitchinterval`` while at least one run is active; restore it after the last one."""
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, GIL_SWITCH_INTERVAL))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)
