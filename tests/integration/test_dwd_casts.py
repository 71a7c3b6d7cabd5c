"""The §3 cast helpers on real PostgreSQL, through the bundled mapping (warehouse-model §3, §4.4, §5.2)."""

from datetime import date, datetime
from decimal import Decimal

import pytest

from dwd_support import BIG, CST, SITE, DwdEnv, at, payload

# Type and nullability of a few columns that the mapping states explicitly.
EXPECTED_TYPES = {
    ("dim_member", "gender"): "smallint",
    ("dim_member", "level_discount_rate"): "numeric(6,4)",
    ("dim_member", "tags"): "jsonb",
    ("dim_member_card", "balance"): "numeric(12,2)",
    ("dim_goods_category", "parent_category_id"): "integer",
    ("dwd_settlement", "status"): "smallint",
    ("dwd_payment", "settle_id"): "bigint",
    ("dwd_table_use", "finish_time"): "timestamp with time zone",
}


@pytest.fixture
def env(pg_dsn):
    e = DwdEnv(pg_dsn)
    yield e
    e.close()


def _one(env, name):
    rows = env.rows(name)
    assert len(rows) == 1, rows
    return rows[0]


def test_column_types_follow_the_mapping(env):
    for (table, column), expected in EXPECTED_TYPES.items():
        got = env.conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = %s", (f"dwd.{table}", column)).fetchone()[0]
        assert got == expected, (table, column)


def test_member_casts_empty_zero_nested_and_big_ids(env):
    rec = payload("ods.member", 1, name="", birthday="", referrerId=0, nickname="🎱【夜】",
                  level={"levelId": 3, "levelName": "", "discountRate": "0.9"}, tags=[])
    env.ods.put("ods.member", rec, fetched_at=at(1))
    env.merge("dim_member", at(10))
    row = _one(env, "dim_member")
    assert row["member_id"] == BIG + 1  # exact, not rounded through a float
    assert row["member_name"] is None and row["birthday"] is None  # "" -> NULL
    assert row["referrer_member_id"] is None  # REF: 0 -> NULL
    assert row["nickname"] == "🎱【夜】"
    assert row["level_id"] == 3 and row["level_name"] is None
    assert row["level_discount_rate"] == Decimal("0.9000")
    assert row["tags"] == [] and row["gender"] == 1 and row["points"] == 121
    assert row["member_no"] == "000001"  # leading zeros kept
    assert row["register_time"] == datetime(2023, 6, 1, 10, 0, tzinfo=CST)


def test_member_card_money_dates_booleans_and_text_ids(env):
    rec = payload("ods.member_card", 1, balance="57.5", giftBalance="", discountRate="", remainingTimes="",
                  expireDate="2025-12-31", isDefault=0)
    env.ods.put("ods.member_card", rec, fetched_at=at(1))
    env.merge("dim_member_card", at(10))
    row = _one(env, "dim_member_card")
    assert row["card_id"] == "0008801235"
    assert row["balance"] == Decimal("57.50") and row["gift_balance"] is None
    assert row["discount_rate"] is None and row["remaining_times"] is None
    assert row["expire_date"] == date(2025, 12, 31)
    assert row["is_default"] is False
    assert row["member_id"] == BIG + 1


def test_goods_cost_price_json_number_and_category_root_ref(env):
    env.ods.put("ods.goods", payload("ods.goods", 1, costPrice=2.3, memberPrice="", isOnSale=1), fetched_at=at(1))
    env.ods.put("ods.goods_category", payload("ods.goods_category", 1, parentId=0), fetched_at=at(1))
    env.ods.put("ods.goods_category", payload("ods.goods_category", 2, parentId=1), fetched_at=at(1))
    env.merge("dim_goods", at(10))
    env.merge("dim_goods_category", at(10))
    goods = _one(env, "dim_goods")
    assert goods["cost_price"] == Decimal("2.30") and goods["member_price"] is None
    assert goods["is_on_sale"] is True and goods["sale_price"] == Decimal("8.00")
    cats = env.rows("dim_goods_category")
    assert [c["parent_category_id"] for c in cats] == [None, 1]  # int REF: 0 -> NULL


