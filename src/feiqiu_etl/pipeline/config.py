"""``PipelineConfig`` (spec §3.1, §4.1): the frozen, validated settings of one task's pipeline, and ``Gap``, the
random gap before each of its requests.

The bounds live on the field types below (``Workers``, ``GapSeconds`` …): the settings model
(:mod:`feiqiu_etl.config.settings`) declares its ``pipeline.*`` keys with the same types, so a bound is written
once. Which layer a value came from (task key > connector task default > global key > built-in default) is
decided there, once; this module only holds the result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

Workers = Annotated[int, Field(ge=1, le=256, description="processing threads")]
QueueSize = Annotated[int, Field(ge=1, le=1_000_000, description="processing queue bound (write queue: 2x)")]
BatchSize = Annotated[int, Field(ge=1, le=1_000_000, description="most rows per write transaction")]
BatchTimeout = Annotated[float, Field(gt=0, le=3600, description="s a partial batch may wait")]
GapSeconds = Annotated[float, Field(ge=0, le=86400, description="random gap between requests, s")]
FailureLimit = Annotated[int, Field(ge=1, le=1_000_000, description="failed requests or writes in a row before "
                                                                       "a task is aborted (FAILED)")]


@dataclass(frozen=True)
class Gap:
    """The random gap before a request: uniform in ``[min, max]`` seconds (upstream-api.md §2.2 asks for a
    random gap). A value: :meth:`draw` takes the random source.
    Raises ``ValueError`` when ``min < 0`` or ``min > max``."""

    min: float
    max: float

    def __post_init__(self) -> None:
        if self.min < 0:
            raise ValueError(f"min_interval must be >= 0, got {self.min}")
        if self.min > self.max:
            raise ValueError(f"min_interval({self.min}) must not exceed max_interval({self.max})")

    @property
    def mean(self) -> float:
        """The expected gap, s (for estimates)."""
        return (self.min + self.max) / 2

    def draw(self, rng: random.Random) -> float:
        """One gap, s, uniform in ``[min, max]``."""
        return min(max(rng.uniform(self.min, self.max), self.min), self.max)

    def mean_toward(self, safe: float | None, factor: float) -> float:
        """The expected gap (s) once a lane narrows it toward the floor ``safe`` by ``factor`` (as
        :class:`~feiqiu_etl.pipeline.pace.Pace` does: a draw above ``safe`` moves toward it by ``1 - factor`` of its
        distance, one at or below stays); the plain :attr:`mean` when ``safe`` is None or ``factor`` is 1."""
        a, b = self.min, self.max
        if safe is None or factor >= 1 or safe >= b:
            return self.mean
        if safe <= a:
            return safe + factor * (self.mean - safe)
        below = (safe - a) / (b - a)  # a < safe < b: the draws below safe stay, those above narrow
        return below * (a + safe) / 2 + (1 - below) * (safe + factor * (b - safe) / 2)


@pydantic_dataclass(frozen=True, config=ConfigDict(strict=True, allow_inf_nan=False))
class PipelineConfig:
    """Pipeline settings of one task. Units: seconds for ``batch_timeout`` and the gap; counts otherwise.

    Strict: counts must be ``int`` (not ``bool``, ``float`` or text), seconds finite numbers, each within the
    bounds of its type (Property 3; e.g. at most 256 workers). Raises ``ValueError`` (a pydantic
    ``ValidationError``) otherwise, and when ``rate_min > rate_max``.
    """

    workers: Workers = 2
    queue_size: QueueSize = 100
    batch_size: BatchSize = 1000
    batch_timeout: BatchTimeout = 5.0
    rate_min: GapSeconds = 5.0
    rate_max: GapSeconds = 20.0
    max_consecutive_failures: FailureLimit = 10

    @model_validator(mode="after")
    def _ordered_gap(self) -> "PipelineConfig":
        if self.rate_min > self.rate_max:
            raise ValueError(f"rate_min({self.rate_min}) must not exceed rate_max({self.rate_max})")
        return self

    @property
    def gap(self) -> Gap:
        """The gap before each request of this task."""
        return Gap(self.rate_min, self.rate_max)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The setting names (``pipeline.<name>``), in declaration order."""
        return tuple(f.name for f in fields(cls))
