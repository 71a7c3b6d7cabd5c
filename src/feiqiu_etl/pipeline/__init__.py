"""The generic engine: one serial request lane, a processing pool, one writer, exact termination.

Nothing in this package knows about Feiqiu, HTTP or PostgreSQL: requests are sent through a
``transport`` callable, processed by ``process_fn`` and written by ``write_fn`` supplied by the caller.
"""

from feiqiu_etl.pipeline.cancellation import CancellationToken
from feiqiu_etl.pipeline.clock import Clock, FakeClock, SystemClock
from feiqiu_etl.pipeline.errors import AbortPipeline, Cancelled
from feiqiu_etl.pipeline.models import (
    PipelineRequest,
    PipelineResult,
    ProcessOutput,
    ResponseItem,
    WriteResult,
)
from feiqiu_etl.pipeline.rate_limiter import RateLimiter
from feiqiu_etl.pipeline.request_scheduler import RequestScheduler
from feiqiu_etl.pipeline.unified_pipeline import UnifiedPipeline
from feiqiu_etl.pipeline.work_tracker import WorkTracker

__all__ = [
    "AbortPipeline", "CancellationToken", "Cancelled", "Clock", "FakeClock", "PipelineRequest",
    "PipelineResult", "ProcessOutput", "RateLimiter", "RequestScheduler", "ResponseItem",
    "SystemClock", "UnifiedPipeline", "WorkTracker", "WriteResult",
]
