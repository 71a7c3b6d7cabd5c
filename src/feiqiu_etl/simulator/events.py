"""Builders for event records (the 12 windowed tasks of upstream-api.md §4.1).

What it is for: one builder per event type with every field of §4.4–§4.7, §4.12, §4.13, §4.15, §4.17–§4.19, §4.21
and §4.22 (the settlement itself, which consists of many of these, is composed in :mod:`.settlement`). Who a
record belongs to travels as a frozen value: :class:`Sale` (its settlement, member and operator), :class:`Payer`
(a payment's member, card and cashier) and :class:`Related` (what a ledger entry is for).

What it must never do: draw randomness from anywhere but ``store.rng``, write ``null`` into a record, or give a
window field a value outside the time it is asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from feiqiu_etl.simulator.state import Record, Store, record
from feiqiu_etl.simulator.values import (
    ZERO,
    cents,
    digits,
    fmt_time,
    masked_voucher,
    money,
    money_sum,
    money_text,
    parse_money,
    staff_member,
    whole_minutes,
)

OPEN_METHODS = ("WECHAT", "ALIPAY", "CASH", "BANK_CARD", "OTHER")
OPEN_WEIGHTS = (50, 25, 15, 6, 4)
REFUND_REASONS = ("客人提前离场", "重复支付", "商品退货（未开封）", "台费计算错误", "服务不满意，协商退款")
RECHARGE_TIERS = (("充500送100", 500, 100), ("充1000送300", 1000, 300), ("", 200, 0), ("", 100, 0), ("充300送50🎁", 300, 50))


@dataclass(frozen=True)
class Sale:
    """The settlement a record belongs to: ``settle_id`` and ``member_id`` (0: none) and the ``operator`` who
    served it ("": one is drawn from the staff). An assistant service names its assistant, not an operator."""

    settle_id: int = 0
    member_id: int = 0
    operator: str = ""


@dataclass(frozen=True)
class Payer:
    """Who a payment is from: ``member_id`` (0: a guest), ``card_id`` (kept only for ``MEMBER_CARD``) and the
    ``cashier`` ("": one is drawn from the staff)."""

    member_id: int = 0
    card_id: str = ""
    cashier: str = ""


@dataclass(frozen=True)
class Related:
    """What a stored-value ledger entry is for: ``kind`` (``SETTLEMENT``, ``RECHARGE``, ``REFUND`` or ""), the
    id of that record as text and a ``remark``."""

    kind: str = ""
    ref: str = ""
    remark: str = ""


NO_SALE = Sale()


# --- table sessions, goods lines, stock, assistant services ---------------------------------------------------

def make_table_use(store: Store, table: Record, begin: datetime, finish: datetime | None, updated: datetime,
                   status: str, sale: Sale = NO_SALE) -> Record:
    """ODS_TABLE_USE record (upstream-api.md §4.7); ``finish=None`` while the table is still running."""
    rng = store.rng
    unit_price = parse_money(table["unitPrice"])
    billing_unit = (1, 15, 30)[table["tableId"] % 3]
    played = whole_minutes((finish or updated) - begin)
    paused = rng.randint(3, 20) if played > 40 and rng.random() < 0.1 else 0
    billed = math.ceil(max(played - paused, 1) / billing_unit) * billing_unit
    min_charge = cents(unit_price / 2) if table["tableId"] % 4 == 0 else ZERO
    amount = max(cents(unit_price * billed / 60), min_charge)
    if status == "CANCELLED":
        billed, amount = 0, ZERO
    pricing = {"ruleName": table["priceRuleName"], "unitPrice": table["unitPrice"],
               "billingUnitMinutes": billing_unit, "minCharge": money(rng, min_charge)}
    return record(
        "useId", store.ids.id64(begin), store.site_id, tableId=table["tableId"], tableName=table["tableName"],
        areaId=table["areaId"], settleId=sale.settle_id, memberId=sale.member_id, beginTime=fmt_time(begin),
        finishTime=fmt_time(finish) if finish else "", billedMinutes=billed, pausedMinutes=paused, pricing=pricing,
        amount=money(rng, amount), status=status, openOperator=sale.operator or staff_member(store.rng)[1],
        updateTime=fmt_time(updated),
    )


def make_goods_line(store: Store, at: datetime, settle_id: int = 0, use_id: int = 0, member_id: int = 0,
                    operator: str = "") -> Record | None:
    """ODS_GOODS_SALE record (upstream-api.md §4.12); ``None`` if the store sells nothing."""
    rng = store.rng
    goods = store.pick("ODS_GOODS", lambda g: g["isOnSale"] == 1) or store.pick("ODS_GOODS")
    if goods is None:
        return None
    qty = 1 if goods["unit"] in ("包", "杯", "份") else rng.choices((1, 2, 3, 4), (60, 25, 10, 5))[0]
    price = goods["memberPrice"] if member_id and goods["memberPrice"] else goods["salePrice"]
    is_gift = 1 if rng.random() < 0.05 else 0
    amount = ZERO if is_gift else parse_money(price) * qty
    return record(
        "lineId", store.ids.id64(at), store.site_id, settleId=settle_id, useId=use_id, memberId=member_id,
        goodsId=goods["goodsId"], goodsName=goods["goodsName"], categoryId=goods["categoryId"], qty=qty,
        unitPrice=price, amount=f"{amount:.2f}" if is_gift else money(rng, amount), discountAmount="0.00",
        isGift=is_gift, status="RETURNED" if rng.random() < 0.03 else "NORMAL",
        operatorName=operator or staff_member(store.rng)[1], createTime=fmt_time(at),
    )


def make_stock_change(store: Store, goods_id: str, at: datetime, change_type: str, qty_change: int,
                      related_no: str = "", remark: str = "", apply: bool = True) -> Record:
    """ODS_INVENTORY_CHANGE record (upstream-api.md §4.13); ``apply`` moves the goods' ``stockQty`` too."""
    goods = store.get("ODS_GOODS", goods_id)
    stock = (goods["stockQty"] if goods else 0) + qty_change
    if goods is not None and apply:
        store.put("ODS_GOODS", {**goods, "stockQty": stock})
    cost = Decimal(str(goods["costPrice"])) if goods else ZERO
    return record(
        "changeId", store.ids.id64(at), store.site_id, goodsId=goods_id,
        goodsName=goods["goodsName"] if goods else "", changeType=change_type, qtyChange=qty_change,
        qtyAfter=stock, unitCost=money(store.rng, cost), relatedNo=related_no, operatorName=staff_member(store.rng)[1],
        remark=remark, createTime=fmt_time(at),
    )


