"""cli/signals.py: a signal after a run's outcome is decided cancels nothing that counts and leaves the exit
code the run's (adversarial trial: a SIGTERM after the DWD load exited 5 while the run was recorded SUCCESS)."""

from __future__ import annotations

import logging
import signal
from types import SimpleNamespace

from feiqiu_etl.cli.signals import RunEnd, signals_cancel
from feiqiu_etl.pipeline.cancellation import CancellationToken


def _restore(saved):
    for s, h in saved.items():
        signal.signal(s, h)


def test_before_the_outcome_is_decided_a_signal_cancels_and_the_handlers_are_restored(caplog):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    token, end = CancellationToken(), RunEnd()
    end.runner = SimpleNamespace(decided=False, result=None)
    try:
        with caplog.at_level(logging.WARNING), signals_cancel(token, end):
            signal.raise_signal(signal.SIGTERM)
        assert token.is_cancelled and token.reason == "signal"
        assert [r.getMessage() for r in caplog.records][-1].startswith("cancelling: no new requests")
        assert {s: signal.getsignal(s) for s in saved} == saved  # the run raised or ended undecided
    finally:
        _restore(saved)


def test_once_the_outcome_is_decided_a_signal_says_so_and_the_handlers_stay_until_exit(caplog):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    token, end = CancellationToken(), RunEnd()
    result = SimpleNamespace(run_id="r1", status="SUCCESS", exit_code=0)
    end.runner = SimpleNamespace(decided=False, result=result)
    try:
        with caplog.at_level(logging.WARNING), signals_cancel(token, end):
            assert end.decided() is None
            end.runner.decided = True  # the runner has decided: its end is being recorded
            assert end.decided() is result
            signal.raise_signal(signal.SIGTERM)
            lines = [r.getMessage() for r in caplog.records]
            assert lines == ["signal after run r1 had ended SUCCESS: nothing is cancelled, exiting as it ended "
                             "(exit 0)"]
            end.result = result  # the run returned
        assert signal.getsignal(signal.SIGTERM) is not saved[signal.SIGTERM]  # output and exit stay covered
        assert signal.getsignal(signal.SIGINT) is not saved[signal.SIGINT]
    finally:
        _restore(saved)


def test_a_signal_after_one_that_cancelled_the_run_aborts_with_130_even_once_the_run_has_decided(monkeypatch):
    """Load run of the suite: the first SIGTERM cancelled, the run decided CANCELLED before the second arrived, and
    the second exited 5 ("as it ended") where the documented second signal is exit 130."""
    from feiqiu_etl.cli import signals as module

    aborted = []
    monkeypatch.setattr(module, "_abort_now", lambda line, code: aborted.append((line, code)))
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    token, end = CancellationToken(), RunEnd()
    result = SimpleNamespace(run_id="r1", status="CANCELLED", exit_code=5)
    end.runner = SimpleNamespace(decided=False, result=result)
    try:
        with signals_cancel(token, end):
            signal.raise_signal(signal.SIGTERM)  # cancels
            end.runner.decided = True
            signal.raise_signal(signal.SIGTERM)  # the second signal
            assert aborted == [(b"\nsecond signal: aborting now\n", 130)]
    finally:
        _restore(saved)
