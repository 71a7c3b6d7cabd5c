"""Property 7 (spec §5): ``CancellationToken`` starts uncancelled, ``cancel()`` is one-way, and a token
with a timeout cancels itself when the timeout elapses.

Random operation sequences (cancel, dispose, reads, from several threads) check the state machine.
Timeouts are tiny real ones (1–50 ms) waited on ``token.event`` with a bounded deadline, so the whole
property costs well under a second; ``dispose()`` before the timeout must keep the token uncancelled.
"""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.pipeline import CancellationToken

DEADLINE = 5.0  # real seconds a timed token may take to fire on a loaded machine before we call it broken

OPS = st.lists(st.sampled_from(["cancel", "dispose", "read", "cancel_in_thread"]), max_size=12)


# Feature: etl-unified-pipeline, Property 7: CancellationToken 状态转换
@given(ops=OPS, timeout=st.one_of(st.none(), st.sampled_from([0, -1.0, 0.0]), st.floats(0.001, 0.02)),
       dispose_first=st.sampled_from([False, False, False, True]))
def test_p7_cancel_is_one_way_and_a_timeout_cancels(ops, timeout, dispose_first):
    timed = timeout is not None and timeout > 0
    token = CancellationToken(timeout=None if timed else timeout)
    assert token.is_cancelled is False and token.reason is None and not token.event.is_set()
    cancelled = False
    for op in ops:
        if op == "cancel":
            token.cancel()
            cancelled = True
        elif op == "cancel_in_thread":
            t = threading.Thread(target=token.cancel, kwargs={"reason": "signal"})
            t.start()
            t.join()
            cancelled = True
        elif op == "dispose":
            token.dispose()
        assert token.is_cancelled is cancelled  # never reverts, never fires on its own without a timeout
        assert token.event.is_set() is cancelled
    if cancelled:
        assert token.reason == next(("cancel" if op == "cancel" else "signal") for op in ops if "cancel" in op)
    token.dispose()

    if timed:
        fired = CancellationToken(timeout=timeout)
        assert fired.event.wait(DEADLINE), f"timeout {timeout}s did not cancel within {DEADLINE}s"
        assert fired.is_cancelled and fired.reason == "timeout"
        fired.cancel()  # a later cancel changes nothing
        fired.dispose()
        assert fired.is_cancelled and fired.reason == "timeout"
        if dispose_first:
            delay = timeout + 0.03  # room for dispose() to land first even when the machine is busy
            stopped = CancellationToken(timeout=delay)
            stopped.dispose()
            assert not stopped.event.wait(delay * 2)  # a disposed timer never fires
            assert not stopped.is_cancelled