def make_service(store: Store, use: Record | None, begin: datetime, minutes: int, updated: datetime, status: str,
                 sale: Sale = NO_SALE, is_extension: int = 0) -> Record | None:
    """ODS_ASSISTANT_SERVICE record (upstream-api.md §4.15); ``None`` without an active assistant."""
    rng = store.rng
    assistant = store.pick("ODS_ASSISTANT", lambda a: a["status"] == "ACTIVE") or store.pick("ODS_ASSISTANT")
    if assistant is None:
        return None
    unit = parse_money(assistant["hourlyPrice"])
    serving = status == "SERVING"
    billed = 0 if status == "CANCELLED" else minutes
    return record(
        "serviceId", store.ids.id64(begin), store.site_id, assistantId=assistant["assistantId"],
        assistantName=assistant["name"], tableId=use["tableId"] if use else 0, useId=use["useId"] if use else 0,
        settleId=sale.settle_id, memberId=sale.member_id, serviceType="COACHING" if rng.random() < 0.2 else "ACCOMPANY",
        beginTime=fmt_time(begin), finishTime="" if serving else fmt_time(begin + timedelta(minutes=minutes)),
        serviceMinutes=billed, unitPrice=assistant["hourlyPrice"], amount=money(rng, unit * billed / 60),
        isExtension=is_extension, status=status, updateTime=fmt_time(updated),
    )


# --- platform, coupons, payments, ledger ---------------------------------------------------------------------

def make_verification(store: Store, package: Record, at: datetime, settle_id: int = 0, member_id: int = 0,
                      revoked_at: datetime | None = None) -> Record:
    """ODS_GROUP_VERIFICATION record (upstream-api.md §4.17)."""
    rng = store.rng
    douyin = package["platform"] == "DOUYIN"
    sale = parse_money(package["salePrice"])
    extra = {"poiId": digits(rng, 16 if douyin else 9), "skuId": digits(rng, 19 if douyin else 10)}
    if douyin:
        extra["orderSource"] = "抖音团购"
    return record(
        "verifyId", store.ids.id64(at), store.site_id, platform=package["platform"], receiptCode=masked_voucher(rng),
        certificateId=digits(rng, 19) if douyin else "", platformOrderId=digits(rng, 19 if douyin else 16),
        packageId=package["packageId"], packageName=package["packageName"], settleId=settle_id, memberId=member_id,
        salePrice=package["salePrice"],
        merchantReceivable=money(rng, sale * (Decimal("0.95") if douyin else Decimal("0.94"))),
        status="REVOKED" if revoked_at else "VERIFIED", revokeTime=fmt_time(revoked_at) if revoked_at else "",
        operatorName=staff_member(store.rng)[1], extra=extra, verifyTime=fmt_time(at),
    )


