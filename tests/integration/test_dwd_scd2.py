"""SCD Type 2 merge of one dimension: every row of warehouse-model §4.2 and every invariant of §4.3."""

import threading

import psycopg
import pytest

from dwd_support import OPEN_END, SITE2, DwdEnv, at, payload, scd2_violations
from feiqiu_etl.tasks.dwd.scd2 import MergeTimeError
from feiqiu_etl.tasks.dwd.staging import table_lock

GOODS = "ods.goods"
BK = ["goods_id"]
VERSION_COLS = "goods_id, version_no, valid_from, valid_to, is_current, goods_name, sale_price, stock_qty"


@pytest.fixture
def env(pg_dsn):
    e = DwdEnv(pg_dsn)
    yield e
    assert scd2_violations(e.conn, "dim_goods", BK) == []
    e.close()


def put(env, n, fetched, **fields):
    env.ods.put(GOODS, payload(GOODS, n, **fields), fetched_at=at(fetched))


def versions(env, n=None):
    rows = env.rows("dim_goods", VERSION_COLS)
    return [r for r in rows if n is None or r["goods_id"] == str(100230 + n)]


def counts(c):
    return (c.inserted, c.updated, c.closed)


# ---------------------------------------------------------------------------------------- §4.2, row by row


def test_live_and_no_current_row_inserts_version_1(env):
    put(env, 1, 1)
    assert counts(env.merge("dim_goods", at(10), run_id="r1")) == (1, 0, 0)
    (v,) = env.rows("dim_goods")
    assert (v["version_no"], v["valid_from"], v["valid_to"], v["is_current"], v["run_id"]) == (
        1, at(10), OPEN_END, True, "r1")
    assert v["change_hash"] == env.conn.execute(
        "SELECT md5(jsonb_build_array(%s::text, 1, %s::text, %s::text, 8.00, NULL::numeric, 2.30, true)::text)",
        (v["goods_name"], v["barcode"], v["unit"])).fetchone()[0]


def test_same_hash_overwrites_type1_columns_only_when_they_differ(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10), run_id="r1")
    put(env, 1, 2, stockQty=7, specs=[{"specName": "大瓶", "price": "12"}])
    assert counts(env.merge("dim_goods", at(20), run_id="r2")) == (0, 1, 0)
    (v,) = env.rows("dim_goods")
    assert (v["version_no"], v["stock_qty"], v["specs"], v["valid_from"], v["run_id"]) == (
        1, 7, [{"specName": "大瓶", "price": "12"}], at(10), "r2")
    # Unchanged type-1 values: nothing is written (loaded_at stays).
    loaded_at = v["loaded_at"]
    assert counts(env.merge("dim_goods", at(30), run_id="r3")) == (0, 0, 0)
    assert env.rows("dim_goods")[0]["loaded_at"] == loaded_at


def test_changed_hash_closes_current_and_inserts_next_version(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10))
    put(env, 1, 2, salePrice="9.00", stockQty=5)
    assert counts(env.merge("dim_goods", at(20))) == (1, 0, 1)
    v1, v2 = versions(env)
    assert (v1["valid_to"], v1["is_current"], v1["stock_qty"]) == (at(20), False, 48)  # closed row kept its values
    assert (v2["version_no"], v2["valid_from"], v2["valid_to"], v2["is_current"]) == (2, at(20), OPEN_END, True)
    assert (v2["sale_price"], v2["stock_qty"]) == (9, 5)


def test_deleted_or_absent_key_closes_its_current_row(env):
    put(env, 1, 1)
    put(env, 2, 1)
    env.merge("dim_goods", at(10))
    env.ods.soft_delete(GOODS, payload(GOODS, 1), at_=at(15))
    env.conn.execute("DELETE FROM ods.goods WHERE goods_id = %s", (str(100232),))  # absent from S
    assert counts(env.merge("dim_goods", at(20))) == (0, 0, 2)
    assert [(v["valid_to"], v["is_current"]) for v in versions(env)] == [(at(20), False)] * 2
    assert counts(env.merge("dim_goods", at(30))) == (0, 0, 0)


