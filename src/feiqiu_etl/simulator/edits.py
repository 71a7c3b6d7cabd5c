"""Realistic changes to existing records, and new records for ``Dataset.insert`` (upstream-api.md Q11–Q13).

What it is for: one edit rule per task that changes a tracked field (or an event's status) the way the back office
would — a member's level, a goods price, a settlement reopened, a voucher revoked (keeping its ``verifyTime``,
Q13), a refund completed (keeping its ``refundTime``) — plus one inserter per task that creates a new record whose
window field is "now". Volatile fields (Q11) are changed only by :func:`touch_volatile`.

What it must never do: modify a stored record in place (it returns new dicts; ``Dataset`` stores them), touch a
record of another task (so mutation counts stay predictable), or bump ``updateTime`` (``Dataset`` decides that).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

from feiqiu_etl.simulator.catalog import VOLATILE_FIELDS
from feiqiu_etl.simulator.events import (
    OPEN_METHODS,
    Payer,
    Related,
    make_balance_change,
    make_coupon_usage,
    make_goods_line,
    make_handover,
    make_payment,
    make_recharge,
    make_refund,
    make_service,
    make_stock_change,
    make_table_use,
    make_verification,
)
from feiqiu_etl.simulator.master import (
    ASSISTANT_LEVELS,
    MEMBER_LEVELS,
    make_area,
    make_assistant,
    make_card,
    make_category,
    make_coupon,
    make_goods,
    make_member,
    make_package,
    make_table,
)
from feiqiu_etl.simulator.settlement import SettlementPlan, compose_settlement
from feiqiu_etl.simulator.state import Record, Store
from feiqiu_etl.simulator.values import NICKNAMES, STAFF, cents, fmt_date, fmt_time, money, parse_money

Edit = Callable[[Store, Record, datetime], Record]


def _other(rng, options, current):
    choices = [o for o in options if o != current]
    return rng.choice(choices) if choices else current


def _bump_money(store: Store, text: str, step: int = 5) -> str:
    value = parse_money(text) + store.rng.choice((-step, step, step * 2))
    return money(store.rng, max(value, Decimal(1)))


def _suffix(store: Store, text: str) -> str:
    return f"{text}（{store.rng.choice(('新', '升级版', '调整', '2号', '停用前'))}）"


def _toggle(value: int) -> int:
    return 0 if value else 1


def _edit_member(store: Store, r: Record, now: datetime) -> Record:
    rng = store.rng
    field = rng.choice(("nickname", "level", "status", "name", "mobile"))
    if field == "nickname":
        return {**r, "nickname": _other(rng, NICKNAMES + ("改名了😎",), r["nickname"])}
    if field == "level":
        level_id, name, rate = _other(rng, MEMBER_LEVELS, (r["level"]["levelId"], r["level"]["levelName"],
                                                         r["level"]["discountRate"]))
        return {**r, "level": {"levelId": level_id, "levelName": name, "discountRate": rate}}
    if field == "status":
        return {**r, "status": 2 if r["status"] == 1 else 1}
    if field == "name":
        return {**r, "name": _other(rng, (store.faker.name(), ""), r["name"])}
    return {**r, "mobile": f"{r['mobile'][:3]}****{rng.randrange(10000):04d}"}


def _edit_card(store: Store, r: Record, now: datetime) -> Record:
    field = store.rng.choice(("status", "expireDate", "discountRate"))
    if field == "status":
        return {**r, "status": 2 if r["status"] == 1 else 1}
    if field == "expireDate":
        return {**r, "expireDate": fmt_date(now + timedelta(days=store.rng.randint(180, 720)))}
    return {**r, "discountRate": _other(store.rng, ("", "0.88", "0.90", "0.95"), r["discountRate"])}


def _edit_table(store: Store, r: Record, now: datetime) -> Record:
    field = store.rng.choice(("unitPrice", "priceRuleName", "enabled"))
    if field == "unitPrice":
        return {**r, "unitPrice": _bump_money(store, r["unitPrice"])}
    if field == "priceRuleName":
        return {**r, "priceRuleName": _other(store.rng, ("夜场价（22:00后）", "会员日特价", "节假日价"), r["priceRuleName"])}
    return {**r, "enabled": _toggle(r["enabled"])}


def _edit_area(store: Store, r: Record, now: datetime) -> Record:
    if store.rng.random() < 0.5:
        return {**r, "enabled": _toggle(r["enabled"])}
    return {**r, "areaName": _suffix(store, r["areaName"])}


def _edit_goods(store: Store, r: Record, now: datetime) -> Record:
    rng = store.rng
    field = rng.choice(("salePrice", "goodsName", "memberPrice", "isOnSale", "costPrice"))
    if field == "salePrice":
        return {**r, "salePrice": _bump_money(store, r["salePrice"], 1)}
    if field == "goodsName":
        return {**r, "goodsName": _suffix(store, r["goodsName"])}
    if field == "memberPrice":
        price = "" if r["memberPrice"] else money(rng, parse_money(r["salePrice"]) * Decimal("0.9"))
        return {**r, "memberPrice": price}
    if field == "isOnSale":
        return {**r, "isOnSale": _toggle(r["isOnSale"])}
    return {**r, "costPrice": round(r["costPrice"] + rng.choice((-0.5, 0.3, 0.8)), 1) or 0.1}


def _edit_category(store: Store, r: Record, now: datetime) -> Record:
    if store.rng.random() < 0.5:
        return {**r, "enabled": _toggle(r["enabled"])}
    return {**r, "categoryName": _suffix(store, r["categoryName"])}


def _edit_assistant(store: Store, r: Record, now: datetime) -> Record:
    rng = store.rng
    field = rng.choice(("level", "name", "status"))
    if field == "level":
        level, price = rng.choice([lv for lv in ASSISTANT_LEVELS if lv[0] != r["levelName"]])
        return {**r, "levelName": level, "hourlyPrice": money(rng, price)}
    if field == "name":
        return {**r, "name": f"{r['name']}🎱" if "🎱" not in r["name"] else r["name"].replace("🎱", "")}
    status = "LEFT" if r["status"] == "ACTIVE" else "ACTIVE"
    return {**r, "status": status, "onShift": 0 if status == "LEFT" else r["onShift"]}


def _edit_package(store: Store, r: Record, now: datetime) -> Record:
    field = store.rng.choice(("salePrice", "status", "packageName", "saleEndDate"))
    if field == "salePrice":
        return {**r, "salePrice": _bump_money(store, r["salePrice"], 2)}
    if field == "status":
        return {**r, "status": "OFF_SALE" if r["status"] == "ON_SALE" else "ON_SALE"}
    if field == "packageName":
        return {**r, "packageName": _suffix(store, r["packageName"])}
    end = "" if r["saleEndDate"] else fmt_date(now + timedelta(days=store.rng.randint(30, 365)))
    return {**r, "saleEndDate": end}


def _edit_coupon(store: Store, r: Record, now: datetime) -> Record:
    if store.rng.random() < 0.5:
        return {**r, "status": "STOPPED" if r["status"] == "ACTIVE" else "ACTIVE"}
    return {**r, "validDays": _other(store.rng, (7, 15, 30, 60, 90), r["validDays"])}


def _edit_remark(store: Store, r: Record, now: datetime) -> Record:
    remark = _other(store.rng, ("已复核", "补录（收银差错）", "【备注】客人要求开票", "核对无误✅"), r["remark"])
    return {**r, "remark": remark}


def _edit_settlement(store: Store, r: Record, now: datetime) -> Record:
    """Reopen (1→2), re-settle (2→1, possibly with an extra manual discount, which changes the items) or void."""
    rng = store.rng
    if r["status"] == 2:
        resettled = {**r, "status": 1, "settleTime": fmt_time(now)}
        return _extra_discount(store, resettled, now) if rng.random() < 0.6 else resettled
    if r["status"] == 1:
        roll = rng.random()
        if roll < 0.5:
            return {**r, "status": 2}
        if roll < 0.65:
            return {**r, "status": 3}
        return _extra_discount(store, r, now)
    return _edit_remark(store, r, now)


def _extra_discount(store: Store, r: Record, now: datetime) -> Record:
    """Add a MANUAL discount item, taking it off the last payment, so all sums still hold (§5.2)."""
    rng = store.rng
    items = [dict(i) for i in store.settlement_items.get(r["settleId"], [])]
    payments = [i for i in items if i["itemType"] == "PAYMENT"]
    last = payments[-1] if payments else None
    amount = cents(rng.choice((1, 2, 5)))
    if last is None or parse_money(last["amount"]) <= amount:
        return {**r, "remark": _other(rng, ("重新结账：更正备注", "重结（客人要求）"), r["remark"])}
    last["amount"] = money(rng, parse_money(last["amount"]) - amount)
    first_payment = items.index(payments[0])
    items.insert(first_payment, {
        "itemId": store.ids.id64(now), "settleId": r["settleId"],
        "itemType": "DISCOUNT", "refId": "", "itemName": "重结优惠（手工）", "qty": 1, "unitPrice": "",
        "amount": money(rng, -amount), "discountSource": "MANUAL", "payMethod": "", "sortNo": 0,
    })
    for number, item in enumerate(items, start=1):
        item["sortNo"] = number
    store.settlement_items[r["settleId"]] = items
    methods = [dict(m) for m in r["payMethods"]]
    for method in methods:
        if method["payMethod"] == last["payMethod"]:
            method["amount"] = money(rng, parse_money(method["amount"]) - amount)
            break
    return {**r, "discountAmount": money(rng, parse_money(r["discountAmount"]) + amount),
            "paidAmount": money(rng, parse_money(r["paidAmount"]) - amount), "payMethods": methods}


def _edit_table_use(store: Store, r: Record, now: datetime) -> Record:
    status = r["status"]
    if status == "PLAYING":
        return {**r, "status": "PAUSED", "pausedMinutes": r["pausedMinutes"] + 1}
    if status == "PAUSED":
        return {**r, "status": "PLAYING"}
    if status == "FINISHED":
        return {**r, "status": "CANCELLED", "amount": "0.00", "billedMinutes": 0}
    return {**r, "openOperator": _other(store.rng, STAFF, r["openOperator"])}


def _edit_service(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "SERVING":
        begin = datetime.strptime(r["beginTime"], "%Y-%m-%d %H:%M:%S")
        minutes = max(int((now - begin).total_seconds() // 60), 1)
        amount = money(store.rng, parse_money(r["unitPrice"]) * minutes / 60)
        return {**r, "status": "FINISHED", "finishTime": fmt_time(now), "serviceMinutes": minutes, "amount": amount}
    return {**r, "serviceType": "COACHING" if r["serviceType"] == "ACCOMPANY" else "ACCOMPANY"}


def _edit_recharge(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "PAID":
        return {**r, "status": "REFUNDED"}
    return {**r, "operatorName": _other(store.rng, STAFF, r["operatorName"])}


def _edit_goods_sale(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "NORMAL":
        return {**r, "status": "RETURNED"}
    return {**r, "operatorName": _other(store.rng, STAFF, r["operatorName"])}


def _edit_verification(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "VERIFIED":
        return {**r, "status": "REVOKED", "revokeTime": fmt_time(now)}  # verifyTime stays (Q13)
    return {**r, "operatorName": _other(store.rng, STAFF, r["operatorName"])}


def _edit_payment(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "SUCCESS":
        return {**r, "status": "PART_REFUNDED"}
    return {**r, "cashierName": _other(store.rng, STAFF, r["cashierName"])}


def _edit_refund(store: Store, r: Record, now: datetime) -> Record:
    if r["status"] == "PROCESSING":
        return {**r, "status": "SUCCESS", "finishTime": fmt_time(now)}  # refundTime stays (Q13)
    return {**r, "reason": _other(store.rng, ("客人提前离场", "重复支付", "协商退款（已审批）"), r["reason"])}


def _edit_coupon_usage(store: Store, r: Record, now: datetime) -> Record:
    return {**r, "status": "REVERTED" if r["status"] == "USED" else "USED"}


EDITS: dict[str, Edit] = {
    "ODS_MEMBER": _edit_member,
    "ODS_MEMBER_CARD": _edit_card,
    "ODS_MEMBER_BALANCE_CHANGE": _edit_remark,
    "ODS_RECHARGE_ORDER": _edit_recharge,
    "ODS_SETTLEMENT": _edit_settlement,
    "ODS_TABLE_USE": _edit_table_use,
    "ODS_BILLIARD_TABLE": _edit_table,
    "ODS_TABLE_AREA": _edit_area,
    "ODS_GOODS": _edit_goods,
    "ODS_GOODS_CATEGORY": _edit_category,
    "ODS_GOODS_SALE": _edit_goods_sale,
    "ODS_INVENTORY_CHANGE": _edit_remark,
    "ODS_ASSISTANT": _edit_assistant,
    "ODS_ASSISTANT_SERVICE": _edit_service,
    "ODS_GROUP_PACKAGE": _edit_package,
    "ODS_GROUP_VERIFICATION": _edit_verification,
    "ODS_PAYMENT": _edit_payment,
    "ODS_REFUND": _edit_refund,
    "ODS_COUPON": _edit_coupon,
    "ODS_COUPON_USAGE": _edit_coupon_usage,
    "ODS_SHIFT_HANDOVER": _edit_remark,
}


def edit(store: Store, task: str, current: Record, now: datetime) -> Record:
    """A changed copy of ``current`` (never equal to it) by the task's edit rule."""
    changed = EDITS[task](store, current, now)
    for _ in range(5):
        if changed != current:
            return changed
        changed = EDITS[task](store, current, now)
    key = "remark" if "remark" in current else next(k for k, v in current.items() if isinstance(v, str) and k.endswith("Name"))
    return {**current, key: f"{current[key]}·"}


