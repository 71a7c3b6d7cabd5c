"""Issue 3 acceptance: a second run after the source changed reports exact counts and fetches details only
for new or changed parents (counted from the simulator's own request log)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from feiqiu_etl.simulator import Simulator
from feiqiu_etl.connector.windows import fmt
from flowkit import ANCHOR, CONNECTOR, ods_rows, run_flow, sim_config

WINDOW = dict(window_start=fmt(ANCHOR - timedelta(days=2)), window_end=fmt(ANCHOR + timedelta(days=1)))


def _expected_list(sim, spec, site):
    records = (sim.dataset.records(spec.code, site) if spec.kind == "snapshot"
               else sim.dataset.window(spec.code, site, WINDOW["window_start"], WINDOW["window_end"]))
    return {(site, *(k.convert(r[k.field]) for k in spec.keys)): r for r in records}


def _diff(before: dict, after: dict, snapshot: bool) -> dict:
    inserted = [k for k in after if k not in before]
    updated = [k for k in after if k in before and before[k] != after[k]]
    skipped = [k for k in after if k in before and before[k] == after[k]]
    deleted = [k for k in before if k not in after] if snapshot else []
    return {"inserted": inserted, "updated": updated, "skipped": skipped, "deleted": deleted}


def _held_changed(sim, spec, site, before: dict, after: dict, diff: dict) -> list:
    """Parents (unchanged list rows) whose detail is due because a row it holds changed: a card of the member
    new, changed or deleted in the card snapshot (connector ``detail.due_when``, issue 25 part 6)."""
    named = set()
    for rule in spec.detail.due_when:
        child = CONNECTOR.task(rule.changed)
        old, new = before[child.code], _expected_list(sim, child, site)
        for kind, keys in _diff(old, new, snapshot=child.kind == "snapshot").items():
            if kind != "skipped":
                named |= {str((new if kind != "deleted" else old)[k][rule.parent_field]) for k in keys}
    key = spec.keys[0]
    return [after[k] for k in diff["skipped"] if str(after[k][key.field]) in named]


def _detail_expectation(sim, spec, site, changed_parents, before_detail):
    d = spec.detail
    counts = {"inserted": 0, "updated": 0, "skipped": 0, "deleted": 0}
    for record in changed_parents:
        parent = d.parent.convert(record[d.id_column])
        rows = {}
        for row in sim.dataset.detail_rows(spec.code, site, record[d.id_column]):
            row = {d.parent.field: record[d.id_column], **row}
            rows[(site, *(k.convert(row[k.field]) for k in d.keys))] = row
        idx = 1 + [k.column for k in d.keys].index(d.parent.column) if d.parent_is_key else None
        mine = {k: v for k, v in before_detail.items()
                if (k[idx] if idx is not None else v.get(d.parent.field)) == parent}
        diff = _diff(mine, rows, snapshot=True)
        for kind in counts:
            counts[kind] += len(diff[kind])
    return counts


@pytest.fixture
def sim():
    with Simulator(sim_config(seed=23)) as s:
        s.dataset.set_now(ANCHOR + timedelta(hours=1))
        yield s


def test_second_run_reports_exact_counts_and_details_only_for_changed_parents(sim, pg_dsn):
    site = sim.config.site_ids[0]
    assert run_flow(sim, pg_dsn, window=False, **WINDOW).status == "SUCCESS"
    before = {s.code: ods_rows(pg_dsn, s.table) for s in CONNECTOR.tasks}
    before_detail = {s.code: ods_rows(pg_dsn, s.detail.target_table) for s in CONNECTOR.tasks if s.detail}

    sim.dataset.set_now(ANCHOR + timedelta(hours=2))
    mutated = sim.dataset.mutate_random(0.1, rng_seed=5)
    assert sum(c["updated"] for c in mutated.values()) > 0 and sum(c["inserted"] for c in mutated.values()) > 0
    for code, pk in (("ODS_MEMBER", "memberId"), ("ODS_GROUP_PACKAGE", "packageId"), ("ODS_COUPON", "couponId")):
        sim.dataset.delete(code, site, sim.dataset.records(code, site)[-1][pk])  # Q12: vanishes from the snapshot
    for code in ("ODS_GOODS", "ODS_BILLIARD_TABLE"):  # volatile fields: no updateTime bump, still a change
        first = next(iter(sim.dataset.records(code, site)))
        pk = first["goodsId" if code == "ODS_GOODS" else "tableId"]
        sim.dataset.touch_volatile(code, site, pk)

    sim.clear_log()
    second = run_flow(sim, pg_dsn, window=False, **WINDOW)
    assert second.status == "SUCCESS", [t.result.errors for t in second.tasks if t.result.errors]
    by_code = {t.task_code: t.result for t in second.tasks}
    detail_bodies = [e.body for e in sim.request_log() if e.path.endswith("/detail")]

    expected_detail_requests = []
    for spec in CONNECTOR.tasks:
        after = _expected_list(sim, spec, site)
        diff = _diff(before[spec.code], after, snapshot=spec.kind == "snapshot")
        want = {kind: len(keys) for kind, keys in diff.items()}
        if spec.detail:
            changed = [after[k] for k in diff["inserted"] + diff["updated"]]
            changed += _held_changed(sim, spec, site, before, after, diff)  # issue 25: detail.due_when
            detail = _detail_expectation(sim, spec, site, changed, before_detail[spec.code])
            for kind in want:
                want[kind] += detail[kind]
            expected_detail_requests += [(spec.detail.endpoint, spec.detail.param_builder(r)) for r in changed]
            assert by_code[spec.code].detail_skipped == len(diff["skipped"]), spec.code
        r = by_code[spec.code]
        got = {"inserted": r.total_inserted, "updated": r.total_updated, "skipped": r.total_skipped,
               "deleted": r.total_deleted}
        assert got == want, spec.code
        assert ods_rows(pg_dsn, spec.table) == after, spec.code
    assert sorted(map(repr, detail_bodies)) == sorted(repr(p) for _, p in expected_detail_requests)
    assert len(detail_bodies) < sum(len(before[s.code]) for s in CONNECTOR.tasks if s.detail)
