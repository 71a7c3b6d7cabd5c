"""The endpoint table of the simulated Feiqiu API: 21 list endpoints (upstream-api.md §4.1) and 3 detail endpoints
(§5.1), as data.

What it is for: every other simulator module looks up paths, kinds, window fields, list shapes (§1.4), primary keys,
risk-control gap classes (§2.2) and JSON escaping from here, so the contract lives in one table.
What it must never do: hold state or know how records are generated.

Escaping (Q9): endpoints with ``ensure_ascii=True`` send every non-ASCII character as ``\\uXXXX`` (emoji as
surrogate pairs); the others send raw UTF-8. The choice is fixed per endpoint (see ``ESCAPED_PATHS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    SNAPSHOT = "snapshot"
    WINDOWED = "windowed"


class GapClass(str, Enum):
    """Risk-control endpoint class (upstream-api.md §2.2 rule 2)."""

    STANDARD = "standard"
    GROUPBUY = "groupbuy"


@dataclass(frozen=True)
class ListShape:
    """Where a list lives in the response (upstream-api.md §1.4)."""

    name: str
    data_path: tuple[str, ...]
    list_key: str


SHAPES = {
    "A": ListShape("A", ("data",), "list"),
    "B": ListShape("B", ("data",), "records"),
    "C": ListShape("C", ("data",), "rows"),
    "D": ListShape("D", ("data", "page"), "list"),
}

ESCAPED_PATHS = frozenset({
    "/api/member/list",
    "/api/member/detail",
    "/api/member/balance/change/list",
    "/api/settlement/list",
    "/api/table/area/list",
    "/api/goods/list",
    "/api/groupbuy/package/detail",
    "/api/payment/list",
    "/api/coupon/usage/list",
    "/api/shift/handover/list",
})
"""Paths answered with ``json.dumps(..., ensure_ascii=True)``; every other path answers in raw UTF-8."""


@dataclass(frozen=True)
class ListEndpoint:
    """One row of the upstream-api.md §4.1 table."""

    task_code: str
    path: str
    kind: Kind
    window_field: str | None
    shape: ListShape
    pk: str
    pk_is_int: bool
    gap_class: GapClass = GapClass.STANDARD

    @property
    def windowed(self) -> bool:
        return self.kind is Kind.WINDOWED

    @property
    def ensure_ascii(self) -> bool:
        return self.path in ESCAPED_PATHS


@dataclass(frozen=True)
class DetailEndpoint:
    """One row of the upstream-api.md §5.1 table."""

    parent_task: str
    path: str
    id_param: str
    id_is_int: bool
    data_path: tuple[str, ...]
    list_key: str
    row_pk: tuple[str, ...]
    gap_class: GapClass = GapClass.STANDARD

    @property
    def ensure_ascii(self) -> bool:
        return self.path in ESCAPED_PATHS


def _snap(task: str, path: str, shape: str, pk: str, pk_is_int: bool, gap=GapClass.STANDARD) -> ListEndpoint:
    return ListEndpoint(task, path, Kind.SNAPSHOT, None, SHAPES[shape], pk, pk_is_int, gap)


def _win(task: str, path: str, field: str, shape: str, pk: str, pk_is_int: bool = True) -> ListEndpoint:
    return ListEndpoint(task, path, Kind.WINDOWED, field, SHAPES[shape], pk, pk_is_int)


LIST_ENDPOINTS: tuple[ListEndpoint, ...] = (
    _snap("ODS_MEMBER", "/api/member/list", "A", "memberId", True),
    _snap("ODS_MEMBER_CARD", "/api/member/card/list", "A", "cardId", False),
    _win("ODS_MEMBER_BALANCE_CHANGE", "/api/member/balance/change/list", "createTime", "B", "changeId"),
    _win("ODS_RECHARGE_ORDER", "/api/member/recharge/list", "payTime", "A", "rechargeNo", False),
    _win("ODS_SETTLEMENT", "/api/settlement/list", "updateTime", "A", "settleId"),
    _win("ODS_TABLE_USE", "/api/table/use/list", "updateTime", "A", "useId"),
    _snap("ODS_BILLIARD_TABLE", "/api/table/list", "A", "tableId", True),
    _snap("ODS_TABLE_AREA", "/api/table/area/list", "C", "areaId", True),
    _snap("ODS_GOODS", "/api/goods/list", "A", "goodsId", False),
    _snap("ODS_GOODS_CATEGORY", "/api/goods/category/list", "A", "categoryId", True),
    _win("ODS_GOODS_SALE", "/api/goods/sale/list", "createTime", "A", "lineId"),
    _win("ODS_INVENTORY_CHANGE", "/api/goods/stock/change/list", "createTime", "B", "changeId"),
    _snap("ODS_ASSISTANT", "/api/assistant/list", "A", "assistantId", False),
    _win("ODS_ASSISTANT_SERVICE", "/api/assistant/service/list", "updateTime", "A", "serviceId"),
    _snap("ODS_GROUP_PACKAGE", "/api/groupbuy/package/list", "D", "packageId", False, GapClass.GROUPBUY),
    _win("ODS_GROUP_VERIFICATION", "/api/groupbuy/verify/list", "verifyTime", "C", "verifyId"),
    _win("ODS_PAYMENT", "/api/payment/list", "payTime", "A", "payId"),
    _win("ODS_REFUND", "/api/refund/list", "refundTime", "A", "refundId"),
    _snap("ODS_COUPON", "/api/coupon/list", "A", "couponId", True),
    _win("ODS_COUPON_USAGE", "/api/coupon/usage/list", "useTime", "C", "usageId"),
    _win("ODS_SHIFT_HANDOVER", "/api/shift/handover/list", "handoverTime", "A", "handoverId"),
)

DETAIL_ENDPOINTS: tuple[DetailEndpoint, ...] = (
    DetailEndpoint("ODS_SETTLEMENT", "/api/settlement/detail", "settleId", True, ("data",), "items", ("itemId",)),
    DetailEndpoint(
        "ODS_GROUP_PACKAGE", "/api/groupbuy/package/detail", "packageId", False, ("data", "package"), "contents",
        ("packageId", "contentId"), GapClass.GROUPBUY,
    ),
    DetailEndpoint("ODS_MEMBER", "/api/member/detail", "memberId", True, ("data",), "cards", ("memberId", "cardId")),
)

LIST_BY_TASK = {e.task_code: e for e in LIST_ENDPOINTS}
LIST_BY_PATH = {e.path: e for e in LIST_ENDPOINTS}
DETAIL_BY_PATH = {e.path: e for e in DETAIL_ENDPOINTS}
DETAIL_BY_PARENT = {e.parent_task: e for e in DETAIL_ENDPOINTS}
TASK_CODES = tuple(e.task_code for e in LIST_ENDPOINTS)

DETAIL_DUE_WHEN = {"ODS_MEMBER": (("ODS_MEMBER_CARD", "memberId"),)}
"""Parent task → ``(child task, field naming the parent)``: a child record that is new, changed or deleted makes its
parent's detail due, because the detail holds it (a member's detail holds the member's cards, with the balance and
``lastUseTime``; issue 25 part 6)."""

VOLATILE_FIELDS = {
    "ODS_BILLIARD_TABLE": "currentStatus",
    "ODS_GOODS": "stockQty",
    "ODS_ASSISTANT": "onShift",
    "ODS_COUPON": "issuedCount",
    "ODS_MEMBER": "points",
}
"""Fields that change without bumping ``updateTime`` (upstream-api.md Q11)."""


def list_endpoint(task_code: str) -> ListEndpoint:
    """The §4.1 row of ``task_code``; ``KeyError`` names the valid codes."""
    try:
        return LIST_BY_TASK[task_code]
    except KeyError:
        raise KeyError(f"unknown task code {task_code!r}; expected one of {TASK_CODES}") from None
