"""The generic engine: one serial request lane, a processing pool, one writer, exact termination.

Nothing in this package knows about Feiqiu, HTTP or PostgreSQL: requests are sent through a
``transport`` callable, processed by ``process_fn`` and written by ``write_fn`` supplied by the caller.

The names below are imported from their modules when first used (``from feiqiu_etl.pipeline import X``
works as before): a command that needs only ``pipeline.config`` or ``pipeline.cancellation`` does not load the
whole engine (issue 27: read-only commands within a second).
"""

import importlib

_WHERE = {
    "CancellationToken": "cancellation", "Clock": "clock", "FakeClock": "clock", "SystemClock": "clock",
    "AbortPipeline": "errors", "Cancelled": "errors", "PipelineRequest": "models", "PipelineResult": "models",
    "ProcessOutput": "models", "ResponseItem": "models", "WriteResult": "models", "RateLimiter": "rate_limiter",
    "RequestScheduler": "request_scheduler", "UnifiedPipeline": "unified_pipeline", "WorkTracker": "work_tracker",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"feiqiu_etl.pipeline.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
