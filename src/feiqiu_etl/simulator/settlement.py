"""The settlement composer: one settlement (upstream-api.md §4.6) with its §5.2 items and everything it consists of.

What it is for: :func:`compose_settlement` builds a settlement together with its §5.2 items and (when ``emit``)
the table sessions, goods lines, stock movements, assistant services, coupon usages, verifications, payments and
stored-value ledger entries it consists of (the builders of :mod:`.events`), so that the money adds up across
entities: TABLE + GOODS + ASSISTANT + DISCOUNT items = ``paidAmount`` = PAYMENT items = the settlement's payments.

What it must never do: let the items, the header and the payments of a settlement disagree by a cent, draw
randomness from anywhere but ``store.rng``, or change the order of its draws (the data of a seed is fixed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from feiqiu_etl.simulator.events import (
    OPEN_METHODS,
    OPEN_WEIGHTS,
    Payer,
    Related,
    Sale,
    make_balance_change,
    make_coupon_usage,
    make_goods_line,
    make_payment,
    make_service,
    make_stock_change,
    make_table_use,
    make_verification,
    split_card_amount,
)
from feiqiu_etl.simulator.master import TABLE_TYPES
from feiqiu_etl.simulator.state import Record, Store, record
from feiqiu_etl.simulator.values import (
    REMARKS,
    ZERO,
    cents,
    fmt_time,
    money,
    money_sum,
    money_text,
    parse_money,
    staff_member,
    whole_minutes,
)

PAY_METHOD_NAMES = {"WECHAT": "微信支付", "ALIPAY": "支付宝支付", "CASH": "现金", "MEMBER_CARD": "会员卡支付",
                    "GROUPBUY": "团购券抵扣", "BANK_CARD": "银行卡", "OTHER": "其他支付"}


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


@dataclass(frozen=True)
class _Settling:
    """One settlement being composed: its store, plan and items, id and time, member and card, cashier, and
    whether the records it consists of are stored (``emit``)."""

    store: Store
    plan: SettlementPlan
    items: _Items
    settle_id: int
    at: datetime
    member_id: int
    card: Record | None
    cashier: str
    emit: bool

    @property
    def sale(self) -> Sale:
        return Sale(self.settle_id, self.member_id, self.cashier)


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


def _table_sessions(store: Store, settle_at: datetime, sale: Sale, two: bool) -> list[Record]:
    rng = store.rng
    tables = store.values("ODS_BILLIARD_TABLE")
    tables = [t for t in tables if t["enabled"] == 1] or tables
    chosen = rng.sample(tables, 2 if two and len(tables) > 1 else 1)
    end = max(settle_at - timedelta(minutes=rng.randint(0, 6)), store.start)
    begin = max(end - timedelta(minutes=rng.randint(40, 240)), store.start)
    cuts = [begin, begin + (end - begin) * rng.uniform(0.3, 0.7), end] if len(chosen) == 2 else [begin, end]
    return [make_table_use(store, table, cuts[i].replace(microsecond=0), cuts[i + 1].replace(microsecond=0),
                           settle_at, "SETTLED", sale)
            for i, table in enumerate(chosen)]


def _discounts(s: _Settling, table_amount: Decimal, receivable: Decimal) -> Decimal:
    """Add member/coupon/manual DISCOUNT items; return the discount total (excluding rounding)."""
    store, items, rng = s.store, s.items, s.store.rng
    total = ZERO
    member = store.get("ODS_MEMBER", s.member_id) if s.member_id else None
    rate = Decimal(member["level"]["discountRate"]) if member else Decimal(1)
    if rate < 1 and table_amount > 0:
        amount = cents(table_amount * (1 - rate))
        label = f"{rate * 100:.0f}"
        label = label.rstrip("0") if label.endswith("0") else label  # 0.80 -> "8折" (八折), 0.88 -> "88折"
        items.add("DISCOUNT", "", f"会员{label}折（台费）", 1, "", -amount, "MEMBER_DISCOUNT")
        total += amount
    active = store.pick("ODS_COUPON", lambda c: c["status"] == "ACTIVE") if s.plan.coupon and s.member_id else None
    if active is not None and parse_money(active["minSpend"]) <= receivable:
        total += _coupon(s, active, table_amount, receivable - total - 1)
    if rng.random() < 0.05 and receivable - total > 20:
        amount = cents(rng.choice((5, 8.8, 10)))
        items.add("DISCOUNT", "", rng.choice(("店长优惠", "老客优惠（手工）", "生日优惠🎂")), 1, "", -amount, "MANUAL")
        total += amount
    return total


def _coupon(s: _Settling, coupon: Record, table_amount: Decimal, most: Decimal) -> Decimal:
    """Use ``coupon`` for at most ``most``: its usage (stored with ``emit``) and COUPON item; the deduction."""
    if coupon["couponType"] == "DISCOUNT":
        deduct = cents(table_amount * (1 - Decimal(coupon["discountRate"])))
    else:
        deduct = min(parse_money(coupon["faceValue"]), table_amount)
    deduct = min(deduct, most)
    if deduct <= 0:
        return ZERO
    usage = make_coupon_usage(s.store, coupon, s.member_id, s.settle_id, deduct, s.at)
    if s.emit:
        s.store.put("ODS_COUPON_USAGE", usage)
    s.items.add("DISCOUNT", usage["usageId"], coupon["couponName"], 1, "", -deduct, "COUPON")
    return deduct


def _payment_parts(s: _Settling, paid: Decimal) -> list[tuple[str, Decimal]]:
    """How ``paid`` is split between methods: a group-buy voucher (its verification stored with ``emit``), the
    member's stored-value card, then one or two open methods."""
    store, card, rng = s.store, s.card, s.store.rng
    parts: list[tuple[str, Decimal]] = []
    remaining = paid
    package = store.pick("ODS_GROUP_PACKAGE", lambda p: p["status"] == "ON_SALE") if s.plan.verification else None
    if package is not None:
        amount = min(parse_money(package["salePrice"]), remaining)
        if s.emit:
            begin = s.at - timedelta(minutes=rng.randint(30, 180))
            store.put("ODS_GROUP_VERIFICATION",
                      make_verification(store, package, max(begin, store.start), s.settle_id, s.member_id))
        parts.append(("GROUPBUY", amount))
        remaining -= amount
    usable_card = card is not None and card["cardKind"] == "STORED_VALUE" and card["status"] == 1
    if remaining > 0 and s.plan.card_payment and usable_card:
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
    return parts


