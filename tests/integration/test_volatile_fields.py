"""Issue 20.2: a parent whose only change is in a volatile field (upstream-api.md Q11: ``member.points``) is
updated in ODS and asks for no detail — the simulator's request log counts the requests — unless the task's
``detail.refetch_on_volatile`` asks for it; any other change still fetches the detail."""

from __future__ import annotations

from pathlib import Path

import psycopg
import yaml

from feiqiu_etl.connector.model import default_connector_path
from feiqiu_etl.simulator import Simulator
from flowkit import expected_rows, ods_rows, run_flow, sim_config, CONNECTOR

TASK = "ODS_MEMBER"
DETAIL = "/api/member/detail"


def _detail_ids(sim: Simulator) -> list[int]:
    return sorted(int(e.body["memberId"]) for e in sim.request_log() if e.path == DETAIL)


def _cards(dsn: str) -> dict:
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1] for r in conn.execute(
            "SELECT member_id, array_agg(content_hash ORDER BY card_id) FROM ods.member_detail_card GROUP BY 1")}


def _run(sim, dsn, **kw):
    result = run_flow(sim, dsn, tasks=[TASK], window=False, **kw)
    assert result.status == "SUCCESS", result.to_dict()
    return result.tasks[0]


def _connector(tmp_path: Path, **detail) -> str:
    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    data.pop("dwd_mapping", None)
    for task in data["tasks"]:
        if task["code"] == TASK:
            task["detail"].update(detail)
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_a_points_only_change_updates_ods_and_asks_for_no_detail(pg_dsn):
    with Simulator(sim_config(seed=81)) as sim:
        site = sim.config.site_ids[0]
        _run(sim, pg_dsn)
        members = [m["memberId"] for m in sim.dataset.records(TASK, site)]
        points_only, edited, both = members[:6], members[6:9], members[9:11]
        for m in points_only + both:
            sim.dataset.touch_volatile(TASK, site, m)
        for m in edited + both:
            sim.dataset.update(TASK, site, m, {"nickname": f"n{m % 1000}"})
        cards_before = _cards(pg_dsn)
        sim.clear_log()
        second = _run(sim, pg_dsn)
        assert _detail_ids(sim) == sorted(edited + both)  # the points alone asked for nothing
        r = second.result
        assert r.total_updated == len(points_only + edited + both) and r.detail_success == len(edited + both)
        # ODS holds the new points of every member; the stored detail rows of the points-only ones stay as they were
        assert ods_rows(pg_dsn, "ods.member") == expected_rows(sim, CONNECTOR.task(TASK), site)
        cards = _cards(pg_dsn)
        assert all(cards.get(m) == cards_before.get(m) for m in points_only)
        with psycopg.connect(pg_dsn) as conn:  # nothing is owed: a volatile change is not a missing detail
            assert conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0] == 0


def test_refetch_on_volatile_asks_for_the_details_anyway(pg_dsn, tmp_path):
    connector = _connector(tmp_path, refetch_on_volatile=True)
    with Simulator(sim_config(seed=82)) as sim:
        site = sim.config.site_ids[0]
        _run(sim, pg_dsn, connector_path=connector)
        members = [m["memberId"] for m in sim.dataset.records(TASK, site)][:5]
        for m in members:
            sim.dataset.touch_volatile(TASK, site, m)
        sim.clear_log()
        second = _run(sim, pg_dsn, connector_path=connector)
        assert _detail_ids(sim) == sorted(members) and second.result.detail_success == 5


def test_new_fields_and_points_together_still_need_no_detail_but_a_lost_field_does(pg_dsn):
    with Simulator(sim_config(seed=83)) as sim:
        site = sim.config.site_ids[0]
        _run(sim, pg_dsn)
        members = [m["memberId"] for m in sim.dataset.records(TASK, site)]
        for m in members[:4]:
            sim.dataset.touch_volatile(TASK, site, m)
        sim.add_field("vipLevel", 2, TASK)  # schema drift on every member, points on four of them
        sim.clear_log()
        second = _run(sim, pg_dsn)
        assert _detail_ids(sim) == [] and second.result.total_updated == len(members)
        sim.remove_field("vipLevel", TASK)  # a field the stored payloads had disappears: a real change
        sim.clear_log()
        third = _run(sim, pg_dsn)
        assert _detail_ids(sim) == sorted(members) and third.result.detail_success == len(members)
