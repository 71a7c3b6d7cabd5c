"""The ODS write path on real PostgreSQL: insert/update/skip counts, in-batch duplicates, per-parent
detail soft delete (warehouse-model §2.3), one transaction per batch."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest

from feiqiu_etl.connector import load_connector
from feiqiu_etl.db.schema import ensure_ods_tables
from feiqiu_etl.tasks.ods.hashing import canonical_json, content_hash
from feiqiu_etl.tasks.ods.rows import DetailDone, OdsRow, layouts_for
from feiqiu_etl.tasks.ods.writer import OdsWriter

SPEC = load_connector().task("ODS_SETTLEMENT")
SITE = 1
NOW = datetime(2024, 3, 1, tzinfo=timezone.utc)


def item(item_id: int, settle_id: int, amount: str = "1.00") -> OdsRow:
    record = {"itemId": item_id, "settleId": settle_id, "amount": amount}
    return OdsRow("ods.settlement_item", SITE, (item_id,), (settle_id,), None, canonical_json(record),
                  content_hash(record), NOW, record)


def settlement(settle_id: int, paid: str) -> OdsRow:
    record = {"settleId": settle_id, "paidAmount": paid, "updateTime": "2024-03-01 10:00:00"}
    return OdsRow("ods.settlement", SITE, (settle_id,), (), NOW, canonical_json(record), content_hash(record), NOW,
                  record, wants_detail=True)


@pytest.fixture
def writer(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        ensure_ods_tables(conn, [SPEC])
        yield OdsWriter(conn, SPEC, layouts_for(SPEC), "run-1", "feiqiu")


def _items(conn):
    return conn.execute("SELECT item_id, settle_id, is_deleted FROM ods.settlement_item ORDER BY item_id").fetchall()


def test_counts_duplicates_and_detail_follow_ups(writer):
    first = writer.write([settlement(10, "5.00"), settlement(11, "6.00"), settlement(10, "5.50")])
    assert (first.inserted, first.updated, first.skipped) == (2, 0, 1)  # the earlier 10 is superseded
    assert sorted(r.params["settleId"] for r in first.follow_ups) == [10, 11]
    again = writer.write([settlement(10, "5.50"), settlement(11, "6.50")])
    assert (again.inserted, again.updated, again.skipped) == (0, 1, 1)
    assert again.follow_ups_skipped == 1
    assert again.follow_ups == []  # 11 was already requested in this run (ids de-duplicated)


def test_detail_marker_soft_deletes_only_missing_rows_of_that_parent(writer):
    conn = writer.conn
    writer.write([item(1, 10), item(2, 10), item(3, 10), item(4, 11)])
    result = writer.write([item(1, 10), item(3, 10, "2.00"),
                           DetailDone("ods.settlement_item", SPEC.code, SITE, 10, "10", [(1,), (3,)], NOW)])
    assert (result.updated, result.skipped, result.deleted) == (1, 1, 1)
    assert _items(conn) == [(1, 10, False), (2, 10, True), (3, 10, False), (4, 11, False)]
    empty = writer.write([DetailDone("ods.settlement_item", SPEC.code, SITE, 11, "11", [], NOW)])
    assert empty.deleted == 1 and _items(conn)[-1] == (4, 11, True)


def test_a_failing_batch_rolls_back_completely(writer):
    conn = writer.conn
    bad = item(7, 10)
    bad.payload = '{"broken json'
    with pytest.raises(psycopg.Error):
        writer.write([item(5, 10), bad])
    assert _items(conn) == []
    assert writer.write([item(5, 10)]).inserted == 1


def test_a_batch_run_again_after_a_lost_commit_still_asks_for_its_parents_details(writer):
    """The connection was lost after the server committed the batch, before the client heard it: the retry finds
    its parents unchanged, yet must request the details they owe (recorded by the first, committed attempt)."""
    saved = writer.save_state()
    first = writer.write([settlement(20, "5.00"), settlement(21, "6.00")])  # committed; the answer "lost"
    assert sorted(r.params["settleId"] for r in first.follow_ups) == [20, 21]
    writer.restore_state(saved)  # what DbSlot's retry does before running the batch again
    again = writer.write([settlement(20, "5.00"), settlement(21, "6.00")])
    assert (again.inserted, again.updated, again.skipped) == (0, 0, 2)
    assert sorted(r.params["settleId"] for r in again.follow_ups) == [20, 21]
    later = writer.write([settlement(20, "5.00")])  # an ordinary batch: no retry, nothing asked again
    assert later.follow_ups == [] and later.follow_ups_skipped == 1


def test_a_detail_whose_rows_were_lost_with_their_batch_stays_owed(writer):
    """Issue 21: the rows of one detail response may span two batches; when the first fails for good (the
    database gone), the end marker in the next must not clear the owed entry nor soft-delete the stored rows."""
    conn = writer.conn
    writer.write([settlement(10, "5.00"), settlement(11, "6.00")])  # both owed now
    writer.write([item(1, 10), item(2, 10)])  # what the first fetch of 10 stored
    writer.batch_lost([item(3, 10), settlement(12, "1.00")])  # a later fetch of 10: its rows never committed
    done = writer.write([DetailDone("ods.settlement_item", SPEC.code, SITE, 10, "10", [(3,)], NOW),
                         DetailDone("ods.settlement_item", SPEC.code, SITE, 11, "11", [], NOW)])
    assert done.deleted == 0 and _items(conn) == [(1, 10, False), (2, 10, False)]  # nothing of 10 deleted
    owed = conn.execute("SELECT parent_key FROM etl_meta.detail_pending ORDER BY 1").fetchall()
    checked = conn.execute("SELECT parent_key FROM etl_meta.detail_checked ORDER BY 1").fetchall()
    assert owed == [("10",)] and checked == [("11",)]  # 11's detail (no rows) is complete; 10's stays owed
