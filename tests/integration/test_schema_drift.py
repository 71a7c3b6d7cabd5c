"""Issue 10 acceptance: a field that appears in every record (schema drift) is reported once, updates ODS, and
costs no lane time: the re-run sends list pages only (counted in the simulator's request log), unless the
task's ``detail.refetch_on_new_fields`` asks for the details again."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import psycopg
import yaml
from rich.console import Console

from feiqiu_etl.connector.model import default_connector_path
from feiqiu_etl.cli.views.summary import render_summary
from feiqiu_etl.simulator import Simulator
from flowkit import run_flow, sim_config

TASK = "ODS_SETTLEMENT"


def _paths(sim: Simulator) -> list[str]:
    return [e.path for e in sim.request_log()]


def _parents(dsn) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM ods.settlement").fetchone()[0]


def _run(sim, dsn, **kw):
    result = run_flow(sim, dsn, tasks=[TASK], **kw)
    assert result.status == "SUCCESS", result.to_dict()
    (task,) = result.tasks
    return result, task


def test_new_field_is_reported_once_and_sends_list_pages_only(pg_dsn, caplog):
    with Simulator(sim_config(seed=5)) as sim:
        _, first = _run(sim, pg_dsn)
        assert first.result.detail_success > 0 and first.schema_drift == []  # the first run is the baseline
        parents = _parents(pg_dsn)

        sim.clear_log()
        sim.add_field("memberLevelName", "金卡")
        with caplog.at_level(logging.WARNING):
            result, second = _run(sim, pg_dsn)
        paths = _paths(sim)
        assert paths and set(paths) == {"/api/settlement/list"}, sorted(set(paths))  # no detail request at all
        r = second.result
        assert (r.total_updated, r.detail_success, r.detail_skipped) == (parents, 0, parents)
        assert second.schema_drift == [{"table": "ods.settlement", "new_fields": ["memberLevelName"],
                                        "lost_fields": [], "first_seen_run": result.run_id}]
        assert any("schema drift" in m and "memberLevelName" in m for m in caplog.messages)
        with psycopg.connect(pg_dsn) as conn:
            stored = conn.execute("SELECT count(*) FILTER (WHERE payload->>'memberLevelName' = '金卡'), count(*) "
                                  "FROM ods.settlement").fetchone()
            summary = conn.execute("SELECT summary FROM etl_meta.run WHERE run_id = %s", (result.run_id,)).fetchone()[0]
        assert stored == (parents, parents)  # ODS holds the new field
        assert summary["tasks"][0]["schema_drift"] == second.schema_drift  # the run record
        assert json.loads(json.dumps(result.to_dict()))["tasks"][0]["schema_drift"] == second.schema_drift  # --json
        out = io.StringIO()
        render_summary(result.to_dict(), Console(file=out, width=120))
        assert "schema drift in ods.settlement: new field(s) memberLevelName" in out.getvalue()

        sim.clear_log()
        _, third = _run(sim, pg_dsn)
        assert third.schema_drift == [] and third.result.total_updated == 0  # reported once, nothing changed
        assert set(_paths(sim)) == {"/api/settlement/list"}


def test_refetch_on_new_fields_asks_for_the_details_again(pg_dsn, tmp_path: Path):
    data = yaml.safe_load(default_connector_path().read_text(encoding="utf-8"))
    data.pop("dwd_mapping", None)
    for task in data["tasks"]:
        if task["code"] == TASK:
            task["detail"]["refetch_on_new_fields"] = True
    connector = tmp_path / "connector.yaml"
    connector.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with Simulator(sim_config(seed=5)) as sim:
        _, first = _run(sim, pg_dsn, connector_path=str(connector))
        sim.clear_log()
        sim.add_field("memberLevelName", "金卡")
        _, second = _run(sim, pg_dsn, connector_path=str(connector))
        details = [p for p in _paths(sim) if p == "/api/settlement/detail"]
        assert len(details) == second.result.detail_success == _parents(pg_dsn) > 0


def test_a_lost_field_is_reported_and_its_parents_fetch_their_details(pg_dsn):
    with Simulator(sim_config(seed=5, extra_fields={TASK: {"legacyFlag": 1}})) as sim:
        _, first = _run(sim, pg_dsn)
        sim.remove_field("legacyFlag", TASK)  # the upstream drops the field again
        sim.clear_log()
        result, second = _run(sim, pg_dsn)
        assert second.schema_drift == [{"table": "ods.settlement", "new_fields": [], "lost_fields": ["legacyFlag"],
                                        "first_seen_run": result.run_id}]
        # a lost field is a real change of every parent: their details are fetched again
        assert second.result.detail_success == _parents(pg_dsn) > 0
        assert "/api/settlement/detail" in _paths(sim)


def test_a_field_name_with_a_nul_is_recorded_as_stored_and_drift_keeps_working(pg_dsn, caplog):
    """Adversarial trial: an upstream field name holding ``\\u0000`` made recording the schema drift fail for the
    task on every run (PostgreSQL text cannot hold NUL). It is recorded as the payload stores it: without NUL."""
    with Simulator(sim_config(seed=5)) as sim:
        _run(sim, pg_dsn)
        sim.add_field("odd\x00Name", 1)
        with caplog.at_level(logging.WARNING):
            _, second = _run(sim, pg_dsn)
        assert not [r for r in caplog.records if "not recorded" in r.getMessage()]
        assert [d["new_fields"] for d in second.schema_drift] == [["oddName"]]
        with psycopg.connect(pg_dsn) as conn:
            fields = {r[0] for r in conn.execute("SELECT field FROM etl_meta.ods_field WHERE task_code = %s",
                                                 (TASK,)).fetchall()}
            stored = conn.execute("SELECT count(*) FROM ods.settlement WHERE payload ? 'oddName'").fetchone()[0]
        assert "oddName" in fields and stored == _parents(pg_dsn)
        _, third = _run(sim, pg_dsn)  # the next run sees no drift: the field is known as stored
        assert third.schema_drift == []
