"""Data classes passed between the stages (spec §4.2–§4.4), plus the processing output shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable
from feiqiu_etl.common.status import Status


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
    rejected: int | None = None
    """Records of ``fetched`` that did not become rows (a bad record: one error each); None: ``len(errors)``.
    Set it when ``errors`` also holds errors that are no record (e.g. a pagination loop)."""


def is_record(row: Any) -> bool:
    """Whether a row handed to the writer is a fetched record (what the row counts count). Rows are records
    unless their class says ``is_record = False``: bookkeeping a ``write_fn`` acts on (e.g. "this parent's
    detail was fetched"), created by processing or by ``on_request_failed`` from no fetched record."""
    return getattr(row, "is_record", True)


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

    Counts that add up (docs/guides/run-results.md "Counts that add up"), in every final state — success, failure, cancel, timeout:

    * details: ``detail_success + detail_failure + detail_skipped == detail_asked``. ``detail_asked`` counts the
      detail requests the run took in (seeds pulled, follow-ups created) plus the parents that needed none
      (``WriteResult.follow_ups_skipped``, also in ``detail_skipped``); ``detail_dropped`` is the part of
      ``detail_skipped`` that a stop (cancel, timeout, abort) left unsent. Seeds never pulled were not asked.
    * rows: ``total_fetched == total_inserted + total_updated + total_skipped + rows_failed + rows_not_written``.
      ``rows_failed`` are records that were fetched but not written because they were bad (processing) or their
      batch failed or was rejected; ``rows_not_written`` records still on their way to the writer when the run
      ended (the writer drains on every stop, so only a writer stuck past its join deadline leaves any).
    """

    status: str = Status.SUCCESS
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
    detail_asked: int = 0
    detail_dropped: int = 0
    rows_failed: int = 0
    rows_not_written: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def finish(self, *, aborted: bool, cancelled: bool, timing: dict[str, float], elapsed: float) -> "PipelineResult":
        """Set ``cancelled``, ``timing`` (seconds per stage plus ``total``) and the status:
        FAILED (aborted) > CANCELLED > PARTIAL (any failure recorded) > SUCCESS (spec §3.4)."""
        self.cancelled = cancelled
        self.timing = {k: round(v, 6) for k, v in timing.items()}
        self.timing["total"] = round(elapsed, 6)
        if aborted:
            self.status = Status.FAILED
        elif cancelled:
            self.status = Status.CANCELLED
        elif self.request_failures + self.processing_failures + self.write_failures > 0:
            self.status = Status.PARTIAL
        else:
            self.status = Status.SUCCESS
        return self

    def unreconciled(self) -> list[str]:
        """The count identities above that do not hold (empty when the counts add up), as readable text."""
        broken = []
        answered = self.detail_success + self.detail_failure + self.detail_skipped
        if answered != self.detail_asked:
            broken.append(f"details: {self.detail_success} answered + {self.detail_failure} failed + "
                          f"{self.detail_skipped} skipped != {self.detail_asked} asked")
        accounted = self.total_inserted + self.total_updated + self.total_skipped + self.rows_failed \
            + self.rows_not_written
        if accounted != self.total_fetched:
            broken.append(f"rows: {self.total_inserted} inserted + {self.total_updated} updated + "
                          f"{self.total_skipped} unchanged + {self.rows_failed} failed + {self.rows_not_written} "
                          f"not written != {self.total_fetched} fetched")
        return broken

    def merge(self, other: "PipelineResult") -> None:
        """Add ``other``'s counters into this one (status is not changed)."""
        for name in (
            "total_requests", "completed_requests", "total_fetched", "total_inserted", "total_updated",
            "total_skipped", "total_deleted", "request_failures", "processing_failures", "write_failures",
            "detail_success", "detail_failure", "detail_skipped", "attempts", "rate_limited", "banned_seconds",
            "detail_fetched", "detail_asked", "detail_dropped", "rows_failed", "rows_not_written",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(other.errors)
        self.cancelled = self.cancelled or other.cancelled
        for k, v in other.timing.items():
            self.timing[k] = self.timing.get(k, 0.0) + v
