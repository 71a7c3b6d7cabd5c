"""Simulates the store's trading history day by day, in time order, over ``[anchor - days, anchor)``.

What it is for: turning the per-day volumes of a :class:`ScaleProfile` into events (settlements with everything
they consist of, recharges, refunds, stand-alone verifications, stock movements, ledger corrections, unfinished
table sessions, shift handovers) whose window fields all lie inside the history, processed chronologically so that
running balances (card balances, stock) are consistent. What it must never do: create an event at or after the
anchor, or consume randomness in an order that depends on anything but (seed, scale, anchor, days, site).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any

from feiqiu_etl.simulator.config import ScaleProfile
from feiqiu_etl.simulator.events import (
    Related,
    make_balance_change,
    make_handover,
    make_recharge,
    make_refund,
    make_service,
    make_stock_change,
    make_table_use,
    make_verification,
)
from feiqiu_etl.simulator.settlement import SettlementPlan, compose_settlement
from feiqiu_etl.simulator.state import Store
from feiqiu_etl.simulator.values import ZERO, business_time, cents, fmt_time, parse_money, random_time_between

LIVE_HOURS = timedelta(hours=4)
"""Table sessions opened this close to the anchor are still running (PLAYING/PAUSED/FINISHED)."""
HANDOVER_SLACK_MINUTES = 15
"""A shift is handed over up to this long after it ends."""


@dataclass(order=True)
class Event:
    at: datetime
    order: int
    kind: str = field(compare=False)
    plan: SettlementPlan | None = field(default=None, compare=False)
    ref: Any = field(default=None, compare=False)
    """The primary key an edit event acts on (``trading``); ``None`` for new trading."""


def whole_events(store: Store, per_day: float) -> int:
    """Whole events for one day: the integer part plus a Bernoulli draw for the fraction."""
    whole = int(per_day)
    return whole + (1 if store.rng.random() < per_day - whole else 0)


def _plan_day(store: Store, profile: ScaleProfile) -> list[SettlementPlan]:
    rng = store.rng
    count = profile.settlements_per_day
    plans = [SettlementPlan(member=rng.random() < 0.3) for _ in range(count)]
    if not plans:
        return plans
    extra = min(max(profile.table_uses_per_day - count, 0), round(count * 0.12))
    for plan in rng.sample(plans, extra):
        plan.extra_table = True
    for _ in range(profile.goods_sales_per_day):
        rng.choice(plans).goods_lines += 1
    for _ in range(profile.assistant_services_per_day):
        plan = rng.choice(plans)
        plan.services = min(plan.services + 1, 2)
    for plan in rng.sample(plans, min(count, (profile.verifications_per_day * 2 + 2) // 3)):
        plan.verification = True
    for plan in rng.sample(plans, min(count, profile.coupon_usages_per_day)):
        plan.coupon = True
    card_payments = max(profile.balance_changes_per_day - profile.recharges_per_day - 1, 0)
    for plan in rng.sample(plans, min(count, card_payments)):
        plan.card_payment = True
    return plans


def day_events(store: Store, profile: ScaleProfile, day_start: datetime, day_end: datetime,
                counter: list[int]) -> list[Event]:
    rng = store.rng

    def at() -> datetime:
        counter[0] += 1
        return business_time(rng, day_start, day_end)

    events = [Event(at(), counter[0], "settle", plan) for plan in _plan_day(store, profile)]
    settlement_uses = profile.settlements_per_day + sum(1 for e in events if e.plan.extra_table)
    stand_alone = profile.verifications_per_day - (profile.verifications_per_day * 2 + 2) // 3
    stock_fillers = max(profile.inventory_changes_per_day - round(profile.goods_sales_per_day * 1.05), 0)
    ledger_fillers = min(1, profile.balance_changes_per_day)
    kinds = (
        ["recharge"] * profile.recharges_per_day + ["refund"] * whole_events(store, profile.refunds_per_day)
        + ["verify"] * max(stand_alone, 0) + ["stock"] * stock_fillers + ["ledger"] * ledger_fillers
        + ["table"] * max(profile.table_uses_per_day - settlement_uses, 0)
    )
    events.extend(Event(at(), counter[0], kind) for kind in kinds)
    return events


class Timeline:
    """Runs the events of all days in time order against one store."""

    def __init__(self, store: Store, profile: ScaleProfile) -> None:
        self.store = store
        self.profile = profile
        self.card_pool = [c["cardId"] for c in store.values("ODS_MEMBER_CARD")
                          if c["cardKind"] == "STORED_VALUE" and c["status"] == 1]
        self.refundable: list[dict] = []

    def run(self, days: int) -> None:
        store = self.store
        counter = [0]
        events: list[Event] = []
        for index in range(days):
            day_start = store.start + timedelta(days=index)
            events.extend(day_events(store, self.profile, day_start, day_start + timedelta(days=1), counter))
        for event in sorted(events):
            getattr(self, f"_on_{event.kind}")(event)
        self._handovers(store.start, store.anchor)
        self._open_tables()
        self._live_table_states()

    # --- handlers ------------------------------------------------------------------------------------------
    def _on_settle(self, event: Event) -> None:
        store = self.store
        header, items = compose_settlement(store, event.at, event.plan, emit=True, card_pool=self.card_pool)
        roll = store.rng.random()
        if roll < 0.05:
            changed = min(event.at + timedelta(minutes=store.rng.randint(5, 90)), store.anchor - timedelta(seconds=1))
            header = {**header, "status": 3 if roll < 0.03 else 2, "updateTime": fmt_time(changed)}
            if header["status"] == 3:
                self._revert_coupon_usages(items)
        store.put("ODS_SETTLEMENT", header)
        store.settlement_items[header["settleId"]] = items
        self.refundable.extend(p for p in self._payments_of(items) if p["payMethod"] != "GROUPBUY")

    def _payments_of(self, items: list[dict]) -> list[dict]:
        pay_ids = [int(i["refId"]) for i in items if i["itemType"] == "PAYMENT"]
        return [p for p in (self.store.get("ODS_PAYMENT", pid) for pid in pay_ids) if p is not None]

    def _revert_coupon_usages(self, items: list[dict]) -> None:
        for item in items:
            if item["discountSource"] == "COUPON":
                usage = self.store.get("ODS_COUPON_USAGE", int(item["refId"]))
                if usage is not None:
                    self.store.put("ODS_COUPON_USAGE", {**usage, "status": "REVERTED"})

    def _on_recharge(self, event: Event) -> None:
        store = self.store
        card = store.get("ODS_MEMBER_CARD", store.rng.choice(self.card_pool)) if self.card_pool else None
        if card is not None:
            store.put("ODS_RECHARGE_ORDER", make_recharge(store, event.at, card))

    def _on_refund(self, event: Event) -> None:
        store = self.store
        stamp = fmt_time(event.at)
        candidates = [p for p in self.refundable[-60:] if p["payTime"] < stamp]
        if not candidates:
            return
        payment = store.get("ODS_PAYMENT", store.rng.choice(candidates)["payId"])
        if payment is None or payment["status"] != "SUCCESS":
            return
        finished = event.at + timedelta(minutes=store.rng.randint(1, 120))
        done = finished if finished < store.anchor and store.rng.random() < 0.85 else None
        store.put("ODS_REFUND", make_refund(store, event.at, payment, done))

    def _on_verify(self, event: Event) -> None:
        store = self.store
        package = store.pick("ODS_GROUP_PACKAGE")
        if package is None:
            return
        revoked = None
        if store.rng.random() < 0.15:
            later = event.at + timedelta(minutes=store.rng.randint(5, 600))
            revoked = later if later < store.anchor else None
        member = store.random_key("ODS_MEMBER") if store.rng.random() < 0.3 else 0
        store.put("ODS_GROUP_VERIFICATION", make_verification(store, package, event.at, 0, member or 0, revoked))

    def _on_stock(self, event: Event) -> None:
        store = self.store
        goods = store.pick("ODS_GOODS")
        if goods is None:
            return
        kind = store.rng.choices(("PURCHASE", "LOSS", "STOCKTAKE"), (60, 15, 25))[0]
        if kind == "PURCHASE":
            qty, related, remark = store.rng.choice((12, 24, 48)), f"CG{event.at:%Y%m%d}{store.next_number('purchase', 1):04d}", ""
        elif kind == "LOSS":
            qty, related, remark = -min(store.rng.randint(1, 3), goods["stockQty"]), "", "破损报废"
        else:
            qty, related, remark = store.rng.choice((-2, -1, 1, 2)), "", "月度盘点（差异）"
        store.put("ODS_INVENTORY_CHANGE", make_stock_change(store, goods["goodsId"], event.at, kind, qty, related, remark))

    def _on_ledger(self, event: Event) -> None:
        store = self.store
        card = store.get("ODS_MEMBER_CARD", store.rng.choice(self.card_pool)) if self.card_pool else None
        if card is None:
            return
        kind = store.rng.choice(("GIFT", "ADJUST", "EXPIRE"))
        gift = parse_money(card["giftBalance"])
        if kind == "GIFT":
            principal, bonus, remark = ZERO, cents(store.rng.choice((10, 20, 50))), "生日赠送🎂"
        elif kind == "EXPIRE":
            principal, bonus, remark = ZERO, -gift, "赠送金到期清零"
        else:
            principal, bonus, remark = cents(store.rng.choice((-5, 5, 10))), ZERO, "人工调整（收银差错）"
            principal = max(principal, -parse_money(card["balance"]))
        store.put("ODS_MEMBER_BALANCE_CHANGE",
                  make_balance_change(store, card, event.at, kind, principal, bonus, Related(remark=remark)))

    def _on_table(self, event: Event) -> None:
        store = self.store
        table = store.pick("ODS_BILLIARD_TABLE", lambda t: t["enabled"] == 1)
        if table is None:
            return
        if event.at >= store.anchor - LIVE_HOURS:
            self._live_session(table, event.at)
        else:
            begin = max(event.at - timedelta(minutes=store.rng.randint(1, 8)), store.start)
            store.put("ODS_TABLE_USE", make_table_use(store, table, begin, event.at, event.at, "CANCELLED"))

    def _live_session(self, table: dict, at: datetime, status: str | None = None) -> None:
        """A session still open at the anchor (PLAYING/PAUSED, ``finishTime`` ``""``) or awaiting settlement."""
        store, rng = self.store, self.store.rng
        begin = max(at - timedelta(minutes=rng.randint(5, 150)), store.start)
        status = status or rng.choices(("PLAYING", "PAUSED", "FINISHED"), (70, 10, 20))[0]
        finish = at if status == "FINISHED" else None
        use = store.put("ODS_TABLE_USE", make_table_use(store, table, begin, finish, at, status))
        if status == "PLAYING" and rng.random() < 0.3:
            service = make_service(store, use, begin, 0, begin, "SERVING")
            if service is not None:
                store.put("ODS_ASSISTANT_SERVICE", service)

    # --- after the events ----------------------------------------------------------------------------------
    def _handovers(self, lo: datetime, hi: datetime, catch_up: bool = False) -> None:
        """The shift handovers whose time lies in ``[lo, hi)``. With ``catch_up`` (a later span), a shift whose
        handover an earlier span drew at or after its end is stamped ``lo``; a shift that has one is skipped."""
        store = self.store
        shifts = ((10, 8), (18, 8)) if self.profile.handovers_per_day < 3 else ((8, 8), (16, 8), (0, 8))
        done = {h["shiftStartTime"] for h in store.values("ODS_SHIFT_HANDOVER")}
        for index in range(-1, math.ceil((hi - lo) / timedelta(days=1)) + 1):
            day = datetime.combine((lo + timedelta(days=index)).date(), time())
            for number, (hour, length) in enumerate(shifts):
                shift_start = day + timedelta(hours=hour)
                end = shift_start + timedelta(hours=length)
                handover_at = end + timedelta(minutes=store.rng.randint(0, HANDOVER_SLACK_MINUTES))
                if handover_at >= hi or fmt_time(shift_start) in done:
                    continue
                if handover_at < lo:
                    if not (catch_up and end + timedelta(minutes=HANDOVER_SLACK_MINUTES) >= lo):
                        continue
                    handover_at = lo
                closing = number == len(shifts) - 1 and len(shifts) == 2
                receiver = "" if closing else store.rng.choice(("前台-小林", "收银-阿芳", "夜班-小陈"))
                store.put("ODS_SHIFT_HANDOVER", make_handover(store, shift_start, handover_at, receiver))

    def _open_tables(self) -> None:
        """A few tables still running at the anchor (``finishTime`` ``""``), whatever the scale."""
        store = self.store
        tables = [t for t in store.values("ODS_BILLIARD_TABLE") if t["enabled"] == 1]
        for index in range(min(len(tables), max(1, len(tables) // 6))):
            at = random_time_between(store.rng, store.anchor - timedelta(hours=2), store.anchor)
            self._live_session(store.rng.choice(tables), at, "PLAYING" if index == 0 else None)

    def _live_table_states(self) -> None:
        store = self.store
        for use in store.values("ODS_TABLE_USE"):
            if use["status"] in ("PLAYING", "PAUSED"):
                table = store.get("ODS_BILLIARD_TABLE", use["tableId"])
                if table is not None:
                    store.put("ODS_BILLIARD_TABLE", {**table, "currentStatus": "IN_USE"})

