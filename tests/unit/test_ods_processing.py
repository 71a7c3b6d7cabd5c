import json

import pytest

from feiqiu_etl.connector import load_connector
from feiqiu_etl.pipeline import PipelineRequest, ResponseItem
from feiqiu_etl.tasks.ods.hashing import content_hash
from feiqiu_etl.tasks.ods.processing import OdsProcessor, ResponseShapeError, SnapshotState, locate_list
from feiqiu_etl.tasks.ods.rows import DetailDone, layouts_for

CONNECTOR = load_connector()
SITE = 8640015201004417


def processor(code, snapshot=None, max_pages=100):
    spec = CONNECTOR.task(code)
    return OdsProcessor(spec, SITE, layouts_for(spec), max_pages, snapshot=snapshot)


def item(payload, page=1, limit=2, code="ODS_SETTLEMENT", **kw):
    spec = CONNECTOR.task(code)
    req = PipelineRequest(spec.endpoint, {"siteId": SITE, "page": page, "limit": limit}, page_size=limit,
                          data_path=spec.data_path, list_key=spec.list_key, scope=("s",), **kw)
    return ResponseItem(req, payload, 1)


@pytest.mark.parametrize("payload,path,key", [
    ({"data": {"list": [1], "total": 1}}, ("data",), "list"),
    ({"data": {"records": [1], "total": 1}}, ("data",), "records"),
    ({"data": {"rows": [1], "total": 1}}, ("data",), "rows"),
    ({"data": {"page": {"pageNo": 1, "pageSize": 200, "total": 1, "list": [1]}}}, ("data", "page"), "list"),
])
def test_locate_list_all_four_shapes(payload, path, key):
    assert locate_list(payload, path, key) == ([1], 1)


def test_missing_list_names_the_path():
    with pytest.raises(ResponseShapeError, match="data.page"):
        locate_list({"data": {"list": []}}, ("data", "page"), "list")


def settlement(sid, **extra):
    return {"settleId": sid, "siteId": SITE, "updateTime": "2024-03-01 21:10:37", "paidAmount": "57.5", **extra}


def test_full_page_asks_for_next_page_short_page_stops():
    p = processor("ODS_SETTLEMENT")
    out = p(item({"code": 0, "data": {"total": 3, "list": [settlement(1872950412356812801), settlement(2)]}}))
    assert [r.keys for r in out.rows] == [(1872950412356812801,), (2,)]
    assert out.rows[0].window.isoformat() == "2024-03-01T21:10:37+08:00"
    assert out.follow_ups[0].params["page"] == 2
    out2 = p(item({"code": 0, "data": {"total": 3, "list": [settlement(3)]}}, page=2))
    assert out2.follow_ups == []


def test_total_alone_never_stops_paging():
    p = processor("ODS_SETTLEMENT")
    out = p(item({"code": 0, "data": {"total": 2, "list": [settlement(1), settlement(2)]}}))
    assert len(out.follow_ups) == 1  # full page: fetch the next one even though page*limit >= total


def test_repeated_page_and_page_cap_are_errors():
    p = processor("ODS_SETTLEMENT", max_pages=5)
    page = {"code": 0, "data": {"total": 9, "list": [settlement(1), settlement(2)]}}
    nxt = p(item(page)).follow_ups[0]
    again = p(ResponseItem(nxt, page, 2))
    assert again.follow_ups == [] and "loop detected" in again.errors[0]["error"]
    # A, B, A: a page that repeats any earlier page of the listing, not only the previous one
    other = {"code": 0, "data": {"total": 9, "list": [settlement(3), settlement(4)]}}
    b = p(ResponseItem(nxt, other, 2)).follow_ups[0]
    a_again = p(ResponseItem(b, page, 3))
    assert a_again.follow_ups == [] and "page 3 repeats page 1" in a_again.errors[0]["error"]
    capped = p(item(page, page=5))
    assert capped.follow_ups == [] and "page cap" in capped.errors[0]["error"]


def test_bad_record_is_a_record_error_others_continue():
    p = processor("ODS_SETTLEMENT")
    out = p(item({"code": 0, "data": {"total": 3, "list": [settlement(1), {"siteId": SITE}, "junk"]}}, limit=200))
    assert [r.keys for r in out.rows] == [(1,)]
    assert len(out.errors) == 2 and out.fetched == 3


def test_escaped_and_raw_utf8_hash_the_same_and_trailing_zero_differs():
    raw = '{"remark":"客人说下次还来🎱","amount":"57.5","id":1872950412356812801}'
    escaped = json.dumps(json.loads(raw), ensure_ascii=True)
    assert "\\ud83c" in escaped
    assert content_hash(json.loads(raw)) == content_hash(json.loads(escaped))
    assert content_hash({"amount": "57.5"}) != content_hash({"amount": "57.50"})
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})