def test_deleted_key_without_current_row_does_nothing(env):
    env.ods.put(GOODS, payload(GOODS, 1), fetched_at=at(1), is_deleted=True, deleted_at=at(2))
    assert counts(env.merge("dim_goods", at(10))) == (0, 0, 0)
    assert versions(env) == []


def test_revival_starts_a_new_version_and_keeps_counting(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10))
    env.ods.soft_delete(GOODS, payload(GOODS, 1), at_=at(15))
    env.merge("dim_goods", at(20))
    put(env, 1, 25)  # the same content comes back: still a new version
    env.conn.execute("UPDATE ods.goods SET is_deleted = false, deleted_at = NULL")
    assert counts(env.merge("dim_goods", at(30))) == (1, 0, 0)
    v1, v2 = versions(env)
    assert (v1["valid_from"], v1["valid_to"]) == (at(10), at(20))
    assert (v2["version_no"], v2["valid_from"], v2["is_current"]) == (2, at(30), True)  # gap [20, 30) uncovered


# -------------------------------------------------------------------------------------- §4.3, invariants


def test_rule3_rerun_on_unchanged_ods_writes_nothing(env):
    for n in range(1, 6):
        put(env, n, n, stockQty=n)
    env.merge("dim_goods", at(10))
    put(env, 2, 11, goodsName="可乐")
    env.merge("dim_goods", at(20))
    before = env.rows("dim_goods")
    assert counts(env.merge("dim_goods", at(30), run_id="again")) == (0, 0, 0)
    assert env.rows("dim_goods") == before


def test_rule4_several_changes_between_runs_collapse_into_one_version(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10))
    put(env, 1, 2, goodsName="可乐")
    put(env, 1, 3, goodsName="雪碧", salePrice="5")
    assert counts(env.merge("dim_goods", at(20))) == (1, 0, 1)
    assert [(v["version_no"], v["goods_name"]) for v in versions(env)] == [(1, "红牛🐂 250ml"), (2, "雪碧")]


def test_rule6_null_is_a_value_and_reformatting_is_not_a_change(env):
    put(env, 1, 1, barcode="", salePrice="12.5")
    env.merge("dim_goods", at(10))
    put(env, 1, 2, salePrice="12.50")  # same numeric
    rec = payload(GOODS, 1, salePrice="12.50")
    del rec["barcode"]  # a missing field is NULL, the same as ""
    env.ods.put(GOODS, rec, fetched_at=at(2))
    assert counts(env.merge("dim_goods", at(20))) == (0, 0, 0)
    put(env, 1, 3, barcode="null", salePrice="12.5")  # the text 'null' is not NULL
    assert counts(env.merge("dim_goods", at(30))) == (1, 0, 1)
    put(env, 1, 4, barcode="null", salePrice="")  # value -> NULL
    assert counts(env.merge("dim_goods", at(40))) == (1, 0, 1)
    put(env, 1, 5, barcode="null", salePrice="3")  # NULL -> value
    assert counts(env.merge("dim_goods", at(50))) == (1, 0, 1)
    assert [(v["version_no"], v["sale_price"]) for v in versions(env)] == [
        (1, 12.5), (2, 12.5), (3, None), (4, 3)]


def test_rule7_closed_rows_are_immutable(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10))
    put(env, 1, 2, goodsName="可乐")
    env.merge("dim_goods", at(20))
    closed_before = [r for r in env.rows("dim_goods") if not r["is_current"]]
    put(env, 1, 3, goodsName="可乐", stockQty=1, createTime="2020-01-01 00:00:00")  # type-1 only
    assert counts(env.merge("dim_goods", at(30))) == (0, 1, 0)
    env.ods.soft_delete(GOODS, payload(GOODS, 1), at_=at(35))
    env.merge("dim_goods", at(40))
    closed_after = [r for r in env.rows("dim_goods") if r["version_no"] == 1]
    assert closed_after == closed_before


