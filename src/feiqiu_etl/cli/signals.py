"""Signals, the command line's only: the first SIGINT/SIGTERM cancels the run gracefully, a second one aborts at
once (exit 130) after the hard-abort cleanups of :mod:`feiqiu_etl.app.database` (the embedded server this process
started is stopped). :func:`run_with_signals` is how ``run`` and ``demo`` hand a request to :func:`feiqiu_etl.app.run`
with the live display."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import replace
from typing import Any, Iterator

from feiqiu_etl.app.database import HARD_ABORT
from feiqiu_etl.app.run import RunRequest, run
from feiqiu_etl.common import exitcodes
from feiqiu_etl.pipeline.cancellation import CancellationToken


@contextlib.contextmanager
def signals_cancel(cancellation: CancellationToken) -> Iterator[None]:
    """First SIGINT/SIGTERM → ``cancellation.cancel()`` (graceful); a second one aborts at once (exit 130), after
    running the hard-abort cleanups (the embedded server is stopped; nothing is left running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if cancellation.is_cancelled:
            os.write(2, b"\nsecond signal: aborting now\n")
            logging.disable(logging.CRITICAL)  # no "database not answering" from threads as our server stops
            for cleanup in list(HARD_ABORT):
                with contextlib.suppress(Exception):
                    cleanup()
            os._exit(exitcodes.HARD_ABORT)
        # Through logging, not a raw write: on a terminal the line prints above the live display (a raw write
        # moved the cursor behind it and left two stale display lines), and --log-format json stays JSON.
        logging.getLogger("feiqiu_etl").warning("cancelling: no new requests; writing what was fetched "
                                                "(signal again to abort)")
        cancellation.cancel("signal")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)



def run_with_signals(request: RunRequest, *, progress: bool = True):
    """:func:`feiqiu_etl.app.run` of ``request`` with a cancellation of its own (``--timeout``: the options'),
    the signals above and, with ``progress``, the live display (:func:`feiqiu_etl.cli.views.progress.live_progress`).
    Signals stay covered until the embedded server (if one was started) has stopped."""
    from feiqiu_etl.cli.views.progress import live_progress

    cancellation = CancellationToken(timeout=request.options.timeout)

    def watch(runner: Any, settings: Any):
        return live_progress(runner, enabled=progress, heartbeat=settings.progress.heartbeat_seconds)

    try:
        with signals_cancel(cancellation):
            return run(replace(request, cancellation=cancellation, watch=watch))
    finally:
        cancellation.dispose()
