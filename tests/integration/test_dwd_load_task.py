"""``DwdLoadTask``: per-table transactions in parallel, failures isolated (spec §3.7, Properties 11 and 14)."""

import json
import logging

import pytest

from dwd_support import BUILDERS, DwdEnv, at, fail_inserts, payload, scd2_violations
from feiqiu_etl.tasks.dwd import DwdLoadTask, DwdSummary, DwdTableResult, ensure_dwd_tables, load_dwd_mapping
from feiqiu_etl.tasks.dwd.schema import DwdSchemaError


@pytest.fixture
def env(pg_dsn):
    e = DwdEnv(pg_dsn)
    for source in BUILDERS:
        for n in (1, 2, 3):
            e.ods.put(source, payload(source, n), fetched_at=at(n))
    yield e
    e.close()


def task(env, now, **kw):
    return DwdLoadTask(env.dsn, env.mapping, run_id=kw.pop("run_id", "run-1"), now=now, **kw)


def test_full_load_then_rerun(env):
    summary = task(env, at(100)).load()
    assert summary.status == "SUCCESS" and (summary.succeeded, summary.failed) == (16, 0)
    assert [t.table for t in summary.tables] == list(env.mapping.names)  # mapping order, each table once
    assert all(t.inserted == 3 and t.updated == 0 and t.closed == 0 for t in summary.tables)
    assert [t.kind for t in summary.tables] == ["dimension"] * 8 + ["fact"] * 8
    again = task(env, at(200), run_id="run-2").load()
    assert again.status == "SUCCESS"
    assert all((t.inserted, t.updated, t.closed) == (0, 0, 0) for t in again.tables)
    for dim in env.mapping.dimensions:
        assert scd2_violations(env.conn, dim.name, list(dim.business_key)) == []


def test_a_failing_table_rolls_back_alone_and_is_reported(env):
    """Property 11: the failure is in ``errors``; every other table loads."""
    task(env, at(100)).load()
    goods_before = env.rows("dim_goods")
    # A changed row (its close runs first) plus a new one whose insert then fails after the close, so only a
    # rollback keeps the old current row.
    env.ods.put("ods.goods", payload("ods.goods", 1, goodsName="可乐"), fetched_at=at(110))
    env.ods.put("ods.goods", payload("ods.goods", 9), fetched_at=at(110))
    fail_inserts(env.conn, "dwd.dim_goods", "goods_id rejected")
    env.ods.put("ods.payment", payload("ods.payment", 4), fetched_at=at(110))
    fail_inserts(env.conn, "dwd.dwd_payment")
    env.ods.put("ods.member", payload("ods.member", 1, nickname="新昵称"), fetched_at=at(110))
    env.ods.put("ods.settlement", payload("ods.settlement", 9), fetched_at=at(110))

    summary = task(env, at(200), run_id="run-2").load()
    assert summary.status == "PARTIAL"
    assert summary.succeeded + summary.failed == summary.total == 16
    assert [e["table"] for e in summary.errors] == ["dim_goods", "dwd_payment"]
    by_name = {t.table: t for t in summary.tables}
    assert "RaiseException" in by_name["dim_goods"].error and "goods_id" in by_name["dim_goods"].error
    assert "RaiseException" in by_name["dwd_payment"].error
    assert (by_name["dim_goods"].inserted, by_name["dim_goods"].closed) == (0, 0)
    assert env.rows("dim_goods") == goods_before
    assert (by_name["dim_member"].inserted, by_name["dim_member"].closed) == (1, 1)
    assert by_name["dwd_settlement"].inserted == 1
    assert "\n" not in by_name["dim_goods"].error


def test_every_table_failing_is_failed_status(env):
    fail_inserts(env.conn, "dwd.dwd_refund")
    fail_inserts(env.conn, "dwd.dim_table_area")
    summary = task(env, at(100)).load(only_tables=["dwd_refund", "dwd.dim_table_area"])
    assert summary.status == "FAILED" and (summary.succeeded, summary.failed) == (0, 2)
    assert [t.table for t in summary.tables] == ["dim_table_area", "dwd_refund"]


def test_now_not_after_existing_valid_from_fails_those_dimensions_clearly(env):
    task(env, at(100)).load(only_tables=["dim_member", "dim_goods"])
    summary = task(env, at(100), run_id="run-2").load(only_tables=["dim_member", "dim_goods", "dim_table"])
    assert [e["table"] for e in summary.errors] == ["dim_member", "dim_goods"]
    assert all("MergeTimeError" in e["error"] and "is not after the latest valid_from" in e["error"]
               for e in summary.errors)
    assert summary.status == "PARTIAL" and {t.table: t.inserted for t in summary.tables}["dim_table"] == 3
    assert "now 2024-03-01T20:01:40+08:00 is not after the latest valid_from 2024-03-01T20:01:40+08:00" in (
        summary.errors[0]["error"])