def test_keys_are_scoped_by_site(env):
    put(env, 1, 1)
    env.ods.put(GOODS, payload(GOODS, 1, siteId=SITE2, goodsName="别店"), fetched_at=at(1))
    assert counts(env.merge("dim_goods", at(10))) == (2, 0, 0)
    env.ods.soft_delete(GOODS, payload(GOODS, 1, siteId=SITE2), at_=at(12))
    assert counts(env.merge("dim_goods", at(20))) == (0, 0, 1)
    assert [(r["site_id"] == SITE2, r["is_current"]) for r in env.rows("dim_goods")] == [(False, True), (True, False)]


# --------------------------------------------------------------------------------- duplicates, now, locking


def test_duplicate_business_keys_resolve_to_one_row_deterministically(env):
    # Three ODS rows (different ODS keys) whose payloads all say goodsId 100231.
    rec = payload(GOODS, 1)
    env.ods.put(GOODS, {**rec, "goodsName": "旧"}, fetched_at=at(1), key=("X1",))
    env.ods.put(GOODS, {**rec, "goodsName": "新A"}, fetched_at=at(5), key=("X2",))
    env.ods.put(GOODS, {**rec, "goodsName": "新B"}, fetched_at=at(5), key=("X3",))
    env.merge("dim_goods", at(10))
    assert [v["goods_name"] for v in versions(env)] == ["新B"]  # latest fetched_at, then the greatest ODS key
    # A live row beats a deleted one, even a more recently fetched one.
    env.ods.put(GOODS, {**rec, "goodsName": "删"}, fetched_at=at(9), key=("X4",), is_deleted=True,
                deleted_at=at(9))
    assert counts(env.merge("dim_goods", at(20))) == (0, 0, 0)
    # Only when every row of the key is deleted is the key deleted.
    env.conn.execute("UPDATE ods.goods SET is_deleted = true, deleted_at = %s", (at(25),))
    assert counts(env.merge("dim_goods", at(30))) == (0, 0, 1)


def test_now_not_after_latest_valid_from_fails_and_changes_nothing(env):
    put(env, 1, 1)
    env.merge("dim_goods", at(10))
    put(env, 1, 2, goodsName="可乐")
    before = env.rows("dim_goods")
    for stale in (at(10), at(5)):
        with pytest.raises(MergeTimeError, match=r"dwd\.dim_goods: now .* is not after the latest valid_from"):
            env.merge("dim_goods", stale)
    assert env.rows("dim_goods") == before
    assert counts(env.merge("dim_goods", at(11))) == (1, 0, 1)


def test_two_merges_of_one_table_never_run_at_once(env):
    put(env, 1, 1)
    holder = psycopg.connect(env.dsn)
    try:
        table_lock(holder, env.table("dim_goods"))  # an open transaction holds the table's lock
        waiter = psycopg.connect(env.dsn, autocommit=True)
        waiter.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            from feiqiu_etl.tasks.dwd.scd2 import merge_dim_scd2

            merge_dim_scd2(waiter, env.table("dim_goods"), now=at(10), run_id="blocked")
        assert versions(env) == []
        # Another dimension is not blocked.
        env.ods.put("ods.table_area", payload("ods.table_area", 1), fetched_at=at(1))
        assert merge_dim_scd2(waiter, env.table("dim_table_area"), now=at(10), run_id="free").inserted == 1
        # Once released, a waiting merge proceeds.
        waiter.execute("SET lock_timeout = 0")
        done = threading.Event()
        t = threading.Thread(target=lambda: (merge_dim_scd2(waiter, env.table("dim_goods"), now=at(10),
                                                            run_id="later"), done.set()))
        t.start()
        assert not done.wait(0.3)
        holder.rollback()
        t.join(10)
        assert done.is_set() and len(versions(env)) == 1
        waiter.close()
    finally:
        holder.close()
