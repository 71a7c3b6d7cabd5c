"""The simulator over real HTTP with httpx: risk control with tiny gaps (upstream-api.md §2.2), list shapes (§1.4),
exact big ids (Q2), escaped vs raw JSON (Q9), deletion (Q12), gateway faults and stalls (§2.3), the request log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import httpx
import pytest

from feiqiu_etl.simulator import LIST_ENDPOINTS, RiskControlConfig, Simulator, SimulatorConfig

pytestmark = pytest.mark.integration

SITE = 8640015201004417
ANCHOR = datetime(2024, 3, 4, 12, 0, 0)
WINDOW = {"startTime": "2024-03-01 00:00:00", "endTime": "2024-03-04 12:00:00"}
NO_RISK = RiskControlConfig(enabled=False)


def client(sim: Simulator, timeout: float = 5.0, token: str = "fq_test_token") -> httpx.Client:
    return httpx.Client(base_url=sim.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)


def start(**overrides) -> Simulator:
    return Simulator(SimulatorConfig(**{"anchor": ANCHOR, **overrides})).start()


@pytest.fixture(scope="module")
def sim():
    with Simulator(SimulatorConfig(anchor=ANCHOR, risk=NO_RISK)) as running:
        yield running


@pytest.fixture(scope="module")
def http(sim):
    with client(sim) as c:
        yield c


def post(c: httpx.Client, path: str, body: dict) -> dict:
    response = c.post(path, json=body)
    assert response.status_code == 200
    return response.json()


# --- risk control ---------------------------------------------------------------------------------------------

def test_overlapping_requests_get_one_42901():
    sim = start(risk=RiskControlConfig(gap_standard=0.01, gap_groupbuy=0.01), processing_delay=0.4)
    try:
        results: dict[str, dict] = {}

        def first():
            with client(sim) as c:
                results["first"] = post(c, "/api/member/list", {"siteId": SITE})

        thread = threading.Thread(target=first)
        thread.start()
        time.sleep(0.15)
        with client(sim) as c:
            results["second"] = post(c, "/api/goods/list", {"siteId": SITE})
        thread.join()
        assert results["first"]["code"] == 0
        assert results["second"]["code"] == 42901 and results["second"]["data"] == {"retryAfter": 1}
        outcomes = [(e.path, e.outcome) for e in sim.request_log()]
        assert ("/api/goods/list", "rejected") in outcomes and ("/api/member/list", "accepted") in outcomes
    finally:
        sim.stop()


def test_too_soon_is_42901_and_the_gap_counts_from_completion():
    sim = start(risk=RiskControlConfig(gap_standard=0.3, gap_groupbuy=0.6))
    try:
        with client(sim) as c:
            assert post(c, "/api/member/list", {"siteId": SITE})["code"] == 0
            assert post(c, "/api/member/list", {"siteId": SITE})["code"] == 42901
            time.sleep(0.35)
            assert post(c, "/api/groupbuy/package/list", {"siteId": SITE})["code"] == 42901  # groupbuy gap 0.6
            time.sleep(0.35)
            assert post(c, "/api/member/list", {"siteId": SITE})["code"] == 0
        log = sim.request_log()
        accepted = [e for e in log if e.outcome == "accepted"]
        assert accepted[1].started - accepted[0].ended >= 0.3
    finally:
        sim.stop()


def test_three_violations_ban_the_token_then_the_ban_expires():
    risk = RiskControlConfig(gap_standard=0.2, gap_groupbuy=0.2, violation_window=5, ban_seconds=0.6)
    sim = start(risk=risk)
    try:
        with client(sim) as c:
            assert post(c, "/api/member/list", {"siteId": SITE})["code"] == 0
            codes = [post(c, "/api/member/list", {"siteId": SITE})["code"] for _ in range(4)]
            assert codes == [42901, 42901, 42901, 42902]
            banned = post(c, "/api/member/list", {"siteId": SITE})
            assert banned["code"] == 42902 and banned["data"]["retryAfter"] >= 1
            time.sleep(0.65)
            assert post(c, "/api/member/list", {"siteId": SITE})["code"] == 0
    finally:
        sim.stop()


# --- shapes, ids, escaping --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["A", "B", "C", "D"])
def test_list_shapes(sim, http, shape):
    for endpoint in (e for e in LIST_ENDPOINTS if e.shape.name == shape):
        body = {"siteId": SITE, "page": 1, "limit": 200, **(WINDOW if endpoint.windowed else {})}
        node = post(http, endpoint.path, body)
        for key in endpoint.shape.data_path:
            node = node[key]
        assert node["total"] == len(node[endpoint.shape.list_key]) > 0
        assert node[endpoint.shape.list_key] == sim.dataset.records(endpoint.task_code, SITE)


def test_big_ids_survive_the_round_trip(sim, http):
    listing = post(http, "/api/settlement/list", {"siteId": SITE, "limit": 200, **WINDOW})["data"]["list"]
    settle_id = listing[0]["settleId"]
    assert settle_id > 2**53
    detail = post(http, "/api/settlement/detail", {"siteId": SITE, "settleId": settle_id})
    assert detail["code"] == 0 and detail["data"]["settleId"] == settle_id
    assert all(item["settleId"] == settle_id for item in detail["data"]["items"])
    corrupted = int(float(settle_id))
    assert post(http, "/api/settlement/detail", {"siteId": SITE, "settleId": corrupted})["code"] == 40401


def test_escaped_and_raw_endpoints_parse_to_equal_records(http):
    escaped = http.post("/api/settlement/list", json={"siteId": SITE, "limit": 200, **WINDOW})
    assert escaped.content.isascii() and b"\\u" in escaped.content
    listing = escaped.json()["data"]["list"]
    with_emoji = next(s for s in listing if "🎱" in s["remark"] or "🐂" in s["remark"])
    assert "\\ud83c" in escaped.text or "\\ud83d" in escaped.text  # surrogate pairs
    raw = http.post("/api/settlement/detail", json={"siteId": SITE, "settleId": with_emoji["settleId"]})
    assert not raw.content.isascii()
    assert with_emoji["remark"].encode() in raw.content
    header = {k: v for k, v in raw.json()["data"].items() if k != "items"}
    assert header == with_emoji


def test_deleted_master_data_vanishes_and_its_detail_is_40401(sim, http):
    member = sim.dataset.records("ODS_MEMBER", SITE)[-1]
    body = {"siteId": SITE, "memberId": member["memberId"]}
    assert post(http, "/api/member/detail", body)["code"] == 0
    sim.dataset.delete("ODS_MEMBER", SITE, member["memberId"])
    assert post(http, "/api/member/detail", body)["code"] == 40401
    listing = post(http, "/api/member/list", {"siteId": SITE, "limit": 200})["data"]["list"]
    assert member["memberId"] not in {m["memberId"] for m in listing}


def test_churn_between_pages_changes_totals_while_paging():
    sim = start(risk=NO_RISK, churn_between_pages=True)
    try:
        with client(sim) as c:
            totals, seen, page = [], [], 1
            while True:
                data = post(c, "/api/member/list", {"siteId": SITE, "page": page, "limit": 5})["data"]
                totals.append(data["total"])
                seen += [m["memberId"] for m in data["list"]]
                if len(data["list"]) < 5:
                    break
                page += 1
        final = {m["memberId"] for m in sim.dataset.records("ODS_MEMBER", SITE)}
        assert len(set(totals)) > 1 or set(seen) != final
    finally:
        sim.stop()


# --- gateway faults, stalls, log, plumbing -------------------------------------------------------------------

def test_gateway_faults_are_not_envelopes(sim, http):
    sim.inject(path="/api/goods/list", kind="http429", retry_after=2)
    sim.inject(path="/api/goods/list", kind="http502")
    throttled = http.post("/api/goods/list", json={"siteId": SITE})
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    bad_gateway = http.post("/api/goods/list", json={"siteId": SITE})
    assert bad_gateway.status_code == 502 and bad_gateway.content == b""
    assert post(http, "/api/goods/list", {"siteId": SITE})["code"] == 0


def test_stall_makes_the_client_time_out_and_the_lane_is_released_afterwards():
    sim = start(risk=RiskControlConfig(gap_standard=0.01, gap_groupbuy=0.01))
    try:
        # 3 s of stall: the next request must land while it is in flight, also at load 9 (0.6 s was overrun)
        sim.inject(path="/api/member/list", kind="stall", stall_seconds=3.0)
        with client(sim, timeout=0.2) as c, pytest.raises(httpx.ReadTimeout):
            c.post("/api/member/list", json={"siteId": SITE})
        with client(sim) as c:
            assert post(c, "/api/table/list", {"siteId": SITE})["code"] == 42901  # still in flight
            time.sleep(3.0)
            assert post(c, "/api/table/list", {"siteId": SITE})["code"] == 0
        stalled = sim.request_log()[0]
        assert stalled.fault == "stall" and stalled.ended - stalled.started >= 3.0
    finally:
        sim.stop()


def test_unknown_path_and_get(http):
    assert http.post("/api/unknown", json={"siteId": SITE}).status_code == 404
    response = http.get("/api/member/list")
    assert response.status_code == 405 and response.headers["Allow"] == "POST"


def test_request_log_endpoint_never_shows_the_token(sim, http):
    post(http, "/api/coupon/list", {"siteId": SITE})
    response = httpx.get(f"{sim.base_url}/__sim/log")
    assert response.status_code == 200 and "fq_test_token" not in response.text
    entries = response.json()
    last = entries[-1]
    assert last["path"] == "/api/coupon/list" and last["body"] == {"siteId": SITE}
    assert last["record_count"] == 5 and last["outcome"] == "accepted" and last["ended"] >= last["started"]
    assert [e["seq"] for e in entries] == [e.seq for e in sim.request_log()]


def test_serve_forever_prints_url_and_stops_on_sigterm(tmp_path):
    script = ("from datetime import datetime\n"
              "from feiqiu_etl.simulator import SimulatorConfig, serve_forever\n"
              "serve_forever(SimulatorConfig(anchor=datetime(2024, 3, 4, 12), token='fq_cli_token'))\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = process.stdout.readline().split()[-1]
        token_line = process.stdout.readline()
        assert url.startswith("http://127.0.0.1:") and "fq_cli_token" in token_line
        response = httpx.post(f"{url}/api/coupon/list", json={"siteId": SITE},
                              headers={"Authorization": "Bearer fq_cli_token"})
        assert response.json()["code"] == 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_bodies_keep_exact_integers_in_the_log(sim, http):
    big = 1872950412356812801
    post(http, "/api/settlement/detail", {"siteId": SITE, "settleId": big})
    entry = sim.request_log()[-1]
    assert entry.body["settleId"] == big and entry.code == 40401
    assert json.loads(json.dumps(entry.to_json()))["body"]["settleId"] == big


def test_advance_and_minimum_endpoints_move_time_and_answer_the_ground_truth():
    sim = start(risk=RiskControlConfig(gap_standard=5, gap_groupbuy=5))  # admin calls never meet risk control
    try:
        with client(sim) as http, client(sim, token="fq_wrong") as stranger:
            assert post(stranger, "/__sim/advance", {"hours": 24})["code"] == 40101
            assert httpx.get(f"{sim.base_url}/__sim/clock").json()["data"]["now"] == "2024-03-04 12:00:00"
            for bad in ({"hours": 0}, {"hours": "24"}, {"hours": 745}, {}):
                assert post(http, "/__sim/advance", bad)["code"] == 40001, bad
            answer = post(http, "/__sim/advance", {"hours": 24})
            assert answer["code"] == 0 and answer["data"]["from"] == "2024-03-04 12:00:00"
            assert answer["data"]["now"] == "2024-03-05 12:00:00" and answer["data"]["hours"] == 24
            settlements = answer["data"]["sites"][str(SITE)]["ODS_SETTLEMENT"]
            assert settlements["inserted"] == sim.config.profile.settlements_per_day
            clock = httpx.get(f"{sim.base_url}/__sim/clock").json()["data"]
            assert clock == {"now": "2024-03-05 12:00:00", "anchor": "2024-03-04 12:00:00",
                             "marks": ["2024-03-04 12:00:00", "2024-03-05 12:00:00"]}
            # the new day is served by the API: a window ending at the simulator's now holds it
            window = {"siteId": SITE, "startTime": "2024-03-04 12:00:00", "endTime": "2024-03-05 12:00:00",
                      "limit": 200}
            listed = post(http, "/api/settlement/list", window)["data"]["total"]
            assert listed >= settlements["inserted"]
            body = {"siteId": SITE, "startTime": window["startTime"], "endTime": window["endTime"]}
            minimum = post(http, "/__sim/minimum", body)
            assert minimum["code"] == 0
            expected = sim.minimum_requests(SITE, datetime(2024, 3, 4, 12), datetime(2024, 3, 5, 12)).to_json()
            assert minimum["data"] == expected and expected["requests"] > 0
            assert next(t for t in expected["tasks"] if t["task_code"] == "ODS_SETTLEMENT")["details"] == listed
            assert post(http, "/__sim/minimum", {**body, "endTime": body["startTime"]})["code"] == 40002
            assert post(http, "/__sim/minimum", {**body, "limit": 500})["code"] == 40003
            assert post(http, "/__sim/minimum", {**body, "siteId": 1})["code"] == 40001
            assert post(stranger, "/__sim/minimum", body)["code"] == 40101
            assert http.get("/__sim/unknown").status_code == 404
        assert [e.path for e in sim.request_log()] == ["/api/settlement/list"]  # admin calls are not API traffic
    finally:
        sim.stop()


def test_risk_control_can_be_changed_while_the_simulator_runs():
    sim = start(risk=RiskControlConfig(gap_standard=5, gap_groupbuy=5))
    try:
        with client(sim) as http, client(sim, token="fq_wrong") as stranger:
            body = {"siteId": SITE, "page": 1, "limit": 200, **WINDOW}
            assert post(http, "/api/payment/list", body)["code"] == 0
            assert post(http, "/api/payment/list", body)["code"] == 42901  # 5 s not passed
            assert post(stranger, "/__sim/risk", {"enabled": False})["code"] == 40101
            for bad in ({"enabled": 1}, {"gap_standard": "3"}, {"gap_standard": -1}, {"speed": 2}):
                assert post(http, "/__sim/risk", bad)["code"] == 40001, bad
            answer = post(http, "/__sim/risk", {"enabled": False})
            assert answer["code"] == 0 and answer["data"]["enabled"] is False and answer["data"]["gap_standard"] == 5
            assert [post(http, "/api/payment/list", body)["code"] for _ in range(3)] == [0, 0, 0]  # off: no gap
            assert post(http, "/__sim/risk", {"enabled": True, "gap_standard": 0.05})["data"]["gap_standard"] == 0.05
            time.sleep(0.06)
            assert post(http, "/api/payment/list", body)["code"] == 0
            assert post(http, "/api/payment/list", body)["code"] == 42901  # on again, with the new G
    finally:
        sim.stop()