def make_coupon_usage(store: Store, coupon: Record, member_id: int, settle_id: int, deduct: Decimal,
                      at: datetime) -> Record:
    """ODS_COUPON_USAGE record (upstream-api.md §4.21)."""
    return record(
        "usageId", store.ids.id64(at), store.site_id, couponId=coupon["couponId"], couponName=coupon["couponName"],
        couponCode=f"CP{digits(store.rng, 12, first_nonzero=False)}", memberId=member_id, settleId=settle_id,
        deductAmount=money(store.rng, deduct), status="USED", useTime=fmt_time(at),
    )


def _channel_trade_no(store: Store, method: str, at: datetime) -> str:
    if method == "WECHAT":
        return "42000" + digits(store.rng, 23, first_nonzero=False)
    if method == "ALIPAY":
        return f"{at:%Y%m%d}2200" + digits(store.rng, 16, first_nonzero=False)
    return ""


def make_payment(store: Store, at: datetime, biz_type: str, biz_id: str, method: str, amount: Decimal,
                 payer: Payer = Payer()) -> Record:
    """ODS_PAYMENT record (upstream-api.md §4.18); ``biz_id`` is the settleId as text or the rechargeNo."""
    created = at - timedelta(seconds=store.rng.randint(1, 90))
    return record(
        "payId", store.ids.id64(at), store.site_id,
        payNo=f"ZF{at:%y%m%d%H%M%S}{store.next_number('payNo', 1) % 10000:04d}",
        channelTradeNo=_channel_trade_no(store, method, at), bizType=biz_type, bizId=biz_id, payMethod=method,
        amount=money(store.rng, amount), memberId=payer.member_id,
        cardId=payer.card_id if method == "MEMBER_CARD" else "", status="SUCCESS",
        cashierName=payer.cashier or staff_member(store.rng)[1], createTime=fmt_time(created), payTime=fmt_time(at),
    )


def make_balance_change(store: Store, card: Record, at: datetime, change_type: str, principal: Decimal,
                        gift: Decimal, related: Related = Related(), apply: bool = True) -> Record:
    """ODS_MEMBER_BALANCE_CHANGE record (upstream-api.md §4.4); ``apply`` also moves the card (and its
    ``updateTime``, which every balance change bumps)."""
    rng = store.rng
    balance = parse_money(card["balance"]) + principal
    gift_balance = parse_money(card["giftBalance"]) + gift
    if apply:
        store.put("ODS_MEMBER_CARD", {**card, "balance": money(rng, balance), "giftBalance": money(rng, gift_balance),
                                      "updateTime": fmt_time(at)})
        if change_type == "CONSUME":
            store.card_last_use[card["cardId"]] = fmt_time(at)
    return record(
        "changeId", store.ids.id64(at), store.site_id, memberId=card["memberId"], cardId=card["cardId"],
        changeType=change_type, amount=money(rng, principal), giftAmount=money(rng, gift),
        balanceAfter=money(rng, balance), giftBalanceAfter=money(rng, gift_balance), relatedType=related.kind,
        relatedId=related.ref, operatorName=staff_member(store.rng)[1], remark=related.remark,
        createTime=fmt_time(at),
    )


def split_card_amount(card: Record, amount: Decimal) -> tuple[Decimal, Decimal]:
    """Split a card payment into (principal, gift) deductions, proportionally to the balances."""
    principal, gift = parse_money(card["balance"]), parse_money(card["giftBalance"])
    total = principal + gift
    gift_part = min(gift, cents(amount * gift / total)) if total > 0 else ZERO
    principal_part = amount - gift_part
    if principal_part > principal:
        principal_part, gift_part = principal, amount - principal
    return principal_part, gift_part


