"""The sections of the settings model: one frozen pydantic model per dotted namespace (``pipeline.*``,
``dwd.*``, ``window.*``, ``api.*``, ``lane.*``, ``detail.*``, ``integrity.*``, ``db.*``, ``run.*``, ``progress.*``,
``sql.*``, ``state.*``, ``display.*``, ``web.*``), each field with its default, bounds and description.

:class:`~feiqiu_etl.config.settings.Settings` holds one of each; the layers, the sources and the environment
names are its business. A value out of bounds raises pydantic's ``ValidationError`` here (the settings module
turns it into one :class:`~feiqiu_etl.config.errors.ConfigError` line naming the key).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from feiqiu_etl.deadline import Deadline
from feiqiu_etl.pipeline.config import BatchSize, BatchTimeout, FailureLimit, GapSeconds, QueueSize, Workers


def _flag(name: str, text: str) -> dict:
    return {"flag": name, "help": text}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PipelineKeys(_Section):
    """``pipeline.<key>`` values of one level — global, or one task — where None means "not set here". The bounds
    are those of :class:`~feiqiu_etl.pipeline.config.PipelineConfig` (the same field types)."""

    workers: Workers | None = Field(None, json_schema_extra=_flag("--pipeline-workers", "processing threads"))
    queue_size: QueueSize | None = None
    batch_size: BatchSize | None = Field(None, json_schema_extra=_flag("--pipeline-batch-size",
                                                                       "rows per write batch"))
    batch_timeout: BatchTimeout | None = None
    rate_min: GapSeconds | None = Field(None, json_schema_extra=_flag("--pipeline-rate-min",
                                                                      "minimum gap between requests, s"))
    rate_max: GapSeconds | None = Field(None, json_schema_extra=_flag("--pipeline-rate-max",
                                                                      "maximum gap between requests, s"))
    max_consecutive_failures: FailureLimit | None = None


class PipelineSection(PipelineKeys):
    """The global ``pipeline.*`` keys and, under ``tasks``, each task's (lower-case task code)."""

    tasks: dict[str, PipelineKeys] = {}


class DwdSection(_Section):
    parallel_workers: int = Field(4, ge=1, le=64, description="DWD tables merged in parallel")


class WindowSection(_Section):
    lookback_hours: float = Field(48.0, ge=0, le=24 * 366, description="incremental runs re-fetch this many hours "
                                                                          "before the high-water mark, for tasks whose "
                                                                          "connector entry sets no lookback_minutes")
    initial_days: float = Field(7.0, ge=0, le=3660, description="first incremental run fetches this many days back")
    segment_days: float = Field(31.0, ge=1 / 24, le=31, description="longest window segment, days (<= 31, the "
                                                                       "API's limit, and the default)")


class ApiSection(_Section):
    timeout: float = Field(30.0, ge=0.1, le=600, description="HTTP timeout per request, s (default: the "
                                                              "connector's timeout_seconds)")
    retry_attempts: int = Field(3, ge=1, le=20, description="attempts per request including the first")
    retry_backoff: float = Field(1.0, ge=0, le=600, description="first retry backoff, s, doubled each attempt")
    connect_timeout: float = Field(10.0, ge=0.1, le=600, description="HTTP connect timeout, s (at most api.timeout)")


class LaneSection(_Section):
    max_transport_failures: int = Field(5, ge=1, le=1000, description="abort a lane after this many requests in a "
                                                                         "row reached no server")
    max_active_stores: int = Field(8, ge=1, le=64, description="stores of one lane that take turns on it at once")
    safety_margin: float = Field(0.1, ge=0, le=10, description="to meet a deadline a gap narrows to no less than its "
                                                                "class's documented minimum times 1 + this")
    safety_margin_seconds: float = Field(0.3, ge=0, le=3600, description="... and no less than that minimum plus this "
                                                                          "many seconds")


class DetailSection(_Section):
    max_attempts: int = Field(5, ge=1, le=1000, description="runs that may fail on an owed detail before it is "
                                                             "given up")
    recheck_share: float = Field(0.01, ge=0, le=0.5, description="share of a lane's requests spent re-fetching the "
                                                                  "details checked longest ago, rounded down per task "
                                                                  "(the rest carried to its next run; 0 = off)")


