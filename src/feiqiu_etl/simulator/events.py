"""Builders for event records (the 12 windowed tasks of upstream-api.md §4.1) and the settlement composer.

What it is for: one builder per event type with every field of §4.4–§4.7, §4.12, §4.13, §4.15, §4.17–§4.19, §4.21
and §4.22, and :func:`compose_settlement`, which builds a settlement together with its §5.2 items and (when
``emit``) the table sessions, goods lines, stock movements, assistant services, coupon usages, verifications,
payments and stored-value ledger entries it consists of, so that the money adds up across entities:
TABLE + GOODS + ASSISTANT + DISCOUNT items = ``paidAmount`` = PAYMENT items = the settlement's payments.

What it must never do: draw randomness from anywhere but ``store.rng``, write ``null`` into a record, or give a
window field a value outside the time it is asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from feiqiu_etl.simulator.master import TABLE_TYPES
from feiqiu_etl.simulator.state import Record, Store, record
from feiqiu_etl.simulator.values import (
    REMARKS,
    STAFF,
    ZERO,
    cents,
    digits,
    fmt_time,
    masked_voucher,
    money,
    money_text,
    parse_money,
)

PAY_METHOD_NAMES = {"WECHAT": "微信支付", "ALIPAY": "支付宝支付", "CASH": "现金", "MEMBER_CARD": "会员卡支付",
                    "GROUPBUY": "团购券抵扣", "BANK_CARD": "银行卡", "OTHER": "其他支付"}
OPEN_METHODS = ("WECHAT", "ALIPAY", "CASH", "BANK_CARD", "OTHER")
OPEN_WEIGHTS = (50, 25, 15, 6, 4)
REFUND_REASONS = ("客人提前离场", "重复支付", "商品退货（未开封）", "台费计算错误", "服务不满意，协商退款")
RECHARGE_TIERS = (("充500送100", 500, 100), ("充1000送300", 1000, 300), ("", 200, 0), ("", 100, 0), ("充300送50🎁", 300, 50))


@dataclass
class SettlementPlan:
    """What one settlement consists of (counts and switches chosen by the day planner)."""

    goods_lines: int = 0
    services: int = 0
    verification: bool = False
    coupon: bool = False
    card_payment: bool = False
    extra_table: bool = False
    member: bool = False


def _staff(store: Store) -> tuple[int, str]:
    index = store.rng.randrange(len(STAFF))
    return 11 + index, STAFF[index]


def _minutes(delta: timedelta) -> int:
    return max(int(delta.total_seconds() // 60), 0)


def _money_sum(values) -> Decimal:
    return sum((parse_money(v) for v in values), ZERO)


# --- table sessions, goods lines, stock, assistant services ---------------------------------------------------

def make_table_use(store: Store, table: Record, begin: datetime, finish: datetime | None, updated: datetime,
                   status: str, settle_id: int = 0, member_id: int = 0, operator: str = "") -> Record:
    """ODS_TABLE_USE record (upstream-api.md §4.7); ``finish=None`` while the table is still running."""
    rng = store.rng
    unit_price = parse_money(table["unitPrice"])
    billing_unit = (1, 15, 30)[table["tableId"] % 3]
    played = _minutes((finish or updated) - begin)
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
        areaId=table["areaId"], settleId=settle_id, memberId=member_id, beginTime=fmt_time(begin),
        finishTime=fmt_time(finish) if finish else "", billedMinutes=billed, pausedMinutes=paused, pricing=pricing,
        amount=money(rng, amount), status=status, openOperator=operator or _staff(store)[1],
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
        operatorName=operator or _staff(store)[1], createTime=fmt_time(at),
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
        qtyAfter=stock, unitCost=money(store.rng, cost), relatedNo=related_no, operatorName=_staff(store)[1],
        remark=remark, createTime=fmt_time(at),
    )


def make_service(store: Store, use: Record | None, begin: datetime, minutes: int, updated: datetime, status: str,
                 settle_id: int = 0, member_id: int = 0, is_extension: int = 0) -> Record | None:
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
        settleId=settle_id, memberId=member_id, serviceType="COACHING" if rng.random() < 0.2 else "ACCOMPANY",
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
        operatorName=_staff(store)[1], extra=extra, verifyTime=fmt_time(at),
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
                 member_id: int = 0, card_id: str = "", cashier: str = "") -> Record:
    """ODS_PAYMENT record (upstream-api.md §4.18); ``biz_id`` is the settleId as text or the rechargeNo."""
    created = at - timedelta(seconds=store.rng.randint(1, 90))
    return record(
        "payId", store.ids.id64(at), store.site_id,
        payNo=f"ZF{at:%y%m%d%H%M%S}{store.next_number('payNo', 1) % 10000:04d}",
        channelTradeNo=_channel_trade_no(store, method, at), bizType=biz_type, bizId=biz_id, payMethod=method,
        amount=money(store.rng, amount), memberId=member_id, cardId=card_id if method == "MEMBER_CARD" else "",
        status="SUCCESS", cashierName=cashier or _staff(store)[1], createTime=fmt_time(created), payTime=fmt_time(at),
    )


def make_balance_change(store: Store, card: Record, at: datetime, change_type: str, principal: Decimal,
                        gift: Decimal, related_type: str = "", related_id: str = "", remark: str = "",
                        apply: bool = True) -> Record:
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
        balanceAfter=money(rng, balance), giftBalanceAfter=money(rng, gift_balance), relatedType=related_type,
        relatedId=related_id, operatorName=_staff(store)[1], remark=remark, createTime=fmt_time(at),
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
    operator_id, operator = _staff(store)
    recharge_no = f"CZ{at:%Y%m%d%H}{store.next_number('rechargeNo', 1):06d}"
    order = record(
        "rechargeNo", recharge_no, store.site_id, memberId=card["memberId"], cardId=card["cardId"],
        amount=money(rng, amount), giftAmount=money(rng, gift), activityName=activity, payMethod=method,
        status="PAID", operatorId=operator_id, operatorName=operator,
        createTime=fmt_time(at - timedelta(seconds=rng.randint(20, 300))), payTime=fmt_time(at),
    )
    if emit:
        store.put("ODS_PAYMENT", make_payment(store, at, "RECHARGE", recharge_no, method, cents(amount),
                                              card["memberId"], "", operator))
        store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
            store, card, at, "RECHARGE", cents(amount), cents(gift), "RECHARGE", recharge_no, activity))
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
        status="SUCCESS" if finished else "PROCESSING", operatorName=_staff(store)[1], refundTime=fmt_time(at),
        finishTime=fmt_time(finished) if finished else "",
    )
    if emit:
        store.put("ODS_PAYMENT", {**payment, "status": "REFUNDED" if full else "PART_REFUNDED"})
        card = store.get("ODS_MEMBER_CARD", payment["cardId"]) if payment["cardId"] else None
        if card is not None:
            store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
                store, card, at, "REFUND", amount, ZERO, "REFUND", str(refund_id), refund["reason"]))
    return refund


# --- settlements -------------------------------------------------------------------------------------------

class _Items:
    """Collects the §5.2 line items of one settlement."""

    def __init__(self, store: Store, settle_id: int, at: datetime) -> None:
        self.store, self.settle_id, self.at, self.rows = store, settle_id, at, []

    def add(self, kind: str, ref: int | str, name: str, qty: int, unit_price: str, amount: Decimal | str,
            source: str = "", method: str = "") -> None:
        text = amount if isinstance(amount, str) else money(self.store.rng, amount)
        self.rows.append({
            "itemId": self.store.ids.id64(self.at), "settleId": self.settle_id, "itemType": kind,
            "refId": str(ref) if ref else "", "itemName": name, "qty": qty, "unitPrice": unit_price,
            "amount": text, "discountSource": source, "payMethod": method, "sortNo": len(self.rows) + 1,
        })


def _choose_member(store: Store, plan: SettlementPlan, card_pool: list[str]) -> tuple[int, Record | None]:
    rng = store.rng
    if plan.card_payment:
        for _ in range(6):
            card = store.get("ODS_MEMBER_CARD", rng.choice(card_pool)) if card_pool else None
            if card and card["status"] == 1 and parse_money(card["balance"]) + parse_money(card["giftBalance"]) > 0:
                return card["memberId"], card
    if plan.member or plan.coupon or plan.card_payment:
        member = store.get("ODS_MEMBER", store.random_key("ODS_MEMBER"))
        if member is not None:
            cards = store.cards_of(member["memberId"])
            return member["memberId"], (cards[0] if cards else None)
    return 0, None


def _table_sessions(store: Store, settle_at: datetime, settle_id: int, member_id: int, two: bool,
                    operator: str) -> list[Record]:
    rng = store.rng
    tables = store.values("ODS_BILLIARD_TABLE")
    tables = [t for t in tables if t["enabled"] == 1] or tables
    chosen = rng.sample(tables, 2 if two and len(tables) > 1 else 1)
    end = max(settle_at - timedelta(minutes=rng.randint(0, 6)), store.start)
    begin = max(end - timedelta(minutes=rng.randint(40, 240)), store.start)
    cuts = [begin, begin + (end - begin) * rng.uniform(0.3, 0.7), end] if len(chosen) == 2 else [begin, end]
    return [make_table_use(store, table, cuts[i].replace(microsecond=0), cuts[i + 1].replace(microsecond=0),
                           settle_at, "SETTLED", settle_id, member_id, operator)
            for i, table in enumerate(chosen)]


def _discounts(store: Store, items: _Items, plan: SettlementPlan, member_id: int, table_amount: Decimal,
               receivable: Decimal, settle_id: int, at: datetime, emit: bool) -> Decimal:
    """Add member/coupon/manual DISCOUNT items; return the discount total (excluding rounding)."""
    rng = store.rng
    total = ZERO
    member = store.get("ODS_MEMBER", member_id) if member_id else None
    rate = Decimal(member["level"]["discountRate"]) if member else Decimal(1)
    if rate < 1 and table_amount > 0:
        amount = cents(table_amount * (1 - rate))
        label = f"{rate * 100:.0f}"
        label = label.rstrip("0") if label.endswith("0") else label  # 0.80 -> "8折" (八折), 0.88 -> "88折"
        items.add("DISCOUNT", "", f"会员{label}折（台费）", 1, "", -amount, "MEMBER_DISCOUNT")
        total += amount
    coupon = store.pick("ODS_COUPON", lambda c: c["status"] == "ACTIVE") if plan.coupon and member_id else None
    if coupon is not None and parse_money(coupon["minSpend"]) <= receivable:
        if coupon["couponType"] == "DISCOUNT":
            deduct = cents(table_amount * (1 - Decimal(coupon["discountRate"])))
        else:
            deduct = min(parse_money(coupon["faceValue"]), table_amount)
        deduct = min(deduct, receivable - total - 1)
        if deduct > 0:
            usage = make_coupon_usage(store, coupon, member_id, settle_id, deduct, at)
            if emit:
                store.put("ODS_COUPON_USAGE", usage)
            items.add("DISCOUNT", usage["usageId"], coupon["couponName"], 1, "", -deduct, "COUPON")
            total += deduct
    if rng.random() < 0.05 and receivable - total > 20:
        amount = cents(rng.choice((5, 8.8, 10)))
        items.add("DISCOUNT", "", rng.choice(("店长优惠", "老客优惠（手工）", "生日优惠🎂")), 1, "", -amount, "MANUAL")
        total += amount
    return total


def _payments(store: Store, items: _Items, plan: SettlementPlan, paid: Decimal, member_id: int,
              card: Record | None, settle_id: int, at: datetime, cashier: str, emit: bool) -> list[Record]:
    rng = store.rng
    parts: list[tuple[str, Decimal]] = []
    remaining = paid
    package = store.pick("ODS_GROUP_PACKAGE", lambda p: p["status"] == "ON_SALE") if plan.verification else None
    if package is not None:
        amount = min(parse_money(package["salePrice"]), remaining)
        if emit:
            begin = at - timedelta(minutes=rng.randint(30, 180))
            store.put("ODS_GROUP_VERIFICATION",
                      make_verification(store, package, max(begin, store.start), settle_id, member_id))
        parts.append(("GROUPBUY", amount))
        remaining -= amount
    usable_card = card is not None and card["cardKind"] == "STORED_VALUE" and card["status"] == 1
    if remaining > 0 and plan.card_payment and usable_card:
        available = parse_money(card["balance"]) + parse_money(card["giftBalance"])
        amount = min(remaining, available)
        if amount > 0:
            parts.append(("MEMBER_CARD", amount))
            remaining -= amount
    if remaining > 0:
        if rng.random() < 0.1 and remaining > 10:
            first = cents(remaining * Decimal(rng.randint(30, 70)) / 100)
            parts.append((rng.choices(OPEN_METHODS, OPEN_WEIGHTS)[0], first))
            remaining -= first
        parts.append((rng.choices(OPEN_METHODS, OPEN_WEIGHTS)[0], remaining))
    payments = []
    for method, amount in parts:
        card_id = card["cardId"] if method == "MEMBER_CARD" and card else ""
        payment = make_payment(store, at, "SETTLEMENT", str(settle_id), method, amount, member_id, card_id, cashier)
        payments.append(payment)
        items.add("PAYMENT", payment["payId"], PAY_METHOD_NAMES[method], 1, "", payment["amount"], method=method)
        if emit:
            store.put("ODS_PAYMENT", payment)
            if method == "MEMBER_CARD" and card is not None:
                principal, gift = split_card_amount(card, amount)
                store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
                    store, card, at, "CONSUME", -principal, -gift, "SETTLEMENT", str(settle_id)))
    return payments


def _pay_methods(store: Store, payments: list[Record]) -> list[Record]:
    totals: dict[str, Decimal] = {}
    for payment in payments:
        totals[payment["payMethod"]] = totals.get(payment["payMethod"], ZERO) + parse_money(payment["amount"])
    return [{"payMethod": method, "amount": money(store.rng, amount)} for method, amount in totals.items()]


def compose_settlement(store: Store, settle_at: datetime, plan: SettlementPlan, emit: bool = True,
                       card_pool: list[str] | None = None) -> tuple[Record, list[Record]]:
    """A settlement (upstream-api.md §4.6) and its §5.2 items, consistent by construction.

    With ``emit`` every record it consists of is stored as well (table sessions, goods lines and their stock
    movements, assistant services, coupon usage, verification, payments, card ledger entries); without it only
    the settlement and its items are returned (``Dataset.insert``), their ``refId`` values then point nowhere.
    """
    rng = store.rng
    settle_id = store.ids.id64(settle_at)
    member_id, card = _choose_member(store, plan, card_pool or [])
    cashier_id, cashier = _staff(store)
    items = _Items(store, settle_id, settle_at)
    uses = _table_sessions(store, settle_at, settle_id, member_id, plan.extra_table, cashier)
    for use in uses:
        table = store.get("ODS_BILLIARD_TABLE", use["tableId"])
        kind = TABLE_TYPES.get(table["tableType"], "") if table else ""
        items.add("TABLE", use["useId"], f"{use['tableName']} {kind}".strip(), use["billedMinutes"],
                  use["pricing"]["unitPrice"], use["amount"])
    table_amount = _money_sum(u["amount"] for u in uses)
    begin = datetime.strptime(uses[0]["beginTime"], "%Y-%m-%d %H:%M:%S")
    goods_amount = _goods(store, items, plan, uses, begin, settle_at, settle_id, member_id, cashier, emit)
    assistant_amount = _services(store, items, plan, uses, begin, settle_at, settle_id, member_id, emit)
    receivable = table_amount + goods_amount + assistant_amount
    discount = _discounts(store, items, plan, member_id, table_amount, receivable, settle_id, settle_at, emit)
    after = receivable - discount
    rounding = after - int(after) if rng.random() < 0.7 and after > 1 else ZERO
    if rounding > 0:
        items.add("DISCOUNT", "", "抹零", 1, "", -rounding, "ROUNDING")
    paid = after - rounding
    payments = _payments(store, items, plan, paid, member_id, card, settle_id, settle_at, cashier, emit)
    if emit:
        for use in uses:
            store.put("ODS_TABLE_USE", use)
    card_used = next((p["cardId"] for p in payments if p["cardId"]), "")
    header = record(
        "settleId", settle_id, store.site_id,
        settleNo=f"JZ{settle_at:%y%m%d}{store.next_number(f'settleNo:{settle_at:%y%m%d}', 1):06d}",
        tableIds=[u["tableId"] for u in uses], memberId=member_id,
        memberCardId=card_used or (card["cardId"] if card is not None and rng.random() < 0.3 else ""),
        tableAmount=money(rng, table_amount), goodsAmount=money(rng, goods_amount),
        assistantAmount=money(rng, assistant_amount), receivableAmount=money(rng, receivable),
        discountAmount=money_text(discount, trimmed=False), roundingAmount=money_text(rounding, trimmed=False),
        paidAmount=money(rng, paid), payMethods=_pay_methods(store, payments), status=1, cashierId=cashier_id,
        cashierName=cashier, guestCount=rng.randint(1, 6), remark=rng.choice(REMARKS), createTime=uses[0]["beginTime"],
        settleTime=fmt_time(settle_at), updateTime=fmt_time(settle_at),
    )
    return header, items.rows


def _goods(store: Store, items: _Items, plan: SettlementPlan, uses: list[Record], begin: datetime,
           end: datetime, settle_id: int, member_id: int, cashier: str, emit: bool) -> Decimal:
    total = ZERO
    for _ in range(plan.goods_lines):
        at = begin + (end - begin) * store.rng.random()
        use_id = store.rng.choice(uses)["useId"] if store.rng.random() < 0.9 else 0
        line = make_goods_line(store, at.replace(microsecond=0), settle_id, use_id, member_id, cashier)
        if line is None:
            continue
        if emit:
            store.put("ODS_GOODS_SALE", line)
            _line_stock(store, line, at)
        if line["status"] == "NORMAL":
            total += parse_money(line["amount"])
            items.add("GOODS", line["lineId"], line["goodsName"], line["qty"], line["unitPrice"], line["amount"])
    return total


def _line_stock(store: Store, line: Record, at: datetime) -> None:
    goods = store.get("ODS_GOODS", line["goodsId"])
    at = at.replace(microsecond=0)
    if goods is not None and goods["stockQty"] < line["qty"]:
        store.put("ODS_INVENTORY_CHANGE", make_stock_change(
            store, goods["goodsId"], at, "PURCHASE", 48, f"CG{at:%Y%m%d}{store.next_number('purchase', 1):04d}",
            "库存不足，紧急补货"))
    store.put("ODS_INVENTORY_CHANGE",
              make_stock_change(store, line["goodsId"], at, "SALE", -line["qty"], str(line["lineId"])))
    if line["status"] == "RETURNED":
        store.put("ODS_INVENTORY_CHANGE", make_stock_change(
            store, line["goodsId"], at + timedelta(minutes=2), "RETURN", line["qty"], str(line["lineId"]), "客人退货"))


def _services(store: Store, items: _Items, plan: SettlementPlan, uses: list[Record], begin: datetime,
              end: datetime, settle_id: int, member_id: int, emit: bool) -> Decimal:
    total = ZERO
    start = begin
    for index in range(plan.services):
        span = _minutes(end - start)
        if span < 30:
            break
        minutes = min(store.rng.choice((60, 60, 90, 120)), span // 30 * 30)
        service = make_service(store, uses[0], start, minutes, end, "SETTLED", settle_id, member_id,
                               1 if index else 0)
        if service is None:
            break
        if emit:
            store.put("ODS_ASSISTANT_SERVICE", service)
        assistant = store.get("ODS_ASSISTANT", service["assistantId"])
        level = f"（{assistant['levelName']}）" if assistant else ""
        items.add("ASSISTANT", service["serviceId"], f"助教 {service['assistantName']}{level}", minutes,
                  service["unitPrice"], service["amount"])
        total += parse_money(service["amount"])
        start += timedelta(minutes=minutes)
    return total


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
    staff_id, staff = _staff(store)
    return record(
        "handoverId", store.ids.id64(handover_at), store.site_id, staffId=staff_id, staffName=staff,
        receiverName=receiver, shiftStartTime=lo, handoverTime=hi, settleCount=len(settlements),
        totalIncome=money(rng, _money_sum(p["amount"] for p in payments)), cashExpected=money(rng, expected),
        cashCounted=money(rng, expected + diff), cashDiff=money_text(diff, trimmed=False),
        payBreakdown=[{"payMethod": m, "count": c, "amount": money(rng, a)} for m, (c, a) in sorted(breakdown.items())],
        remark="" if diff == 0 else rng.choice(("现金短款，已登记", "长款待核实", "找零误差")),
    )
