"""One poison value no longer blocks a DWD table (issue 11, finding 4).

A source row that cannot be loaded (a value that does not cast, an empty business key) is quarantined in
``etl_meta.dwd_quarantine`` with its table, key, column, value and reason, reported in the run's DWD summary,
and the rest of the table loads; once the source row is corrected it loads and leaves the quarantine. For
facts and for dimensions (SCD2), on PostgreSQL's own input check (>= 16) and on the PL/pgSQL helper older
servers use.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from dwd_support import BIG, SITE, DwdEnv, at, payload, scd2_violations
from feiqiu_etl.tasks.dwd import DwdLoadTask
from feiqiu_etl.tasks.dwd import staging

SETTLE = "ods.settlement"
GOODS = "ods.goods"
POISON = "123456789012345678901234567890.99"


@pytest.fixture(params=["native", "plpgsql"])
def env(request, pg_dsn, monkeypatch):
    if request.param == "plpgsql":  # what a server before 16 runs (no pg_input_error_info)
        monkeypatch.setattr(staging, "NATIVE_INPUT_CHECK", 10**9)
    e = DwdEnv(pg_dsn)
    yield e
    e.close()


def quarantine(env, table=None):
    where = "WHERE table_name = %s" if table else ""
    return env.conn.execute(
        f"SELECT table_name, source_table, source_key, column_name, value, reason FROM etl_meta.dwd_quarantine"
        f" {where} ORDER BY table_name, source_key", (table,) if table else ()).fetchall()


def load(env, now, tables, run_id="r"):
    summary = DwdLoadTask(env.dsn, env.mapping, run_id=run_id, now=now).load(only_tables=tables)
    return summary, {t.table: t for t in summary.tables}


def test_a_settlement_with_an_overflowing_amount_is_quarantined_and_the_rest_loads(env):
    for n in range(1, 71):
        env.ods.put(SETTLE, payload(SETTLE, n), fetched_at=at(n))
    env.ods.put(SETTLE, payload(SETTLE, 35, paidAmount=POISON), fetched_at=at(35))

    summary, by = load(env, at(1000), ["dwd_settlement"])
    result = by["dwd_settlement"]
    assert result.error is None and result.inserted == 69 and result.quarantined == 1
    assert summary.status == "PARTIAL" and summary.quarantined == 1
    (table, source, key, column, value, reason), = quarantine(env)
    assert (table, source, column, value) == ("dwd.dwd_settlement", SETTLE, "paid_amount", POISON)
    assert key == {"site_id": SITE, "settle_id": BIG + 35}
    assert reason.startswith("numeric field overflow") and "precision 12, scale 2" in reason
    shown = result.to_dict()["quarantine"][0]
    assert (shown["key"], shown["column"], shown["value"]) == (key, "paid_amount", POISON)
    assert BIG + 35 not in {r["settle_id"] for r in env.rows("dwd_settlement")}

    summary, by = load(env, at(2000), ["dwd_settlement"])  # nothing changed: still held, still reported
    assert (by["dwd_settlement"].inserted, by["dwd_settlement"].quarantined) == (0, 1)
    assert summary.status == "PARTIAL"

    env.ods.put(SETTLE, payload(SETTLE, 35, paidAmount="57.00"), fetched_at=at(3000))  # corrected upstream
    summary, by = load(env, at(4000), ["dwd_settlement"])
    assert (by["dwd_settlement"].inserted, by["dwd_settlement"].quarantined) == (1, 0)
    assert summary.status == "SUCCESS" and quarantine(env) == []
    row = next(r for r in env.rows("dwd_settlement") if r["settle_id"] == BIG + 35)
    assert row["paid_amount"] == Decimal("57.00")


def test_a_dimension_key_whose_source_turns_bad_keeps_its_current_version(env):
    for n in (1, 2, 3):
        env.ods.put(GOODS, payload(GOODS, n), fetched_at=at(n))
    load(env, at(100), ["dim_goods"])
    env.ods.put(GOODS, payload(GOODS, 1, salePrice="八块", goodsName="坏"), fetched_at=at(110))  # bad now
    env.ods.put(GOODS, payload(GOODS, 2, goodsName="可乐"), fetched_at=at(110))  # a normal change
    env.ods.put(GOODS, payload(GOODS, 4, memberPrice="1e40"), fetched_at=at(110))  # new and bad

    _, by = load(env, at(200), ["dim_goods"])
    result = by["dim_goods"]
    assert result.error is None and (result.inserted, result.closed, result.quarantined) == (1, 1, 2)
    held = {(k["goods_id"], c, v) for _, _, k, c, v, _ in quarantine(env)}
    assert held == {("100231", "sale_price", "八块"), ("100234", "member_price", "1e40")}
    current = {r["goods_id"]: r for r in env.rows("dim_goods") if r["is_current"]}
    assert set(current) == {"100231", "100232", "100233"}  # 100231 not closed, 100234 not inserted
    assert current["100231"]["version_no"] == 1 and current["100231"]["goods_name"] == "红牛🐂 250ml"
    assert current["100232"]["version_no"] == 2 and current["100232"]["goods_name"] == "可乐"
    assert scd2_violations(env.conn, "dim_goods", ["goods_id"]) == []

    _, by = load(env, at(300), ["dim_goods"])  # unchanged: nothing happens, both still held
    assert (by["dim_goods"].inserted, by["dim_goods"].closed, by["dim_goods"].quarantined) == (0, 0, 2)

    env.ods.put(GOODS, payload(GOODS, 1, goodsName="坏"), fetched_at=at(310))  # price corrected
    _, by = load(env, at(400), ["dim_goods"])
    assert (by["dim_goods"].inserted, by["dim_goods"].closed, by["dim_goods"].quarantined) == (1, 1, 1)
    current = {r["goods_id"]: r for r in env.rows("dim_goods") if r["is_current"]}
    assert current["100231"]["version_no"] == 2 and current["100231"]["goods_name"] == "坏"
    assert [k["goods_id"] for _, _, k, *_ in quarantine(env)] == ["100234"]
    assert scd2_violations(env.conn, "dim_goods", ["goods_id"]) == []


def test_an_empty_business_key_is_quarantined(env):
    env.ods.put(GOODS, payload(GOODS, 1), fetched_at=at(1))
    env.ods.put(GOODS, payload(GOODS, 9, goodsId=""), fetched_at=at(1), key=("bad",))
    _, by = load(env, at(100), ["dim_goods"])
    assert (by["dim_goods"].inserted, by["dim_goods"].quarantined, by["dim_goods"].error) == (1, 1, None)
    (_, _, key, column, value, reason), = quarantine(env)
    assert key == {"site_id": SITE, "goods_id": "bad"} and column == "goods_id" and value is None
    assert reason == "business key goods_id is empty"


def test_a_bad_newest_row_of_a_key_is_never_replaced_by_an_older_one(env):
    env.ods.put(GOODS, payload(GOODS, 1, goodsName="旧"), fetched_at=at(1), key=("old",))
    env.ods.put(GOODS, payload(GOODS, 1, goodsName="新", salePrice="abc"), fetched_at=at(2), key=("new",))
    _, by = load(env, at(100), ["dim_goods"])
    assert (by["dim_goods"].inserted, by["dim_goods"].quarantined) == (0, 1)
    assert env.rows("dim_goods") == []
    assert [k["goods_id"] for _, _, k, *_ in quarantine(env)] == ["new"]


def test_a_guarded_cast_is_checked_only_when_its_condition_holds(env):
    """dwd_payment's settle_id casts bizId only when bizType is SETTLEMENT (warehouse-model §5.2)."""
    env.ods.put("ods.payment", payload("ods.payment", 1, bizType="RECHARGE", bizId="RC20240301"), fetched_at=at(1))
    env.ods.put("ods.payment", payload("ods.payment", 2, bizId="not-a-number"), fetched_at=at(1))
    env.ods.put("ods.payment", payload("ods.payment", 3, amount="one hundred"), fetched_at=at(1))
    _, by = load(env, at(100), ["dwd_payment"])
    assert (by["dwd_payment"].inserted, by["dwd_payment"].quarantined) == (1, 2)
    assert {(c, v) for *_, c, v, _ in quarantine(env)} == {("settle_id", "not-a-number"), ("amount", "one hundred")}
    (row,) = env.rows("dwd_payment")
    assert row["recharge_no"] == "RC20240301" and row["settle_id"] is None


def test_quarantined_rows_are_kept_per_table_and_roll_back_with_a_failed_load(env):
    env.ods.put(GOODS, payload(GOODS, 1, salePrice="x"), fetched_at=at(1))
    env.ods.put(SETTLE, payload(SETTLE, 1, paidAmount="y"), fetched_at=at(1))
    load(env, at(100), ["dim_goods", "dwd_settlement"])
    assert [t for t, *_ in quarantine(env)] == ["dwd.dim_goods", "dwd.dwd_settlement"]
    env.ods.put(GOODS, payload(GOODS, 1), fetched_at=at(110))  # corrected, but this load fails
    env.conn.execute("CREATE FUNCTION dwd.no() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no'; END $$")
    env.conn.execute("CREATE TRIGGER no BEFORE INSERT ON dwd.dim_goods FOR EACH ROW EXECUTE FUNCTION dwd.no()")
    _, by = load(env, at(200), ["dim_goods"])
    assert by["dim_goods"].error is not None
    assert [t for t, *_ in quarantine(env)] == ["dwd.dim_goods", "dwd.dwd_settlement"]  # rolled back with it
