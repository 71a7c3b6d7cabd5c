"""Incremental fact loads by key with a per-table watermark (warehouse-model §5.1)."""

import psycopg
import pytest

from dwd_support import DwdEnv, at, fail_inserts, payload
from feiqiu_etl.tasks.dwd.facts import read_watermark

SETTLE = "ods.settlement"


@pytest.fixture
def env(pg_dsn):
    e = DwdEnv(pg_dsn)
    yield e
    e.close()


def counts(c):
    return (c.inserted, c.updated, c.closed)


def watermark(env, name="dwd_settlement"):
    return read_watermark(env.conn, env.table(name))


def test_first_load_takes_every_row_and_sets_the_watermark(env):
    for n in range(1, 4):
        env.ods.put(SETTLE, payload(SETTLE, n), fetched_at=at(n))
    assert watermark(env) is None
    assert counts(env.load_fact("dwd_settlement", run_id="r1")) == (3, 0, 0)
    assert watermark(env) == at(3)
    rows = env.rows("dwd_settlement")
    assert [r["src_fetched_at"] for r in rows] == [at(1), at(2), at(3)]
    assert all(r["run_id"] == "r1" and r["is_deleted"] is False for r in rows)
    ods_hashes = [r[0] for r in env.conn.execute("SELECT content_hash FROM ods.settlement ORDER BY settle_id")]
    assert [r["src_content_hash"] for r in rows] == ods_hashes


def test_rerun_writes_nothing_not_even_the_watermark(env):
    for n in range(1, 4):
        env.ods.put(SETTLE, payload(SETTLE, n), fetched_at=at(n))
    env.load_fact("dwd_settlement", run_id="r1")
    before = env.rows("dwd_settlement")
    wm_row = env.conn.execute("SELECT * FROM etl_meta.dwd_watermark").fetchall()
    assert counts(env.load_fact("dwd_settlement", run_id="r2")) == (0, 0, 0)  # the row at the watermark is re-read
    assert env.rows("dwd_settlement") == before
    assert env.conn.execute("SELECT * FROM etl_meta.dwd_watermark").fetchall() == wm_row


def test_changed_and_new_rows_after_the_watermark_are_upserted(env):
    for n in range(1, 4):
        env.ods.put(SETTLE, payload(SETTLE, n), fetched_at=at(n))
    env.load_fact("dwd_settlement", run_id="r1")
    untouched = env.rows("dwd_settlement")[0]
    env.ods.put(SETTLE, payload(SETTLE, 2, status=2, paidAmount="0"), fetched_at=at(10))
    env.ods.put(SETTLE, payload(SETTLE, 4), fetched_at=at(11))
    assert counts(env.load_fact("dwd_settlement", run_id="r2")) == (1, 1, 0)
    rows = {r["settle_no"]: r for r in env.rows("dwd_settlement")}
    assert rows["JZ240301000002"]["status"] == 2 and rows["JZ240301000002"]["run_id"] == "r2"
    assert rows["JZ240301000001"] == untouched
    assert watermark(env) == at(11)


def test_rows_below_the_watermark_are_not_candidates(env):
    env.ods.put(SETTLE, payload(SETTLE, 1), fetched_at=at(5))
    env.load_fact("dwd_settlement")
    env.ods.put(SETTLE, payload(SETTLE, 2), fetched_at=at(4))  # older than the watermark: not read
    env.ods.put(SETTLE, payload(SETTLE, 3), fetched_at=at(5))  # equal: read (>=)
    assert counts(env.load_fact("dwd_settlement")) == (1, 0, 0)
    assert [r["settle_no"] for r in env.rows("dwd_settlement")] == ["JZ240301000001", "JZ240301000003"]


def test_a_new_fetch_with_the_same_content_is_not_rewritten(env):
    env.ods.put(SETTLE, payload(SETTLE, 1), fetched_at=at(1))
    env.load_fact("dwd_settlement", run_id="r1")
    env.ods.put(SETTLE, payload(SETTLE, 1), fetched_at=at(9))
    assert counts(env.load_fact("dwd_settlement", run_id="r2")) == (0, 0, 0)
    assert env.rows("dwd_settlement")[0]["run_id"] == "r1"
    assert watermark(env) == at(9)


def test_soft_delete_is_copied_through_deleted_at_and_never_deletes(env):
    item = "ods.settlement_item"
    for n in (1, 2):
        env.ods.put(item, payload(item, n), fetched_at=at(1))
    env.load_fact("dwd_settlement_item")
    env.ods.soft_delete(item, payload(item, 2), at_=at(20))  # fetched_at unchanged; deleted_at moves
    assert counts(env.load_fact("dwd_settlement_item")) == (0, 1, 0)
    assert [r["is_deleted"] for r in env.rows("dwd_settlement_item")] == [False, True]
    assert watermark(env, "dwd_settlement_item") == at(20)
    env.ods.put(item, payload(item, 2), fetched_at=at(30))  # revived with the same content
    env.conn.execute("UPDATE ods.settlement_item SET is_deleted = false, deleted_at = NULL")
    assert counts(env.load_fact("dwd_settlement_item")) == (0, 1, 0)
    assert [r["is_deleted"] for r in env.rows("dwd_settlement_item")] == [False, False]


def test_a_failed_load_keeps_rows_and_watermark(env):
    env.ods.put(SETTLE, payload(SETTLE, 1), fetched_at=at(1))
    env.load_fact("dwd_settlement")
    before = env.rows("dwd_settlement")
    env.ods.put(SETTLE, payload(SETTLE, 1, status=3), fetched_at=at(5))
    env.ods.put(SETTLE, payload(SETTLE, 2), fetched_at=at(6))
    fail_inserts(env.conn, "dwd.dwd_settlement")
    with pytest.raises(psycopg.errors.RaiseException):
        env.load_fact("dwd_settlement")
    assert env.rows("dwd_settlement") == before
    assert watermark(env) == at(1)