def test_nul_is_stripped_before_storage():
    p = processor("ODS_SETTLEMENT")
    out = p(item({"code": 0, "data": {"total": 1, "list": [settlement(1, remark="a\u0000b")]}}))
    assert json.loads(out.rows[0].payload)["remark"] == "ab"


def test_nul_removed_from_upstream_text_is_counted():
    """Issue 28 item 7: a NUL byte in upstream text was dropped with no record of it. The processor counts every
    one removed (values and keys, over all pages), for the task's one line and its ``nul_removed``."""
    from feiqiu_etl.tasks.ods.hashing import canonical_row_counted

    p = processor("ODS_SETTLEMENT")
    assert p.nul_removed == 0
    p(item({"code": 0, "data": {"total": 2, "list": [settlement(1, remark="a\u0000b\u0000"),
                                                       settlement(2, remark="plain")]}}))
    p(item({"code": 0, "data": {"total": 1, "list": [settlement(3, **{"no\u0000te": "\u0000"})]}}))
    assert p.nul_removed == 4
    assert canonical_row_counted({"a": "x\\u0000y"})[3] == 0  # an escaped backslash is no NUL
    assert canonical_row_counted({"a": ["\u0000", {"b": "\u0000\u0000"}]})[3] == 3


def test_snapshot_completeness_rules():
    s = SnapshotState()
    s.page(3, [(1,), (2,)], short=False)
    s.page(3, [(3,)], short=True)
    assert s.incomplete_reason() is None
    moved = SnapshotState()
    moved.page(3, [(1,), (2,)], short=False)
    moved.page(4, [(3,)], short=True)
    assert "total moved" in moved.incomplete_reason()
    skipped = SnapshotState()
    skipped.page(4, [(1,), (2,)], short=False)
    skipped.page(4, [(4,)], short=True)
    assert "distinct keys" in skipped.incomplete_reason()


def test_detail_response_rows_carry_parent_and_end_with_marker():
    p = processor("ODS_GROUP_PACKAGE")
    req_item = item({"code": 0, "data": {"package": {"packageId": "PKG1", "contents": [
        {"contentId": 1, "name": "中式台球桌", "qty": 120}, {"packageId": "PKG1", "contentId": 2}]}}},
        code="ODS_GROUP_PACKAGE", is_detail=True, detail_id="PKG1",
        context={"parent_value": "PKG1", "parent_key": "PKG1"})
    out = p(req_item)
    assert [r.keys for r in out.rows[:-1]] == [("PKG1", 1), ("PKG1", 2)]
    marker = out.rows[-1]
    assert isinstance(marker, DetailDone) and marker.seen == [("PKG1", 1), ("PKG1", 2)]


def _deep(n):
    node = {}
    for _ in range(n):
        node = {"x": node}
    return node


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "\ud800", _deep(5000)])
def test_one_bad_record_on_a_full_page_loses_only_that_record(bad):
    p = processor("ODS_SETTLEMENT")
    page = [settlement(1), settlement(2, remark=bad), settlement(3)]
    out = p(item({"code": 0, "data": {"total": 9, "list": page}}, limit=3))
    assert [r.keys for r in out.rows] == [(1,), (3,)]
    assert len(out.errors) == 1 and out.follow_ups[0].params["page"] == 2


def test_foreign_store_and_foreign_parent_are_record_errors():
    p = processor("ODS_SETTLEMENT")
    out = p(item({"code": 0, "data": {"total": 3, "list": [
        settlement(1), settlement(2, siteId=99), settlement(3, siteId=True), settlement(4, siteId=str(SITE))]}},
        limit=200))
    assert [r.keys for r in out.rows] == [(1,), (4,)] and all(r.site_id == SITE for r in out.rows)
    assert "not the requested store" in out.errors[0]["error"]
    d = processor("ODS_GROUP_PACKAGE")
    detail = d(item({"code": 0, "data": {"package": {"contents": [
        {"packageId": "PKG1", "contentId": 1}, {"packageId": "PKG2", "contentId": 1}]}}},
        code="ODS_GROUP_PACKAGE", is_detail=True, detail_id="PKG1",
        context={"parent_value": "PKG1", "parent_key": "PKG1"}))
    assert [r.keys for r in detail.rows] == [("PKG1", 1)] and "not the requested parent" in detail.errors[0]["error"]
    assert not any(isinstance(r, DetailDone) for r in detail.rows)  # an incomplete detail never soft-deletes
