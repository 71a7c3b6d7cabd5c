"""CancellationToken (pipeline/cancellation.py): its timer."""

from __future__ import annotations

from feiqiu_etl.pipeline.cancellation import CancellationToken


def test_a_timeout_longer_than_the_platform_can_wait_arms_a_capped_timer_and_no_thread_dies():
    """Adversarial trial: ``run --timeout 99999999999h`` printed a thread's OverflowError traceback before the
    command's own one-line refusal: ``threading.Timer`` cannot wait 3.6e14 s."""
    import threading
    import time

    died: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_type)
    try:
        token = CancellationToken(timeout=3.6e14)
        time.sleep(0.2)
        assert died == [] and not token.is_cancelled and token._timer is not None and token._timer.is_alive()
        token.dispose()
    finally:
        threading.excepthook = previous
