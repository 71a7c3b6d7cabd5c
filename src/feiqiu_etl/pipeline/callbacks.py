"""The callables a caller hands :class:`~feiqiu_etl.pipeline.unified_pipeline.UnifiedPipeline`: how a request
is sent, how a response is processed and rows written, and the hooks of a finished scope or a failed request."""

from __future__ import annotations

from typing import Any, Callable, Hashable

from feiqiu_etl.pipeline.models import PipelineRequest, ProcessOutput, ResponseItem, WriteResult

SendFn = Callable[..., Any]
"""``send(fn, min_wait=0.0)``: run ``fn()`` in the lane after the gap (raises ``Cancelled``)."""
Transport = Callable[[PipelineRequest, SendFn], Any]
ProcessFn = Callable[[ResponseItem], ProcessOutput | list]
WriteFn = Callable[[list], WriteResult | None]
ScopeFn = Callable[[Hashable, bool], WriteResult | None]
FailureFn = Callable[[PipelineRequest, BaseException], list | None]