def test_fact_casts_sref_signed_money_nested_pricing_and_case_forms(env):
    env.ods.put("ods.settlement_item", payload("ods.settlement_item", 1, refId=""), fetched_at=at(1))
    env.ods.put("ods.settlement_item", payload("ods.settlement_item", 2, refId=str(BIG + 7), amount="96"),
                fetched_at=at(1))
    env.ods.put("ods.table_use", payload("ods.table_use", 1), fetched_at=at(1))
    env.ods.put("ods.payment", payload("ods.payment", 1), fetched_at=at(1))
    env.ods.put("ods.payment", payload("ods.payment", 2, bizType="RECHARGE", bizId="CZ2024030112000001",
                                       memberId=0, cardId=""), fetched_at=at(1))
    env.ods.put("ods.refund", payload("ods.refund", 1), fetched_at=at(1))
    env.ods.put("ods.refund", payload("ods.refund", 2, bizType="RECHARGE", bizId="CZ2024030112000001"),
                fetched_at=at(1))
    for name in ("dwd_settlement_item", "dwd_table_use", "dwd_payment", "dwd_refund"):
        env.load_fact(name)

    items = env.rows("dwd_settlement_item")
    assert [(i["ref_id"], i["amount"], i["unit_price"]) for i in items] == [
        (None, Decimal("-11.52"), None), (BIG + 7, Decimal("96.00"), None)]
    assert items[0]["settle_id"] == BIG + 1 and items[0]["pay_method"] is None

    use = _one(env, "dwd_table_use")
    assert (use["price_rule_name"], use["unit_price"], use["billing_unit_minutes"], use["min_charge"]) == (
        "标准计费", Decimal("48.00"), 30, Decimal("24.00"))
    assert use["finish_time"] is None and use["settle_id"] is None and use["member_id"] == BIG + 1

    pays = env.rows("dwd_payment")
    assert [(p["settle_id"], p["recharge_no"], p["member_id"], p["card_id"]) for p in pays] == [
        (BIG + 1, None, BIG + 1, "0008801234"), (None, "CZ2024030112000001", None, None)]
    assert pays[0]["biz_id"] == str(BIG + 1) and pays[0]["channel_trade_no"] is None
    refunds = env.rows("dwd_refund")
    assert [(r["settle_id"], r["pay_id"]) for r in refunds] == [(BIG + 1, BIG + 501), (None, BIG + 501)]


@pytest.mark.parametrize("session_tz", ["UTC", "America/New_York"])
def test_ts_attaches_plus_eight_whatever_the_session_time_zone(pg_dsn, session_tz):
    env = DwdEnv(pg_dsn, timezone_name=session_tz)
    try:
        env.ods.put("ods.settlement", payload("ods.settlement", 1, settleTime=""), fetched_at=at(1))
        env.ods.put("ods.member", payload("ods.member", 1), fetched_at=at(1))
        env.load_fact("dwd_settlement")
        env.merge("dim_member", at(10))
        row = _one(env, "dwd_settlement")
        assert row["create_time"] == datetime(2024, 3, 1, 20, 15, 40, tzinfo=CST)
        assert row["settle_time"] is None
        assert row["site_id"] == SITE
        member_hash = _one(env, "dim_member")["change_hash"]
    finally:
        env.close()
    # The same data merged in a Shanghai session hashes the same: no timestamptz is tracked (§4.1).
    shanghai = DwdEnv(pg_dsn)
    try:
        assert shanghai.merge("dim_member", at(20)).inserted == 0
        assert shanghai.rows("dim_member")[0]["change_hash"] == member_hash
    finally:
        shanghai.close()


def test_a_payload_that_does_not_cast_is_quarantined_and_writes_nothing(env):
    env.ods.put("ods.goods", payload("ods.goods", 1, salePrice="八块"), fetched_at=at(1))
    assert env.merge("dim_goods", at(10)).inserted == 0
    assert env.rows("dim_goods") == []
    (column, value, reason), = env.conn.execute(
        "SELECT column_name, value, reason FROM etl_meta.dwd_quarantine WHERE table_name = 'dwd.dim_goods'").fetchall()
    assert (column, value) == ("sale_price", "八块") and "invalid input syntax for type numeric" in reason