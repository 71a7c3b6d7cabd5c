"""Moves one simulated store's clock forward: the trading of the hours that pass, plus the edits real stores make.

What it is for: :meth:`Dataset.advance_trading <feiqiu_etl.simulator.dataset.Dataset.advance_trading>` runs a
:class:`Trading` per store over ``[start, end)``. It generates, in time order:

* the trading of that time at the scale's per-day volumes (upstream-api.md §4.1 "Volume"; a part of a day gets that
  part of the volumes): settlements with everything they consist of, recharges, refunds, verifications, stock
  movements, ledger entries, cancelled table sessions, shift handovers, tables still running at the end;
* the edits of the back office, stamped with the moment they happen (``updateTime`` moves to it, Q11):
  ~``REOPEN_SHARE`` of a day's settlements reopened (re-settled a few minutes later, sometimes with a manual
  discount that changes the items; some voided, which reverts their coupon usages), ~``EDIT_SHARE`` of members and
  of goods edited, new members signing up, table sessions and assistant services open at ``start`` finished;
* changes that keep the window field (Q13): verifications revoked (``verifyTime`` stays), refunds completed
  (``refundTime`` stays), payments refunded (``payTime`` stays), coupon usages reverted (``useTime`` stays). They
  come within ``Q13_WITHIN`` of that field, so a look-back at least that long sees them;
* the volatile fields of Q11, changed **without** moving ``updateTime``: ``member.points`` (earned by settling, plus
  small bonuses), ``goods.stockQty`` (moved by every stock change), ``assistant.onShift``, ``coupon.issuedCount``
  and ``billiardTable.currentStatus`` (IN_USE exactly while a session runs).

What it must never do: draw randomness from anything but ``store.rng`` (the caller seeds it per store and span), stamp
a record at or after ``end``, or move ``updateTime`` for a volatile change.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import fields, replace
from datetime import datetime, timedelta

from feiqiu_etl.simulator import edits
from feiqiu_etl.simulator.config import ScaleProfile
from feiqiu_etl.simulator.master import make_card, make_member
from feiqiu_etl.simulator.state import Record, Store
from feiqiu_etl.simulator.timeline import Event, Timeline, whole_events, day_events
from feiqiu_etl.simulator.values import business_time, fmt_time, parse_money, parse_time

DAY = timedelta(days=1)
REOPEN_SHARE = 0.10
"""Settlements reopened per day, as a share of the day's settlements."""
VOID_SHARE = 0.10
"""Of the reopened settlements, the share voided instead of re-settled."""
REOPEN_WITHIN = timedelta(hours=36)
"""A settlement is reopened at most this long after it was settled."""
EDIT_SHARE = 0.02
"""Members, and goods, edited per day (as a share of them)."""
SIGNUP_SHARE = 0.002
"""New members per day, as a share of the members."""
BONUS_SHARE = 0.07
"""Members whose points change per day without a settlement (sign-in bonus, redemption): Q11 only."""
REVOKE_SHARE = 0.10
"""Verifications revoked per day, as a share of the day's verifications."""
Q13_WITHIN = timedelta(hours=24)
"""Changes that keep the window field (Q13) come at most this long after it."""
PER_DAY = tuple(f.name for f in fields(ScaleProfile) if f.name.endswith("_per_day"))


