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


class RunEnd:
    """Whether a run's outcome is decided: its :class:`~feiqiu_etl.runner.results.RunResult` once the runner has
    decided it (``runner.decided``, just before its end is recorded) or the run has returned. From then on a
    signal cancels nothing that counts: the process exits as the run ended (a SUCCESS exits 0) and says the
    signal came after (adversarial trial: a SIGTERM after the DWD load exited 5 while the run was SUCCESS)."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.result: Any = None
        self.signals = 0  # signals after the outcome was decided

    def decided(self) -> Any:
        """The decided result, or None while the run can still be cancelled."""
        if self.result is not None:
            return self.result
        runner = self.runner
        return runner.result if runner is not None and runner.decided else None


@contextlib.contextmanager
def signals_cancel(cancellation: CancellationToken, end: RunEnd | None = None) -> Iterator[None]:
    """First SIGINT/SIGTERM → ``cancellation.cancel()`` (graceful); a second one aborts at once (exit 130), after
    running the hard-abort cleanups (the embedded server is stopped; nothing is left running). With ``end``: once
    ``end.decided()``, a signal says it came after the run had ended and the exit code stays the run's (a second
    one exits at once with it); those handlers stay until the process exits (its output is the run's). A signal
    after one that cancelled the run is always the second signal (exit 130), even once the run has decided."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    cancelled_by_signal = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal cancelled_by_signal
        if cancelled_by_signal:  # the second signal of a run a signal cancelled, decided or not: at once, 130
            _abort_now(b"\nsecond signal: aborting now\n", exitcodes.HARD_ABORT)
        decided = end.decided() if end is not None else None
        if decided is not None:
            end.signals += 1
            _after_end(decided, cancellation, again=end.signals > 1)
            return
        if cancellation.is_cancelled:
            _abort_now(b"\nsecond signal: aborting now\n", exitcodes.HARD_ABORT)
        # Through logging, not a raw write: on a terminal the line prints above the live display (a raw write
        # moved the cursor behind it and left two stale display lines), and --log-format json stays JSON.
        logging.getLogger("feiqiu_etl").warning("cancelling: no new requests; writing what was fetched "
                                                "(signal again to abort)")
        cancelled_by_signal = True
        cancellation.cancel("signal")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if end is None or end.decided() is None:
            for s, h in previous.items():
                signal.signal(s, h)


def _after_end(result: Any, cancellation: CancellationToken, *, again: bool) -> None:
    """A signal after the run's outcome was decided: the first is said (the run is not cancelled: it ended);
    the cancellation only skips what is optional after the end (retention); a second (``again``) exits at once
    with the run's own exit code."""
    if again:
        _abort_now(f"\nsecond signal: exiting now (exit {result.exit_code}, as run {result.run_id} ended)\n"
                   .encode(), result.exit_code)
    logging.getLogger("feiqiu_etl").warning(
        "signal after run %s had ended %s: nothing is cancelled, exiting as it ended (exit %d)", result.run_id,
        result.status, result.exit_code)
    cancellation.cancel("signal")


def _abort_now(line: bytes, code: int) -> None:
    """Write ``line`` to stderr, run the hard-abort cleanups and end the process with ``code`` at once."""
    os.write(2, line)
    logging.disable(logging.CRITICAL)  # no "database not answering" from threads as our server stops
    for cleanup in list(HARD_ABORT):
        with contextlib.suppress(Exception):
            cleanup()
    os._exit(code)


def run_with_signals(request: RunRequest, *, progress: bool = True):
    """:func:`feiqiu_etl.app.run` of ``request`` with a cancellation of its own (``--timeout``: the options'),
    the signals above and, with ``progress``, the live display (:func:`feiqiu_etl.cli.views.progress.live_progress`).
    Signals stay covered until the embedded server (if one was started) has stopped; once the run has recorded
    its end, until the process exits (a signal then does not change the exit code: :class:`RunEnd`)."""
    from feiqiu_etl.cli.views.progress import live_progress

    cancellation = CancellationToken(timeout=request.options.timeout)
    end = RunEnd()

    def watch(runner: Any, settings: Any):
        end.runner = runner
        return live_progress(runner, enabled=progress, heartbeat=settings.progress.heartbeat_seconds)

    try:
        with signals_cancel(cancellation, end):
            try:
                end.result = run(replace(request, cancellation=cancellation, watch=watch))
            except BaseException:
                end.runner = None  # the command ends with this error's exit code: signals as before the run
                raise
            return end.result
    finally:
        cancellation.dispose()
