"""Generated data of the simulator: determinism, sizes, every documented field and quirk (upstream-api.md §3–§5),
cross-entity consistency, and the mutation helpers (Q11–Q13, §1.5)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from feiqiu_etl.simulator import LIST_ENDPOINTS, TASK_CODES, Dataset, SimulatorConfig
from feiqiu_etl.simulator.catalog import DETAIL_ENDPOINTS, VOLATILE_FIELDS, list_endpoint

SITE = 8640015201004417
ANCHOR = datetime(2024, 3, 4, 12, 0, 0)
MONEY = re.compile(r"^-?\d+(\.\d{1,2})?$")
TIME = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$")

FIELDS = {  # every documented field per task (upstream-api.md §4.2–§4.22), plus siteId
    "ODS_MEMBER": "memberId memberNo name nickname mobile gender status birthday level points tags registerSource "
                  "referrerId createTime updateTime",
    "ODS_MEMBER_CARD": "cardId memberId cardTypeId cardTypeName cardKind balance giftBalance discountRate "
                       "remainingTimes status isDefault expireDate openTime updateTime",
    "ODS_MEMBER_BALANCE_CHANGE": "changeId memberId cardId changeType amount giftAmount balanceAfter giftBalanceAfter "
                                 "relatedType relatedId operatorName remark createTime",
    "ODS_RECHARGE_ORDER": "rechargeNo memberId cardId amount giftAmount activityName payMethod status operatorId "
                          "operatorName createTime payTime",
    "ODS_SETTLEMENT": "settleId settleNo tableIds memberId memberCardId tableAmount goodsAmount assistantAmount "
                      "receivableAmount discountAmount roundingAmount paidAmount payMethods status cashierId "
                      "cashierName guestCount remark createTime settleTime updateTime",
    "ODS_TABLE_USE": "useId tableId tableName areaId settleId memberId beginTime finishTime billedMinutes pausedMinutes "
                     "pricing amount status openOperator updateTime",
    "ODS_BILLIARD_TABLE": "tableId tableName areaId tableType priceRuleName unitPrice sortNo enabled currentStatus "
                          "updateTime",
    "ODS_TABLE_AREA": "areaId areaName remark sortNo tableCount enabled updateTime",
    "ODS_GOODS": "goodsId goodsName categoryId barcode unit salePrice memberPrice costPrice stockQty isOnSale specs "
                 "createTime updateTime",
    "ODS_GOODS_CATEGORY": "categoryId categoryName parentId level sortNo enabled updateTime",
    "ODS_GOODS_SALE": "lineId settleId useId memberId goodsId goodsName categoryId qty unitPrice amount discountAmount "
                      "isGift status operatorName createTime",
    "ODS_INVENTORY_CHANGE": "changeId goodsId goodsName changeType qtyChange qtyAfter unitCost relatedNo operatorName "
                            "remark createTime",
    "ODS_ASSISTANT": "assistantId assistantNo name gender mobile levelName hourlyPrice skills status onShift entryDate "
                     "avatarUrl updateTime",
    "ODS_ASSISTANT_SERVICE": "serviceId assistantId assistantName tableId useId settleId memberId serviceType "
                             "beginTime finishTime serviceMinutes unitPrice amount isExtension status updateTime",
    "ODS_GROUP_PACKAGE": "packageId platform platformDealId packageName packageType salePrice originalPrice "
                         "durationMinutes saleStartDate saleEndDate usableWeekdays usableTimeRange status createTime "
                         "updateTime",
    "ODS_GROUP_VERIFICATION": "verifyId platform receiptCode certificateId platformOrderId packageId packageName "
                              "settleId memberId salePrice merchantReceivable status revokeTime operatorName extra "
                              "verifyTime",
    "ODS_PAYMENT": "payId payNo channelTradeNo bizType bizId payMethod amount memberId cardId status cashierName "
                   "createTime payTime",
    "ODS_REFUND": "refundId refundNo payId bizType bizId payMethod amount reason status operatorName refundTime "
                  "finishTime",
    "ODS_COUPON": "couponId couponName couponType faceValue discountRate minSpend validDays issuedCount status "
                  "createTime updateTime",
    "ODS_COUPON_USAGE": "usageId couponId couponName couponCode memberId settleId deductAmount status useTime",
    "ODS_SHIFT_HANDOVER": "handoverId staffId staffName receiverName shiftStartTime handoverTime settleCount "
                          "totalIncome cashExpected cashCounted cashDiff payBreakdown remark",
}
ROW_FIELDS = {
    "ODS_SETTLEMENT": "itemId settleId itemType refId itemName qty unitPrice amount discountSource payMethod sortNo",
    "ODS_GROUP_PACKAGE": "packageId contentId contentType refId name qty unit valueAmount",
    "ODS_MEMBER": "memberId cardId cardKind cardTypeName status balance giftBalance remainingTimes isDefault bindTime "
                  "lastUseTime",
}
MONEY_FIELDS = {"amount", "giftAmount", "balanceAfter", "giftBalanceAfter", "tableAmount", "goodsAmount",
                "assistantAmount", "receivableAmount", "discountAmount", "roundingAmount", "paidAmount", "salePrice",
                "originalPrice", "merchantReceivable", "deductAmount", "totalIncome", "cashExpected", "cashCounted",
                "cashDiff", "unitCost", "hourlyPrice", "balance", "giftBalance", "valueAmount", "minSpend"}


def make(**overrides) -> Dataset:
    return Dataset(SimulatorConfig(**{"anchor": ANCHOR, **overrides}))


@pytest.fixture(scope="module")
def ds() -> Dataset:
    return make()


@pytest.fixture
def fresh() -> Dataset:
    return make()


def all_records(ds: Dataset):
    for task in TASK_CODES:
        for rec in ds.records(task, SITE):
            yield task, rec


def walk(value):
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


# --- determinism and size ----------------------------------------------------------------------------------------

def test_generation_is_deterministic():
    first, second = make(), make()
    for task in TASK_CODES:
        assert first.records(task, SITE) == second.records(task, SITE)
    assert make(seed=8).records("ODS_SETTLEMENT", SITE) != first.records("ODS_SETTLEMENT", SITE)


def test_small_scale_is_tiny_and_medium_is_fast():
    small = make()
    total = sum(len(small.records(t, SITE)) for t in TASK_CODES)
    assert 200 <= total <= 700
    assert 10 * 3 <= len(small.records("ODS_SETTLEMENT", SITE)) <= 20 * 3
    started = time.process_time()  # the generator's own CPU time: at load 9 on 2 CPUs the wall clock took 8 s
    medium = make(scale="medium")
    assert time.process_time() - started < 5
    assert len(medium.records("ODS_MEMBER", SITE)) == 2000
    assert 150 * 3 <= len(medium.records("ODS_SETTLEMENT", SITE))


def test_several_sites_have_their_own_data():
    ds = make(site_ids=(SITE, 8640015201004418))
    a = ds.records("ODS_MEMBER", SITE)
    b = ds.records("ODS_MEMBER", 8640015201004418)
    assert a and b and {r["memberId"] for r in a}.isdisjoint({r["memberId"] for r in b})
    assert {r["siteId"] for r in b} == {8640015201004418}


def test_windowed_history_lies_in_the_configured_days(ds):
    lo, hi = "2024-03-01 12:00:00", "2024-03-04 12:00:00"
    for endpoint in LIST_ENDPOINTS:
        if endpoint.windowed:
            values = [r[endpoint.window_field] for r in ds.records(endpoint.task_code, SITE)]
            assert values and all(lo <= v < hi for v in values), endpoint.task_code


# --- fields and quirks --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", TASK_CODES)
def test_every_documented_field_is_present_and_nothing_is_null(ds, task):
    expected = set(FIELDS[task].split()) | {"siteId"}
    for rec in ds.records(task, SITE):
        assert set(rec) == expected
        assert rec["siteId"] == SITE
        assert all(v is not None for v in walk(rec))


@pytest.mark.parametrize("parent", [d.parent_task for d in DETAIL_ENDPOINTS])
def test_detail_rows_have_all_fields_and_carry_the_parent_key(ds, parent):
    key = list_endpoint(parent).pk
    rows_seen = 0
    for rec in ds.records(parent, SITE):
        for row in ds.detail_rows(parent, SITE, rec[key]):
            assert set(row) == set(ROW_FIELDS[parent].split())
            assert row[key] == rec[key]
            rows_seen += 1
    assert rows_seen > 0


def test_money_is_text_with_varying_trailing_zeros(ds):
    texts = []
    for _, rec in all_records(ds):
        for node in walk(rec):
            if isinstance(node, dict):
                texts += [v for k, v in node.items() if k in MONEY_FIELDS and v != ""]
    assert texts and all(isinstance(t, str) and MONEY.match(t) for t in texts)
    assert any(t.endswith(".00") for t in texts)
    assert any("." not in t for t in texts) and any(re.search(r"\.\d$", t) for t in texts)


def test_cost_price_is_a_json_float(ds):
    assert all(isinstance(g["costPrice"], float) for g in ds.records("ODS_GOODS", SITE))


def test_id64_values_exceed_2_53_and_survive_json(ds):
    settlements = ds.records("ODS_SETTLEMENT", SITE)
    assert all(s["settleId"] > 2**53 and len(str(s["settleId"])) == 19 for s in settlements)
    text = json.dumps(settlements)
    assert json.loads(text) == settlements


def test_string_ids_and_string_references(ds):
    cards = ds.records("ODS_MEMBER_CARD", SITE)
    assert all(re.match(r"^\d{10}$", c["cardId"]) for c in cards) and any(c["cardId"].startswith("0") for c in cards)
    assert all(isinstance(g["goodsId"], str) and g["goodsId"].isdigit() for g in ds.records("ODS_GOODS", SITE))
    payments = ds.records("ODS_PAYMENT", SITE)
    settle_ids = {str(s["settleId"]) for s in ds.records("ODS_SETTLEMENT", SITE)}
    assert all(isinstance(p["bizId"], str) for p in payments)
    assert {p["bizId"] for p in payments if p["bizType"] == "SETTLEMENT"} <= settle_ids
    changes = ds.records("ODS_INVENTORY_CHANGE", SITE)
    line_ids = {str(line["lineId"]) for line in ds.records("ODS_GOODS_SALE", SITE)}
    assert {c["relatedNo"] for c in changes if c["changeType"] == "SALE"} <= line_ids


def test_booleans_are_0_1_and_refs_use_0_for_none(ds):
    for table in ds.records("ODS_BILLIARD_TABLE", SITE):
        assert table["enabled"] in (0, 1)
    assert any(s["memberId"] == 0 for s in ds.records("ODS_SETTLEMENT", SITE))
    assert any(c["parentId"] == 0 for c in ds.records("ODS_GOODS_CATEGORY", SITE))
    assert any(c["parentId"] != 0 for c in ds.records("ODS_GOODS_CATEGORY", SITE))


def test_text_has_full_width_punctuation_emoji_and_masks(ds):
    text = json.dumps([r for _, r in all_records(ds)], ensure_ascii=False)
    assert "🎱" in text and "【" in text and "（" in text
    assert all(re.match(r"^\d{3}\*{4}\d{4}$", m["mobile"]) for m in ds.records("ODS_MEMBER", SITE))
    assert all(re.match(r"^\d{4}\*{4}\d{4}$", v["receiptCode"]) for v in ds.records("ODS_GROUP_VERIFICATION", SITE))


def test_times_are_well_formed(ds):
    for task, rec in all_records(ds):
        for key, value in rec.items():
            if key.endswith("Time") and value != "":
                assert TIME.match(value), (task, key, value)


# --- cross-entity consistency --------------------------------------------------------------------------------------

def test_settlement_items_sum_to_paid_amount(ds):
    for settlement in ds.records("ODS_SETTLEMENT", SITE):
        items = ds.detail_rows("ODS_SETTLEMENT", SITE, settlement["settleId"])
        charges = sum(Decimal(i["amount"]) for i in items if i["itemType"] != "PAYMENT")
        paid = sum(Decimal(i["amount"]) for i in items if i["itemType"] == "PAYMENT")
        assert charges == paid == Decimal(settlement["paidAmount"])
        assert Decimal(settlement["receivableAmount"]) - Decimal(settlement["discountAmount"]) \
            - Decimal(settlement["roundingAmount"]) == Decimal(settlement["paidAmount"])
        assert sum(Decimal(m["amount"]) for m in settlement["payMethods"]) == Decimal(settlement["paidAmount"])
        assert all(Decimal(i["amount"]) < 0 for i in items if i["itemType"] == "DISCOUNT")


def test_member_detail_cards_belong_to_the_member(ds):
    members_with_cards = 0
    for member in ds.records("ODS_MEMBER", SITE):
        data = ds.detail("ODS_MEMBER", SITE, member["memberId"])
        assert data["member"] == member
        assert [t["tagName"] for t in data["tags"]] == member["tags"]
        members_with_cards += bool(data["cards"])
    assert members_with_cards > 0


def test_package_detail_has_usage_rules_and_contents(ds):
    for package in ds.records("ODS_GROUP_PACKAGE", SITE):
        data = ds.detail("ODS_GROUP_PACKAGE", SITE, package["packageId"])["package"]
        assert set(data["usageRules"]) == {"applicableTableTypes", "maxPerVisit", "stackable", "needReservation",
                                           "notes"}
        assert [c["contentId"] for c in data["contents"]] == list(range(1, len(data["contents"]) + 1))


# --- window queries and mutations ----------------------------------------------------------------------------------

def test_window_query_is_half_open_and_ordered(ds):
    records = ds.records("ODS_SETTLEMENT", SITE)
    start, end = records[3]["updateTime"], records[-3]["updateTime"]
    got = ds.window("ODS_SETTLEMENT", SITE, start, end)
    assert got == [r for r in records if start <= r["updateTime"] < end]


def test_update_bumps_update_time_and_moves_the_record_to_now(fresh):
    fresh.set_now(ANCHOR + timedelta(minutes=5))
    settlement = fresh.records("ODS_SETTLEMENT", SITE)[0]
    changed = fresh.update("ODS_SETTLEMENT", SITE, settlement["settleId"])
    assert changed != settlement and changed["updateTime"] == "2024-03-04 12:05:00"
    assert fresh.records("ODS_SETTLEMENT", SITE)[-1] == changed
    items = fresh.detail_rows("ODS_SETTLEMENT", SITE, settlement["settleId"])
    assert sum(Decimal(i["amount"]) for i in items if i["itemType"] == "PAYMENT") == Decimal(changed["paidAmount"])


def test_update_with_explicit_changes(fresh):
    member = fresh.records("ODS_MEMBER", SITE)[0]
    changed = fresh.update("ODS_MEMBER", SITE, member["memberId"], {"nickname": "新昵称🐂", "tags": ["学生"]})
    assert changed["nickname"] == "新昵称🐂" and changed["updateTime"] == fresh.now()
    assert [t["tagName"] for t in fresh.detail("ODS_MEMBER", SITE, member["memberId"])["tags"]] == ["学生"]


@pytest.mark.parametrize("task", sorted(VOLATILE_FIELDS))
def test_touch_volatile_changes_only_the_volatile_field(fresh, task):
    pk = list_endpoint(task).pk
    before = fresh.records(task, SITE)[0]
    after = fresh.touch_volatile(task, SITE, before[pk])
    diff = {k for k in before if before[k] != after[k]}
    assert diff == {VOLATILE_FIELDS[task]}


def test_touch_volatile_rejects_tasks_without_one(fresh):
    with pytest.raises(ValueError):
        fresh.touch_volatile("ODS_TABLE_AREA", SITE, 1)


def test_delete_removes_master_data_and_its_detail(fresh):
    member = fresh.records("ODS_MEMBER", SITE)[0]
    fresh.delete("ODS_MEMBER", SITE, member["memberId"])
    assert member["memberId"] not in {m["memberId"] for m in fresh.records("ODS_MEMBER", SITE)}
    assert fresh.detail("ODS_MEMBER", SITE, member["memberId"]) is None
    with pytest.raises(ValueError):
        fresh.delete("ODS_PAYMENT", SITE, fresh.records("ODS_PAYMENT", SITE)[0]["payId"])


@pytest.mark.parametrize("task", TASK_CODES)
def test_insert_creates_a_new_complete_record(fresh, task):
    endpoint = list_endpoint(task)
    before = {r[endpoint.pk] for r in fresh.records(task, SITE)}
    created = fresh.insert(task, SITE)
    assert created[endpoint.pk] not in before
    assert set(created) == set(FIELDS[task].split()) | {"siteId"}
    if endpoint.windowed:
        assert created[endpoint.window_field] == fresh.now()
    assert len(fresh.records(task, SITE)) == len(before) + 1


def test_mutate_random_counts_match_the_changes():
    ds = make()
    before = {t: {json.dumps(r, sort_keys=True) for r in ds.records(t, SITE)} for t in TASK_CODES}
    sizes = {t: len(ds.records(t, SITE)) for t in TASK_CODES}
    counts = ds.mutate_random(0.2, rng_seed=3)
    for task in TASK_CODES:
        c = counts[task]
        assert c["updated"] + c["deleted"] + c["inserted"] == max(round(0.2 * sizes[task]), 1)
        after = ds.records(task, SITE)
        assert len(after) == sizes[task] - c["deleted"] + c["inserted"]
        unchanged = sum(json.dumps(r, sort_keys=True) in before[task] for r in after)
        assert unchanged == sizes[task] - c["deleted"] - c["updated"], task
    again = make()
    assert again.mutate_random(0.2, rng_seed=3) == counts
    assert again.records("ODS_MEMBER", SITE) == ds.records("ODS_MEMBER", SITE)


def test_churn_is_deterministic_per_seed():
    outcomes = []
    for _ in range(2):
        ds = make(churn_between_pages=True)
        outcomes.append([ds.churn("ODS_MEMBER", SITE) for _ in range(20)])
    assert outcomes[0] == outcomes[1] and any(outcomes[0])


def test_clock(fresh):
    assert fresh.now() == "2024-03-04 12:00:00"
    assert fresh.advance(90) == "2024-03-04 12:01:30"
    fresh.set_now(datetime(2024, 3, 5, 8, 0, 0, 123))
    assert fresh.now() == "2024-03-05 08:00:00"


def test_card_use_moves_the_card_and_the_points_and_the_minimum_counts_the_members_detail(fresh):
    """Issue 25 part 6: a card use changes the card (balance, updateTime; the detail's lastUseTime) and the member's
    points only (Q11: its updateTime stays); the minimum counts one detail per such member, none as volatile only."""
    site = fresh.site_ids[0]
    start = fresh.marks()[-1]
    fresh.advance(3600)
    card = next(c for c in fresh.records("ODS_MEMBER_CARD", site) if c["status"] == 1 and Decimal(c["balance"]) > 2)
    member = next(m for m in fresh.records("ODS_MEMBER", site) if m["memberId"] == card["memberId"])
    used = fresh.card_use(site, card["memberId"], "2.00")
    after = next(m for m in fresh.records("ODS_MEMBER", site) if m["memberId"] == card["memberId"])
    assert Decimal(used["balance"]) + Decimal(used["giftBalance"]) == \
        Decimal(card["balance"]) + Decimal(card["giftBalance"]) - 2
    assert used["updateTime"] == fresh.now() != card["updateTime"]
    assert after["points"] > member["points"] and after["updateTime"] == member["updateTime"]
    row = next(r for r in fresh.detail_rows("ODS_MEMBER", site, card["memberId"]) if r["cardId"] == card["cardId"])
    assert row["lastUseTime"] == fresh.now() and row["balance"] == used["balance"]
    consume = [c for c in fresh.records("ODS_MEMBER_BALANCE_CHANGE", site) if c["cardId"] == card["cardId"]
               and c["createTime"] == fresh.now()]
    assert len(consume) == 1 and consume[0]["changeType"] == "CONSUME"
    minimum = fresh.minimum_requests(site, start, start + timedelta(hours=2))
    assert (minimum.task("ODS_MEMBER").details, minimum.task("ODS_MEMBER").volatile_only) == (1, 0)
    with pytest.raises(ValueError, match="no active card"):
        lonely = next(m["memberId"] for m in fresh.records("ODS_MEMBER", site)
                      if m["memberId"] not in {c["memberId"] for c in fresh.records("ODS_MEMBER_CARD", site)})
        fresh.card_use(site, lonely)