class IntegritySection(_Section):
    refetch_listings: int = Field(2, ge=0, le=1000, description="listings per task and run fetched again from page 1 "
                                  "when they end short or over their total (issue 25; default: the connector's)")
    zero_floor: int = Field(20, ge=0, le=10_000_000, description="a window that answers 0 rows where the trailing "
                            "median of those weekdays (of the same clock window, for a window of no whole day) is "
                            "at least this many rows is unexpected_zero "
                            "(fetched once more, alerted); 0 = off (default: the connector's)")
    zero_weeks: int = Field(4, ge=2, le=52, description="weeks back the trailing median of a weekday reads")
    max_delete_share: float = Field(0.2, ge=0, le=1, description="a complete snapshot whose soft delete would remove "
                                    "more than this share of a store's live rows of the table (and more than "
                                    "max_delete_rows) is held back until confirmed (issue 25; default: the connector's)")
    max_delete_rows: int = Field(5, ge=0, le=10_000_000, description="... and more than this many rows (default: "
                                 "the connector's)")


class DbSection(_Section):
    connect_timeout: float = Field(10.0, ge=0.5, le=600, description="PostgreSQL connect timeout, s")
    unavailable_limit: float = Field(60.0, ge=1, le=86400, description="s the database may stay away during a run")
    pool_size: int = Field(16, ge=1, le=1000, description="connections the lanes of a run share (the run's registry, "
                                                          "lane guard and LISTEN sessions come on top)")
    statement_timeout: float = Field(600.0, ge=1, le=86400, description="s one statement of a run may run or wait "
                                                                          "for a lock on a live server")


class RunSection(_Section):
    heartbeat_seconds: float = Field(1.0, ge=0.1, le=60, description="how often a run publishes its status, s")
    stale_after: float = Field(30.0, ge=2, le=86400, description="a RUNNING run whose heartbeat is older (s) and "
                                                                  "whose process is gone is INTERRUPTED")
    retention_days: float = Field(90, ge=0, le=36600, description="runs that ended more than this many days ago "
                                                                   "lose their stored log and request timeline at "
                                                                   "the end of each run (0 = keep forever; "
                                                                   "feiqiu-etl runs prune)")
    stall_after: float = Field(900.0, ge=1, le=86400, description="a lane with no progress for this long (s) is "
                                                                   "reported stalled (status, web, log)")
    deadline: str | None = Field(None, description="stop sending requests at this time of day (06:00, display zone) "
                                                   "or this long after the start (45m, 90s); --deadline")

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, value: str | None) -> str | None:
        return None if value is None else Deadline.parse(value).text


class SqlSection(_Section):
    timeout: float = Field(60.0, ge=0.001, le=86400, description="s one `feiqiu-etl sql` statement may run")


class StateSection(_Section):
    reset_timeout: float = Field(30.0, ge=1, le=3600, description="s `feiqiu-etl state reset` may take in the "
                                                                  "database (statement and lock timeout)")


class ProgressSection(_Section):
    heartbeat_seconds: float = Field(30.0, ge=0, le=86400, description="without a terminal, a progress line this "
                                                                        "often, s (0 = never)")


class DisplaySection(_Section):
    timezone: str = Field("local", min_length=1, max_length=64,
                          description="the zone every command and the web page show times in: `local` (the "
                                      "machine's) or an IANA name such as Asia/Shanghai; window times stay in "
                                      "the upstream's zone (Asia/Shanghai)")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from feiqiu_etl.formats import zone_problem

        problem = zone_problem(value.strip())
        if problem:
            raise ValueError(problem)  # the key is named by the layer reading it
        return value.strip()


class WebSection(_Section):
    language: Literal["auto", "zh-CN", "zh", "en"] = Field(
        "auto", description="the web page's language: `auto` (the browser's Accept-Language), `zh-CN` (`zh`) or "
                            "`en`; the page's switch overrides it per browser (cookie) (issue 29)")
