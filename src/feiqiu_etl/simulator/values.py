"""Value helpers for simulated records: times, money strings, snowflake ids, masked phones, text fragments.

What it is for: producing field values with the exact JSON types and quirks of upstream-api.md §3 (money as text
with varying trailing zeros, id64 above 2^53, codes with leading zeros, masked phones, Chinese text with
full-width punctuation and emoji outside the BMP). What it must never do: use the global ``random`` module or any
other hidden state — every random choice comes from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
DATE_FORMAT = "%Y-%m-%d"
_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$")
CENT = Decimal("0.01")
ZERO = Decimal("0")

TWITTER_EPOCH_MS = 1288834974657
"""Snowflake epoch; 2024 timestamps give 19-digit ids around 1.87e18, like upstream-api.md §6.2."""
_EPOCH = datetime(1970, 1, 1, 8, 0, 0)  # 1970-01-01T00:00:00Z in Shanghai local time


def fmt_time(value: datetime) -> str:
    return value.strftime(TIME_FORMAT)


def fmt_date(value: datetime) -> str:
    return value.strftime(DATE_FORMAT)


def parse_time(text: object) -> datetime | None:
    """Strictly parse ``"YYYY-MM-DD HH:MM:SS"`` (upstream-api.md §1.2); ``None`` if malformed."""
    if not isinstance(text, str) or not _TIME_RE.match(text):
        return None
    try:
        return datetime.strptime(text, TIME_FORMAT)
    except ValueError:
        return None


def cents(value: Decimal | int | str | float) -> Decimal:
    """Round half-up to cents."""
    return Decimal(str(value)).quantize(CENT, rounding=ROUND_HALF_UP)


def money_text(value: Decimal, trimmed: bool) -> str:
    """Format money (Q1): ``"12.50"`` / ``"12.00"`` or, when ``trimmed``, ``"12.5"`` / ``"12"``."""
    value = cents(value)
    if value == 0:
        value = abs(value)
    text = f"{value:.2f}"
    if trimmed:
        text = text.rstrip("0").rstrip(".")
    return text


def money(rng: random.Random, value: Decimal | int | str) -> str:
    """Money string with a randomly chosen trailing-zero style (mostly two decimals)."""
    return money_text(cents(value), trimmed=rng.random() < 0.2)


def parse_money(text: str) -> Decimal:
    return Decimal(text) if text else ZERO


def epoch_ms(value: datetime) -> int:
    return int((value - _EPOCH).total_seconds() * 1000)


class IdAllocator:
    """Unique snowflake-like id64 values (Q2): ``(ms since the snowflake epoch) << 22 | random low bits``.

    ``rng`` is a public attribute so a caller can swap the random source for a scoped operation.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._used: set[int] = set()

    def id64(self, at: datetime) -> int:
        base = (epoch_ms(at) - TWITTER_EPOCH_MS) << 22
        while True:
            candidate = base + self.rng.getrandbits(22)
            if candidate not in self._used:
                self._used.add(candidate)
                return candidate


def masked_phone(rng: random.Random) -> str:
    """Masked mobile (Q10): ``"138****5678"``."""
    prefix = rng.choice(("130", "133", "135", "136", "138", "139", "150", "151", "158", "177", "186", "188", "199"))
    return f"{prefix}****{rng.randrange(10000):04d}"


def masked_voucher(rng: random.Random) -> str:
    """Masked voucher code (Q10): ``"1234****5678"``."""
    return f"{rng.randrange(1000, 10000)}****{rng.randrange(10000):04d}"


def digits(rng: random.Random, count: int, first_nonzero: bool = True) -> str:
    head = str(rng.randrange(1, 10)) if first_nonzero else str(rng.randrange(10))
    return head + "".join(str(rng.randrange(10)) for _ in range(count - 1))


def ean13(rng: random.Random) -> str:
    """A valid EAN-13 barcode starting with the Chinese prefix 69."""
    body = "69" + digits(rng, 10, first_nonzero=False)
    total = sum(int(d) * (3 if i % 2 else 1) for i, d in enumerate(body))
    return body + str((10 - total % 10) % 10)


def random_time_between(rng: random.Random, start: datetime, end: datetime) -> datetime:
    span = int((end - start).total_seconds())
    return start + timedelta(seconds=rng.randrange(max(span, 1)))


def business_time(rng: random.Random, day_start: datetime, day_end: datetime) -> datetime:
    """A time in ``[day_start, day_end)`` weighted towards opening hours (10:00–02:00, busiest in the evening)."""
    for _ in range(20):
        moment = random_time_between(rng, day_start, day_end)
        weight = HOUR_WEIGHTS[moment.hour]
        if rng.random() < weight:
            return moment
    return moment


HOUR_WEIGHTS = (0.5, 0.35, 0.15, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.05, 0.25, 0.35,
                0.45, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 0.9, 0.7)

REMARKS = (
    "", "", "", "", "", "客人说下次还来🎱", "老客户，已提醒续卡", "【加急】球杆需更换皮头", "团购券核销（美团）",
    "包厢空调报修（已处理）", "生日客人，赠送果盘🎂", "朋友局🐂🐂", "夜场优惠：满200减20", "会员推荐新客",
)

NICKNAMES = (
    "台球小王子", "一杆清台🎱", "夜猫子", "球神🐂", "斯诺克爱好者", "阿杰", "小胖", "老K", "九球天后", "清风",
    "Mr.Lee", "冲冲冲🚀", "稳如老狗", "左手杆", "黑八专家🎱", "",
)

STAFF = ("前台-小周", "前台-小林", "收银-阿芳", "店长-王磊", "夜班-小陈", "前台-莉莉")


def staff_member(rng: random.Random) -> tuple[int, str]:
    """One of :data:`STAFF`, drawn from ``rng``: ``(staffId, name)``, the ids from 11 on."""
    index = rng.randrange(len(STAFF))
    return 11 + index, STAFF[index]


def whole_minutes(delta: timedelta) -> int:
    """``delta`` in whole minutes, rounded down; 0 for a negative span."""
    return max(int(delta.total_seconds() // 60), 0)


def money_sum(values: Iterable[str]) -> Decimal:
    """The sum of money strings (``"12.50"`` …) as a Decimal; ``ZERO`` for none."""
    return sum((parse_money(v) for v in values), ZERO)
