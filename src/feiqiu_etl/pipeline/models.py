"""Data classes passed between the stages (spec §4.2–§4.4), plus the processing output shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable


@dataclass
class PipelineRequest:
    """One request for the lane (spec §4.2).

    ``scope`` groups requests whose completion is tracked together (e.g. one window segment);
    ``context`` carries caller data (the parent record of a detail request, the page number, …);
    ``gap_class`` names the upstream's spacing class of the endpoint (the lane keeps a floor per class).
    """

    endpoint: str
    params: dict
    page_size: int | None = 200
    data_path: tuple[str, ...] = ("data",)
    list_key: str | None = None
    segment_index: int = 0
    is_detail: bool = False
    detail_id: Any = None
    scope: Hashable | None = None
    context: dict = field(default_factory=dict)
    gap_class: str | None = None

    def label(self, page_param: str = "page") -> str:
        """Short text for progress and logs: the endpoint plus the page or the detail id."""
        if self.is_detail:
            return f"{self.endpoint} id {self.detail_id}"
        page = (self.params or {}).get(page_param)
        return f"{self.endpoint} page {page}" if page is not None else self.endpoint


@dataclass
class ResponseItem:
    """A successful response on its way to a processing worker.

    ``emit(request)``, set by ``UnifiedPipeline``, sends a follow-up (e.g. the next page) to the lane at once,
    before ``process_fn`` returns; engines without it take follow-ups from the ``ProcessOutput`` only."""

    request: PipelineRequest
    payload: Any
    seq: int
    emit: Callable[[PipelineRequest], None] | None = field(default=None, repr=False, compare=False)


@dataclass
class ProcessOutput:
    """What ``process_fn`` returns for one response.

    ``rows`` go to the writer; ``follow_ups`` go back to the lane (the next page, detail requests);
    ``fetched`` is the number of records the response held; ``errors`` are record-level failures
    (each one counts as a processing failure, the other records continue — spec §6.1).
    """

    rows: list = field(default_factory=list)
    follow_ups: list[PipelineRequest] = field(default_factory=list)
    fetched: int | None = None
    errors: list[dict] = field(default_factory=list)


@dataclass
class WriteResult:
    """Result of one batch write (spec §4.4). ``follow_ups`` are requests created by what was written
    (e.g. detail requests for new or changed parents); ``follow_ups_skipped`` counts parents that did
    not need one (reported as ``detail_skipped``)."""

    inserted: int = 0
    updated: int = 0
    skipped: int = 0
    deleted: int = 0
    errors: int = 0
    follow_ups: list[PipelineRequest] = field(default_factory=list)
    follow_ups_skipped: int = 0


@dataclass
class PipelineResult:
    """Execution statistics (spec §4.3). Invariant (Property 14): ``request_failures +
    processing_failures + write_failures == len(errors)``.

    Beyond §4.3: ``attempts`` counts every request actually sent, retries included (``total_requests``
    counts logical requests); ``rate_limited`` counts answers that demanded a wait (HTTP 429, risk control)
    and ``banned_seconds`` the seconds the upstream blocked the account; ``detail_fetched`` is the part of
    ``total_fetched`` that came from detail responses.
    """

    status: str = "SUCCESS"
    total_requests: int = 0
    completed_requests: int = 0
    total_fetched: int = 0
    total_inserted: int = 0
    total_updated: int = 0
    total_skipped: int = 0
    total_deleted: int = 0
    request_failures: int = 0
    processing_failures: int = 0
    write_failures: int = 0
    cancelled: bool = False
    errors: list[dict] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    detail_success: int = 0
    detail_failure: int = 0
    detail_skipped: int = 0
    attempts: int = 0
    rate_limited: int = 0
    banned_seconds: float = 0.0
    detail_fetched: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def finish(self, *, aborted: bool, cancelled: bool, timing: dict[str, float], elapsed: float) -> "PipelineResult":
        """Set ``cancelled``, ``timing`` (seconds per stage plus ``total``) and the status:
        FAILED (aborted) > CANCELLED > PARTIAL (any failure recorded) > SUCCESS (spec §3.4)."""
        self.cancelled = cancelled
        self.timing = {k: round(v, 6) for k, v in timing.items()}
        self.timing["total"] = round(elapsed, 6)
        if aborted:
            self.status = "FAILED"
        elif cancelled:
            self.status = "CANCELLED"
        elif self.request_failures + self.processing_failures + self.write_failures > 0:
            self.status = "PARTIAL"
        else:
            self.status = "SUCCESS"
        return self

    def merge(self, other: "PipelineResult") -> None:
        """Add ``other``'s counters into this one (status is not changed)."""
        for name in (
            "total_requests", "completed_requests", "total_fetched", "total_inserted", "total_updated",
            "total_skipped", "total_deleted", "request_failures", "processing_failures", "write_failures",
            "detail_success", "detail_failure", "detail_skipped", "attempts", "rate_limited", "banned_seconds",
            "detail_fetched",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(other.errors)
        self.cancelled = self.cancelled or other.cancelled
        for k, v in other.timing.items():
            self.timing[k] = self.timing.get(k, 0.0) + v
