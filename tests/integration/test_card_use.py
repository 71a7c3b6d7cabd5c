"""Issue 25 part 6 "Done when: card use": a member's detail is due when what it holds changed, not only when the
member's list row did. 5 members pay with a stored-value card (balance and points change; the member's
``updateTime`` stays: Q11): the next run fetches those 5 details — the card snapshot's changed cards make them due
(connector ``detail.due_when``) — and afterwards 0 rows of ``ods.member_detail_card`` contradict
``ods.member_card``. Without the rule the same 5 stay stale (what the issue measured)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import yaml

from feiqiu_etl.connector import load_connector
from feiqiu_etl.connector.model import default_connector_path
from feiqiu_etl.simulator import Simulator
from flowkit import run_flow, sim_config

TASKS = ["ODS_MEMBER", "ODS_MEMBER_CARD"]  # given parent first: the run order puts the cards first
DETAIL = "/api/member/detail"
SAME = ("balance", "giftBalance", "status", "remainingTimes", "cardKind", "cardTypeName", "isDefault")
"""The fields a detail's card row shares with the card snapshot (upstream-api §5.4)."""


def contradictions(dsn: str) -> int:
    """Rows of ods.member_detail_card whose shared fields differ from the live card of ods.member_card."""
    differ = " OR ".join(f"d.payload->'{f}' IS DISTINCT FROM c.payload->'{f}'" for f in SAME)
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM ods.member_detail_card d JOIN ods.member_card c ON c.site_id = d.site_id "
            f"AND c.card_id = d.card_id WHERE NOT d.is_deleted AND NOT c.is_deleted AND ({differ} "
            "OR d.member_id::text IS DISTINCT FROM c.payload->>'memberId')").fetchone()[0]


def _use_cards(sim: Simulator, n: int) -> list[int]:
    site = sim.config.site_ids[0]
    members: list[int] = []
    for card in sim.dataset.records("ODS_MEMBER_CARD", site):
        if card["status"] == 1 and float(card["balance"]) > 1 and card["memberId"] not in members:
            members.append(card["memberId"])
        if len(members) == n:
            break
    for member_id in members:
        used = sim.dataset.card_use(site, member_id, "1.00")
        assert used["memberId"] == member_id
    return sorted(members)


def _details(sim: Simulator) -> list[int]:
    return sorted(int(e.body["memberId"]) for e in sim.request_log() if e.path == DETAIL)


def _without_rule(tmp_path: Path) -> str:
    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    data.pop("dwd_mapping", None)
    for task in data["tasks"]:
        if task["code"] == "ODS_MEMBER":
            task["detail"].pop("due_when")
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_card_use_by_5_members_makes_their_details_due_and_leaves_no_contradiction(pg_dsn):
    with Simulator(sim_config(seed=61)) as sim:
        first = run_flow(sim, pg_dsn, tasks=TASKS, window=False)
        assert first.status == "SUCCESS" and [t.task_code for t in first.tasks] == ["ODS_MEMBER_CARD", "ODS_MEMBER"]
        assert contradictions(pg_dsn) == 0
        used = _use_cards(sim, 5)
        sim.clear_log()
        second = run_flow(sim, pg_dsn, tasks=TASKS, window=False)
        assert second.status == "SUCCESS", second.to_dict()
        cards, member = second.tasks
        # 5 cards; 5 points-only members and the 5 card rows of their details
        assert cards.result.total_updated == 5 and member.result.total_updated == 5 + 5
        assert _details(sim) == used  # exactly those 5 details, once each
        assert member.owed_details == 5 and member.result.detail_success == 5
        assert contradictions(pg_dsn) == 0
        with psycopg.connect(pg_dsn) as conn:
            used_at = conn.execute("SELECT count(*) FROM ods.member_detail_card WHERE member_id = ANY(%s) "
                                   "AND payload->>'lastUseTime' = %s", (used, sim.dataset.now())).fetchone()[0]
            owed = conn.execute("SELECT count(*) FROM etl_meta.detail_pending").fetchone()[0]
        assert used_at == 5 and owed == 0  # lastUseTime, which only the detail holds, is current
        sim.clear_log()
        third = run_flow(sim, pg_dsn, tasks=TASKS, window=False)  # nothing changed: nothing asked
        assert third.status == "SUCCESS" and _details(sim) == []


def test_without_the_rule_the_same_card_use_leaves_5_stale_rows(pg_dsn, tmp_path):
    connector = _without_rule(tmp_path)
    with Simulator(sim_config(seed=61)) as sim:
        assert run_flow(sim, pg_dsn, tasks=TASKS, window=False, connector_path=connector).status == "SUCCESS"
        _use_cards(sim, 5)
        sim.clear_log()
        second = run_flow(sim, pg_dsn, tasks=TASKS, window=False, connector_path=connector)
        assert second.status == "SUCCESS" and _details(sim) == []  # volatile only: no detail asked
        assert contradictions(pg_dsn) == 5


def test_the_rule_is_connector_data_checked_on_load(tmp_path):
    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    for task in data["tasks"]:
        if task["code"] == "ODS_MEMBER":
            task["detail"]["due_when"] = [{"changed": "ODS_NOPE", "parent_field": "memberId"}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    try:
        load_connector(path)
    except ValueError as exc:
        assert "detail.due_when.changed 'ODS_NOPE' is not another task" in str(exc)
        assert "\n" not in str(exc)
    else:
        raise AssertionError("an unknown task in detail.due_when was accepted")
    good = load_connector()
    assert [o.parent_task for o in good.task("ODS_MEMBER_CARD").owes_details] == ["ODS_MEMBER"]
    order = [s.code for s in good.select(["ODS_MEMBER", "ODS_PAYMENT", "ODS_MEMBER_CARD"])]
    assert order == ["ODS_PAYMENT", "ODS_MEMBER_CARD", "ODS_MEMBER"]