def touch_volatile(store: Store, task: str, current: Record) -> Record:
    """Change only the Q11 volatile field of ``current`` (``ValueError`` for tasks without one)."""
    field = VOLATILE_FIELDS.get(task)
    if field is None:
        raise ValueError(f"{task} has no volatile field; volatile fields exist for {sorted(VOLATILE_FIELDS)}")
    rng = store.rng
    value = current[field]
    if field == "currentStatus":
        value = _other(rng, ("IDLE", "IN_USE", "RESERVED"), value)
    elif field == "onShift":
        value = _toggle(value)
    else:
        value = value + rng.randint(1, 30) if field != "stockQty" else max(value + rng.choice((-3, -1, 6, 12)), 0)
        if value == current[field]:
            value += 1
    return {**current, field: value}


# --- inserts ---------------------------------------------------------------------------------------------------

def _some(store: Store, task: str) -> Record:
    found = store.pick(task)
    if found is None:
        raise LookupError(f"cannot insert: the store has no {task} record to refer to")
    return found


def _insert_settlement(store: Store, now: datetime) -> Record:
    rng = store.rng
    plan = SettlementPlan(goods_lines=rng.randint(0, 3), services=rng.choice((0, 0, 1)), member=rng.random() < 0.4,
                          coupon=rng.random() < 0.2)
    header, items = compose_settlement(store, now, plan, emit=False)
    store.settlement_items[header["settleId"]] = items
    return header


