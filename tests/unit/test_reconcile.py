"""Reconciliation of listings against their total (issue 25, tasks/ods/reconcile.py): the paging decisions, the
verdicts, the refetch budget, the trailing median of the unexpected zero, the snapshot-trust hook of the
deletion guard, and what show RUN, the alert rule and the processor make of them. Pure: no database, no HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from feiqiu_etl.alerts.config import RulesModel
from feiqiu_etl.alerts.messages import run_message
from feiqiu_etl.alerts.rules import RECONCILE, run_findings
from feiqiu_etl.connector import load_connector
from feiqiu_etl.pipeline import PipelineRequest, ResponseItem
from feiqiu_etl.formats import reconcile_lines
from feiqiu_etl.tasks.ods.processing import OdsProcessor, SnapshotState
from feiqiu_etl.tasks.ods.reconcile import (END, INCOMPLETE, MORE, OK, OVER, REFETCH, REFETCHED, SHORT,
                                            UNEXPECTED_ZERO, IntegrityRules, ListingOutcome, Reconciler,
                                            expected_rows, full_days, snapshot_trust, summary)
from feiqiu_etl.tasks.ods.rows import layouts_for

CONNECTOR = load_connector()
SITE = 8640015201004417
SEG = ("segment", "ODS_PAYMENT", SITE, datetime(2024, 3, 2), datetime(2024, 3, 4))
SNAP = ("snapshot", "ODS_GOODS", SITE)


def keys(*ids):
    return [(i,) for i in ids]


def test_a_clean_listing_is_ok_at_its_first_short_page_and_costs_nothing_more():
    r = Reconciler(IntegrityRules(), limit=2)
    assert r.page(SEG, 1, 1, 3, keys(1, 2), 2, short=False) == MORE
    assert r.page(SEG, 1, 2, 3, keys(3), 1, short=True) == END
    assert r.verdict(SEG) == (OK, None) and r.refetches == 0
    o = r.outcome(SEG)
    assert (o.kind, o.first_total, o.pages, o.rows_received, o.distinct_keys, o.listings, o.totals_moved) == (
        "window", 3, 2, 3, 3, 1, [])
    assert (o.window_start, o.window_end) == (datetime(2024, 3, 2), datetime(2024, 3, 4))


def test_paging_follows_total_a_short_page_below_total_asks_the_next_page():
    r = Reconciler(IntegrityRules(), limit=200)
    assert r.page(SNAP, 1, 1, 240, keys(*range(199)), 199, short=True) == MORE  # 199 of 240: page 2 is due
    assert r.page(SNAP, 1, 2, 240, keys(*range(200, 240)), 40, short=True) == REFETCH  # 239 < 240
    assert r.page(SNAP, 2, 1, 240, keys(*range(200)), 200, short=False) == MORE
    assert r.page(SNAP, 2, 2, 240, keys(*range(200, 240)), 40, short=True) == END
    verdict, reason = r.verdict(SNAP)
    assert verdict == REFETCHED and reason == "listing 1: 239 distinct keys of total 240"
    o = r.outcome(SNAP)
    assert (o.kind, o.pages, o.rows_received, o.distinct_keys, o.listings) == ("snapshot", 4, 479, 240, 2)


def test_a_short_page_whose_next_page_would_start_past_total_ends_the_listing():
    r = Reconciler(IntegrityRules(), limit=200)
    assert r.page(SEG, 1, 1, 40, keys(*range(39)), 39, short=True) == REFETCH  # no page 2 to ask: 200 >= 40


def test_without_a_total_the_short_page_ends_it_as_before():
    r = Reconciler(IntegrityRules(), limit=2)
    assert r.page(SEG, 1, 1, None, keys(1), 1, short=True) == END
    assert r.verdict(SEG) == (OK, None)


def test_still_short_after_the_refetch_is_short_and_the_budget_is_per_task_and_run():
    r = Reconciler(IntegrityRules(refetch_listings=1), limit=10)
    assert r.page(SEG, 1, 1, 5, keys(1, 2, 3, 4), 4, short=True) == REFETCH
    assert r.page(SEG, 2, 1, 5, keys(1, 2, 3, 4), 4, short=True) == END
    assert r.verdict(SEG) == (SHORT, "4 distinct keys of total 5, also after a refetch")
    other = ("segment", "ODS_PAYMENT", SITE, datetime(2024, 3, 4), datetime(2024, 3, 5))
    assert r.page(other, 1, 1, 5, keys(1), 1, short=True) == END  # the one refetch is spent
    assert r.verdict(other) == (SHORT, "1 distinct keys of total 5; no refetch left (1 per task and run)")
    assert r.refetches == 1


def test_over_more_keys_or_more_pages_than_the_total_implies():
    r = Reconciler(IntegrityRules(refetch_listings=0), limit=2)
    assert r.page(SEG, 1, 1, 1, keys(1, 2), 2, short=False) == MORE
    assert r.page(SEG, 1, 2, 1, [], 0, short=True) == END
    assert r.verdict(SEG)[0] == OVER and "2 distinct keys but total is 1" in r.verdict(SEG)[1]
    pages = Reconciler(IntegrityRules(refetch_listings=0), limit=2)
    for page in (1, 2):  # the same two keys twice (a repeated page is caught elsewhere; here: pages > implied)
        assert pages.page(SNAP, 1, page, 2, keys(1, 2), 2, short=False) == MORE
    assert pages.page(SNAP, 1, 3, 2, [], 0, short=True) == END
    assert pages.verdict(SNAP) == (OVER, "3 pages where total 2 implies at most 2; no refetch left (0 per task and run)")


def test_a_total_that_moves_is_judged_by_the_largest_and_recorded():
    r = Reconciler(IntegrityRules(), limit=2)
    assert r.page(SEG, 1, 1, 3, keys(1, 2), 2, short=False) == MORE
    assert r.page(SEG, 1, 2, 4, keys(3), 1, short=True) == REFETCH
    assert r.page(SEG, 2, 1, 4, keys(1, 2), 2, short=False) == MORE
    assert r.page(SEG, 2, 2, 4, keys(3, 4), 2, short=False) == MORE
    assert r.page(SEG, 2, 3, 4, [], 0, short=True) == END
    assert r.verdict(SEG)[0] == REFETCHED and "(totals reported: 3, 4)" in r.verdict(SEG)[1]
    assert r.outcome(SEG).first_total == 3 and r.outcome(SEG).totals_moved == [4]


def test_unexpected_zero_needs_the_floor_is_fetched_once_more_and_never_more():
    scope_expected = {SEG: 24.5}
    r = Reconciler(IntegrityRules(zero_floor=20), limit=200, expected=scope_expected)
    assert r.page(SEG, 1, 1, 0, [], 0, short=True) == REFETCH
    assert r.page(SEG, 2, 1, 0, [], 0, short=True) == END
    assert r.verdict(SEG) == (UNEXPECTED_ZERO, "0 rows where the trailing median is 24.5 (floor 20), also after a "
                                               "refetch")
    below = Reconciler(IntegrityRules(zero_floor=25), limit=200, expected=scope_expected)
    assert below.page(SEG, 1, 1, 0, [], 0, short=True) == END and below.verdict(SEG) == (OK, None)
    unknown = Reconciler(IntegrityRules(zero_floor=1), limit=200)  # no history: 0 rows is believed
    assert unknown.page(SEG, 1, 1, 0, [], 0, short=True) == END and unknown.verdict(SEG) == (OK, None)


def test_a_listing_that_never_ended_is_incomplete():
    r = Reconciler(IntegrityRules(), limit=2)
    r.page(SEG, 1, 1, 9, keys(1, 2), 2, short=False)
    assert r.verdict(SEG)[0] == INCOMPLETE and r.outcome(SEG).pages == 1
    assert r.outcome(("snapshot", "X", SITE)).listings == 1  # nothing seen at all


def test_snapshot_trust_refuses_an_empty_answer_while_the_store_holds_rows():
    empty = ListingOutcome("snapshot", first_total=0, verdict=OK)
    assert "answered total 0 and no rows while the store holds 30 live row(s)" in snapshot_trust(empty, 30)
    assert snapshot_trust(empty, None) is not None
    assert snapshot_trust(empty, 0) is None  # an empty store stays empty
    assert "verdict short" in snapshot_trust(ListingOutcome("snapshot", first_total=5, distinct_keys=4,
                                                            verdict=SHORT, reason="4 of 5"), 5)
    assert snapshot_trust(ListingOutcome("snapshot", first_total=5, distinct_keys=5, verdict=REFETCHED), 5) is None


def test_full_days_and_the_trailing_weekday_median():
    assert full_days(datetime(2024, 3, 2, 6), datetime(2024, 3, 4, 0)) == [datetime(2024, 3, 3)]
    assert full_days(datetime(2024, 3, 2), datetime(2024, 3, 2, 23)) == []
    day = datetime(2024, 3, 3)
    counts = {day - timedelta(weeks=1): 30, day - timedelta(weeks=2): 20, day - timedelta(weeks=3): 0}
    assert expected_rows([day], counts, first_day=day - timedelta(weeks=3), weeks=4) == 20.0  # 30, 20, 0
    # days before the store's first row are not zeros; one sample is not enough
    assert expected_rows([day], counts, first_day=day - timedelta(weeks=1), weeks=4) is None
    assert expected_rows([day], {}, first_day=None, weeks=4) is None


def outcome(verdict, kind="window", reason="why"):
    return ListingOutcome(kind, datetime(2024, 3, 2) if kind == "window" else None,
                          datetime(2024, 3, 3) if kind == "window" else None, first_total=5, pages=2,
                          rows_received=9, distinct_keys=4, listings=2, verdict=verdict, reason=reason)


def test_show_lines_and_the_alert_rule_name_every_listing_not_ok():
    task = {"task": "ODS_PAYMENT", "site_id": SITE, "reconcile": summary(
        [outcome(OK), outcome(REFETCHED), outcome(SHORT, reason="4 distinct keys of total 5")], 1, 2)}
    lines = reconcile_lines([task])
    assert lines[0] == ("reconcile: 3 listing(s): 1 ok, 1 refetched, 1 short; 1 refetched of a budget of 2 "
                        "(integrity.refetch_listings per task)", "head")
    assert [v for _, v in lines[1:]] == [REFETCHED, SHORT]
    assert "2024-03-02 00:00:00 … 2024-03-03 00:00:00: short: 4 distinct keys of total 5" in lines[2][0]
    assert reconcile_lines([{"task": "X", "site_id": 1}]) == []  # a run recorded before issue 25
    run = {"run_id": "r1", "status": "PARTIAL", "tasks": [task]}
    findings = [f for f in run_findings(run, RulesModel()) if f.reason == RECONCILE]
    assert [i["verdict"] for i in findings[0].facts["listings"]] == [SHORT]  # refetched raises nothing
    assert run_findings(run, RulesModel(reconcile=False, partial=False)) == []
    body = run_message(findings, run).body
    assert "listings not exact against their total: ODS_PAYMENT" in body and "short (4 distinct keys" in body
    clean = {"run_id": "r2", "status": "SUCCESS", "tasks": [{**task, "reconcile": summary([outcome(REFETCHED)], 1, 2)}]}
    assert run_findings(clean, RulesModel()) == []


def settlement(sid):
    return {"settleId": sid, "siteId": SITE, "updateTime": "2024-03-01 21:10:37", "paidAmount": "1"}


def listing_item(ids, total, page=1, limit=2, context=None):
    spec = CONNECTOR.task("ODS_SETTLEMENT")
    req = PipelineRequest(spec.endpoint, {"siteId": SITE, "page": page, "limit": limit}, page_size=limit,
                          data_path=spec.data_path, list_key=spec.list_key, scope=SEG, context=context or {})
    return ResponseItem(req, {"code": 0, "data": {"total": total, "list": [settlement(i) for i in ids]}}, 1)


def test_the_processor_pages_on_refetches_from_page_1_and_fails_a_listing_that_stays_short():
    spec = CONNECTOR.task("ODS_SETTLEMENT")
    snapshot = SnapshotState()
    p = OdsProcessor(spec, SITE, layouts_for(spec), 100, snapshot=snapshot,
                     reconciler=Reconciler(IntegrityRules(refetch_listings=1), limit=2))
    first = p(listing_item([1], total=3))  # short page, 1 of 3 keys: page 2 is due
    assert [f.params["page"] for f in first.follow_ups] == [2] and first.errors == []
    last = p(ResponseItem(first.follow_ups[0], listing_item([3], total=3).payload, 2))
    [again] = last.follow_ups  # 2 of 3 keys at the end: page 1 again, listing 2, a fresh repeated-page memory
    assert again.params["page"] == 1 and again.context["attempt"] == 2 and again.context["seen_pages"] == {}
    assert snapshot.attempt == 2 and snapshot.keys == set()
    stale = p(ResponseItem(again, listing_item([1], total=3).payload, 3))  # the same fault again: page 2 ...
    final = p(ResponseItem(stale.follow_ups[0], listing_item([3], total=3).payload, 4))
    assert final.follow_ups == []
    assert [e["error"] for e in final.errors] == ["listing short: 2 distinct keys of total 3, also after a refetch"]
    assert [r.keys for r in final.rows] == [(3,)]  # the rows it has are still written
    assert snapshot.incomplete_reason() is not None


def test_the_processor_without_a_reconciler_stops_at_the_first_short_page():
    spec = CONNECTOR.task("ODS_SETTLEMENT")
    p = OdsProcessor(spec, SITE, layouts_for(spec), 100)
    assert p(listing_item([1], total=3)).follow_ups == []


@pytest.mark.parametrize("field, bad", [("refetch_listings", -1), ("zero_weeks", 1)])
def test_bad_integrity_settings_are_refused(field, bad):
    from pydantic import ValidationError

    from feiqiu_etl.config.settings import IntegritySection

    with pytest.raises(ValidationError):
        IntegritySection(**{field: bad})
