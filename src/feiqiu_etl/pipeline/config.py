"""``PipelineConfig`` (spec §3.1, §4.1): frozen, validated pipeline settings with task-level overrides.

Precedence in :meth:`PipelineConfig.from_app_config`, highest first: explicit task-level key
(``pipeline.<task_code>.<key>``), the connector's task default (e.g. the 8 s group-buy gap,
upstream-api.md §2.2), explicit global key (``pipeline.<key>``), the built-in default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Protocol


class ConfigSource(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


INT_LIMITS = {"workers": 256, "queue_size": 1_000_000, "batch_size": 1_000_000,
              "max_consecutive_failures": 1_000_000}
FLOAT_LIMITS = {"batch_timeout": 3600.0, "rate_min": 86400.0, "rate_max": 86400.0}


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline settings. Units: seconds for ``batch_timeout`` and rates; counts otherwise.

    Raises ``ValueError`` (one line) when workers/queue_size/batch_size < 1, batch_timeout <= 0,
    a rate is negative, ``rate_min > rate_max`` or max_consecutive_failures < 1 (Property 3), and for
    non-finite values or values above sane limits (``INT_LIMITS``, ``FLOAT_LIMITS``: e.g. 256 workers).
    """

    workers: int = 2
    queue_size: int = 100
    batch_size: int = 1000
    batch_timeout: float = 5.0
    rate_min: float = 5.0
    rate_max: float = 20.0
    max_consecutive_failures: int = 10

    def __post_init__(self) -> None:
        for name, high in INT_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
            if value > high:
                raise ValueError(f"{name} must be <= {high}, got {value}")
        for name, high in FLOAT_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value > high:
                raise ValueError(f"{name} must be <= {high:g} s, got {value:g}")
        if self.batch_timeout <= 0:
            raise ValueError(f"batch_timeout must be > 0, got {self.batch_timeout}")
        if self.rate_min < 0:
            raise ValueError(f"rate_min must be >= 0, got {self.rate_min}")
        if self.rate_min > self.rate_max:
            raise ValueError(f"rate_min({self.rate_min}) must not exceed rate_max({self.rate_max})")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_app_config(
        cls,
        config: ConfigSource,
        task_code: str | None = None,
        task_defaults: Mapping[str, Any] | None = None,
    ) -> "PipelineConfig":
        """Build from a key/value source (``AppConfig``) for ``task_code``. Raises ``ValueError`` for a
        value that does not parse (``"pipeline.workers: expected int, got 'x'"``) or fails validation."""
        task_defaults = task_defaults or {}
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw, where = None, None
            if task_code:
                where = f"pipeline.{task_code.lower()}.{f.name}"
                raw = config.get(where)
            if raw is None and f.name in task_defaults:
                raw, where = task_defaults[f.name], f"task default {f.name}"
            if raw is None:
                where = f"pipeline.{f.name}"
                raw = config.get(where)
            if raw is None:
                continue
            values[f.name] = _coerce(raw, f.default, where)
        return cls(**values)


def _coerce(raw: Any, default: Any, where: str) -> Any:
    kind = type(default)
    if isinstance(raw, bool):
        raise ValueError(f"{where}: expected {kind.__name__}, got {raw!r}")
    try:
        if kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(str(raw).strip()) if not isinstance(raw, (int, float)) else int(raw)
        return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected {kind.__name__}, got {raw!r}") from None