def _insert_table_use(store: Store, now: datetime) -> Record:
    return make_table_use(store, _some(store, "ODS_BILLIARD_TABLE"), now - timedelta(minutes=1), None, now, "PLAYING")


def _insert_category(store: Store, now: datetime) -> Record:
    return make_category(store, f"新分类{store.rng.randint(1, 999)}", None, now)


def _insert_payment(store: Store, now: datetime) -> Record:
    settlement = _some(store, "ODS_SETTLEMENT")
    method = store.rng.choice(OPEN_METHODS)
    amount = cents(store.rng.randint(10, 300))
    return make_payment(store, now, "SETTLEMENT", str(settlement["settleId"]), method, amount,
                        Payer(settlement["memberId"]))


def _insert_coupon_usage(store: Store, now: datetime) -> Record:
    coupon = _some(store, "ODS_COUPON")
    settlement = store.pick("ODS_SETTLEMENT", lambda s: s["memberId"] != 0) or _some(store, "ODS_SETTLEMENT")
    member = settlement["memberId"] or _some(store, "ODS_MEMBER")["memberId"]
    deduct = parse_money(coupon["faceValue"]) if coupon["faceValue"] else cents(5)
    return make_coupon_usage(store, coupon, member, settlement["settleId"], deduct, now)


INSERTS: dict[str, Callable[[Store, datetime], Record]] = {
    "ODS_MEMBER": lambda s, now: make_member(s, now),
    "ODS_MEMBER_CARD": lambda s, now: make_card(s, _some(s, "ODS_MEMBER"), now),
    "ODS_MEMBER_BALANCE_CHANGE": lambda s, now: make_balance_change(
        s, _some(s, "ODS_MEMBER_CARD"), now, "ADJUST", cents(5), cents(0), Related(remark="人工调整（补录）"), apply=False),
    "ODS_RECHARGE_ORDER": lambda s, now: make_recharge(s, now, _some(s, "ODS_MEMBER_CARD"), emit=False),
    "ODS_SETTLEMENT": _insert_settlement,
    "ODS_TABLE_USE": _insert_table_use,
    "ODS_BILLIARD_TABLE": lambda s, now: make_table(s, _some(s, "ODS_TABLE_AREA"), now),
    "ODS_TABLE_AREA": lambda s, now: make_area(s, now),
    "ODS_GOODS": lambda s, now: make_goods(s, at=now),
    "ODS_GOODS_CATEGORY": _insert_category,
    "ODS_GOODS_SALE": lambda s, now: make_goods_line(s, now),
    "ODS_INVENTORY_CHANGE": lambda s, now: make_stock_change(
        s, _some(s, "ODS_GOODS")["goodsId"], now, "PURCHASE", 24, f"CG{now:%Y%m%d}{s.next_number('purchase', 1):04d}",
        apply=False),
    "ODS_ASSISTANT": lambda s, now: make_assistant(s, now),
    "ODS_ASSISTANT_SERVICE": lambda s, now: make_service(s, None, now, 0, now, "SERVING"),
    "ODS_GROUP_PACKAGE": lambda s, now: make_package(s, now),
    "ODS_GROUP_VERIFICATION": lambda s, now: make_verification(s, _some(s, "ODS_GROUP_PACKAGE"), now),
    "ODS_PAYMENT": _insert_payment,
    "ODS_REFUND": lambda s, now: make_refund(s, now, _some(s, "ODS_PAYMENT"), None, emit=False),
    "ODS_COUPON": lambda s, now: make_coupon(s, now),
    "ODS_COUPON_USAGE": _insert_coupon_usage,
    "ODS_SHIFT_HANDOVER": lambda s, now: make_handover(s, now - timedelta(hours=8), now, ""),
}


def new_record(store: Store, task: str, now: datetime) -> Record:
    """A new realistic record of ``task`` with a fresh primary key and (for events) window field ``now``."""
    created = INSERTS[task](store, now)
    if created is None:
        raise LookupError(f"cannot insert into {task}: the store lacks the master data it needs")
    return created