def _payments(s: _Settling, paid: Decimal) -> list[Record]:
    """The settlement's payments and PAYMENT items; with ``emit`` the payments and card ledger entries stored."""
    store, card = s.store, s.card
    payments = []
    for method, amount in _payment_parts(s, paid):
        card_id = card["cardId"] if method == "MEMBER_CARD" and card else ""
        payment = make_payment(store, s.at, "SETTLEMENT", str(s.settle_id), method, amount,
                               Payer(s.member_id, card_id, s.cashier))
        payments.append(payment)
        s.items.add("PAYMENT", payment["payId"], PAY_METHOD_NAMES[method], 1, "", payment["amount"], method=method)
        if s.emit:
            store.put("ODS_PAYMENT", payment)
            if method == "MEMBER_CARD" and card is not None:
                principal, gift = split_card_amount(card, amount)
                store.put("ODS_MEMBER_BALANCE_CHANGE", make_balance_change(
                    store, card, s.at, "CONSUME", -principal, -gift, Related("SETTLEMENT", str(s.settle_id))))
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
    cashier_id, cashier = staff_member(store.rng)
    s = _Settling(store, plan, _Items(store, settle_id, settle_at), settle_id, settle_at, member_id, card, cashier,
                  emit)
    uses = _table_sessions(store, settle_at, s.sale, plan.extra_table)
    for use in uses:
        table = store.get("ODS_BILLIARD_TABLE", use["tableId"])
        kind = TABLE_TYPES.get(table["tableType"], "") if table else ""
        s.items.add("TABLE", use["useId"], f"{use['tableName']} {kind}".strip(), use["billedMinutes"],
                    use["pricing"]["unitPrice"], use["amount"])
    table_amount = money_sum(u["amount"] for u in uses)
    begin = datetime.strptime(uses[0]["beginTime"], "%Y-%m-%d %H:%M:%S")
    goods_amount = _goods(s, uses, begin)
    assistant_amount = _services(s, uses, begin)
    receivable = table_amount + goods_amount + assistant_amount
    discount = _discounts(s, table_amount, receivable)
    after = receivable - discount
    rounding = after - int(after) if rng.random() < 0.7 and after > 1 else ZERO
    if rounding > 0:
        s.items.add("DISCOUNT", "", "抹零", 1, "", -rounding, "ROUNDING")
    paid = after - rounding
    payments = _payments(s, paid)
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
    return header, s.items.rows


def _goods(s: _Settling, uses: list[Record], begin: datetime) -> Decimal:
    """The plan's goods lines, sold between ``begin`` and the settlement (stored with their stock movements with
    ``emit``), and their GOODS items; the total of the lines not returned."""
    store, end = s.store, s.at
    total = ZERO
    for _ in range(s.plan.goods_lines):
        at = begin + (end - begin) * store.rng.random()
        use_id = store.rng.choice(uses)["useId"] if store.rng.random() < 0.9 else 0
        line = make_goods_line(store, at.replace(microsecond=0), s.settle_id, use_id, s.member_id, s.cashier)
        if line is None:
            continue
        if s.emit:
            store.put("ODS_GOODS_SALE", line)
            _line_stock(store, line, at)
        if line["status"] == "NORMAL":
            total += parse_money(line["amount"])
            s.items.add("GOODS", line["lineId"], line["goodsName"], line["qty"], line["unitPrice"], line["amount"])
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


def _services(s: _Settling, uses: list[Record], begin: datetime) -> Decimal:
    """The plan's assistant services, back to back from ``begin`` at the first table (stored with ``emit``), and
    their ASSISTANT items; their total."""
    store, end = s.store, s.at
    total = ZERO
    start = begin
    for index in range(s.plan.services):
        span = whole_minutes(end - start)
        if span < 30:
            break
        minutes = min(store.rng.choice((60, 60, 90, 120)), span // 30 * 30)
        service = make_service(store, uses[0], start, minutes, end, "SETTLED", Sale(s.settle_id, s.member_id),
                               1 if index else 0)
        if service is None:
            break
        if s.emit:
            store.put("ODS_ASSISTANT_SERVICE", service)
        assistant = store.get("ODS_ASSISTANT", service["assistantId"])
        level = f"（{assistant['levelName']}）" if assistant else ""
        s.items.add("ASSISTANT", service["serviceId"], f"助教 {service['assistantName']}{level}", minutes,
                    service["unitPrice"], service["amount"])
        total += parse_money(service["amount"])
        start += timedelta(minutes=minutes)
    return total