class Trading(Timeline):
    """The trading and edits of one store over a span (see the module docstring)."""

    def __init__(self, store: Store, profile: ScaleProfile) -> None:
        super().__init__(store, profile)
        self._queue: list[Event] = []
        self._order = 0

    def run_span(self, start: datetime, end: datetime) -> None:
        """Generate everything that happens in ``[start, end)``; afterwards the store's anchor is ``end``.

        While it runs, the store's ``start`` is ``start``: what a settlement consists of (table sessions, goods
        lines, verifications) began at most that early, never in time a connector has already read.
        """
        store = self.store
        history_start, store.start, store.anchor = store.start, start, end
        try:
            self._run(start, end)
        finally:
            store.start = history_start

    def _run(self, start: datetime, end: datetime) -> None:
        store = self.store
        recent = fmt_time(start - Q13_WITHIN)  # a refund changes its payment, whose payTime stays (Q13)
        self.refundable = sorted((p for p in store.values("ODS_PAYMENT") if p["status"] == "SUCCESS"
                                  and p["payMethod"] != "GROUPBUY" and p["payTime"] >= recent),
                                 key=lambda p: (p["payTime"], p["payId"]))[-60:]
        self._finish_open(start)
        self._complete_refunds(start)
        cursor = start
        while cursor < end:
            chunk_end = min(cursor + DAY, end)
            share = (chunk_end - cursor) / DAY
            for event in day_events(store, self._scaled(share), cursor, chunk_end, [0]):
                self._push(event.at, event.kind, plan=event.plan)
            self._edits(share, cursor, chunk_end)
            cursor = chunk_end
        while self._queue:
            event = heapq.heappop(self._queue)
            getattr(self, f"_on_{event.kind}")(event)
        self._handovers(start, end, catch_up=True)
        self._open_tables()
        self._volatile(start, end)

    # --- scheduling ----------------------------------------------------------------------------------------
    def _push(self, at: datetime, kind: str, ref=None, plan=None) -> None:
        """Schedule an event; one at or after the end of the span does not happen (in this span)."""
        if at < self.store.anchor:
            self._order += 1
            heapq.heappush(self._queue, Event(at, self._order, kind, plan, ref))

    def _scaled(self, share: float) -> ScaleProfile:
        """The profile's per-day volumes for ``share`` of a day (whole events, the fraction drawn)."""
        if share == 1:
            return self.profile
        values = {name: getattr(self.profile, name) * share for name in PER_DAY}
        return replace(self.profile, **{name: value if name == "refunds_per_day" else whole_events(self.store, value)
                                        for name, value in values.items()})

    def _edits(self, share: float, lo: datetime, hi: datetime) -> None:
        store, profile = self.store, self.profile
        members = len(store.records["ODS_MEMBER"])
        plan = (("reopen", profile.settlements_per_day * REOPEN_SHARE), ("edit_member", members * EDIT_SHARE),
                ("edit_goods", len(store.records["ODS_GOODS"]) * EDIT_SHARE), ("signup", members * SIGNUP_SHARE),
                ("revoke", profile.verifications_per_day * REVOKE_SHARE))
        for kind, per_day in plan:
            for _ in range(whole_events(store, per_day * share)):
                self._push(business_time(store.rng, lo, hi), kind)

    # --- what was open at the start -------------------------------------------------------------------------
    def _finish_open(self, start: datetime) -> None:
        """Table sessions and assistant services running at ``start`` finish within its first hours."""
        rng = self.store.rng
        for use in sorted(self.store.values("ODS_TABLE_USE"), key=lambda u: u["useId"]):
            if use["status"] in ("PLAYING", "PAUSED"):
                self._push(start + timedelta(minutes=rng.randint(5, 180)), "finish_use", ref=use["useId"])
        for service in sorted(self.store.values("ODS_ASSISTANT_SERVICE"), key=lambda s: s["serviceId"]):
            if service["status"] == "SERVING":
                self._push(start + timedelta(minutes=rng.randint(5, 180)), "finish_service", ref=service["serviceId"])

    def _complete_refunds(self, start: datetime) -> None:
        """Refunds still processing complete (Q13: ``refundTime`` stays) within ``Q13_WITHIN`` of being started;
        older ones stay stuck."""
        rng = self.store.rng
        for refund in sorted(self.store.values("ODS_REFUND"), key=lambda r: r["refundId"]):
            began = parse_time(refund["refundTime"])
            if refund["status"] != "PROCESSING" or began is None:
                continue
            at = max(began + timedelta(minutes=rng.randint(1, 120)), start + timedelta(minutes=rng.randint(1, 60)))
            if at < began + Q13_WITHIN:
                self._push(at, "complete_refund", ref=refund["refundId"])

    # --- handlers of edit events --------------------------------------------------------------------------
    def _edit(self, task: str, record: Record, at: datetime) -> Record:
        """The task's edit rule at ``at``; ``updateTime`` moves to ``at`` where the record has one (Q11)."""
        changed = edits.edit(self.store, task, record, at)
        if "updateTime" in record:
            changed["updateTime"] = fmt_time(at)
        return self.store.put(task, changed)

    def _on_finish_use(self, event: Event) -> None:
        use = self.store.get("ODS_TABLE_USE", event.ref)
        if use is None or use["status"] not in ("PLAYING", "PAUSED"):
            return
        begin = parse_time(use["beginTime"])
        unit = use["pricing"]["billingUnitMinutes"] or 1
        played = max(int((event.at - begin).total_seconds() // 60) - use["pausedMinutes"], 1)
        billed = math.ceil(played / unit) * unit
        amount = max(parse_money(use["pricing"]["unitPrice"]) * billed / 60, parse_money(use["pricing"]["minCharge"]))
        self.store.put("ODS_TABLE_USE", {**use, "status": "FINISHED", "finishTime": fmt_time(event.at),
                                         "billedMinutes": billed, "amount": f"{amount:.2f}",
                                         "updateTime": fmt_time(event.at)})

    def _on_finish_service(self, event: Event) -> None:
        service = self.store.get("ODS_ASSISTANT_SERVICE", event.ref)
        if service is not None and service["status"] == "SERVING":
            self._edit("ODS_ASSISTANT_SERVICE", service, event.at)

    def _on_complete_refund(self, event: Event) -> None:
        refund = self.store.get("ODS_REFUND", event.ref)
        if refund is not None and refund["status"] == "PROCESSING":
            self._edit("ODS_REFUND", refund, event.at)

    def _on_reopen(self, event: Event) -> None:
        store, rng = self.store, self.store.rng
        lo, hi = fmt_time(event.at - REOPEN_WITHIN), fmt_time(event.at)
        candidates = sorted(s["settleId"] for s in store.values("ODS_SETTLEMENT")
                            if s["status"] == 1 and lo <= s["settleTime"] < hi)
        if not candidates:
            return
        settlement = store.get("ODS_SETTLEMENT", rng.choice(candidates))
        if rng.random() < VOID_SHARE:
            store.put("ODS_SETTLEMENT", {**settlement, "status": 3, "updateTime": hi})
            self._revert_coupon_usages(store.settlement_items.get(settlement["settleId"], []))
            return
        store.put("ODS_SETTLEMENT", {**settlement, "status": 2, "updateTime": hi})
        self._push(event.at + timedelta(minutes=rng.randint(3, 45)), "resettle", ref=settlement["settleId"])

    def _on_resettle(self, event: Event) -> None:
        settlement = self.store.get("ODS_SETTLEMENT", event.ref)
        if settlement is not None and settlement["status"] == 2:
            self._edit("ODS_SETTLEMENT", settlement, event.at)

    def _on_edit_member(self, event: Event) -> None:
        self._edit_some("ODS_MEMBER", event.at)

    def _on_edit_goods(self, event: Event) -> None:
        self._edit_some("ODS_GOODS", event.at)

    def _edit_some(self, task: str, at: datetime) -> None:
        keys = sorted(self.store.records[task])
        if keys:
            self._edit(task, self.store.get(task, self.store.rng.choice(keys)), at)

    def _on_signup(self, event: Event) -> None:
        store = self.store
        member = store.put("ODS_MEMBER", make_member(store, event.at))
        if store.rng.random() < 0.4:
            store.put("ODS_MEMBER_CARD", make_card(store, member, event.at))

    def _on_revoke(self, event: Event) -> None:
        store = self.store
        lo, hi = fmt_time(event.at - Q13_WITHIN), fmt_time(event.at)
        candidates = sorted(v["verifyId"] for v in store.values("ODS_GROUP_VERIFICATION")
                            if v["status"] == "VERIFIED" and lo <= v["verifyTime"] < hi)
        if candidates:
            self._edit("ODS_GROUP_VERIFICATION", store.get("ODS_GROUP_VERIFICATION", store.rng.choice(candidates)),
                       event.at)

    # --- volatile fields (Q11): no updateTime ---------------------------------------------------------------
    def _volatile(self, start: datetime, end: datetime) -> None:
        store, rng = self.store, self.store.rng
        share = min((end - start) / DAY, 1.0)
        lo, hi = fmt_time(start), fmt_time(end)
        earned: dict[int, int] = {}
        for settlement in store.values("ODS_SETTLEMENT"):
            if settlement["memberId"] and settlement["status"] == 1 and lo <= settlement["settleTime"] < hi:
                earned[settlement["memberId"]] = earned.get(settlement["memberId"], 0) + \
                    int(parse_money(settlement["paidAmount"]))
        members = sorted(store.records["ODS_MEMBER"])
        bonus = whole_events(store, len(members) * BONUS_SHARE * share)
        for member_id in rng.sample(members, min(len(members), bonus)):
            earned[member_id] = earned.get(member_id, 0) + rng.randint(1, 20)
        for member_id in sorted(earned):
            member = store.get("ODS_MEMBER", member_id)
            if member is not None and earned[member_id] > 0:
                store.put("ODS_MEMBER", {**member, "points": member["points"] + earned[member_id]})
        for assistant in sorted(store.values("ODS_ASSISTANT"), key=lambda a: a["assistantId"]):
            if assistant["status"] == "ACTIVE" and rng.random() < 0.6 * share:
                store.put("ODS_ASSISTANT", {**assistant, "onShift": 0 if assistant["onShift"] else 1})
        for coupon in sorted(store.values("ODS_COUPON"), key=lambda c: c["couponId"]):
            if coupon["status"] == "ACTIVE" and rng.random() < share:
                store.put("ODS_COUPON", {**coupon, "issuedCount": coupon["issuedCount"] + rng.randint(1, 30)})
        running = {u["tableId"] for u in store.values("ODS_TABLE_USE") if u["status"] in ("PLAYING", "PAUSED")}
        for table in sorted(store.values("ODS_BILLIARD_TABLE"), key=lambda t: t["tableId"]):
            status = "IN_USE" if table["tableId"] in running else (
                "IDLE" if table["currentStatus"] == "IN_USE" else table["currentStatus"])
            if status != table["currentStatus"]:
                store.put("ODS_BILLIARD_TABLE", {**table, "currentStatus": status})
