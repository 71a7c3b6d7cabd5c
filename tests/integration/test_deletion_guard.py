"""Issue 25 part 4 "Done when": the deletion guard against the real simulator and PostgreSQL
(tasks/ods/deletions.py). Three snapshot lists that answer ``code 0, total 0`` for a whole run delete nothing:
the run ends PARTIAL naming the three tasks, one alert is sent, and the next normal run is SUCCESS with no extra
SCD2 version. Half of the goods deleted upstream is held back once, then applied by the confirming run — or at
once by ``state accept-deletions`` — and DWD closes those versions."""

from __future__ import annotations

import psycopg
import pytest

from clikit import cli, cli_json
from alertkit import WebhookReceiver
from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, run_flow, sim_config

EMPTY = ["ODS_MEMBER", "ODS_GOODS", "ODS_BILLIARD_TABLE"]
PATHS = {code: CONNECTOR.task(code).endpoint for code in EMPTY}
DIMS = {"ODS_MEMBER": "dwd.dim_member", "ODS_GOODS": "dwd.dim_goods", "ODS_BILLIARD_TABLE": "dwd.dim_table"}


def live(dsn: str, table: str) -> tuple[int, int]:
    """(live rows, soft-deleted rows) of an ODS table."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FILTER (WHERE NOT is_deleted), count(*) FILTER (WHERE is_deleted) "
                            f"FROM {table}").fetchone()


def versions(dsn: str, table: str) -> tuple[int, int]:
    """(all SCD2 versions, current versions) of a DWD dimension."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*), count(*) FILTER (WHERE is_current) FROM {table}").fetchone()


def holds(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT task_code, status, jsonb_array_length(keys), live_rows, empty_snapshot, applied "
                            "FROM etl_meta.deletion_hold ORDER BY id").fetchall()


@pytest.fixture
def hook(monkeypatch):
    """A receiver the runs alert through ``FEIQIU_ALERT_URLS`` (a run given no configuration reads the
    environment's when it starts)."""
    with WebhookReceiver() as receiver:
        monkeypatch.setenv("FEIQIU_ALERT_URLS", receiver.url)
        yield receiver


def test_three_empty_snapshots_delete_nothing_end_partial_alert_once_and_leave_no_scd2_trace(pg_dsn, hook):
    dims = [d for d in DIMS.values()]
    with Simulator(sim_config(seed=25)) as sim:
        first = run_flow(sim, pg_dsn, tasks=EMPTY, window=False, load_dwd=True)
        assert first.status == "SUCCESS", first.to_dict()
        before = {code: live(pg_dsn, CONNECTOR.task(code).table) for code in EMPTY}
        assert all(n > 0 and gone == 0 for n, gone in before.values()), before
        scd2 = {d: versions(pg_dsn, d) for d in dims}
        hook.received.clear()
        for code in EMPTY:  # code 0, total 0, no rows: for every list request of the run
            sim.inject(PATHS[code], "total_zero", count=50)
        glitch = run_flow(sim, pg_dsn, tasks=EMPTY, window=False, load_dwd=True)
        sim.clear_faults()
        assert glitch.status == "PARTIAL"
        assert {code: live(pg_dsn, CONNECTOR.task(code).table) for code in EMPTY} == before  # 0 soft-deleted
        assert sum(t.result.total_deleted for t in glitch.tasks) == 0
        errors = [e["error"] for t in glitch.tasks for e in t.result.errors]
        assert len(errors) == 3
        for code in EMPTY:  # each task named, with its share and rows
            n = before[code][0]
            assert any(f"{code} at store" in e and f"{n} of {n} live rows (100.0%" in e and "no row at all" in e
                       for e in errors), (code, errors)
        assert {t.task_code: t.deletions["held"] for t in glitch.tasks} == {c: before[c][0] for c in EMPTY}
        assert {d: versions(pg_dsn, d) for d in dims} == scd2  # DWD follows ODS: no version closed
        messages = hook.messages()
        assert len(messages) == 1, messages  # one alert
        assert "PARTIAL" in messages[0]["title"] and "DELETIONS_HELD" in messages[0]["title"]
        assert all(code in messages[0]["message"] for code in EMPTY)
        assert [h[1:5] for h in holds(pg_dsn)] == [("held", before[c][0], before[c][0], True)
                                                     for c in sorted(EMPTY, key=lambda c: [t.task_code for t in
                                                                                            glitch.tasks].index(c))]
        shown = cli_json("state", "show", "--dsn", pg_dsn)
        assert sorted(h["task"] for h in shown["held_deletions"]) == sorted(EMPTY)

        normal = run_flow(sim, pg_dsn, tasks=EMPTY, window=False, load_dwd=True)
        assert normal.status == "SUCCESS", normal.to_dict()
        assert {code: live(pg_dsn, CONNECTOR.task(code).table) for code in EMPTY} == before
        assert {d: versions(pg_dsn, d) for d in dims} == scd2  # 0 extra SCD2 versions
        assert sum(t.result.total_inserted + t.result.total_updated for t in normal.tasks) == 0
        assert [h[1] for h in holds(pg_dsn)] == ["withdrawn"] * 3  # every key came back: nothing to delete


def _half_of_the_goods(sim) -> tuple[int, list[str]]:
    site = sim.config.site_ids[0]
    goods = sorted(g["goodsId"] for g in sim.dataset.records("ODS_GOODS", site))
    gone = goods[::2]
    for goods_id in gone:
        sim.dataset.delete("ODS_GOODS", site, goods_id)
    return site, gone


def _current(dsn: str, ids: list[str]) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM dwd.dim_goods WHERE is_current AND goods_id = ANY(%s)",
                            (ids,)).fetchone()[0]


