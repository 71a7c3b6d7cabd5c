"""Property: the incremental SCD2 merge gives exactly the full merge's table (warehouse-model §4.2), on random
ODS histories that follow the ODS contract (§2.3: rows change only by upserts and soft deletes, each stamped
with a later ``fetched_at``/``deleted_at``), on real PostgreSQL.

One ODS source (``ods.goods``) feeds two copies of ``dim_goods``: ``dwd.dim_goods`` merged incrementally
(``incremental=True``: only rows changed since its watermark) and ``dwd.dim_goods_full`` merged with the full
compare. After every merge both hold the same versions (surrogate keys and ``loaded_at`` aside) and report the
same counts; histories include inserts, tracked and type-1 changes, soft deletes, revivals, no-op merges and,
in some examples, a second ODS row naming the same business key (the incremental merge must notice and fall
back to the full compare).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwd_support import DwdEnv, at, payload, scd2_violations
from feiqiu_etl.tasks.dwd.scd2 import merge_dim_scd2
from feiqiu_etl.tasks.dwd.schema import table_ddl
from feiqiu_etl.tasks.dwd.watermark import read_dim_watermark

GOODS = st.integers(1, 4)
fields = st.fixed_dictionaries({
    "goodsName": st.sampled_from(["红牛🐂 250ml", "可乐", ""]),
    "salePrice": st.sampled_from(["8", "8.00", "12.5", ""]),
    "isOnSale": st.sampled_from([0, 1]),
    "stockQty": st.sampled_from([0, 5, 48]),  # type 1
    "specs": st.sampled_from([[], [{"specName": "大瓶", "price": "12"}]]),  # type 1
})
steps = st.one_of(
    st.tuples(st.just("put"), GOODS, fields),
    st.tuples(st.just("delete"), GOODS),
    st.tuples(st.just("merge")),
    st.tuples(st.just("duplicate"), GOODS, fields),
)
COLUMNS = ("site_id, goods_id, version_no, valid_from, valid_to, is_current, change_hash, run_id, goods_name, "
           "category_id, barcode, unit, sale_price, member_price, cost_price, is_on_sale, stock_qty, specs")


def _rows(env: DwdEnv, name: str) -> list[tuple]:
    return env.conn.execute(f"SELECT {COLUMNS} FROM dwd.{name} ORDER BY site_id, goods_id, version_no").fetchall()


def test_incremental_merge_equals_full_merge(pg_dsn):
    env = DwdEnv(pg_dsn)
    inc = env.table("dim_goods")
    full = replace(inc, target="dwd.dim_goods_full")
    for stmt in table_ddl(full):
        env.conn.execute(stmt)
    try:
        check = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])(
            given(history=st.lists(steps, min_size=1, max_size=14), with_duplicates=st.booleans())(
                lambda history, with_duplicates: _same_tables(env, inc, full, history, with_duplicates)))
        check()
    finally:
        env.close()


def _same_tables(env: DwdEnv, inc, full, history, with_duplicates) -> None:
    if True:
        env.truncate("ods.goods", "dwd.dim_goods", "dwd.dim_goods_full")
        env.conn.execute("DELETE FROM etl_meta.dwd_dim_watermark")
        clock, merges, duplicated = 0, 0, False
        for step in [*history, ("merge",)]:
            clock += 1
            kind = step[0]
            if kind == "put":
                env.ods.put("ods.goods", payload("ods.goods", step[1], **step[2]), fetched_at=at(clock))
            elif kind == "delete":
                env.ods.soft_delete("ods.goods", payload("ods.goods", step[1]), at_=at(clock))
            elif kind == "duplicate" and with_duplicates:
                env.ods.put("ods.goods", payload("ods.goods", step[1], **step[2]), fetched_at=at(clock),
                            key=(str(900000 + step[1]),))
                duplicated = True
            elif kind == "merge":
                merges += 1
                now = at(100_000 + 10 * merges)
                a = merge_dim_scd2(env.conn, inc, now=now, run_id=f"r{merges}", incremental=True)
                b = merge_dim_scd2(env.conn, full, now=now, run_id=f"r{merges}")
                assert (a.inserted, a.updated, a.closed) == (b.inserted, b.updated, b.closed)
                assert _rows(env, "dim_goods") == _rows(env, "dim_goods_full")
                assert scd2_violations(env.conn, "dim_goods", ["goods_id"]) == []
        mark = read_dim_watermark(env.conn, inc)
        last_change = env.conn.execute(
            "SELECT max(GREATEST(fetched_at, COALESCE(deleted_at, fetched_at))) FROM ods.goods").fetchone()[0]
        if last_change is not None:  # the watermark covers the changes merged, never more
            assert mark is not None and mark.watermark <= last_change
            assert mark.key_aligned == (not duplicated)
            if not duplicated:
                assert mark.watermark == last_change


def test_incremental_merge_reads_only_changed_rows_and_notices_soft_deletes(pg_dsn):
    """A change after the watermark is merged; rows before it are not staged again (the stage is small)."""
    env = DwdEnv(pg_dsn)
    try:
        table = env.table("dim_goods")
        for n in range(1, 6):
            env.ods.put("ods.goods", payload("ods.goods", n), fetched_at=at(n))
        first = merge_dim_scd2(env.conn, table, now=at(100), run_id="r1", incremental=True)
        assert first.inserted == 5  # the first merge compares everything
        assert read_dim_watermark(env.conn, table).watermark == at(5)
        again = merge_dim_scd2(env.conn, table, now=at(110), run_id="r2", incremental=True)
        assert (again.inserted, again.updated, again.closed) == (0, 0, 0)
        env.ods.put("ods.goods", payload("ods.goods", 2, goodsName="新名字"), fetched_at=at(20))
        env.ods.soft_delete("ods.goods", payload("ods.goods", 4), at_=at(21))
        third = merge_dim_scd2(env.conn, table, now=at(120), run_id="r3", incremental=True)
        assert (third.inserted, third.updated, third.closed) == (1, 0, 2)
        assert read_dim_watermark(env.conn, table).watermark == at(21)
        current = env.conn.execute("SELECT goods_id FROM dwd.dim_goods WHERE is_current ORDER BY 1").fetchall()
        assert [r[0] for r in current] == [str(100230 + n) for n in (1, 2, 3, 5)]
        # A dimension emptied behind the merge's back is rebuilt by a full compare, not left empty.
        env.truncate("dwd.dim_goods")
        rebuilt = merge_dim_scd2(env.conn, table, now=at(130), run_id="r4", incremental=True)
        assert rebuilt.inserted == 4
    finally:
        env.close()
