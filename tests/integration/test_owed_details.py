"""Owed details have a life cycle: "not found" (40401) resolves them, other failures count attempts until
``detail.max_attempts`` gives them up, and ``feiqiu-etl details`` lists and drops them."""

from __future__ import annotations

import math

import psycopg
from psycopg.types.json import Jsonb

from clikit import cli, cli_json
from feiqiu_etl.simulator import Simulator
from flowkit import run_flow, sim_config


def _owed(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT task_code, parent_key, attempts, last_error FROM etl_meta.detail_pending "
                            "ORDER BY parent_key").fetchall()


def _owe(dsn: str, task: str, site: int, records: list[dict], key: str) -> None:
    with psycopg.connect(dsn) as conn:
        for r in records:
            conn.execute("INSERT INTO etl_meta.detail_pending (connector, task_code, site_id, parent_key, record, "
                         "attempts) VALUES ('feiqiu', %s, %s, %s, %s, 0)", (task, site, str(r[key]), Jsonb(r)))


def test_owed_details_that_answer_not_found_leave_the_list_and_never_fail_the_task(pg_dsn, caplog):
    with Simulator(sim_config(seed=41)) as sim:
        site = sim.config.site_ids[0]
        assert run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False).status == "SUCCESS"
        members = sim.dataset.records("ODS_MEMBER", site)[:12]
        _owe(pg_dsn, "ODS_MEMBER", site, members, "memberId")  # owed by a cancelled run...
        for m in members:
            sim.dataset.delete("ODS_MEMBER", site, m["memberId"])  # ...then deleted upstream: 40401
        with caplog.at_level("INFO", logger="feiqiu_etl"):
            second = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False)
        member = second.tasks[0].result
        # each is said once, naming its parent, at INFO: an expected outcome, not a warning flood
        gone = [r for r in caplog.records if "no longer exists upstream (40401)" in r.getMessage()]
        assert sorted(r.getMessage().split()[3] for r in gone) == sorted(str(m["memberId"]) for m in members)
        assert all(r.levelname == "INFO" for r in gone)
        assert not [r for r in caplog.records if r.levelname == "WARNING" and "40401" in r.getMessage()]
        assert member.status == "PARTIAL" and member.detail_failure == 12  # recorded, not FAILED
        assert _owed(pg_dsn) == []  # resolved: no retry of a record that does not exist
        third = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False)
    assert third.status == "SUCCESS" and third.tasks[0].result.detail_failure == 0


def test_an_owed_detail_that_keeps_failing_is_given_up_after_max_attempts(pg_dsn):
    with Simulator(sim_config(seed=42)) as sim:
        site = sim.config.site_ids[0]
        assert run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False).status == "SUCCESS"
        member = sim.dataset.records("ODS_MEMBER", site)[0]
        _owe(pg_dsn, "ODS_MEMBER", site, [member], "memberId")
        settings = {"detail.max_attempts": 2, "api.retry_attempts": 1, "detail.recheck_share": 0}
        outcomes = []
        for _ in range(3):
            sim.inject(path="/api/member/detail", kind="http503", count=1)
            run = run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False, overrides=settings)
            outcomes.append((run.tasks[0].result.detail_failure, list(run.tasks[0].details_given_up),
                             [(a, bool(e)) for _, _, a, e in _owed(pg_dsn)]))
    assert outcomes[0] == (1, [], [(1, True)])  # one failed attempt counted, with its error
    assert outcomes[1] == (1, [str(member["memberId"])], [])  # second failure: given up and reported
    assert outcomes[2] == (0, [], [])  # nothing owed any more


def test_details_lists_and_drops_owed_details(pg_dsn):
    with Simulator(sim_config(seed=43)) as sim:
        site = sim.config.site_ids[0]
        assert run_flow(sim, pg_dsn, tasks=["ODS_MEMBER"], window=False).status == "SUCCESS"
        members = sim.dataset.records("ODS_MEMBER", site)[:3]
    _owe(pg_dsn, "ODS_MEMBER", site, members, "memberId")
    listed = cli_json("details", "--dsn", pg_dsn)
    assert sorted(r["parent_key"] for r in listed) == sorted(str(m["memberId"]) for m in members)
    dropped = cli("details", "drop", "ODS_MEMBER", str(members[0]["memberId"]), "--dsn", pg_dsn)
    assert dropped.returncode == 0 and "dropped 1" in dropped.stdout
    assert len(_owed(pg_dsn)) == 2
    unknown = cli("details", "drop", "ODS_MEMBER", str(members[1]["memberId"]), "abc", "--dsn", pg_dsn)
    assert unknown.returncode == 2 and "not owed by ODS_MEMBER: abc" in unknown.stderr and len(_owed(pg_dsn)) == 2
    bad_task = cli("details", "drop", "ODS_NOPE", "--all", "--dsn", pg_dsn)
    assert bad_task.returncode == 2 and "ODS_NOPE" in bad_task.stderr
    refused = cli("details", "drop", "ODS_MEMBER", "--dsn", pg_dsn)
    assert refused.returncode == 2 and "--all" in refused.stderr
    assert cli("details", "drop", "ods_member", "--all", "--dsn", pg_dsn).returncode == 0 and _owed(pg_dsn) == []


def test_a_corrupted_detail_is_repaired_by_the_periodic_recheck_within_bounded_runs(pg_dsn):
    share = 0.5  # of a run of one request (the package list): one re-check every second run
    with Simulator(sim_config(seed=44)) as sim:
        site = sim.config.site_ids[0]
        first = run_flow(sim, pg_dsn, tasks=["ODS_GROUP_PACKAGE"], window=False)
        assert first.status == "SUCCESS"
        with psycopg.connect(pg_dsn) as conn:  # one detail row goes bad in the warehouse
            conn.execute("UPDATE ods.group_package_content SET payload = payload || '{\"qty\": -1}', "
                         "content_hash = 'corrupt' WHERE ctid = (SELECT min(ctid) FROM ods.group_package_content)")
        packages = len(sim.dataset.records("ODS_GROUP_PACKAGE", site))
        used = []
        for _ in range(math.ceil(packages / share)):  # all of them re-checked within N runs
            run = run_flow(sim, pg_dsn, tasks=["ODS_GROUP_PACKAGE"], window=False,
                           overrides={"detail.recheck_share": share})
            used.append(run.tasks[0].recheck)
            with psycopg.connect(pg_dsn) as conn:
                bad = conn.execute("SELECT count(*) FROM ods.group_package_content "
                                   "WHERE content_hash = 'corrupt'").fetchone()[0]
            if bad == 0:
                break
    assert bad == 0, used
    assert all(u["used"] == u["budget"] for u in used), used  # the budget is reported and used
    # a budget is a share, rounded down, the rest carried: one re-check per two runs, never more
    assert [u["budget"] for u in used] == [(n + 1) % 2 for n in range(1, len(used) + 1)], used
    assert all(u["credit"] == (0.5 if u["budget"] == 0 else 0.0) for u in used), used
