"""Issue 21: whatever ends a lane early, every detail that was due and not fetched stays owed and the next run
fetches it. The issue's cell: a fleet of two lanes; one token starts answering 40101 after 25 of its requests,
while its lane fetches member details; the other lane finishes exact; the next run, the token valid again,
leaves 0 parents without their detail. Real simulator over HTTP, real PostgreSQL."""

from __future__ import annotations

import psycopg

from feiqiu_etl.simulator import Simulator
from flowkit import CONNECTOR, fleet_file, options, run_opts, sim_config, store_exact

NORTH = (8640015201004417, 8640015201004418)
SOUTH = (8640015201004421,)
TASKS = ["ODS_MEMBER", "ODS_SETTLEMENT", "ODS_GROUP_PACKAGE"]


def parents_without_detail(dsn: str) -> dict[str, int]:
    """Per task, live parents whose detail was never fetched (no ``detail_checked`` row)."""
    out = {}
    with psycopg.connect(dsn) as conn:
        for spec in (CONNECTOR.task(c) for c in TASKS):
            key = spec.keys[0].column
            out[spec.code] = conn.execute(
                f"SELECT count(*) FROM {spec.table} t WHERE NOT t.is_deleted AND NOT EXISTS (SELECT 1 FROM "
                f"etl_meta.detail_checked c WHERE c.task_code = %s AND c.site_id = t.site_id "
                f"AND c.parent_key = t.{key}::text)", (spec.code,)).fetchone()[0]
    return out


def owed(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT task_code, count(*) FROM etl_meta.detail_pending GROUP BY 1").fetchall())


def test_a_token_refused_while_fetching_details_keeps_them_owed_until_the_next_run(pg_dsn, tmp_path):
    cfg = sim_config(seed=91, site_ids=NORTH + SOUTH, tokens={"fq_north": NORTH, "fq_south": SOUTH},
                     token="fq_admin")
    fleet = fleet_file(tmp_path / "fleet.yaml", {"north": ("FQ_NORTH", NORTH), "south": ("FQ_SOUTH", SOUTH)})
    env = {"FQ_NORTH": "fq_north", "FQ_SOUTH": "fq_south"}
    with Simulator(cfg) as sim:
        opts = options(sim, tasks=TASKS, token=None, site_ids=[], fleet_path=fleet, environ=env,
                       overrides={"detail.recheck_share": 0.02})
        sim.revoke("fq_north", after=25)  # 2 member lists, then member details of both stores
        first = run_opts(opts, pg_dsn)
        lanes = {lane.name: lane for lane in first.lanes}
        assert lanes["north"].status == "FAILED" and "40101" in lanes["north"].reason
        assert lanes["south"].status == "SUCCESS" and first.status == "PARTIAL"
        store_exact(pg_dsn, sim, SOUTH[0], TASKS)
        refused = [e for e in sim.request_log() if e.site_id in NORTH and e.code == 40101]
        assert refused and all(e.path in ("/api/member/detail", "/api/member/list") for e in refused)
        missing = parents_without_detail(pg_dsn)
        assert missing["ODS_MEMBER"] > 20 and owed(pg_dsn) == {"ODS_MEMBER": missing["ODS_MEMBER"]}
        with psycopg.connect(pg_dsn) as conn:  # the refusal was no attempt of any of them
            assert conn.execute("SELECT max(attempts) FROM etl_meta.detail_pending").fetchone()[0] == 0

        sim.reinstate("fq_north")
        sim.clear_log()
        second = run_opts(opts, pg_dsn)
        assert second.status == "SUCCESS", second.to_dict()
        assert parents_without_detail(pg_dsn) == dict.fromkeys(TASKS, 0) and owed(pg_dsn) == {}
        for site in NORTH + SOUTH:
            store_exact(pg_dsn, sim, site, TASKS)
        fetched = [e for e in sim.request_log() if e.path == "/api/member/detail" and e.site_id in NORTH]
        assert len(fetched) >= missing["ODS_MEMBER"]