def make_recharge(store: Store, at: datetime, card: Record, emit: bool = True) -> Record:
    """ODS_RECHARGE_ORDER record (upstream-api.md §4.5); with ``emit`` also its payment and ledger entry."""
    rng = store.rng
    activity, amount, gift = rng.choice(RECHARGE_TIERS)
    method = rng.choices(("WECHAT", "ALIPAY", "CASH", "BANK_CARD"), (55, 25, 15, 5))[0]
    operator_id, operator = staff_member(store.rng)
    recharge_no = f"CZ{at:%Y%m%d%H}{store.next_number('rechargeNo', 1):06d}"
    order = record(
        "rechargeNo", recharge_no, store.site_id, memberId=card["memberId"], cardId=card["cardId"],
        amount=money(rng, amount), giftAmount=money(rng, gift), activityName=activity, payMethod=method,
        status="PAID", operatorId=operator_id, operatorName=operator,
        createTime=fmt_time(at - timedelta(seconds=rng.randint(20, 300))), payTime=fmt_time(at),
    )
    if emit:
        store.put("ODS_PAYMENT", make_payment(store, at, "RECHARGE", recharge_no, method, cents(amount),
                                              Payer(card["memberId"], "", operator)))
        store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
            store, card, at, "RECHARGE", cents(amount), cents(gift), Related("RECHARGE", recharge_no, activity)))
    return order


def make_refund(store: Store, at: datetime, payment: Record, finished: datetime | None, emit: bool = True) -> Record:
    """ODS_REFUND record (upstream-api.md §4.19) for ``payment``; with ``emit`` the payment's status and (for card
    payments) the card balance move as well."""
    rng = store.rng
    paid = parse_money(payment["amount"])
    full = rng.random() < 0.5 or paid < 2
    amount = paid if full else cents(paid * Decimal(rng.randint(20, 80)) / 100)
    refund_id = store.ids.id64(at)
    refund = record(
        "refundId", refund_id, store.site_id, refundNo=f"TK{at:%Y%m%d%H%M%S}{store.next_number('refundNo', 1):03d}",
        payId=payment["payId"], bizType=payment["bizType"], bizId=payment["bizId"], payMethod=payment["payMethod"],
        amount=money(rng, amount), reason=rng.choice(REFUND_REASONS),
        status="SUCCESS" if finished else "PROCESSING", operatorName=staff_member(store.rng)[1],
        refundTime=fmt_time(at),
        finishTime=fmt_time(finished) if finished else "",
    )
    if emit:
        store.put("ODS_PAYMENT", {**payment, "status": "REFUNDED" if full else "PART_REFUNDED"})
        card = store.get("ODS_MEMBER_CARD", payment["cardId"]) if payment["cardId"] else None
        if card is not None:
            store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
                store, card, at, "REFUND", amount, ZERO, Related("REFUND", str(refund_id), refund["reason"])))
    return refund


# --- shift handovers ------------------------------------------------------------------------------------------

def make_handover(store: Store, shift_start: datetime, handover_at: datetime, receiver: str) -> Record:
    """ODS_SHIFT_HANDOVER record (upstream-api.md §4.22), summarising the shift's settlements and payments."""
    rng = store.rng
    lo, hi = fmt_time(shift_start), fmt_time(handover_at)
    settlements = [s for s in store.values("ODS_SETTLEMENT") if lo <= s["settleTime"] < hi]
    payments = [p for p in store.values("ODS_PAYMENT") if lo <= p["payTime"] < hi]
    breakdown: dict[str, list] = {}
    for payment in payments:
        entry = breakdown.setdefault(payment["payMethod"], [0, ZERO])
        entry[0] += 1
        entry[1] += parse_money(payment["amount"])
    expected = breakdown.get("CASH", [0, ZERO])[1]
    diff = ZERO if rng.random() < 0.8 else cents(rng.choice((-1, 1)) * rng.uniform(0.5, 20))
    staff_id, staff = staff_member(store.rng)
    return record(
        "handoverId", store.ids.id64(handover_at), store.site_id, staffId=staff_id, staffName=staff,
        receiverName=receiver, shiftStartTime=lo, handoverTime=hi, settleCount=len(settlements),
        totalIncome=money(rng, money_sum(p["amount"] for p in payments)), cashExpected=money(rng, expected),
        cashCounted=money(rng, expected + diff), cashDiff=money_text(diff, trimmed=False),
        payBreakdown=[{"payMethod": m, "count": c, "amount": money(rng, a)} for m, (c, a) in sorted(breakdown.items())],
        remark="" if diff == 0 else rng.choice(("现金短款，已登记", "长款待核实", "找零误差")),
    )