def test_dimensions_run_before_facts(env, caplog):
    with caplog.at_level(logging.INFO, logger="feiqiu_etl.tasks.dwd.load_task"):
        task(env, at(100), parallel_workers=8).load()
    order = [r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("DWD dwd.")]
    kinds = ["dim" if name.startswith("dwd.dim_") else "fact" for name in order]
    assert len(kinds) == 16 and kinds == sorted(kinds)  # every "dim" before every "fact"


def test_serial_and_parallel_summaries_agree(env, pg_server_dsn):
    parallel = task(env, at(100)).load()
    env.truncate(*(t.target for t in env.mapping.tables), "etl_meta.dwd_watermark")
    serial = task(env, at(100)).load(serial=True)

    def shape(s):
        return [(t.table, t.inserted, t.updated, t.closed, t.error) for t in s.tables]

    assert shape(parallel) == shape(serial)


def test_only_tables_validation_and_selection(env):
    with pytest.raises(ValueError, match=r"unknown DWD table\(s\) dim_nope, facts; known: dim_member, "):
        task(env, at(100)).load(only_tables=["dim_nope", "dim_goods", "facts"])
    summary = task(env, at(100)).load(only_tables=["dwd_payment"])
    assert [t.table for t in summary.tables] == ["dwd_payment"]
    assert env.rows("dim_member") == []


def test_summary_is_json_ready():
    s = DwdSummary(now=at(1), tables=(DwdTableResult("dim_a", "dimension", 1, 2, 3, 0.12345),
                                      DwdTableResult("dwd_b", "fact", seconds=0.5, error="DataError: bad")))
    d = json.loads(json.dumps(s.to_dict()))
    assert d == {
        "now": "2024-03-01T12:00:01+00:00",
        "tables": [
            {"table": "dim_a", "kind": "dimension", "inserted": 1, "updated": 2, "closed": 3, "seconds": 0.123,
             "error": None, "quarantined": 0, "quarantine": []},
            {"table": "dwd_b", "kind": "fact", "inserted": 0, "updated": 0, "closed": 0, "seconds": 0.5,
             "error": "DataError: bad", "quarantined": 0, "quarantine": []},
        ],
        "succeeded": 1, "failed": 1, "errors": [{"table": "dwd_b", "error": "DataError: bad"}], "quarantined": 0,
    }
    assert s.status == "PARTIAL" and DwdSummary(now=at(1)).status == "SUCCESS"


def test_constructor_rejects_bad_arguments():
    m = load_dwd_mapping()
    with pytest.raises(ValueError, match="parallel_workers"):
        DwdLoadTask("dbname=x", m, parallel_workers=0, run_id="r")
    with pytest.raises(ValueError, match="run_id"):
        DwdLoadTask("dbname=x", m, run_id="")
    with pytest.raises(ValueError, match="timezone-aware"):
        DwdLoadTask("dbname=x", m, run_id="r", now=at(1).replace(tzinfo=None))


def test_unreachable_database_fails_every_table_without_raising():
    m = load_dwd_mapping()
    summary = DwdLoadTask("host=/nonexistent-socket-dir dbname=x connect_timeout=1", m, run_id="r",
                          now=at(1)).load(only_tables=["dim_goods", "dwd_refund"])
    assert summary.status == "FAILED" and all("OperationalError" in e["error"] for e in summary.errors)


def test_ddl_is_idempotent_and_checks_existing_tables(env):
    ensure_dwd_tables(env.conn, env.mapping)
    constraints = {r[0] for r in env.conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'dwd.dim_member'::regclass")}
    assert {"dim_member_bk_valid_from_uq", "dim_member_valid_range_ck", "dim_member_current_ck"} <= constraints
    index = env.conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'dim_member_current_uq'").fetchone()
    assert index and "UNIQUE" in index[0] and "(site_id, member_id) WHERE is_current" in index[0]
    pk = env.conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                          " WHERE conrelid = 'dwd.dwd_payment'::regclass AND contype = 'p'").fetchone()[0]
    assert pk == "PRIMARY KEY (site_id, pay_id)"
    env.conn.execute("ALTER TABLE dwd.dim_goods DROP COLUMN barcode")
    with pytest.raises(DwdSchemaError, match="dwd.dim_goods exists but lacks mapped column"):
        ensure_dwd_tables(env.conn, env.mapping)


def test_missing_source_or_target_table_fails_that_table_only(env):
    env.conn.execute("DROP TABLE ods.refund")
    env.conn.execute("DROP TABLE dwd.dim_table_area")
    summary = task(env, at(100)).load(only_tables=["dwd_refund", "dim_table_area", "dim_table"])
    errors = {e["table"]: e["error"] for e in summary.errors}
    assert errors["dwd_refund"] == (
        "SourceTableError: dwd.dwd_refund: source table ods.refund does not exist or has no primary key")
    assert errors["dim_table_area"].startswith("UndefinedTable: ") and "dim_table_area" in errors["dim_table_area"]
    assert summary.succeeded == 1