def test_half_of_the_goods_deleted_upstream_is_held_once_then_applied_by_the_confirming_run(pg_dsn):
    with Simulator(sim_config(seed=26)) as sim:
        assert run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True).status == "SUCCESS"
        total = live(pg_dsn, "ods.goods")[0]
        site, gone = _half_of_the_goods(sim)
        assert len(gone) > 5 and len(gone) / total > 0.2  # over both thresholds
        held = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True)
        assert held.status == "PARTIAL" and held.tasks[0].result.total_deleted == 0
        assert f"{len(gone)} of {total} live rows" in held.tasks[0].result.errors[0]["error"]
        assert live(pg_dsn, "ods.goods") == (total, 0) and _current(pg_dsn, gone) == len(gone)
        assert holds(pg_dsn) == [("ODS_GOODS", "held", len(gone), total, False, None)]
        confirmed = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True)
        assert confirmed.status == "SUCCESS", confirmed.to_dict()
        assert confirmed.tasks[0].result.total_deleted == len(gone)
        assert confirmed.tasks[0].deletions["confirmed"] == len(gone)
        assert live(pg_dsn, "ods.goods") == (total - len(gone), len(gone))
        assert holds(pg_dsn) == [("ODS_GOODS", "confirmed", len(gone), total, False, len(gone))]
        assert _current(pg_dsn, gone) == 0  # DWD closed those versions
        dim = {t["table"]: t for t in confirmed.dwd["tables"]}["dim_goods"]
        assert dim["closed"] == len(gone)
        assert site in sim.config.site_ids


def test_state_accept_deletions_applies_the_held_deletions_at_once_and_is_recorded(pg_dsn):
    with Simulator(sim_config(seed=27)) as sim:
        assert run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True).status == "SUCCESS"
        total = live(pg_dsn, "ods.goods")[0]
        site, gone = _half_of_the_goods(sim)
        assert run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True).status == "PARTIAL"
        bad = cli("state", "accept-deletions", "--store", str(site), "--dsn", pg_dsn)
        assert bad.returncode == 2 and "needs --site-id SITE_ID and --task TASK_CODE" in bad.stderr
        windowed = cli("state", "accept-deletions", "--store", str(site), "--task", "ODS_PAYMENT", "--dsn", pg_dsn)
        assert windowed.returncode == 2 and "windowed task" in windowed.stderr
        done = cli_json("state", "accept-deletions", "--store", str(site), "--task", "ods_goods", "--dsn", pg_dsn)
        assert (done["keys"], done["deleted"], done["task"]) == (len(gone), len(gone), "ODS_GOODS")
        assert done["user"] and done["held_by_run"]
        assert live(pg_dsn, "ods.goods") == (total - len(gone), len(gone))  # at once, before any run
        with psycopg.connect(pg_dsn) as conn:
            status, by, applied = conn.execute("SELECT status, decided_by, applied FROM etl_meta.deletion_hold"
                                               ).fetchone()
        assert status == "accepted" and by.startswith(done["user"] + "@") and applied == len(gone)
        again = cli("state", "accept-deletions", "--store", str(site), "--task", "ODS_GOODS", "--dsn", pg_dsn)
        assert again.returncode == 0 and "nothing to accept" in again.stdout
        after = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False, load_dwd=True)
        assert after.status == "SUCCESS" and after.tasks[0].result.total_deleted == 0  # already applied
        assert _current(pg_dsn, gone) == 0  # and DWD closed those versions
        assert {t["table"]: t for t in after.dwd["tables"]}["dim_goods"]["closed"] == len(gone)


def test_a_small_deletion_under_the_thresholds_is_applied_at_once_and_the_thresholds_are_settings(pg_dsn):
    with Simulator(sim_config(seed=28)) as sim:
        site = sim.config.site_ids[0]
        assert run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False).status == "SUCCESS"
        total = live(pg_dsn, "ods.goods")[0]
        goods = sorted(g["goodsId"] for g in sim.dataset.records("ODS_GOODS", site))
        for goods_id in goods[:5]:  # 5 rows: not more than max_delete_rows
            sim.dataset.delete("ODS_GOODS", site, goods_id)
        small = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False)
        assert small.status == "SUCCESS" and small.tasks[0].result.total_deleted == 5
        sim.dataset.delete("ODS_GOODS", site, goods[5])
        sim.dataset.delete("ODS_GOODS", site, goods[6])
        strict = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], window=False,
                          overrides={"integrity.max_delete_rows": 1, "integrity.max_delete_share": 0.05})
        assert strict.status == "PARTIAL" and strict.tasks[0].deletions["held"] == 2
        assert live(pg_dsn, "ods.goods") == (total - 5, 5)
        # an empty snapshot is held back even under both thresholds (3 areas: not more than 5 rows)
        assert run_flow(sim, pg_dsn, tasks=["ODS_TABLE_AREA"], window=False).status == "SUCCESS"
        assert live(pg_dsn, "ods.table_area") == (3, 0)
        sim.inject(CONNECTOR.task("ODS_TABLE_AREA").endpoint, "total_zero", count=5)
        empty = run_flow(sim, pg_dsn, tasks=["ODS_TABLE_AREA"], window=False)
        assert empty.status == "PARTIAL" and empty.tasks[0].deletions["empty"] is True
        assert live(pg_dsn, "ods.table_area") == (3, 0)
    bad = cli("plan", "--set", "integrity.max_delete_share=1.5", "--dsn", pg_dsn)
    assert bad.returncode == 2 and "integrity.max_delete_share must be <= 1" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
