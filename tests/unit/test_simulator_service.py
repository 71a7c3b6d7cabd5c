"""The simulator's request handling without sockets: error codes (§2.1), pagination and shapes (§1.3, §1.4),
windows (§1.2), details (§5), escaping (Q9) and fault injection (§2.3)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from feiqiu_etl.simulator import LIST_ENDPOINTS, RiskControlConfig, Simulator, SimulatorConfig
from feiqiu_etl.simulator.catalog import ESCAPED_PATHS, LIST_BY_TASK

SITE = 8640015201004417
OTHER_SITE = 8640015201009999
ANCHOR = datetime(2024, 3, 4, 12, 0, 0)
WINDOW = {"startTime": "2024-03-01 00:00:00", "endTime": "2024-03-04 12:00:00"}


@pytest.fixture(scope="module")
def sim() -> Simulator:
    config = SimulatorConfig(anchor=ANCHOR, risk=RiskControlConfig(enabled=False),
                             tokens={"fq_other": (OTHER_SITE,)})
    return Simulator(config)


def call(sim: Simulator, path: str, body: dict | None = None, token: str | None = "fq_test_token",
         raw: bytes | None = None, method: str = "POST"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    payload = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
    reply = sim.service.handle(method, path, headers, payload)
    reply.on_complete()
    return reply


def envelope(reply) -> dict:
    assert reply.http_status == 200
    return json.loads(reply.body)


def code_of(sim, path, body=None, **kwargs) -> int:
    return envelope(call(sim, path, body, **kwargs))["code"]


# --- authentication and site permission ---------------------------------------------------------------------------

def test_missing_or_unknown_token_is_40101(sim):
    assert code_of(sim, "/api/member/list", {"siteId": SITE}, token=None) == 40101
    assert code_of(sim, "/api/member/list", {"siteId": SITE}, token="nope") == 40101


def test_site_not_allowed_for_token_is_40103(sim):
    assert code_of(sim, "/api/member/list", {"siteId": OTHER_SITE}) == 40103
    assert code_of(sim, "/api/member/list", {"siteId": SITE}, token="fq_other") == 40103
    assert code_of(sim, "/api/member/list", {"siteId": OTHER_SITE}, token="fq_other") == 0


# --- 40001 / 40003 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {}, {"siteId": None}, {"siteId": "86400x"}, {"siteId": 1.5}, {"siteId": True}, {"siteId": 2**53},
    {"siteId": SITE, "page": 0}, {"siteId": SITE, "page": -1}, {"siteId": SITE, "page": 1.5},
    {"siteId": SITE, "page": "2"}, {"siteId": SITE, "limit": "20"},
])
def test_bad_parameters_are_40001(sim, body):
    assert code_of(sim, "/api/member/list", body) == 40001


def test_malformed_json_body_is_40001(sim):
    assert code_of(sim, "/api/member/list", raw=b"{not json") == 40001
    assert code_of(sim, "/api/member/list", raw=b"[1, 2]") == 40001


@pytest.mark.parametrize("limit", [0, -5, 201, 1000])
def test_limit_out_of_range_is_40003(sim, limit):
    assert code_of(sim, "/api/member/list", {"siteId": SITE, "limit": limit}) == 40003


def test_site_id_as_decimal_string_is_accepted(sim):
    data = envelope(call(sim, "/api/member/list", {"siteId": str(SITE)}))
    assert data["code"] == 0 and data["data"]["list"][0]["siteId"] == SITE


# --- windows (40002) --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [
    {}, {"startTime": "2024-03-01 00:00:00"}, {"endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-03-01", "endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-03-01T00:00:00", "endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-02-30 00:00:00", "endTime": "2024-03-02 00:00:00"},
    {"startTime": 1709222400, "endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-03-02 00:00:00", "endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-03-02 00:00:01", "endTime": "2024-03-02 00:00:00"},
    {"startTime": "2024-01-01 00:00:00", "endTime": "2024-02-01 00:00:01"},
])
def test_invalid_windows_are_40002(sim, window):
    assert code_of(sim, "/api/settlement/list", {"siteId": SITE, **window}) == 40002


def test_exactly_31_days_and_future_end_are_allowed(sim):
    body = {"siteId": SITE, "startTime": "2024-02-10 00:00:00", "endTime": "2024-03-12 00:00:00"}
    assert code_of(sim, "/api/settlement/list", body) == 0


def test_snapshot_endpoints_ignore_windows(sim):
    body = {"siteId": SITE, "startTime": "bogus", "endTime": "2000-01-01 00:00:00", "limit": 200}
    data = envelope(call(sim, "/api/member/list", body))["data"]
    assert data["total"] == len(sim.dataset.records("ODS_MEMBER", SITE))


def test_window_is_half_open_and_matches_dataset(sim):
    records = sim.dataset.records("ODS_PAYMENT", SITE)
    cut = records[len(records) // 2]["payTime"]
    body = {"siteId": SITE, "startTime": cut, "endTime": "2024-03-05 00:00:00", "limit": 200}
    got = envelope(call(sim, "/api/payment/list", body))["data"]["list"]
    assert got == sim.dataset.window("ODS_PAYMENT", SITE, cut, "2024-03-05 00:00:00")
    assert got[0]["payTime"] == cut
    before = envelope(call(sim, "/api/payment/list", {**body, "startTime": "2024-03-01 00:00:00", "endTime": cut}))
    assert all(r["payTime"] < cut for r in before["data"]["list"])
    assert before["data"]["total"] + len(got) == len(records)


# --- pagination and shapes ---------------------------------------------------------------------------------------

def test_default_limit_is_20_and_pages_are_1_based(sim):
    data = envelope(call(sim, "/api/member/list", {"siteId": SITE}))["data"]
    assert len(data["list"]) == 20
    page2 = envelope(call(sim, "/api/member/list", {"siteId": SITE, "page": 2}))["data"]["list"]
    everything = sim.dataset.records("ODS_MEMBER", SITE)
    assert data["list"] + page2 == everything[:40]


def test_page_past_the_end_is_empty_with_total(sim):
    data = envelope(call(sim, "/api/member/list", {"siteId": SITE, "page": 99, "limit": 200}))
    assert data["code"] == 0 and data["data"]["list"] == [] and data["data"]["total"] == 40


def _list_node(endpoint, data):
    node = data
    for key in endpoint.shape.data_path:
        node = node[key]
    return node


@pytest.mark.parametrize("endpoint", LIST_ENDPOINTS, ids=lambda e: e.task_code)
def test_every_list_endpoint_answers_in_its_shape_and_order(sim, endpoint):
    body = {"siteId": SITE, "limit": 200, **(WINDOW if endpoint.windowed else {})}
    node = _list_node(endpoint, envelope(call(sim, endpoint.path, body)))
    expected = sim.dataset.records(endpoint.task_code, SITE)
    assert node["total"] == len(expected) > 0
    assert node[endpoint.shape.list_key] == expected[:200]
    if endpoint.shape.name == "D":
        assert (node["pageNo"], node["pageSize"]) == (1, 200)
    keys = [(r[endpoint.window_field], r[endpoint.pk]) if endpoint.windowed else r[endpoint.pk] for r in expected]
    assert keys == sorted(keys)


def test_escaping_is_per_endpoint(sim):
    for endpoint in LIST_ENDPOINTS:
        body = {"siteId": SITE, "limit": 200, **(WINDOW if endpoint.windowed else {})}
        text = call(sim, endpoint.path, body).body
        assert text.isascii() == (endpoint.path in ESCAPED_PATHS), endpoint.path
    escaped = call(sim, "/api/settlement/list", {"siteId": SITE, "limit": 200, **WINDOW}).body.decode()
    assert "\\u" in escaped


# --- details ---------------------------------------------------------------------------------------------------

def test_detail_errors(sim):
    assert code_of(sim, "/api/settlement/detail", {"siteId": SITE}) == 40001
    assert code_of(sim, "/api/settlement/detail", {"siteId": SITE, "settleId": "abc"}) == 40001
    assert code_of(sim, "/api/settlement/detail", {"siteId": SITE, "settleId": 1872950412356812801}) == 40401
    assert code_of(sim, "/api/groupbuy/package/detail", {"siteId": SITE, "packageId": "PKG-NOPE"}) == 40401
    assert code_of(sim, "/api/member/detail", {"siteId": SITE, "memberId": ""}) == 40001


def test_detail_accepts_id_as_number_or_string_but_not_a_rounded_id(sim):
    settlement = sim.dataset.records("ODS_SETTLEMENT", SITE)[0]
    settle_id = settlement["settleId"]
    as_number = envelope(call(sim, "/api/settlement/detail", {"siteId": SITE, "settleId": settle_id}))
    as_text = envelope(call(sim, "/api/settlement/detail", {"siteId": SITE, "settleId": str(settle_id)}))
    assert as_number["data"] == as_text["data"]
    assert as_number["data"]["settleId"] == settle_id
    rounded = float(settle_id)
    assert int(rounded) != settle_id
    assert code_of(sim, "/api/settlement/detail", {"siteId": SITE, "settleId": rounded}) == 40401


def test_detail_layouts(sim):
    package = sim.dataset.records("ODS_GROUP_PACKAGE", SITE)[0]
    data = envelope(call(sim, "/api/groupbuy/package/detail", {"siteId": SITE, "packageId": package["packageId"]}))
    assert set(data["data"]) == {"package"}
    assert {**package} == {k: v for k, v in data["data"]["package"].items() if k not in ("usageRules", "contents")}
    member = sim.dataset.records("ODS_MEMBER", SITE)[0]
    data = envelope(call(sim, "/api/member/detail", {"siteId": SITE, "memberId": member["memberId"]}))["data"]
    assert set(data) == {"member", "tags", "cards"} and data["member"] == member


# --- faults -----------------------------------------------------------------------------------------------------

def test_injected_faults_hit_only_matching_paths_and_count_down():
    sim = Simulator(SimulatorConfig(anchor=ANCHOR, risk=RiskControlConfig(enabled=False)))
    sim.inject(path="/api/goods/list", kind="http503", count=2)
    sim.inject(path="/api/member/list", kind="code50001")
    assert call(sim, "/api/table/list", {"siteId": SITE}).http_status == 200
    first = call(sim, "/api/goods/list", {"siteId": SITE})
    assert (first.http_status, first.outcome, first.code) == (503, "fault", None)
    assert call(sim, "/api/goods/list", {"siteId": SITE}).http_status == 503
    assert envelope(call(sim, "/api/goods/list", {"siteId": SITE}))["code"] == 0
    failed = envelope(call(sim, "/api/member/list", {"siteId": SITE}))
    assert (failed["code"], failed["data"]) == (50001, None)


def test_gateway_429_has_retry_after_header_and_no_envelope():
    sim = Simulator(SimulatorConfig(anchor=ANCHOR))
    sim.inject(kind="http429", retry_after=7)
    reply = call(sim, "/api/member/list", {"siteId": SITE}, token="whatever")
    assert reply.http_status == 429 and ("Retry-After", "7") in reply.headers
    assert not reply.accepted


def test_injected_42901_releases_the_lane_without_a_completion():
    sim = Simulator(SimulatorConfig(anchor=ANCHOR, risk=RiskControlConfig(gap_standard=0, gap_groupbuy=0)))
    sim.inject(kind="code42901", retry_after=4)
    reply = envelope(call(sim, "/api/member/list", {"siteId": SITE}))
    assert reply["code"] == 42901 and reply["data"] == {"retryAfter": 4}
    assert sim.risk.statistics("fq_test_token").last_completion is None
    assert envelope(call(sim, "/api/member/list", {"siteId": SITE}))["code"] == 0


def test_unknown_path_is_404_html_and_get_is_405(sim):
    reply = call(sim, "/api/nope", {"siteId": SITE})
    assert reply.http_status == 404 and reply.content_type.startswith("text/html")
    reply = call(sim, "/api/member/list", method="GET")
    assert reply.http_status == 405 and ("Allow", "POST") in reply.headers


def test_every_task_in_the_table_has_a_path():
    assert len(LIST_BY_TASK) == 21
