"""upstream-api.md §1.5: the store keeps trading while we page. A record edited mid-paging ends with its last
content; a snapshot whose total moved is not used for soft deletes; the next complete snapshot settles it."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import yaml

from feiqiu_etl.connector.model import default_connector_path
from feiqiu_etl.simulator import Simulator
from feiqiu_etl.connector.windows import fmt
from flowkit import ANCHOR, ods_rows, run_flow, sim_config

WINDOW = dict(window_start=fmt(ANCHOR - timedelta(days=2)), window_end=fmt(ANCHOR + timedelta(days=1)))


def small_pages_connector(tmp_path) -> str:
    """The Feiqiu connector with 5-record pages (connectors are data: no Python needed)."""
    raw = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    raw.pop("dwd_mapping")
    for task in raw["tasks"]:
        task["page_size"] = 5
    path = tmp_path / "feiqiu-small-pages.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_churn_between_pages(tmp_path, pg_dsn):
    connector = small_pages_connector(tmp_path)
    with Simulator(sim_config(seed=3, churn_between_pages=True)) as sim:
        site = sim.config.site_ids[0]
        sim.dataset.set_now(ANCHOR + timedelta(hours=1))
        result = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER", "ODS_SETTLEMENT"], window=False,
                          connector_path=connector, **WINDOW)
        churned = [e for e in sim.request_log() if e.body and e.body.get("page", 1) > 1]
        assert len(churned) > 10
        # updateTime window: edits move a record to the end of the listing, so the last page sees it again
        settlements = {(site, r["settleId"]): r for r in
                       sim.dataset.window("ODS_SETTLEMENT", site, WINDOW["window_start"], WINDOW["window_end"])}
        assert ods_rows(pg_dsn, "ods.settlement") == settlements
        members_now = {(site, r["memberId"]) for r in sim.dataset.records("ODS_MEMBER", site)}
        deleted = set(ods_rows(pg_dsn, "ods.member", live_only=False)) - set(ods_rows(pg_dsn, "ods.member"))
        assert not (deleted & members_now), "a live member was soft-deleted"
        member_run = next(t for t in result.tasks if t.task_code == "ODS_MEMBER")
        assert member_run.snapshot_note.startswith("soft delete skipped"), member_run.snapshot_note



def test_snapshot_soft_delete_and_revival(tmp_path, pg_dsn):
    connector = small_pages_connector(tmp_path)
    with Simulator(sim_config(seed=4)) as sim:
        site = sim.config.site_ids[0]
        assert run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], connector_path=connector).status == "SUCCESS"
        victim = sim.dataset.records("ODS_GOODS", site)[3]
        sim.dataset.delete("ODS_GOODS", site, victim["goodsId"])
        second = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], connector_path=connector)
        assert second.tasks[0].result.total_deleted == 1
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT is_deleted, deleted_at IS NOT NULL FROM ods.goods WHERE goods_id = %s",
                               (victim["goodsId"],)).fetchone()
        assert row == (True, True)
        assert set(ods_rows(pg_dsn, "ods.goods")) == {(site, r["goodsId"]) for r in sim.dataset.records("ODS_GOODS", site)}
        # a record wrongly marked deleted (e.g. skipped by a shifting snapshot) is revived when seen again
        revived = sim.dataset.records("ODS_GOODS", site)[0]["goodsId"]
        with psycopg.connect(pg_dsn) as conn:
            conn.execute("UPDATE ods.goods SET is_deleted = true, deleted_at = now() WHERE goods_id = %s", (revived,))
        third = run_flow(sim, pg_dsn, tasks=["ODS_GOODS"], connector_path=connector)
        assert third.tasks[0].result.total_updated == 1 and third.tasks[0].result.total_deleted == 0
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT is_deleted, deleted_at FROM ods.goods WHERE goods_id = %s",
                                (revived,)).fetchone() == (False, None)
