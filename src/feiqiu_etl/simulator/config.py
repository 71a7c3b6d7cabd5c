"""Configuration values of the upstream simulator (plain frozen dataclasses).

What it is for: one place that says how a simulator instance behaves — which data it generates (seed, scale,
stores, history), who may call it (tokens), how strict its risk control is (upstream-api.md §2.2) and where it
listens. What it must never do: hold live state, read the environment, or bind anything but loopback by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

SHANGHAI = timezone(timedelta(hours=8), "Asia/Shanghai")
"""Asia/Shanghai has no DST, so a fixed +08:00 offset is exact (upstream-api.md §1.2)."""

MAX_SITE_ID = 2**53
SCALES = ("small", "medium", "large")


@dataclass(frozen=True)
class RiskControlConfig:
    """Risk-control numbers of upstream-api.md §2.2, all configurable so tests can use tiny values.

    ``gap_standard``/``gap_groupbuy`` are the minimum gaps G (seconds) between the completion of the previous
    accepted request and the start of the next one, chosen by the *new* request's endpoint class.
    ``violations_to_ban`` violations within ``violation_window`` seconds ban the token for ``ban_seconds``.
    ``enabled=False`` switches risk control off entirely. ``retry_after_unit`` is the second of ``retryAfter``
    (whole units, at least one, rule 5): 1 s as documented; a benchmark that scales every time by a factor ``f``
    scales it too (``f`` s), so that a rejection costs the scaled lane what it costs a real one (issue 30).
    """

    gap_standard: float = 3.0
    gap_groupbuy: float = 8.0
    violations_to_ban: int = 3
    violation_window: float = 60.0
    ban_seconds: float = 300.0
    enabled: bool = True
    retry_after_unit: float = 1.0

    def __post_init__(self) -> None:
        if min(self.gap_standard, self.gap_groupbuy, self.violation_window, self.ban_seconds) < 0:
            raise ValueError("risk-control durations must be >= 0")
        if not self.retry_after_unit > 0:
            raise ValueError("retry_after_unit must be > 0 s")
        if self.violations_to_ban < 1:
            raise ValueError("violations_to_ban must be >= 1")


@dataclass(frozen=True)
class ScaleProfile:
    """Record counts for one store: master data in absolute numbers, events per day (upstream-api.md §4.1)."""

    members: int
    cards: int
    tables: int
    areas: int
    goods: int
    categories: int
    assistants: int
    packages: int
    coupons: int
    settlements_per_day: int
    table_uses_per_day: int
    goods_sales_per_day: int
    inventory_changes_per_day: int
    balance_changes_per_day: int
    recharges_per_day: int
    assistant_services_per_day: int
    verifications_per_day: int
    refunds_per_day: float
    coupon_usages_per_day: int
    handovers_per_day: int


SCALE_PROFILES: Mapping[str, ScaleProfile] = {
    # Tiny: the demo walks all 21 tasks and their details in well under two minutes.
    "small": ScaleProfile(
        members=40, cards=24, tables=12, areas=3, goods=30, categories=8, assistants=6, packages=5, coupons=5,
        settlements_per_day=14, table_uses_per_day=18, goods_sales_per_day=24, inventory_changes_per_day=28,
        balance_changes_per_day=8, recharges_per_day=2, assistant_services_per_day=4, verifications_per_day=3,
        refunds_per_day=0.5, coupon_usages_per_day=2, handovers_per_day=2,
    ),
    # The lower bounds of the §4.1 volume column (refunds: 1 a day rather than 0, so the endpoint has data).
    "medium": ScaleProfile(
        members=2000, cards=1000, tables=20, areas=3, goods=100, categories=8, assistants=5, packages=5,
        coupons=5, settlements_per_day=150, table_uses_per_day=180, goods_sales_per_day=300,
        inventory_changes_per_day=300, balance_changes_per_day=50, recharges_per_day=5,
        assistant_services_per_day=20, verifications_per_day=20, refunds_per_day=1, coupon_usages_per_day=10,
        handovers_per_day=2,
    ),
    # The upper bounds of the §4.1 volume column.
    "large": ScaleProfile(
        members=20000, cards=12000, tables=60, areas=8, goods=400, categories=20, assistants=40, packages=30,
        coupons=20, settlements_per_day=600, table_uses_per_day=700, goods_sales_per_day=1500,
        inventory_changes_per_day=1600, balance_changes_per_day=400, recharges_per_day=40,
        assistant_services_per_day=150, verifications_per_day=200, refunds_per_day=10, coupon_usages_per_day=80,
        handovers_per_day=3,
    ),
}


def shanghai_now() -> datetime:
    """Current Asia/Shanghai wall time as a naive datetime truncated to the second."""
    return datetime.now(SHANGHAI).replace(tzinfo=None, microsecond=0)


@dataclass(frozen=True)
class SimulatorConfig:
    """Everything a :class:`~feiqiu_etl.simulator.Simulator` needs (see the package docstring for an example).

    ``token`` is always valid for all ``site_ids``; ``tokens`` adds more tokens, each mapped to the site ids it
    may read (upstream-api.md §1.1, error 40103). ``anchor`` is the naive Shanghai local time where the
    generated history ends; windowed data spans ``[anchor - days, anchor)``. ``port=0`` picks a free port.
    ``processing_delay`` is slept inside every accepted request. ``churn_between_pages`` makes the data change
    between the pages of one listing (upstream-api.md §1.5), deterministically per seed. ``site_factors``
    multiplies every count of the scale profile for some stores (e.g. ``{site: 10}``: one store ten times
    bigger than the others of its token). ``extra_fields`` (schema drift, e.g. ``{"*": {"newField": 1}}``)
    adds fields to every record of the list endpoints of the named task codes (``"*"``: all);
    ``Simulator.add_field`` does the same while running. ``faults`` are injected when the simulator is created,
    each ``{"kind", "path"?, "count"?, "day"?, "page"?}`` as ``Simulator.inject`` takes them (e.g. a ``short_page`` that
    repeats: ``{"kind": "short_page", "path": "/api/member/list", "count": 1000}``).
    """

    seed: int = 7
    scale: str = "small"
    token: str = "fq_test_token"
    tokens: Mapping[str, tuple[int, ...]] | None = None
    site_ids: tuple[int, ...] = (8640015201004417,)
    anchor: datetime | None = None
    days: int = 3
    risk: RiskControlConfig = field(default_factory=RiskControlConfig)
    host: str = "127.0.0.1"
    port: int = 0
    processing_delay: float = 0.0
    churn_between_pages: bool = False
    site_factors: Mapping[int, float] | None = None
    extra_fields: Mapping[str, Mapping[str, Any]] | None = None
    faults: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, not {self.scale!r}")
        if self.days < 1:
            raise ValueError("days must be >= 1")
        if not self.site_ids:
            raise ValueError("at least one site id is required")
        for site_id in self.all_site_ids():
            if isinstance(site_id, bool) or not isinstance(site_id, int) or not 0 < site_id < MAX_SITE_ID:
                raise ValueError(f"site ids are positive integers below 2^53, not {site_id!r}")
        if not self.token:
            raise ValueError("token must not be empty")
        if self.anchor is not None and self.anchor.tzinfo is not None:
            raise ValueError("anchor is a naive Asia/Shanghai local time")
        from feiqiu_etl.simulator.faults import FaultInjector

        probe = FaultInjector()  # the same checks as Simulator.inject, before anything starts
        for fault in self.faults:
            if not isinstance(fault, Mapping) or "kind" not in fault:
                raise ValueError(f"a fault is a mapping with a kind, not {fault!r}")
            probe.inject(fault.get("path"), fault["kind"], fault.get("count", 1), day=fault.get("day"),
                         page=fault.get("page"))
        for site, factor in (self.site_factors or {}).items():
            if not 0 < factor <= 100:
                raise ValueError(f"site factor of {site} must be in (0, 100], not {factor!r}")

    @property
    def profile(self) -> ScaleProfile:
        return SCALE_PROFILES[self.scale]

    def profile_for(self, site_id: int) -> ScaleProfile:
        """The scale profile of one store (``site_factors`` applied)."""
        factor = (self.site_factors or {}).get(site_id, 1.0)
        if factor == 1.0:
            return self.profile
        from dataclasses import fields, replace

        base = self.profile
        return replace(base, **{f.name: type(getattr(base, f.name))(max(1, round(getattr(base, f.name) * factor)))
                                for f in fields(base)})

    def token_sites(self) -> dict[str, frozenset[int]]:
        """token -> site ids it may access: ``{token: site_ids}`` plus the extra ``tokens``."""
        result = {self.token: frozenset(self.site_ids)}
        for token, sites in (self.tokens or {}).items():
            result[token] = frozenset(sites)
        return result

    def all_site_ids(self) -> tuple[int, ...]:
        """Every store with data: ``site_ids`` first, then any site only named by an extra token."""
        ordered = list(self.site_ids)
        for sites in (self.tokens or {}).values():
            ordered.extend(s for s in sites if s not in ordered)
        return tuple(ordered)

    def resolved_anchor(self) -> datetime:
        return self.anchor.replace(microsecond=0) if self.anchor is not None else shanghai_now()
